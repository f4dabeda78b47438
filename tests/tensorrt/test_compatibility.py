"""The static TensorRT 10.3 check (backends/tensorrt/compatibility.py): each rule on a tiny graph that breaks it,
the graph TensorRT parses (decode.onnx) of 7B-sized models as exported today, the one engine's weight memory, and
`edge-sdk verify --target tensorrt`. No GPU, no TensorRT.

The 7B graphs are built with the exporter's graph builder from the configs (one layer, the real d, D, heads, kv
heads and vocabulary): the check reads graphs without their weights' bytes, so a multi-gigabyte export would test
nothing more. Which rules today's graphs break is asserted exactly; the rule-by-rule cases that wait for a contract
change are strict xfails that name the fix, so they fail the day it lands and their marker must go.
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
        "SvdPredictor", ["x"], ["mask"], name="svd", domain=ops.DOMAIN, plugin_version="1", plugin_namespace="edge_sdk"
    )
    inputs = [_value("x", TensorProto.FLOAT, [2, 4])]
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
QUANTIZED_DTYPES = ("int8", "int4")
DTYPES = FLOAT_DTYPES + QUANTIZED_DTYPES
MAX_SEQ_LEN = 64
LEVELS = 2
RANK = 96
GROUP_SIZE = 32
SAFETENSORS_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1}
# The quantized graphs' known gaps on TensorRT (issue 23 item 3), each with the change it waits for.
QUANTIZED_GAPS = {
    "dq-weight-copy": "SparseFFN takes dequantized float32 rows (and int4 codes pass a column Gather): TensorRT "
    "would fold them to float32 copies; needs the quantized SparseFFN plugin taking codes and scales",
    "fp32-weight-copy": "the fp16 scales are Cast to float32 for DequantizeLinear (exact products); a float32 "
    "copy of the scales, 1/8 of an int4 matrix's bytes",
}
INT4_GAPS = {
    "op-dtype": "int4 codes are UINT4 with zero point 8 (the Q4_0 bytes as stored); TensorRT takes signed INT4 "
    "only: needs the codes stored as signed INT4 (a bundle format change)",
    "dq-zero-point": "zero point 8 of the UINT4 codes; TensorRT is symmetric only: same change as op-dtype",
}


def stored_tensors(config: ModelConfig, kind: str, dtype: str) -> dict[str, graphs.ExternalTensor]:
    """Every tensor of a bundle of this config, laid out back to back as in weights.safetensors."""
    expected = model_tensors(config, dtype, MAX_SEQ_LEN, GROUP_SIZE if dtype in QUANTIZED_DTYPES else None)
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
            quant_format=dtype if quantized else None,
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


def failing_today(kind: str, dtype: str) -> dict[tuple[str, str], str]:
    """{(graph, rule): the fix it waits for} of today's graphs: none for float weights since issue 21 items 1 and 3
    (INT32 masks, weights kept in their bundle dtype); the quantized graphs' gaps otherwise."""
    gaps = {}
    if dtype in QUANTIZED_DTYPES:
        gaps |= QUANTIZED_GAPS
    if dtype == "int4":
        gaps |= INT4_GAPS
    return {(f"{ENGINE_GRAPH}.onnx", rule): reason for rule, reason in gaps.items()}


CASES = [(model, kind, dtype) for model in MODELS for kind in KINDS for dtype in DTYPES]


@pytest.mark.parametrize(("model", "kind", "dtype"), CASES)
def test_todays_graphs_fail_exactly_the_known_rules(model, kind, dtype):
    found = {(v.graph, v.rule) for v in violations_of(model, kind, dtype)}
    assert found == set(failing_today(kind, dtype))


def _rule_cases():
    for model, kind, dtype in CASES:
        failing = failing_today(kind, dtype)
        for graph in (f"{ENGINE_GRAPH}.onnx",):
            for rule in RULES:
                marks = ()
                if (graph, rule) in failing:
                    marks = pytest.mark.xfail(strict=True, reason=failing[(graph, rule)])
                yield pytest.param(
                    model, kind, dtype, graph, rule, marks=marks, id=f"{model}-{kind}-{dtype}-{graph}-{rule}"
                )


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


def test_every_op_is_in_the_table_and_every_tensor_typed():
    """The rules can only judge what they see: every op of every graph is in the support table (a missing one
    would be reported as unsupported-op) and shape inference types every tensor the nodes make."""
    for model in MODELS:
        for kind in KINDS:
            for phase, graph in built_graphs(model, kind, "fp16").items():
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


def _memory_cases():
    for model, kind, dtype in CASES:
        marks = ()
        if dtype in QUANTIZED_DTYPES:
            marks = pytest.mark.xfail(strict=True, reason=QUANTIZED_GAPS["dq-weight-copy"])
        yield pytest.param(model, kind, dtype, marks=marks, id=f"{model}-{kind}-{dtype}")


@pytest.mark.parametrize(("model", "kind", "dtype"), list(_memory_cases()))
def test_the_engine_holds_at_most_1_1x_the_bundles_weights(model, kind, dtype):
    """Issue 21 item 3: one engine (decode.onnx, prefill and decode profiles) holds the weights once; the two
    engines of prefill.onnx and decode.onnx held them about twice."""
    graphs_of_bundle = built_graphs(model, kind, dtype)
    memory = compatibility.weight_memory(graphs_of_bundle)
    assert memory.engine == compatibility.engine_weight_bytes(graphs_of_bundle[ENGINE_GRAPH])
    assert memory.engine <= 1.1 * memory.bundle_weights
    two_engines = sum(compatibility.engine_weight_bytes(graph) for graph in graphs_of_bundle.values())
    assert two_engines > 1.8 * memory.bundle_weights


def test_quantized_dense_projections_stay_quantized_and_the_ffn_rows_are_what_folds():
    """The int8 graph's dense projections are DequantizeLinear -> Gemm, which TensorRT keeps quantized; what the
    estimate adds in float32 is exactly the FFN matrices SparseFFN reads dequantized, and the scales."""
    config = MODELS["llama2-7b"]
    decode = built_graphs("llama2-7b", "none", "int8")[ENGINE_GRAPH]
    copies = [v for v in compatibility.check_graph(decode, "decode.onnx") if v.rule == "dq-weight-copy"]
    ffn_matrix = config.intermediate_size * config.hidden_size
    assert len(copies) == 3 and all(f"float32 copy of {4 * ffn_matrix} bytes" in v.message for v in copies)
    tensors = stored_tensors(config, "none", "int8")
    memory = compatibility.weight_memory(built_graphs("llama2-7b", "none", "int8"))
    scales = sum(t.length for name, t in tensors.items() if name.endswith(".scales"))
    ffn_codes = 3 * ffn_matrix
    # a float32 copy of the FFN codes beside the int8 codes (the prompt's dense FFN reads them through
    # DequantizeLinear -> Gemm, which stays quantized), and every scale as float32 beside its fp16 bytes
    assert memory.engine - memory.bundle_weights == 4 * ffn_codes + scales


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
