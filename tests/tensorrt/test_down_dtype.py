"""int4 bundles that keep their FFN down projections in int8 (export --down-dtype int8) on the TensorRT backend: the
decode.onnx the engine is built from hands every QuantizedSparseFFN its int8 down rows (down_weight_format "int8",
w_down_t INT32 [D, d / 4], no w_down_t_mins: 8 inputs, 11 when asymmetric) and the prompt's down products to int8
QuantizedMatMul nodes (transposed 0); `edge-sdk build` takes the bundle to TensorRT, and on the fake TensorRT
(fake_engine.py) the engine's steps reproduce ONNX Runtime (test_engine_buffers.py). On a device with TensorRT, the
engine through the plugins (edge_sparse_ffn_q with down_format EDGE_Q8) matches ONNX Runtime's reference functions.
test_plugin_library.py makes the plugin of each of these graphs' custom nodes (GRAPH_BUNDLES).
"""

from __future__ import annotations

import sys

import onnx
import pytest
from edge_sdk.backends.tensorrt import build_engine
from onnx import helper

from edge_sdk.bundle import Bundle
from edge_sdk.bundle.graph_ops import DOMAIN

from .test_tensorrt_engine import AVAILABLE, REASON, assert_engine_matches_onnx_runtime

# tests/conftest.py's INT8_DOWN_BUNDLES: symmetric int4, and asymmetric int4 with tied embeddings and an int8 head
NAMES = ("svd-int4-down-int8", "tied-svd-int4-asym-head-int8-down-int8")


def initializer_shapes(graph: onnx.ModelProto) -> dict[str, tuple[int, list[int]]]:
    return {tensor.name: (tensor.data_type, list(tensor.dims)) for tensor in graph.graph.initializer}


def attributes(node: onnx.NodeProto) -> dict:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


@pytest.mark.parametrize("name", NAMES)
def test_decode_graph_gives_the_plugins_int8_down_rows(bundle_matrix, name):
    bundle = bundle_matrix[name]
    assert bundle.manifest.down_dtype == "int8"
    graph = onnx.load(str(bundle.graph_path("decode")), load_external_data=False)
    initializers = initializer_shapes(graph)
    ffns = [node for node in graph.graph.node if node.domain == DOMAIN and node.op_type == "QuantizedSparseFFN"]
    assert len(ffns) == bundle.config.num_layers
    for node in ffns:
        assert attributes(node)["down_weight_format"] == b"int8"
        assert attributes(node)["weight_format"] == (b"int4_asymmetric" if bundle.manifest.asymmetric else b"int4")
        assert len(node.input) == (11 if bundle.manifest.asymmetric else 8)  # never a w_down_t_mins
        (gate_type, gate_shape), (down_type, down_shape) = initializers[node.input[1]], initializers[node.input[5]]
        d = gate_shape[1] * 8  # int4: 8 codes per INT32 word
        assert gate_type == down_type == onnx.TensorProto.INT32
        assert down_shape == [gate_shape[0], d // 4]  # int8: 4 codes per word
        assert initializers[node.input[6]] == (onnx.TensorProto.FLOAT16, [gate_shape[0], d // 32])
    # the prompt's dense FFN reads the same int8 down rows: QuantizedMatMul int8, transposed 0
    matmuls = [node for node in graph.graph.node if node.op_type == "QuantizedMatMul"]
    down_products = [node for node in matmuls if attributes(node).get("transposed") == 0]
    assert len(down_products) == len(ffns)
    for node in down_products:
        assert attributes(node)["weight_format"] == b"int8" and len(node.input) == 3
        assert node.input[1] in {ffn.input[5] for ffn in ffns}


@pytest.mark.parametrize("name", NAMES)
def test_build_takes_int8_down_bundles_to_tensorrt(fake_trt, bundle_matrix, tmp_path, name):
    """The static check's rules hold (every quantized product a plugin) and the engine is cached."""
    bundle = bundle_matrix[name]
    trt = sys.modules["tensorrt"]
    directory = build_engine(bundle, cache_dir=tmp_path / "cache")
    ((parsed, _, _),) = trt.builds
    assert parsed == str(bundle.graph_path("decode"))
    assert sorted(path.name for path in directory.iterdir()) == ["engine.json", "model.engine"]


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
@pytest.mark.parametrize("name", NAMES)
def test_int8_down_engine_matches_onnx_runtime(bundle_matrix, tiny_model_dir, tmp_path, monkeypatch, name):
    """On a device: the plugins (QuantizedSparseFFN with int8 down rows, the int8 QuantizedMatMul of the prompt's down
    products) against ONNX Runtime's reference functions on the same bundle."""
    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path))
    assert_engine_matches_onnx_runtime(Bundle.open(bundle_matrix.path(name)), tiny_model_dir)
