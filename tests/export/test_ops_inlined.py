"""The custom nodes' reference functions expanded by onnx's own inliner (onnx.inliner.inline_local_functions), as
consumers other than ONNX Runtime see them: the inlined model passes onnx.checker in full and strict shape inference,
and computes what ONNX Runtime computes with the functions. A body that needs a function attribute's default
(FunctionProto.attribute_proto) fails here: onnx's inliner and ReferenceEvaluator drop defaults, so an optional
attribute read through a Constant becomes a Constant without a value (QuantizedSparseFFN's down_weight_format)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx.shape_inference
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edge_sdk import quant
from edge_sdk.export import ops

D, d, G, T = 16, 64, 32, 3


def _words(fmt: str, rng: np.random.Generator) -> np.ndarray:
    """INT32 words [D, d / v] of random codes: int8 bytes, or int4 nibbles packed as the bundle packs them."""
    if fmt == "int8":
        return np.ascontiguousarray(rng.integers(-128, 128, size=(D, d)).astype(np.int8)).view("<i4")
    return np.ascontiguousarray(quant.pack_int4(rng.integers(-8, 8, size=(D, d)).astype(np.int8))).view("<i4")


def _fp16(rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((D, d // G)) * 0.02).astype(np.float16)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _check_inlined(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int) -> None:
    types = {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.int32): TensorProto.INT32,
    }
    inputs = [
        helper.make_tensor_value_info(name, types[value.dtype], list(value.shape)) for name, value in feeds.items()
    ]
    output_type = TensorProto.INT32 if node.output[0] == "mask" else TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "inlined", inputs, [helper.make_tensor_value_info(node.output[0], output_type, ["T", "N"])]
    )
    model = helper.make_model(
        graph,
        opset_imports=ops.function_opset_imports(opset),
        functions=ops.reference_functions(opset),
        ir_version=ops.IR_VERSION,
    )
    inlined = onnx.inliner.inline_local_functions(model)
    assert not inlined.functions and all(n.domain == "" for n in inlined.graph.node)
    onnx.checker.check_model(inlined, full_check=True)
    onnx.shape_inference.infer_shapes(inlined, check_type=True, strict_mode=True, data_prop=True)
    np.testing.assert_allclose(_run(inlined, feeds), _run(model, feeds), rtol=1e-6, atol=1e-6)


QUANTIZED_FFN_CASES = [  # weight_format, down_weight_format (None: absent), thresholds
    ("int8", None, False),
    ("int4", None, True),
    ("int4", "int8", False),
    ("int4_asymmetric", None, True),
    ("int4_asymmetric", "int8", True),
]


@pytest.mark.parametrize(("weight_format", "down_format", "thresholds"), QUANTIZED_FFN_CASES)
def test_quantized_sparse_ffn_inlines_to_a_valid_model(
    weight_format: str, down_format: str | None, thresholds: bool
) -> None:
    rng = np.random.default_rng(0)
    base = "int8" if weight_format == "int8" else "int4"
    feeds = {"x": rng.standard_normal((T, d)).astype(np.float32)}
    for matrix in ("w_gate", "w_up", "w_down_t"):
        feeds[matrix] = _words(down_format or base if matrix == "w_down_t" else base, rng)
        feeds[matrix + "_scales"] = _fp16(rng)
    feeds["mask"] = rng.integers(0, 2, size=(T, D)).astype(np.int32)
    if thresholds:
        feeds["thresholds"] = np.abs(rng.standard_normal(D)).astype(np.float32) * 0.01
    if weight_format == "int4_asymmetric":
        for matrix in ("w_gate", "w_up") + (() if down_format == "int8" else ("w_down_t",)):
            feeds[matrix + "_mins"] = _fp16(rng)
    attributes = {"activation": "relu", "weight_format": weight_format, "group_size": G}
    if down_format is not None:
        attributes["down_weight_format"] = down_format
    node = ops.make_node("QuantizedSparseFFN", list(feeds), ["y"], **attributes)
    _check_inlined(node, feeds, ops.QUANTIZED_OPSET_VERSION)


@pytest.mark.parametrize("weight_format", ["int8", "int4", "int4_asymmetric"])
@pytest.mark.parametrize("transposed", [0, 1])
def test_quantized_matmul_inlines_to_a_valid_model(weight_format: str, transposed: int) -> None:
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((T, d if transposed else D)).astype(np.float32),
        "w": _words("int8" if weight_format == "int8" else "int4", rng),
        "w_scales": _fp16(rng),
    }
    if weight_format == "int4_asymmetric":
        feeds["w_mins"] = _fp16(rng)
    node = ops.make_node(
        "QuantizedMatMul", list(feeds), ["y"], weight_format=weight_format, group_size=G, transposed=transposed
    )
    _check_inlined(node, feeds, ops.QUANTIZED_OPSET_VERSION)


@pytest.mark.parametrize("opset", [ops.STANDARD_OPSET_VERSION, ops.QUANTIZED_OPSET_VERSION])
def test_float_ops_inline_to_valid_models(opset: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, d)).astype(np.float32)
    weights = {m: (rng.standard_normal((D, d)) * 0.1).astype(np.float16) for m in ("w_gate", "w_up", "w_down_t")}
    mask = rng.integers(0, 2, size=(T, D)).astype(np.int32)
    _check_inlined(
        ops.make_node("SparseFFN", ["x", *weights, "mask"], ["y"], activation="silu"),
        {"x": x, **weights, "mask": mask},
        opset,
    )
    svd = {
        "x": x,
        "a": rng.standard_normal((D, 4)).astype(np.float32),
        "b": rng.standard_normal((4, d)).astype(np.float32),
        "bias": rng.standard_normal(D).astype(np.float32),
    }
    _check_inlined(ops.make_node("SvdPredictor", list(svd), ["mask"]), svd, opset)
    packed = rng.integers(-(2**31), 2**31, size=(D, d // 32)).astype(np.int32)
    _check_inlined(
        ops.make_node("SignBitPredictor", ["x", "packed"], ["mask"], alpha=1.0), {"x": x, "packed": packed}, opset
    )
