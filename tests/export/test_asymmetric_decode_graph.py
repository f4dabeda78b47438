"""decode.onnx of asymmetric int4 bundles (export --int4-scheme asymmetric): every product with an int4 matrix goes to
QuantizedMatMul / QuantizedSparseFFN with weight_format "int4_asymmetric" and the matrix's minimums (an int8 LM head
stays an "int8" node without), a QuantizedSparseFFN node has all 12 inputs (thresholds one shared zeros initializer,
for an SVD predictor has none), each tensor is one initializer, and the graph keeps TensorRT's rules. prefill.onnx
keeps its standard-op dequantization. What the graphs compute is tests/runtime/test_asymmetric_int4.py's (every engine
against the reference), test_step_graph.py's (decode.onnx's prompt against prefill.onnx) and
test_quantized_lookup.py's (a tied bundle's lookup)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from edge_sdk.backends.tensorrt import compatibility
from onnx import TensorProto, helper, numpy_helper

from edge_sdk.bundle.layout import MINS_SUFFIX, SCALES_SUFFIX
from edge_sdk.export import ops

from ..conftest import ASYMMETRIC_BUNDLES

QUANTIZED_OPS = ("QuantizedMatMul", "QuantizedSparseFFN")


def _graphs(bundle) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return tuple(onnx.load(str(bundle.graph_path(phase)), load_external_data=False) for phase in ("decode", "prefill"))


def _attribute(node: onnx.NodeProto, name: str):
    value = next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.parametrize("name", list(ASYMMETRIC_BUNDLES))
def test_every_int4_product_is_a_quantized_node_with_the_minimums(bundle_matrix, name):
    bundle = bundle_matrix[name]
    decode, prefill = _graphs(bundle)
    config = bundle.config
    tensors = bundle.manifest.tensors
    head = "embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    int8_head = name.endswith("head-int8")
    initializers = {tensor.name: tensor for tensor in decode.graph.initializer}
    ops_used = Counter(node.op_type for node in decode.graph.node)
    assert ops_used["DequantizeLinear"] == 0 and ops_used["SparseFFN"] == 0
    assert ops_used["QuantizedSparseFFN"] == config.num_layers

    zero_thresholds = set()
    for node in decode.graph.node:
        if node.op_type == "QuantizedSparseFFN":
            ops.validate_node(node)
            assert len(node.input) == 12 and _attribute(node, "weight_format") == "int4_asymmetric"
            matrices = [node.input[1], node.input[3], node.input[5]]
            assert list(node.input[9:]) == [matrix + MINS_SUFFIX for matrix in matrices]
            zero_thresholds.add(node.input[8])  # an SVD bundle has no CHESS thresholds
        if node.op_type == "QuantizedMatMul":
            ops.validate_node(node)
            matrix = node.input[1]
            if matrix == head and int8_head:  # the int8 head: symmetric, no minimums
                assert len(node.input) == 3 and _attribute(node, "weight_format") == "int8"
            else:
                assert _attribute(node, "weight_format") == "int4_asymmetric"
                assert list(node.input[2:]) == [matrix + SCALES_SUFFIX, matrix + MINS_SUFFIX]
    # one float32 zeros [D] initializer, shared by every layer's node
    (thresholds,) = zero_thresholds
    zeros = numpy_helper.to_array(initializers[thresholds])
    assert zeros.dtype == np.float32 and zeros.shape == (config.intermediate_size,) and not zeros.any()

    # every minimum the bundle stores is one FLOAT16 initializer, read by the quantized nodes (and a tied lookup)
    minimums = {tensor for tensor in tensors if tensor.endswith(MINS_SUFFIX)}
    assert minimums and all(initializers[tensor].data_type == TensorProto.FLOAT16 for tensor in minimums)
    readers = {tensor: {n.op_type for n in decode.graph.node if tensor in n.input} for tensor in minimums}
    lookup = {"Gather"} if config.tie_word_embeddings and not int8_head else set()
    assert all(readers[tensor] - lookup <= set(QUANTIZED_OPS) for tensor in minimums), readers
    assert len(initializers) == len(decode.graph.initializer)  # one initializer per name
    # prefill.onnx keeps DequantizeLinear -> Gemm in standard ops
    assert not {node.op_type for node in prefill.graph.node} & set(QUANTIZED_OPS)
    assert any(node.op_type == "DequantizeLinear" for node in prefill.graph.node)


@pytest.mark.parametrize("name", list(ASYMMETRIC_BUNDLES))
def test_the_decode_graph_keeps_tensorrts_rules_and_holds_each_matrix_once(bundle_matrix, name):
    bundle = bundle_matrix[name]
    violations, memory = compatibility.check_bundle(bundle)
    assert violations == []
    assert memory.engine == memory.bundle_weights
