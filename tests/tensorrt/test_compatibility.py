"""The static TensorRT 10.3 check (backends/tensorrt/compatibility.py): each rule on a tiny graph that breaks it,
the graph TensorRT parses (decode.onnx) of 7B-sized models as exported today, the one engine's weight memory, and
`edge-sdk verify --target tensorrt`. No GPU, no TensorRT.

The 7B graphs are built with the exporter's graph builder from the configs (one layer, the real d, D, heads, kv
heads and vocabulary): the check reads graphs without their weights' bytes, so a multi-gigabyte export would test
nothing more. Every graph of every model, predictor kind and weight dtype keeps every rule, one test per rule: the
float graphs since issue 21 (INT32 masks, weights kept in their bundle dtype), the int8 / int4 ones since their
products with quantized matrices went to the QuantizedMatMul / QuantizedSparseFFN plugins (issue 23 item 5), and the
asymmetric int4 ones since those plugins take the group minimums (weight_format "int4_asymmetric").
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from edge_sdk.backends.tensorrt import compatibility
from edge_sdk.backends.tensorrt.profiles import ENGINE_GRAPH
from onnx import TensorProto, helper

from edge_sdk.bundle.layout import model_tensors, predictor_tensors
from edge_sdk.cli import main
from edge_sdk.export import graph as graphs
from edge_sdk.export import ops
from edge_sdk.model.activation import Activation
from edge_sdk.model.config import ModelConfig, RopeConfig
from edge_sdk.predictors import KINDS, NO_PREDICTOR

RULES = tuple(compatibility.SOURCES)

# ------------------------------------------------------------------------------------- one rule per tiny graph


def _model(nodes, inputs, outputs, initializers=(), value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=list(initializers), value_info=value_info)
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid(ops.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _value(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def _rules(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(v.rule, v.node) for v in compatibility.check_graph(model, "tiny.onnx")]


def _custom(inputs: list[str], **attributes) -> onnx.NodeProto:
    attributes = {"plugin_version": "1", "plugin_namespace": "edge_sdk", **attributes}
    return helper.make_node("SparseFFN", inputs, ["y"], name="ffn", domain=ops.DOMAIN, activation="relu", **attributes)


def _ffn_graph(mask_type: int, node: onnx.NodeProto) -> onnx.ModelProto:
    names = ["x", "w_gate", "w_up", "w_down_t"]
    inputs = [_value(name, TensorProto.FLOAT16, [4, 8]) for name in names]
    inputs.append(_value("mask", mask_type, [4, 4]))
    return _model([node], inputs, [_value("y", TensorProto.FLOAT, [4, 8])])


def test_plugin_io_rule_refuses_a_bool_mask_and_takes_int32():
    node = _custom(["x", "w_gate", "w_up", "w_down_t", "mask"])
    assert _rules(_ffn_graph(TensorProto.BOOL, node)) == [("plugin-io-dtype", "ffn")]
    assert _rules(_ffn_graph(TensorProto.INT8, node)) == [("plugin-io-dtype", "ffn")]
    assert _rules(_ffn_graph(TensorProto.INT32, node)) == []


def test_plugin_io_rule_refuses_a_bool_plugin_output():
    node = helper.make_node(
        "SvdPredictor", ["x", "a", "b", "bias"], ["mask"], name="svd", domain=ops.DOMAIN, plugin_version="1",
        plugin_namespace="edge_sdk",
    )  # fmt: skip
    inputs = [
        _value("x", TensorProto.FLOAT, [2, 4]),
        _value("a", TensorProto.FLOAT16, [8, 2]),
        _value("b", TensorProto.FLOAT16, [2, 4]),
        _value("bias", TensorProto.FLOAT, [8]),
    ]
    assert _rules(_model([node], inputs, [_value("mask", TensorProto.BOOL, [2, 8])])) == [("plugin-io-dtype", "svd")]
    assert _rules(_model([node], inputs, [_value("mask", TensorProto.FLOAT, [2, 8])])) == []


def test_plugin_attribute_rule_needs_version_and_namespace():
    node = _custom(["x", "w_gate", "w_up", "w_down_t", "mask"], plugin_namespace="")
    violations = compatibility.check_graph(_ffn_graph(TensorProto.INT32, node), "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [("plugin-attributes", "ffn")]
    assert "'plugin_namespace': expected 'edge_sdk', found ''" in violations[0].message
    missing = helper.make_node(
        "SparseFFN", ["x", "w_gate", "w_up", "w_down_t", "mask"], ["y"], name="ffn", domain=ops.DOMAIN
    )
    assert _rules(_ffn_graph(TensorProto.INT32, missing)) == [("plugin-attributes", "ffn")] * 2


def test_empty_optional_plugin_input_is_refused():
    node = _custom(["x", "w_gate", "w_up", "w_down_t", "mask", ""])
    violations = compatibility.check_graph(_ffn_graph(TensorProto.INT32, node), "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [("plugin-empty-input", "ffn")]
    assert "input 5" in violations[0].message and "left off" in violations[0].message


def _quantized_ffn_graph(
    inputs: list[str], types: dict[str, int], weight_format: str, **attributes: str
) -> onnx.ModelProto:
    """One QuantizedSparseFFN node on graph inputs of the given element types (the rules read types, not shapes), with
    further attributes (down_weight_format)."""
    node = helper.make_node(
        "QuantizedSparseFFN", inputs, ["y"], name="ffn", domain=ops.DOMAIN, activation="relu", activation_threshold=0.0,
        weight_format=weight_format, group_size=32, plugin_version="1", plugin_namespace="edge_sdk", **attributes,
    )  # fmt: skip
    values = [_value(name, types[name], None) for name in inputs]
    return _model([node], values, [_value("y", TensorProto.FLOAT, None)])


_MATRICES = ("w_gate", "w_up", "w_down_t")
_FFN_TYPES = {
    "x": TensorProto.FLOAT,
    "mask": TensorProto.INT32,
    "thresholds": TensorProto.FLOAT,
    **{name: TensorProto.INT32 for name in _MATRICES},
    **{f"{name}_scales": TensorProto.FLOAT16 for name in _MATRICES},
    **{f"{name}_mins": TensorProto.FLOAT16 for name in _MATRICES},
}
_SYMMETRIC_FFN = ["x", *(f"{name}{part}" for name in _MATRICES for part in ("", "_scales")), "mask"]
_MINS = [f"{name}_mins" for name in _MATRICES]


def test_plugin_inputs_rule_takes_an_asymmetric_node_with_every_input():
    """An int4_asymmetric QuantizedSparseFFN node has 12 inputs: thresholds (zeros where there are none), then the
    FLOAT16 minimums; a symmetric one 8 or 9."""
    assert _rules(_quantized_ffn_graph([*_SYMMETRIC_FFN, "thresholds", *_MINS], _FFN_TYPES, "int4_asymmetric")) == []
    assert _rules(_quantized_ffn_graph(_SYMMETRIC_FFN, _FFN_TYPES, "int4")) == []
    assert _rules(_quantized_ffn_graph([*_SYMMETRIC_FFN, "thresholds"], _FFN_TYPES, "int8")) == []


def test_plugin_inputs_rule_takes_int8_down_rows_without_their_minimums():
    """down_weight_format "int8" (an int4 bundle with int8 down rows): no w_down_t_mins, so an int4_asymmetric node has
    11 inputs and a symmetric one 8 or 9, as the plugin's signature; 12 inputs, or 11 without the attribute, are
    refused."""
    gate_up_mins = _MINS[:2]
    int8_down = {"down_weight_format": "int8"}
    asymmetric = [*_SYMMETRIC_FFN, "thresholds", *gate_up_mins]
    assert _rules(_quantized_ffn_graph(asymmetric, _FFN_TYPES, "int4_asymmetric", **int8_down)) == []
    assert _rules(_quantized_ffn_graph(_SYMMETRIC_FFN, _FFN_TYPES, "int4", **int8_down)) == []
    assert _rules(_quantized_ffn_graph([*_SYMMETRIC_FFN, "thresholds"], _FFN_TYPES, "int4", **int8_down)) == []
    for inputs, attributes in (([*_SYMMETRIC_FFN, "thresholds", *_MINS], int8_down), (asymmetric, {})):
        graph = _quantized_ffn_graph(inputs, _FFN_TYPES, "int4_asymmetric", **attributes)
        violations = compatibility.check_graph(graph, "tiny.onnx")
        assert [(v.rule, v.node) for v in violations] == [("plugin-inputs", "ffn")], (len(inputs), attributes)


@pytest.mark.parametrize(
    ("inputs", "types", "weight_format", "message"),
    [
        # the minimums without thresholds before them: the plugin would read the gate's minimums as thresholds
        ([*_SYMMETRIC_FFN, *_MINS], {}, "int4_asymmetric", "weight_format 'int4_asymmetric': expected 12 inputs"),
        ([*_SYMMETRIC_FFN, "thresholds"], {}, "int4_asymmetric", "weight_format 'int4_asymmetric': expected 12"),
        ([*_SYMMETRIC_FFN, "thresholds", *_MINS], {}, "int4", "input 'w_gate_mins' (input 9): expected only with"),
        (
            [*_SYMMETRIC_FFN, "thresholds", *_MINS],
            {"w_up_mins": TensorProto.FLOAT},
            "int4_asymmetric",
            "input 'w_up_mins' ('w_up_mins'): expected type FLOAT16, found FLOAT",
        ),
        (
            [*_SYMMETRIC_FFN, "thresholds", *_MINS],
            {"thresholds": TensorProto.FLOAT16},
            "int4_asymmetric",
            "input 'thresholds' ('thresholds'): expected type FLOAT, found FLOAT16",
        ),
    ],
)
def test_plugin_inputs_rule_refuses_inputs_the_plugin_does_not_take(inputs, types, weight_format, message):
    violations = compatibility.check_graph(_quantized_ffn_graph(inputs, _FFN_TYPES | types, weight_format), "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [("plugin-inputs", "ffn")]
    assert message in violations[0].message


def test_topk_rule_allows_k_up_to_3840():
    def topk(k: int, sorted_output: int = 1, k_input: str = "k") -> onnx.ModelProto:
        k_tensor = onnx.numpy_helper.from_array(np.array([k], dtype=np.int64), "k")
        node = helper.make_node("TopK", ["x", k_input], ["values", "indices"], name="topk", sorted=sorted_output)
        inputs = [_value("x", TensorProto.FLOAT, [2, 5000]), _value("k_in", TensorProto.INT64, [1])]
        outputs = [_value("values", TensorProto.FLOAT, [2, k]), _value("indices", TensorProto.INT64, [2, k])]
        return _model([node], inputs, outputs, [k_tensor])

    assert _rules(topk(3840)) == []
    assert _rules(topk(3841)) == [("topk-k", "topk")]
    assert _rules(topk(100, sorted_output=0)) == [("topk-k", "topk")]
    assert _rules(topk(100, k_input="k_in")) == [("topk-k", "topk")]  # K must be an initializer


def test_op_dtype_rule_refuses_bool_scatter_elements():
    def scatter(data_type: int) -> onnx.ModelProto:
        node = helper.make_node("ScatterElements", ["data", "indices", "updates"], ["out"], name="scatter", axis=1)
        inputs = [
            _value("data", data_type, [2, 6]),
            _value("indices", TensorProto.INT64, [2, 3]),
            _value("updates", data_type, [2, 3]),
        ]
        return _model([node], inputs, [_value("out", data_type, [2, 6])])

    assert _rules(scatter(TensorProto.BOOL)) == [("op-dtype", "scatter")] * 2  # data and updates
    assert _rules(scatter(TensorProto.INT32)) == []  # the int64 indices are not the op's data type


def test_unsupported_op_is_named():
    node = helper.make_node("NonZero", ["x"], ["where"], name="nonzero")
    model = _model([node], [_value("x", TensorProto.FLOAT, [4])], [_value("where", TensorProto.INT64, [1, None])])
    violations = compatibility.check_graph(model, "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [("unsupported-op", "nonzero")]
    assert "NonZero" in violations[0].message and "operators.md" in str(violations[0])


def test_float64_rule_finds_a_double_intermediate():
    nodes = [
        helper.make_node("Cast", ["x"], ["wide"], name="widen", to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["wide"], ["y"], name="narrow", to=TensorProto.FLOAT),
    ]
    model = _model(nodes, [_value("x", TensorProto.FLOAT, [4])], [_value("y", TensorProto.FLOAT, [4])])
    assert _rules(model) == [("float64", "widen")]


def test_uint8_only_at_the_graph_boundary():
    to_byte = helper.make_node("Cast", ["x"], ["byte"], name="to_byte", to=TensorProto.UINT8)
    back = helper.make_node("Cast", ["byte"], ["y"], name="back", to=TensorProto.FLOAT)
    inputs = [_value("x", TensorProto.FLOAT, [4])]
    intermediate = _model([to_byte, back], inputs, [_value("y", TensorProto.FLOAT, [4])])
    assert _rules(intermediate) == [("uint8-intermediate", "to_byte")]
    as_output = _model([to_byte], inputs, [_value("byte", TensorProto.UINT8, [4])])
    assert _rules(as_output) == []


_SAFETENSORS_DTYPES = {TensorProto.FLOAT16: ("F16", 2), TensorProto.FLOAT: ("F32", 4)}


def _external(name: str, elem_type: int, dims: list[int], offset: int = 0) -> TensorProto:
    """An initializer stored in weights.safetensors, as the exporter writes one."""
    dtype, itemsize = _SAFETENSORS_DTYPES[elem_type]
    tensor = graphs.ExternalTensor(name, dtype, tuple(dims), offset, int(np.prod(dims)) * itemsize)
    return graphs.external_initializer(tensor, "weights.safetensors")


def test_cast_of_a_weight_or_constant_to_float_is_an_fp32_copy():
    weight = _external("w", TensorProto.FLOAT16, [10, 4])
    constant = helper.make_node(
        "Constant", [], ["c"], name="const", value=helper.make_tensor("v", TensorProto.FLOAT16, [4], [1, 2, 3, 4])
    )
    nodes = [
        constant,
        helper.make_node("Cast", ["w"], ["w32"], name="cast_weight", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["c"], ["c32"], name="cast_constant", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["x16"], ["x32"], name="cast_input", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x32", "w32"], ["xw"], name="matmul"),
        helper.make_node("Mul", ["xw", "c32"], ["y"], name="scale"),
    ]
    inputs = [_value("x16", TensorProto.FLOAT16, [3, 10])]
    model = _model(nodes, inputs, [_value("y", TensorProto.FLOAT, [3, 4])], [weight])
    violations = compatibility.check_graph(model, "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [
        ("fp32-weight-copy", "cast_weight"),
        ("fp32-weight-copy", "cast_constant"),
    ]  # casting an activation is not a copy of weights
    assert "160 bytes" in violations[0].message  # 10 x 4 fp32


def test_dequantize_linear_takes_signed_int4_or_int8_with_zero_point_0_only():
    def dequantize(code_type: int, zero_point: int | None) -> onnx.ModelProto:
        codes = helper.make_tensor("codes", code_type, [2, 32], [1] * 64)
        scales = helper.make_tensor("scales", TensorProto.FLOAT, [2, 1], [0.5, 0.25])
        initializers, inputs = [codes, scales], ["codes", "scales"]
        if zero_point is not None:
            initializers.append(helper.make_tensor("zero", code_type, [2, 1], [zero_point] * 2))
            inputs.append("zero")
        node = helper.make_node("DequantizeLinear", inputs, ["w"], name="dq", axis=1, block_size=32)
        matmul = helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")
        graph = helper.make_graph(
            [node, matmul], "tiny", [_value("x", TensorProto.FLOAT, [3, 2])], [_value("y", TensorProto.FLOAT, [3, 32])],
            initializer=initializers,
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    assert _rules(dequantize(TensorProto.INT4, None)) == []  # what int4 bundles' prefill.onnx holds
    # group-wise INT8: TensorRT 10.3 dequantizes blocks of INT4 only (int8 bundles' decode.onnx has no DequantizeLinear)
    assert _rules(dequantize(TensorProto.INT8, 0)) == [("dq-block-int4", "dq")]
    # the int4 bundles of format version 1: Q4_0's unsigned nibbles with zero point 8
    assert _rules(dequantize(TensorProto.UINT4, 8)) == [
        ("op-dtype", "dq"),
        ("dq-block-int4", "dq"),
        ("dq-zero-point", "dq"),
    ]
    assert _rules(dequantize(TensorProto.INT4, 1)) == [("dq-zero-point", "dq")]


def test_engine_weight_bytes_counts_folded_copies_and_stored_weights():
    weight = _external("w", TensorProto.FLOAT16, [10, 4])
    other = _external("v", TensorProto.FLOAT16, [4, 4], offset=80)
    nodes = [
        helper.make_node("Cast", ["w"], ["w32"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Cast", ["w"], ["w32_again"], name="cast_again", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="stored_use"),
        helper.make_node("MatMul", ["xw", "v"], ["y"], name="other_use"),
    ]
    inputs = [_value("x", TensorProto.FLOAT16, [3, 10])]
    model = _model(nodes, inputs, [_value("y", TensorProto.FLOAT16, [3, 4])], [weight, other])
    # w as an fp32 copy (160, counted once) and as stored (80); v as stored (32)
    assert compatibility.engine_weight_bytes(model) == 160 + 80 + 32
    memory = compatibility.weight_memory({"prefill": model, "decode": model})
    assert memory.engine == 272 and memory.bundle_weights == 112


# ------------------------------------------------------------------------- today's graphs at 7B model sizes

MODELS = {
    "llama2-7b": ModelConfig("llama", 32000, 4096, 11008, 1, 32, 32, 128, 1e-5, 4096, Activation("relu")),
    "mistral-7b": ModelConfig(
        "mistral", 32000, 4096, 14336, 1, 32, 8, 128, 1e-5, 32768, Activation("relu"), sliding_window=4096
    ),
    "qwen2-7b": ModelConfig(
        "qwen2", 152064, 3584, 18944, 1, 28, 4, 128, 1e-6, 32768, Activation("relu"), RopeConfig(1e6), qkv_bias=True
    ),
}
FLOAT_DTYPES = ("fp16", "bf16", "fp32")
# int4-asymmetric: int4 with group minimums (export --int4-scheme asymmetric), weight_format "int4_asymmetric"
QUANTIZED_DTYPES = ("int8", "int4", "int4-asymmetric")
DTYPES = FLOAT_DTYPES + QUANTIZED_DTYPES
MAX_SEQ_LEN = 64
LEVELS = 2
RANK = 96
GROUP_SIZE = 32
SAFETENSORS_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1}


def _stored_dtype(dtype: str) -> tuple[str, bool]:
    """The bundle dtype of a DTYPES entry, and whether its int4 matrices have minimums."""
    return dtype.removesuffix("-asymmetric"), dtype.endswith("-asymmetric")


def stored_tensors(config: ModelConfig, kind: str, dtype: str) -> dict[str, graphs.ExternalTensor]:
    """Every tensor of a bundle of this config, laid out back to back as in weights.safetensors."""
    stored, asymmetric = _stored_dtype(dtype)
    group_size = GROUP_SIZE if dtype in QUANTIZED_DTYPES else None
    expected = model_tensors(config, stored, MAX_SEQ_LEN, group_size, asymmetric=asymmetric)
    if kind != NO_PREDICTOR:
        expected |= predictor_tensors(config, kind, LEVELS, [RANK] * config.num_layers)
    tensors, offset = {}, 0
    for name, tensor in expected.items():
        length = int(np.prod(tensor.shape)) * SAFETENSORS_ITEMSIZE[tensor.dtype]
        tensors[name] = graphs.ExternalTensor(name, tensor.dtype, tensor.shape, offset, length)
        offset += length
    return tensors


_built: dict[tuple[str, str, str], dict[str, onnx.ModelProto]] = {}
_checked: dict[tuple[str, str, str], list[compatibility.Violation]] = {}


def built_graphs(model: str, kind: str, dtype: str) -> dict[str, onnx.ModelProto]:
    """{phase: graph} as `edge-sdk export` writes them for this model, predictor kind and weight dtype."""
    key = (model, kind, dtype)
    if key not in _built:
        config = MODELS[model]
        quantized = dtype in QUANTIZED_DTYPES
        spec = graphs.GraphSpec(
            config,
            "weights.safetensors",
            stored_tensors(config, kind, dtype),
            kind,
            layer_attributes=({"alpha": 1.25},),  # the one layer's signbit alpha
            quant_format=_stored_dtype(dtype)[0] if quantized else None,
            group_size=GROUP_SIZE if quantized else None,
        )
        _built[key] = {phase: graphs.build_graph(spec, phase == "decode") for phase in ("prefill", "decode")}
    return _built[key]


def violations_of(model: str, kind: str, dtype: str) -> list[compatibility.Violation]:
    """The violations of the graph TensorRT parses: decode.onnx, the one engine's graph."""
    key = (model, kind, dtype)
    if key not in _checked:
        _checked[key] = compatibility.check_graph(built_graphs(*key)[ENGINE_GRAPH], f"{ENGINE_GRAPH}.onnx")
    return _checked[key]


CASES = [(model, kind, dtype) for model in MODELS for kind in KINDS for dtype in DTYPES]


def _rule_cases():
    graph = f"{ENGINE_GRAPH}.onnx"
    for model, kind, dtype in CASES:
        for rule in RULES:
            yield pytest.param(model, kind, dtype, graph, rule, id=f"{model}-{kind}-{dtype}-{graph}-{rule}")


@pytest.mark.parametrize(("model", "kind", "dtype", "graph", "rule"), list(_rule_cases()))
def test_graph_keeps_the_rule(model, kind, dtype, graph, rule):
    broken = [str(v) for v in violations_of(model, kind, dtype) if v.graph == graph and v.rule == rule]
    assert broken == []


@pytest.mark.parametrize("kind", KINDS)
def test_masks_cross_plugins_as_int32(kind):
    """Issue 21 item 1: every mask at a plugin is INT32 (OPS.md), the core masks are INT32 graph inputs."""
    decode = built_graphs("qwen2-7b", kind, "fp16")["decode"]
    types = compatibility.tensor_types(decode)
    ffn = [node for node in decode.graph.node if node.op_type == "SparseFFN"]
    assert len(ffn) == 1 and types[ffn[0].input[4]] == "INT32"
    predictors = [node for node in decode.graph.node if node.op_type in ("SvdPredictor", "SignBitPredictor")]
    assert [types[node.output[0]] for node in predictors] == (["INT32"] if kind in ("svd", "signbit") else [])
    core_inputs = [value for value in decode.graph.input if value.name.startswith("core_mask.")]
    assert [value.type.tensor_type.elem_type for value in core_inputs] == (
        [TensorProto.INT32] if kind == "core" else []
    )


@pytest.mark.parametrize("phase", ["prefill", ENGINE_GRAPH])
def test_core_prefill_hands_the_selection_to_the_host(phase):
    """Issue 21 item 2: core prefill outputs the gate activations; no TopK (K = D = 18944 > 3840), no scatter, no
    float64 is left in the graph TensorRT parses (decode.onnx, which runs the prompt too) nor in prefill.onnx."""
    graph = built_graphs("qwen2-7b", "core", "fp32")[phase]
    assert {"TopK", "ScatterElements"}.isdisjoint(node.op_type for node in graph.graph.node)
    outputs = {value.name: value.type.tensor_type for value in graph.graph.output}
    assert outputs["core_activations.0"].elem_type == TensorProto.FLOAT
    assert [dim.dim_param or dim.dim_value for dim in outputs["core_activations.0"].shape.dim] == [
        "batch",
        "seq",
        18944,
    ]
    assert compatibility.check_graph(graph, f"{phase}.onnx") == []


@pytest.mark.parametrize("dtype", ["fp16", *QUANTIZED_DTYPES])
def test_every_op_is_in_the_table_and_every_tensor_typed(dtype):
    """The rules can only judge what they see: every op of every graph is in the support table (a missing one
    would be reported as unsupported-op) and shape inference types every tensor the nodes make (through the
    quantized ops' reference functions too)."""
    for model in MODELS:
        for kind in KINDS:
            for phase, graph in built_graphs(model, kind, dtype).items():
                used = {node.op_type for node in graph.graph.node if node.domain != ops.DOMAIN}
                assert used <= set(compatibility.SUPPORTED_TYPES), (model, kind, phase)
                types = compatibility.tensor_types(graph)
                untyped = [out for node in graph.graph.node for out in node.output if out not in types]
                assert untyped == [], (model, kind, phase)


def _numel(shape) -> int:
    return int(np.prod(shape))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_weight_memory_of_llama2_7b_svd(dtype):
    """Issue 21 item 3: the engine holds every weight as stored (no folded fp32 Casts), the predictor's included."""
    config = MODELS["llama2-7b"]
    tensors = stored_tensors(config, "svd", dtype)
    memory = compatibility.weight_memory(built_graphs("llama2-7b", "svd", dtype))
    model_names = set(model_tensors(config, dtype, MAX_SEQ_LEN))
    # every stored tensor but the per-level capacities, which only static-shape executors read
    assert memory.bundle_weights == sum(t.length for name, t in tensors.items() if not name.endswith(".capacity"))
    as_stored = sum(tensors[name].length for name in model_names)
    predictor = sum(t.length for name, t in tensors.items() if ".svd." in name and not name.endswith(".capacity"))
    assert memory.engine == as_stored + predictor == memory.bundle_weights
    if dtype != "fp32":
        # 32000 x 4096 embedding and lm_head, 4 attention and 3 FFN matrices of one layer at 2 bytes, F32 vectors
        assert as_stored == 2 * (2 * 32000 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008) + 4 * (
            3 * 4096 + 2 * MAX_SEQ_LEN * 128
        )


@pytest.mark.parametrize(("model", "kind", "dtype"), CASES, ids=["-".join(case) for case in CASES])
def test_the_engine_holds_at_most_1_1x_the_bundles_weights(model, kind, dtype):
    """Issue 21 item 3: one engine (decode.onnx, prefill and decode profiles) holds the weights once; the two
    engines of prefill.onnx and decode.onnx held them about twice."""
    graphs_of_bundle = built_graphs(model, kind, dtype)
    memory = compatibility.weight_memory(graphs_of_bundle)
    assert memory.engine == compatibility.engine_weight_bytes(graphs_of_bundle[ENGINE_GRAPH])
    assert memory.engine <= 1.1 * memory.bundle_weights
    two_engines = sum(compatibility.engine_weight_bytes(graph) for graph in graphs_of_bundle.values())
    assert two_engines > 1.8 * memory.bundle_weights


@pytest.mark.parametrize("dtype", QUANTIZED_DTYPES)
@pytest.mark.parametrize("kind", ["svd", "core", "threshold"])
def test_quantized_graphs_hand_every_quantized_matrix_to_a_plugin_once(kind, dtype):
    """Issue 23 item 5: decode.onnx of an int8 / int4 bundle has no DequantizeLinear and no Cast of a weight; every
    quantized matrix is one INT32 initializer over its codes' bytes ([rows, row bytes / 4]), read by the quantized
    plugins only (with its fp16 scales, and an asymmetric matrix's fp16 minimums, as stored), so the engine holds
    exactly the bundle's bytes. An asymmetric QuantizedSparseFFN node has 12 inputs: the predictor's thresholds
    (threshold) or one shared float32 zeros initializer (svd, core). prefill.onnx (ONNX Runtime's) keeps
    DequantizeLinear -> Gemm over the codes as INT8 / INT4."""
    config = MODELS["llama2-7b"]
    graphs_of_bundle = built_graphs("llama2-7b", kind, dtype)
    decode, prefill = graphs_of_bundle[ENGINE_GRAPH], graphs_of_bundle["prefill"]
    tensors = stored_tensors(config, kind, dtype)
    quantized = {name.removesuffix(".scales") for name in tensors if name.endswith(".scales")}
    assert not any(node.op_type == "DequantizeLinear" for node in decode.graph.node)
    assert not any(v.rule == "fp32-weight-copy" for v in violations_of("llama2-7b", kind, dtype))  # no Cast of one
    initializers = {t.name: t for t in decode.graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in decode.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    asymmetric = _stored_dtype(dtype)[1]
    for name in quantized:
        rows, row_bytes = tensors[name].shape
        assert initializers[name].data_type == TensorProto.INT32
        assert list(initializers[name].dims) == [rows, row_bytes // 4]
        parts = (".scales", ".mins") if asymmetric else (".scales",)
        assert (name + ".mins" in initializers) == asymmetric
        for part in ("", *parts):
            assert readers[name + part] <= {"QuantizedMatMul", "QuantizedSparseFFN"}, (name + part, readers[name])
        for part in parts:
            assert initializers[name + part].data_type == TensorProto.FLOAT16
    ffn = [node for node in decode.graph.node if node.op_type == "QuantizedSparseFFN"]
    assert len(ffn) == 1 and [a.i for a in ffn[0].attribute if a.name == "group_size"] == [GROUP_SIZE]
    formats = {a.s.decode() for node in decode.graph.node for a in node.attribute if a.name == "weight_format"}
    assert formats == {"int4_asymmetric" if asymmetric else dtype}
    assert len(ffn[0].input) == (12 if asymmetric else 9 if kind == "threshold" else 8)
    if asymmetric and kind != "threshold":
        zeros = onnx.numpy_helper.to_array(initializers[ffn[0].input[8]])
        assert zeros.dtype == np.float32 and zeros.shape == (config.intermediate_size,) and not zeros.any()
    # the prompt's dense FFN reads the neuron-major down rows that QuantizedSparseFFN reads, through QuantizedMatMul
    down = "layers.0.mlp.down_proj.weight_t"
    down_products = [node for node in decode.graph.node if node.op_type == "QuantizedMatMul" and down in node.input]
    assert [[a.i for a in node.attribute if a.name == "transposed"] for node in down_products] == [[0]]
    memory = compatibility.weight_memory(graphs_of_bundle)
    assert memory.engine == memory.bundle_weights
    prefill_types = {t.name: t.data_type for t in prefill.graph.initializer}
    code_type = TensorProto.INT8 if dtype == "int8" else TensorProto.INT4
    assert {prefill_types[name] for name in quantized} == {code_type}
    assert sum(node.op_type == "DequantizeLinear" for node in prefill.graph.node) == len(quantized)


# ----------------------------------------------------------------------------------- the command on a bundle


def test_verify_target_tensorrt_passes_and_reports_the_engines_weights(trt_bundles):
    """The fp16 tiny bundle now keeps every rule; verify prints each engine's weight bytes against the bundle's."""
    bundle = trt_bundles["svd"]
    violations, memory = compatibility.check_bundle(bundle)
    assert violations == []
    result = CliRunner().invoke(main, ["verify", str(bundle.path), "--files-only", "--target", "tensorrt", "--json"])
    assert result.exit_code == 0, result.output
    reported = json.loads(result.stdout)["tensorrt_engine_weight_bytes"]
    assert reported == {"engine": memory.engine, "bundle weights": memory.bundle_weights}
    assert reported["engine"] == memory.bundle_weights


def test_verify_files_only_still_passes_without_a_target(trt_bundles):
    result = CliRunner().invoke(main, ["verify", str(trt_bundles["svd"].path), "--files-only"])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("OK")


@pytest.mark.parametrize(
    ("weight_format", "attributes", "message"),
    [
        (
            "int4",
            {"down_weight_format": "int4"},
            "attribute 'down_weight_format': expected one of 'int8', found 'int4'",
        ),
        ("int8", {"down_weight_format": "int8"}, "found 'int8' with weight_format 'int8'"),
        ("int5", {}, "attribute 'weight_format': expected one of 'int8', 'int4', 'int4_asymmetric', found 'int5'"),
        ("int4", {"group_size": 48}, "attribute 'group_size': expected one of 32, 64, 128, found 48"),
    ],
)
def test_plugin_attribute_values_rule_refuses_what_the_plugin_creator_refuses(weight_format, attributes, message):
    """A value outside an attribute's allowed set (OPS.md) would fail when TensorRT creates the plugin, after the
    static check said nothing: one violation of its own, beside a correct input count."""
    node_attributes = {"activation": "relu", "weight_format": weight_format, "group_size": 32} | attributes
    node = helper.make_node(
        "QuantizedSparseFFN", _SYMMETRIC_FFN, ["y"], name="ffn", domain=ops.DOMAIN, plugin_version="1",
        plugin_namespace="edge_sdk", **node_attributes,
    )  # fmt: skip
    values = [_value(name, _FFN_TYPES[name], None) for name in _SYMMETRIC_FFN]
    violations = compatibility.check_graph(_model([node], values, [_value("y", TensorProto.FLOAT, None)]), "tiny.onnx")
    assert [(v.rule, v.node) for v in violations] == [("plugin-attribute-values", "ffn")]
    assert message in violations[0].message
