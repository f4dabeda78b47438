"""Custom op contracts (edge_sdk.export.ops): schemas, nodes and the reference ONNX functions, which pass onnx.checker;
what ONNX Runtime computes with them on every op case is in the op table (tests/ops), the exact comparison of the
sign-bit rule, a predictor feeding SparseFFN in one model, and the quantized ops' functions against the same product on
edge_sdk.quant.dequantize's matrices (every weight format, group size and layout) here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

from edge_sdk import quant
from edge_sdk.bundle.graph_ops import OP_TYPES
from edge_sdk.export import ops
from edge_sdk.formats.onnx_wire import without_functions
from edge_sdk.model.activation import SUPPORTED_ACTIVATIONS, Activation
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.signbit import pack_sign_bits, signbit_mask

OPS_MD = Path(ops.__file__).parent.with_name("OPS.md")
FFN_TOLERANCE = ops.error_bound("SparseFFN", "float16")  # max |y - y_ref| relative to max |y_ref|

_ONNX_TYPES = {
    torch.float32: TensorProto.FLOAT,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.bool: TensorProto.BOOL,
    torch.int32: TensorProto.INT32,
}


def _input(name: str, dtype: torch.dtype, shape: list[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _ONNX_TYPES[dtype], shape)


def _initializer(name: str, tensor: torch.Tensor | np.ndarray) -> onnx.TensorProto:
    if isinstance(tensor, np.ndarray):
        return numpy_helper.from_array(tensor, name)
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)
        return helper.make_tensor(name, TensorProto.BFLOAT16, list(tensor.shape), bits.tobytes(), raw=True)
    return numpy_helper.from_array(tensor.numpy(), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: dict[str, torch.Tensor | np.ndarray],
    opset: int = ops.STANDARD_OPSET_VERSION,
) -> onnx.ModelProto:
    """A model as the exporter writes it: IR 10, our opsets, the reference functions; checked in full."""
    graph = helper.make_graph(
        nodes, "op_test", inputs, outputs, initializer=[_initializer(n, t) for n, t in initializers.items()]
    )
    model = helper.make_model(
        graph,
        opset_imports=ops.function_opset_imports(opset),
        functions=ops.reference_functions(opset),
        ir_version=ops.IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _float_attribute(node: onnx.NodeProto, name: str) -> float:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


# ---------------------------------------------------------------------------------------------- SvdPredictor


# ------------------------------------------------------------------------------------------ SignBitPredictor


def _signbit_model(d: int, packed: torch.Tensor, alpha: float) -> tuple[onnx.NodeProto, ort.InferenceSession]:
    node = ops.make_node("SignBitPredictor", ["x", "packed"], ["mask"], alpha=alpha)
    model = _model(
        [node],
        [_input("x", torch.float32, ["T", d])],
        [_input("mask", torch.int32, ["T", packed.shape[0]])],
        {"packed": packed},
    )
    return node, _session(model)


def test_signbit_predictor_comparison_is_exact() -> None:
    """Ties count as active, and alpha * N_pos is not rounded to float32 before comparing with N_neg."""
    cases = [
        # d, alpha, negative products -> active
        (64, 1.0, 32, True),  # 32 >= 32: a tie is active
        (64, 1.0, 33, False),
        # float32(0.9) * 10 = 8.99999976 < 9: inactive; a float32 product rounds to 9.0 and says active
        (19, float(np.float32(0.9)), 9, False),
        (19, float(np.float32(0.9)), 8, True),
    ]
    for d, alpha, n_negative, active in cases:
        packed = pack_sign_bits(torch.ones(1, d))  # one neuron, all weights positive: N_neg = #negative x
        x = torch.ones(1, d)
        x[0, :n_negative] = -1.0
        node, session = _signbit_model(d, packed, alpha)
        assert _float_attribute(node, "alpha") == alpha
        (mask,) = session.run(None, {"x": x.numpy()})
        assert mask.dtype == np.int32 and mask[0, 0] == int(active), (d, alpha, n_negative)
        assert bool(signbit_mask(packed, x, alpha)[0, 0]) is active


# ------------------------------------------------------------------------------------------------- SparseFFN


def _ffn_weights(d: int, n_neurons: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random FFN weights for x ~ N(0, 1): gate pre-activations ~ N(0, 0.1^2), so fatrelu's t = 0.05 matters."""
    generator = torch.Generator().manual_seed(seed)
    scales = {"w_gate": 0.1, "w_up": 1.0, "w_down_t": 1.0}
    return {
        name: (scale * torch.randn(n_neurons, d, generator=generator) / d**0.5).to(dtype)
        for name, scale in scales.items()
    }


def _max_relative_error(y: np.ndarray, reference: torch.Tensor) -> float:
    return float(np.abs(y - reference.numpy()).max() / reference.abs().max())


def test_predictor_feeds_sparse_ffn() -> None:
    """The decode-step pattern of the exported decoder: a SignBitPredictor mask drives SparseFFN in one model."""
    d, n_neurons = 45, 64
    weights = _ffn_weights(d, n_neurons, torch.float16, seed=7)
    packed = pack_sign_bits(weights["w_gate"].float())
    nodes = [
        ops.make_node("SignBitPredictor", ["x", "packed"], ["mask"], name="predict", alpha=1.03),
        ops.make_node("SparseFFN", ["x", *weights, "mask"], ["y"], name="ffn", activation="relu"),
    ]
    model = _model(
        nodes,
        [_input("x", torch.float32, ["T", d])],
        [_input("y", torch.float32, ["T", d])],
        {**weights, "packed": packed},
    )
    x = torch.randn(3, d, generator=torch.Generator().manual_seed(8))
    (y,) = _session(model).run(None, {"x": x.numpy()})
    mask = signbit_mask(packed, x, _float_attribute(nodes[0], "alpha"))
    reference = sparse_ffn(x, *weights.values(), mask, Activation("relu")).output
    assert 0 < mask.sum() < mask.numel()
    assert _max_relative_error(y, reference) <= FFN_TOLERANCE


# ------------------------------------------------------------------------------------- the quantized ops

# The weight formats of the quantized ops: (weight_format attribute, quant format, asymmetric)
WEIGHT_FORMATS = [("int8", "int8", False), ("int4", "int4", False), ("int4_asymmetric", "int4", True)]


def _quantized(shape: tuple[int, int], fmt: str, group_size: int, asymmetric: bool, seed: int) -> quant.QuantizedMatrix:
    """A random matrix quantized; asymmetric rows sit far from zero, above or below it (so that a gate fires for some
    neurons and not for others), and a function ignoring the minimums, or the codes' + 8, computes with other
    values."""
    generator = np.random.default_rng(seed)
    weight = generator.standard_normal(shape)
    if asymmetric:
        weight += 6.0 * generator.choice([-1.0, 1.0], size=(shape[0], 1))
    matrix = quant.quantize(weight, fmt, group_size, asymmetric=asymmetric)
    if asymmetric:
        assert np.abs(matrix.mins.astype(np.float32)).mean() > 4 * matrix.scales.astype(np.float32).mean()
    return matrix


def _operands(name: str, matrix: quant.QuantizedMatrix) -> dict[str, np.ndarray]:
    """A quantized matrix as the quantized ops take it: its codes as INT32 words, its scales, its minimums if any."""
    operands = {name: np.ascontiguousarray(matrix.data).view(np.int32), f"{name}_scales": matrix.scales}
    if matrix.mins is not None:
        operands[f"{name}_mins"] = matrix.mins
    return operands


@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
@pytest.mark.parametrize("transposed", [1, 0])
@pytest.mark.parametrize(("weight_format", "fmt", "asymmetric"), WEIGHT_FORMATS)
def test_quantized_matmul_computes_with_the_dequantized_matrix(weight_format, fmt, asymmetric, transposed, group_size):
    """QuantizedMatMul's function gives, bit for bit, Gemm's product with the float32 matrix quant.dequantize gives
    (an asymmetric node's (code + 8) * scale + min, a symmetric node's code * scale: DequantizeLinear's, unchanged)."""
    rows, cols = 48, 256  # W [N, K] when transposed, else [K, N]: the groups run along its rows either way
    matrix = _quantized((rows, cols), fmt, group_size, asymmetric, seed=group_size + transposed)
    operands = _operands("w", matrix)
    node = ops.make_node(
        "QuantizedMatMul",
        ["x", *operands],
        ["y"],
        weight_format=weight_format,
        group_size=group_size,
        transposed=transposed,
    )
    dequantized = quant.dequantize(matrix)
    product = helper.make_node("Gemm", ["x", "dequantized"], ["y_float"], transB=transposed)
    n_in, n_out = (cols, rows) if transposed else (rows, cols)
    model = _model(
        [node, product],
        [_input("x", torch.float32, ["T", n_in])],
        [_input("y", torch.float32, ["T", n_out]), _input("y_float", torch.float32, ["T", n_out])],
        operands | {"dequantized": dequantized},
        opset=ops.QUANTIZED_OPSET_VERSION,
    )
    x = np.random.default_rng(1).standard_normal((3, n_in)).astype(np.float32)
    y, y_float = _session(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, y_float)
    expected = x.astype(np.float64) @ (dequantized.T if transposed else dequantized).astype(np.float64)
    assert np.abs(y - expected).max() <= ops.error_bound("QuantizedMatMul", weight_format) * np.abs(expected).max()
    if asymmetric:  # the minimums and the + 8 matter
        codes = quant.unpack_int4(matrix.data).astype(np.float32).reshape(rows, -1, group_size)
        scaled = (codes * matrix.scales.astype(np.float32)[..., None]).reshape(rows, cols)
        assert not np.allclose(y, x @ (scaled.T if transposed else scaled), rtol=1e-3)


@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
@pytest.mark.parametrize(("weight_format", "fmt", "asymmetric"), WEIGHT_FORMATS)
@pytest.mark.parametrize("thresholds", [False, True])
def test_quantized_sparse_ffn_computes_with_the_dequantized_matrices(
    weight_format, fmt, asymmetric, group_size, thresholds
):
    """QuantizedSparseFFN's function gives, bit for bit, SparseFFN's on the float32 matrices quant.dequantize gives,
    and the reference within the op's bound. An asymmetric node always has thresholds, zeros where the predictor has
    none: the same as none."""
    d, n_neurons, activation = 256, 64, Activation("relu")
    matrices = {
        name: _quantized((n_neurons, d), fmt, group_size, asymmetric, seed=index + group_size)
        for index, name in enumerate(("w_gate", "w_up", "w_down_t"))
    }
    operands = {
        name: array for matrix, quantized in matrices.items() for name, array in _operands(matrix, quantized).items()
    }
    codes_and_scales = [name for name in operands if not name.endswith("_mins")]
    minimums = [name for name in operands if name.endswith("_mins")]
    dequantized = {f"{name}_float": quant.dequantize(matrix) for name, matrix in matrices.items()}
    x = torch.randn(3, d, generator=torch.Generator().manual_seed(group_size))
    gate = torch.from_numpy(dequantized["w_gate_float"])
    magnitudes = (x @ gate.T).relu()
    chess = magnitudes[magnitudes > 0].median() * torch.rand(n_neurons, generator=torch.Generator().manual_seed(2))
    threshold_values = chess if thresholds else torch.zeros(n_neurons)
    has_thresholds = thresholds or asymmetric
    threshold_inputs = ["thresholds"] if has_thresholds else []
    layout = {"weight_format": weight_format, "group_size": group_size, "activation": activation.kind}
    nodes = [
        ops.make_node(
            "QuantizedSparseFFN", ["x", *codes_and_scales, "mask", *threshold_inputs, *minimums], ["y"], **layout
        ),
        ops.make_node("SparseFFN", ["x", *dequantized, "mask", *threshold_inputs], ["y_float"], activation="relu"),
    ]
    mask = torch.rand(3, n_neurons, generator=torch.Generator().manual_seed(3)) < 0.7
    model = _model(
        nodes,
        [_input("x", torch.float32, ["T", d]), _input("mask", torch.int32, ["T", n_neurons])],
        [_input("y", torch.float32, ["T", d]), _input("y_float", torch.float32, ["T", d])],
        operands | dequantized | ({"thresholds": threshold_values} if has_thresholds else {}),
        opset=ops.QUANTIZED_OPSET_VERSION,
    )
    y, y_float = _session(model).run(None, {"x": x.numpy(), "mask": mask.int().numpy()})
    np.testing.assert_array_equal(y, y_float)
    weights = [torch.from_numpy(array) for array in dequantized.values()]
    reference = sparse_ffn(x, *weights, mask, activation, thresholds=chess if thresholds else None)
    assert 0 < reference.active.sum() < reference.active.numel()
    if thresholds:  # the thresholds decide some neurons
        assert reference.active.sum() < sparse_ffn(x, *weights, mask, activation).active.sum()
    bound = ops.error_bound("QuantizedSparseFFN", weight_format)
    assert _max_relative_error(y, reference.output) <= bound


# ------------------------------------------------------------------------------- schemas, nodes and functions


@pytest.mark.parametrize("opset", [ops.STANDARD_OPSET_VERSION, ops.QUANTIZED_OPSET_VERSION])
def test_reference_functions_implement_the_schemas(opset: int) -> None:
    """Float bundles' graphs (opset 19) carry the float ops' functions; int8 / int4 bundles' (opset 21, DequantizeLinear
    with block_size) every op's, each importing the model's opset."""
    functions = {f.name: f for f in ops.reference_functions(opset)}
    quantized = opset == ops.QUANTIZED_OPSET_VERSION
    assert list(functions) == [op for op in ops.SCHEMAS if quantized or op not in ops.QUANTIZED_OPS]
    for name, function in functions.items():
        schema = ops.SCHEMAS[name]
        assert function.domain == ops.DOMAIN
        assert list(function.input) == [spec.name for spec in schema.inputs]
        assert list(function.output) == [spec.name for spec in schema.outputs]
        declared = list(function.attribute) + [a.name for a in function.attribute_proto]
        assert sorted(declared) == sorted(spec.name for spec in schema.attributes)
        assert [(o.domain, o.version) for o in function.opset_import] == [("", opset)]
    imports = [(o.domain, o.version) for o in ops.function_opset_imports(opset)]
    assert imports == [(ops.DOMAIN, ops.OPSET_VERSION), ("", opset)]
    with pytest.raises(ValueError, match="opset: expected 19 or 21, found 20"):
        ops.reference_functions(20)


def test_ops_module_stays_free_of_torch() -> None:
    """The TensorRT backend, which has no torch, uses the module; its activation list mirrors the model's."""
    code = "import sys, edge_sdk.export.ops; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    assert ops.ACTIVATIONS == SUPPORTED_ACTIVATIONS


def test_make_node_writes_plugin_attributes_and_defaults() -> None:
    nodes = [
        ops.make_node("SvdPredictor", ["x", "a", "b", "bias"], ["m"]),
        ops.make_node("SignBitPredictor", ["x", "packed"], ["m"], alpha=2),
        ops.make_node("SparseFFN", ["x", "g", "u", "d", "m"], ["y"], name="layer0.ffn", activation="silu"),
    ]
    for node in nodes:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert node.domain == "edge_sdk"
        assert attributes["plugin_version"] == b"1" and attributes["plugin_namespace"] == b"edge_sdk"
        ops.validate_node(node)
    assert _float_attribute(nodes[1], "alpha") == 2.0
    assert {a.name: a.f for a in nodes[2].attribute}["activation_threshold"] == 0.0
    assert nodes[2].name == "layer0.ffn"


def test_make_node_rounds_alpha_up_to_float32() -> None:
    node = ops.make_node("SignBitPredictor", ["x", "packed"], ["m"], alpha=0.9)
    stored = _float_attribute(node, "alpha")
    assert stored == float(np.nextafter(np.float32(0.9), np.float32(2)))
    assert stored > 0.9


ASYMMETRIC_FFN_INPUTS = ["x", "g", "gs", "u", "us", "d", "ds", "m", "t", "gm", "um", "dm"]


@pytest.mark.parametrize(
    ("op_type", "inputs", "attributes", "message"),
    [
        (
            "Softmax",
            ["x"],
            {},
            "op_type: expected one of SvdPredictor, SignBitPredictor, SparseFFN, QuantizedSparseFFN, QuantizedMatMul, "
            "found 'Softmax'",
        ),
        ("SignBitPredictor", ["x", "p"], {}, "'alpha' is required, found none"),
        ("SignBitPredictor", ["x", "p"], {"alpha": 0.0}, "'alpha': expected a value > 0.0, found 0.0"),
        ("SignBitPredictor", ["x", "p"], {"alpha": -1.5}, "'alpha': expected a value > 0.0, found -1.5"),
        ("SignBitPredictor", ["x", "p"], {"alpha": 1e39}, "'alpha': expected a finite float32, found inf"),
        ("SignBitPredictor", ["x", "p"], {"alpha": "1"}, "'alpha': expected type float, found string"),
        ("SignBitPredictor", ["x", "p"], {"alpha": 1.0, "beta": 2.0}, "unknown attribute 'beta'"),
        ("SparseFFN", ["x", "g", "u", "d", "m"], {}, "'activation' is required"),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "gelu"},
            "'activation': expected one of 'relu', 'fatrelu', 'drelu', 'silu', found 'gelu'",
        ),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "fatrelu", "activation_threshold": -0.5},
            "'activation_threshold': expected a value >= 0.0, found -0.5",
        ),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "relu", "activation_threshold": 0.5},
            "'activation_threshold': expected 0.0 for activation 'relu' (only fatrelu has a threshold), found 0.5",
        ),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "relu", "plugin_version": "2"},
            "'plugin_version': expected one of '1', found '2'",
        ),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "relu", "plugin_namespace": 7},
            "'plugin_namespace': expected type string, found int",
        ),
        ("SparseFFN", ["x", "g", "u", "d"], {"activation": "relu"}, "expected 5 to 6 inputs"),
        ("SparseFFN", ["x", "", "u", "d", "m"], {"activation": "relu"}, "input 'w_gate' is required"),
        (
            "SparseFFN",
            ["x", "g", "u", "d", "m", ""],
            {"activation": "relu"},
            "optional input 'thresholds': expected it left off the end of the inputs, found the empty name",
        ),
        ("SvdPredictor", ["x", "a", "b", "bias", "extra"], {}, "expected 4 to 4 inputs"),
        ("QuantizedMatMul", ["x", "w", "s"], {"group_size": 32}, "'weight_format' is required, found none"),
        ("QuantizedMatMul", ["x", "w", "s"], {"weight_format": "int4"}, "'group_size' is required, found none"),
        (
            "QuantizedMatMul",
            ["x", "w", "s"],
            {"weight_format": "int2", "group_size": 32},
            "'weight_format': expected one of 'int8', 'int4', 'int4_asymmetric', found 'int2'",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s"],
            {"weight_format": "int8", "group_size": 48},
            "'group_size': expected one of 32, 64, 128, found 48",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s"],
            {"weight_format": "int8", "group_size": 32.0},
            "'group_size': expected type int, found float",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s"],
            {"weight_format": "int8", "group_size": 32, "transposed": 2},
            "'transposed': expected one of 0, 1, found 2",
        ),
        (
            "QuantizedSparseFFN",
            ["x", "g", "gs", "u", "us", "d", "ds", "m"],
            {"activation": "silu", "activation_threshold": 0.5, "weight_format": "int4", "group_size": 32},
            "'activation_threshold': expected 0.0 for activation 'silu' (only fatrelu has a threshold), found 0.5",
        ),
        (
            "QuantizedSparseFFN",
            ["x", "g", "u", "d", "m"],
            {"activation": "relu", "weight_format": "int4", "group_size": 32},
            "expected 8 to 9 inputs, 12 with weight_format 'int4_asymmetric' (x, w_gate, w_gate_scales, w_up, "
            "w_up_scales, w_down_t, w_down_t_scales, mask, thresholds, w_gate_mins, w_up_mins, w_down_t_mins), found 5",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s"],
            {"weight_format": "int4_asymmetric", "group_size": 32},
            "weight_format 'int4_asymmetric': expected 4 inputs, w_mins last",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s", "mins"],
            {"weight_format": "int4", "group_size": 64},
            "input 'w_mins' (input 3): expected only with weight_format 'int4_asymmetric', found it with "
            "weight_format 'int4'",
        ),
        (
            "QuantizedMatMul",
            ["x", "w", "s", "mins"],
            {"weight_format": "int8", "group_size": 64, "transposed": 0},
            "input 'w_mins' (input 3): expected only with weight_format 'int4_asymmetric', found it with "
            "weight_format 'int8'",
        ),
        *(  # an asymmetric node without its minimums, or without thresholds before them
            (
                "QuantizedSparseFFN",
                ASYMMETRIC_FFN_INPUTS[:count],
                {"activation": "relu", "weight_format": "int4_asymmetric", "group_size": 32},
                "weight_format 'int4_asymmetric': expected 12 inputs, w_gate_mins, w_up_mins, w_down_t_mins last; the "
                f"optional thresholds before them given too (an omitted input in the middle would be an empty name), "
                f"found {count}",
            )
            for count in (8, 9, 11)
        ),
        (
            "QuantizedSparseFFN",
            [*ASYMMETRIC_FFN_INPUTS[:8], *ASYMMETRIC_FFN_INPUTS[9:]],
            {"activation": "relu", "weight_format": "int4_asymmetric", "group_size": 32},
            "weight_format 'int4_asymmetric': expected 12 inputs",
        ),
        (
            "QuantizedSparseFFN",
            [*ASYMMETRIC_FFN_INPUTS[:8], "", *ASYMMETRIC_FFN_INPUTS[9:]],
            {"activation": "relu", "weight_format": "int4_asymmetric", "group_size": 32},
            "optional input 'thresholds': expected it left off the end of the inputs, found the empty name",
        ),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS,
            {"activation": "relu", "weight_format": "int4", "group_size": 32},
            "input 'w_gate_mins' (input 9): expected only with weight_format 'int4_asymmetric', found it with "
            "weight_format 'int4'",
        ),
        # int8 down rows (down_weight_format): no w_down_t_mins, and only under int4 gate and up rows
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS,
            {"activation": "relu", "weight_format": "int4_asymmetric", "group_size": 32, "down_weight_format": "int8"},
            "input 'w_down_t_mins' (input 11): expected only with weight_format 'int4_asymmetric' without "
            "down_weight_format 'int8', found it with weight_format 'int4_asymmetric' and down_weight_format 'int8'",
        ),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS[:10],
            {"activation": "relu", "weight_format": "int4_asymmetric", "group_size": 32, "down_weight_format": "int8"},
            "weight_format 'int4_asymmetric': expected 11 inputs, w_gate_mins, w_up_mins last",
        ),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS[:8],
            {"activation": "relu", "weight_format": "int8", "group_size": 32, "down_weight_format": "int8"},
            "attribute 'down_weight_format': expected it absent, or 'int8' with weight_format 'int4', 'int8' with "
            "weight_format 'int4_asymmetric'; found 'int8' with weight_format 'int8'",
        ),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS[:8],
            {"activation": "relu", "weight_format": "int4", "group_size": 32, "down_weight_format": "int4"},
            "attribute 'down_weight_format': expected one of 'int8', found 'int4'",
        ),
    ],
)
def test_make_node_rejects_bad_nodes(op_type: str, inputs: list[str], attributes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        ops.make_node(op_type, inputs, ["out"], name="layer3", **attributes)
    if op_type in ops.SCHEMAS:
        assert str(raised.value).startswith(f"{op_type} node 'layer3': ")


@pytest.mark.parametrize(
    ("op_type", "inputs", "attributes"),
    [
        ("QuantizedMatMul", ["x", "w", "s"], {"weight_format": "int4"}),
        ("QuantizedMatMul", ["x", "w", "s", "mins"], {"weight_format": "int4_asymmetric"}),
        ("QuantizedSparseFFN", ASYMMETRIC_FFN_INPUTS[:8], {"weight_format": "int8", "activation": "relu"}),
        ("QuantizedSparseFFN", ASYMMETRIC_FFN_INPUTS[:9], {"weight_format": "int4", "activation": "relu"}),
        ("QuantizedSparseFFN", ASYMMETRIC_FFN_INPUTS, {"weight_format": "int4_asymmetric", "activation": "silu"}),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS[:8],
            {"weight_format": "int4", "activation": "relu", "down_weight_format": "int8"},
        ),
        (
            "QuantizedSparseFFN",
            ASYMMETRIC_FFN_INPUTS[:11],
            {"weight_format": "int4_asymmetric", "activation": "relu", "down_weight_format": "int8"},
        ),
    ],
)
def test_make_node_takes_the_inputs_of_each_weight_format(op_type, inputs, attributes) -> None:
    """3 inputs for a symmetric QuantizedMatMul, 4 for an asymmetric one; 8 or 9 for a symmetric QuantizedSparseFFN,
    12 for an asymmetric one, 11 with int8 down rows (no w_down_t_mins); an absent down_weight_format stays absent."""
    node = ops.make_node(op_type, inputs, ["y"], group_size=32, **attributes)
    assert list(node.input) == inputs
    written = {attribute.name for attribute in node.attribute}
    assert ("down_weight_format" in written) == ("down_weight_format" in attributes)
    ops.validate_node(node)
    ops.check_inputs(node)


def test_validate_node_checks_input_types_where_known() -> None:
    """Given the tensors' element types (ONNX's names, as shape inference reports them), each input must be one of
    its schema's types, and inputs of one type variable one type; unknown tensors are not judged."""
    node = ops.make_node(
        "QuantizedSparseFFN", ASYMMETRIC_FFN_INPUTS, ["y"], activation="relu", weight_format="int4_asymmetric",
        group_size=32,
    )  # fmt: skip
    typed = {"x": "FLOAT", "g": "INT32", "gs": "FLOAT16", "m": "INT32", "t": "FLOAT", "gm": "FLOAT16"}
    ops.validate_node(node, typed)
    ops.check_inputs(node, typed)
    refused = [
        ({"gm": "FLOAT"}, "input 'w_gate_mins' ('gm'): expected type FLOAT16, found FLOAT"),
        ({"t": "FLOAT16"}, "input 'thresholds' ('t'): expected type FLOAT, found FLOAT16"),
        ({"g": "FLOAT16"}, "input 'w_gate' ('g'): expected type INT32, found FLOAT16"),
        ({"x": "INT64"}, "input 'x' ('x'): expected type FLOAT16 or BFLOAT16 or FLOAT, found INT64"),
    ]
    for changed, message in refused:
        for check in (ops.validate_node, ops.check_inputs):
            with pytest.raises(ValueError, match=re.escape(message)):
                check(node, typed | changed)
    float_ffn = ops.make_node("SparseFFN", ["x", "g", "u", "d", "m"], ["y"], activation="relu")
    with pytest.raises(ValueError, match=re.escape("input 'w_up' ('u'): expected the type of 'w_gate' (TW: FLOAT16)")):
        ops.validate_node(float_ffn, {"g": "FLOAT16", "u": "FLOAT", "d": "FLOAT16"})


def test_validate_node_checks_nodes_read_back() -> None:
    node = ops.make_node("SignBitPredictor", ["x", "p"], ["m"], alpha=1.0)
    without_plugin = onnx.NodeProto()
    without_plugin.CopyFrom(node)
    del without_plugin.attribute[:]
    without_plugin.attribute.append(helper.make_attribute("alpha", 1.0))
    with pytest.raises(ValueError, match="'plugin_version' is required, found none"):
        ops.validate_node(without_plugin)
    wrong_domain = onnx.NodeProto()
    wrong_domain.CopyFrom(node)
    wrong_domain.domain = "com.example"
    with pytest.raises(ValueError, match=r"expected an op of domain 'edge_sdk'.*found 'SignBitPredictor' in domain"):
        ops.validate_node(wrong_domain)
    int_alpha = helper.make_node(
        "SignBitPredictor",
        ["x", "p"],
        ["m"],
        domain="edge_sdk",
        alpha=1,
        plugin_version="1",
        plugin_namespace="edge_sdk",
    )
    with pytest.raises(ValueError, match="'alpha': expected type float, found int"):
        ops.validate_node(int_alpha)


def test_removing_the_reference_functions_keeps_nodes_and_other_functions() -> None:
    d, n_neurons = 32, 16
    generator = torch.Generator().manual_seed(9)
    packed = pack_sign_bits(torch.randn(n_neurons, d, generator=generator))
    node = ops.make_node("SignBitPredictor", ["x", "packed"], ["mask"], alpha=1.0)
    model = _model(
        [node],
        [_input("x", torch.float32, ["T", d])],
        [_input("mask", torch.int32, ["T", n_neurons])],
        {"packed": packed},
    )
    foreign = onnx.parser.parse_function(
        '<domain: "com.example", opset_import: ["" : 19]> SparseFFN (x) => (y) { y = Identity (x) }'
    )
    model.functions.append(foreign)
    stripped = onnx.load_from_string(without_functions(model.SerializeToString(), ops.DOMAIN, set(OP_TYPES)))
    assert [(f.domain, f.name) for f in stripped.functions] == [("com.example", "SparseFFN")]
    assert set(ops.SCHEMAS) == set(OP_TYPES)  # the runtimes' list of our ops is the schemas' list
    assert len(model.functions) == len(ops.reference_functions()) + 1  # the input is left as it was
    assert list(stripped.graph.node) == [node]
    assert [(o.domain, o.version) for o in stripped.opset_import] == [(o.domain, o.version) for o in model.opset_import]
    with pytest.raises(Fail, match=r"edge_sdk:SignBitPredictor.* is not a registered function/op"):
        _session(stripped)  # nothing implements the custom op any more


# ------------------------------------------------------------------------------------------------ OPS.md


def test_schema_markdown_documents_every_input_output_and_attribute() -> None:
    markdown = ops.schema_markdown()
    for name, schema in ops.SCHEMAS.items():
        section = markdown.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
        for spec in (*schema.inputs, *schema.outputs, *schema.attributes):
            assert f"`{spec.name}`" in section, (name, spec.name)
        if name == "SparseFFN":
            assert all(f'"{kind}"' in section for kind in SUPPORTED_ACTIVATIONS)
        if name in ops.QUANTIZED_OPS:
            assert '"int8", "int4", "int4_asymmetric"' in section
            assert section.count('(exactly when weight_format = "int4_asymmetric")') == (
                2 if name == "QuantizedSparseFFN" else 1
            )
        if name == "QuantizedSparseFFN":  # the down projection's minimums, but for int8 down rows
            unless = '(exactly when weight_format = "int4_asymmetric" and down_weight_format is not "int8")'
            assert section.count(unless) == 1 and "| `down_weight_format` | string | absent |" in section
        assert "Reference decomposition:" in section


def test_ops_md_embeds_current_schema_markdown() -> None:
    text = OPS_MD.read_text()
    begin = "<!-- BEGIN GENERATED by `python -m edge_sdk.export.ops`: do not edit -->\n\n"
    end = "\n<!-- END GENERATED -->"
    assert begin in text and end in text, f"{OPS_MD}: generated-block markers missing"
    generated = text.split(begin, 1)[1].split(end, 1)[0]
    assert generated == ops.schema_markdown(), f"{OPS_MD} is stale: run `python -m edge_sdk.export.ops`"
