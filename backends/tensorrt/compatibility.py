"""Static check of a bundle's graphs against TensorRT 10.3's ONNX parser and builder rules, without TensorRT.

`edge-sdk verify --target tensorrt BUNDLE` runs it on a workstation (it needs onnx, not torch and not a GPU):
every rule below names where it comes from, so a violation says why TensorRT would refuse the graph (or build
something other than what the bundle means) before anyone copies the bundle to a Jetson.

Sources, as cited by the rules:
- operators.md: onnx/onnx-tensorrt docs/operators.md, the operator support matrix of the 10.x parser (the rows used
  here read at tag 10.1-GA, the parser generation TensorRT 10.3 ships; its notes: "limited support for DOUBLE",
  "UINT8 is only supported as network input or output tensor types").
- NvInfer.h 10.3, ITopKLayer::setK: "Currently only values of K up to 3840 are supported." (operators.md says
  "less than 3840"; the header, which the builder follows, allows 3840).
- NvInferRuntime.h 10.3, IPluginV3OneBuild::getOutputDataTypes: "DataType:kBOOL and DataType::kUINT8 are not
  supported."; NVIDIA/TensorRT issue 3959: BOOL / INT8 plugin inputs fail the build with "could not find any
  supported formats".
- onnx-tensorrt onnxOpImporters.cpp FallbackPluginImporter (10.x): the creator is looked up by op type,
  `plugin_version` (default "1") and `plugin_namespace` (default "", not ours).
- onnx-tensorrt ModelImporter.cpp (10.x): an empty input name becomes a null ITensor, which reaches addPluginV3.
- edge_sdk/export/OPS.md (edge_sdk.export.ops.SCHEMAS), the plugins' contract: each custom op's inputs in number
  (an int4_asymmetric node's group minimums, and thresholds before them) and element type; a plugin refuses another
  count, and its supportsFormatCombination another type.
- onnx-tensorrt Cast importer (10.x): a Cast of an initializer is an IConstantLayer plus an ICastLayer, which the
  builder's constant folding turns into one constant of the cast type: an fp32 copy of fp16/bf16 weights.
- operators.md 10.x, DequantizeLinear: types INT8, FP8, INT4, "`x_zero_point` must be zero"; onnxOpImporters.cpp
  (10.x) QuantDequantLinearHelper: "TensorRT only supports symmetric quantization" (a nonzero zero point is refused).
- NvInfer.h 10.3, IDequantizeLayer: "Block dequantization is supported only for 2-D input tensors with
  DataType::kINT4 that are rooted at an IConstantLayer", and "All scale coefficients must have positive values" (the
  sign of a scale is in the weights, which this check does not read).
- TensorRT 10.x developer guide, "Working with Quantized Types" (weight-only quantization): a DequantizeLinear of
  constant weights is kept quantized when it feeds the weight input of a MatMul / Gemm (or a convolution); a
  dequantized constant that feeds anything else (a plugin, a Gather) is constant-folded to a float32 tensor.

The graph checked is the one TensorRT parses: decode.onnx, from which the backend builds its one engine (prompt and
decode profiles, profiles.py); it holds prefill's dense FFN too. prefill.onnx is ONNX Runtime's and the C runtime's.
The graph is read as stored (with the custom ops' reference functions, so ONNX shape inference types every
tensor); the TensorRT backend strips the functions before parsing, so no rule looks inside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_sdk.bundle import Bundle
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle.graph_ops import DOMAIN, PLUGIN_NAMESPACE, PLUGIN_VERSION
from edge_sdk.export import ops

from .builder import DEQUANTIZING_GRAPH_REASON, dequantizes_asymmetric_matrices
from .profiles import ENGINE_GRAPH

TOPK_MAX_K = 3840  # NvInfer.h 10.3, ITopKLayer::setK: "Currently only values of K up to 3840 are supported."

_F, _H, _BF = "FLOAT", "FLOAT16", "BFLOAT16"
_I32, _I64, _B = "INT32", "INT64", "BOOL"
_FLOATS = (_F, _H, _BF)
_NUMBERS = (*_FLOATS, _I32, _I64)
_ANY = (*_NUMBERS, _B)

# operators.md (onnx-tensorrt 10.x): the "Supported Types" of every standard op a bundle graph uses. Types are those
# of the op's data tensors; index, shape and axes inputs (and comparison results) follow ONNX's own typing.
SUPPORTED_TYPES: dict[str, tuple[str, ...]] = {
    "Add": _NUMBERS,
    "And": (_B,),
    "Cast": (*_NUMBERS, "UINT8", _B),
    "Ceil": _FLOATS,
    "DequantizeLinear": ("INT8", "INT4", "FLOAT8E4M3FN"),
    "Concat": _ANY,
    "Constant": _ANY,
    "ConstantOfShape": _ANY,
    "Div": _NUMBERS,
    "Expand": _ANY,
    "Gather": _ANY,
    "Gemm": _FLOATS,
    "Greater": _NUMBERS,
    "Less": _NUMBERS,
    "LessOrEqual": _NUMBERS,
    "MatMul": _FLOATS,
    "Mul": _NUMBERS,
    "Neg": _NUMBERS,
    "Not": (_B,),
    "Or": (_B,),
    "Range": _NUMBERS,
    "ReduceMean": _NUMBERS,
    "ReduceProd": _NUMBERS,
    "ReduceSum": _NUMBERS,
    "Relu": _NUMBERS,
    "Reshape": _ANY,
    "ScatterElements": _NUMBERS,
    "Shape": _ANY,
    "Sigmoid": _FLOATS,
    "Slice": _ANY,
    "Softmax": _FLOATS,
    "Sqrt": _FLOATS,
    "Squeeze": _ANY,
    "Sub": _NUMBERS,
    "TopK": _NUMBERS,
    "Transpose": _ANY,
    "Unsqueeze": _ANY,
    "Where": _ANY,
}
# Which tensors of a node carry the types above: (input positions, output positions). Ops not listed: every input.
_TYPED_TENSORS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "Cast": ((0,), (0,)),
    "Constant": ((), (0,)),
    "ConstantOfShape": ((), (0,)),
    "DequantizeLinear": ((0,), ()),
    "Expand": ((0,), ()),
    "Gather": ((0,), ()),
    "ReduceMean": ((0,), ()),
    "ReduceProd": ((0,), ()),
    "ReduceSum": ((0,), ()),
    "Reshape": ((0,), ()),
    "ScatterElements": ((0, 2), ()),
    "Slice": ((0,), ()),
    "Squeeze": ((0,), ()),
    "TopK": ((0,), ()),
    "Unsqueeze": ((0,), ()),
    "Where": ((1, 2), ()),
}
# NvInferRuntime.h 10.3 (IPluginV3OneBuild::getOutputDataTypes: no kBOOL / kUINT8 outputs), TensorRT issue 3959
# (no BOOL / INT8 inputs: "could not find any supported formats"), and TensorRT's DataType enum, which has no double.
PLUGIN_FORBIDDEN_TYPES = ("BOOL", "UINT8", "INT8", "DOUBLE")

SOURCES = {
    "unsupported-op": "onnx-tensorrt docs/operators.md (10.x operator support matrix)",
    "op-dtype": "onnx-tensorrt docs/operators.md (10.x, Supported Types)",
    "topk-k": "NvInfer.h 10.3 ITopKLayer: K <= 3840; operators.md 10.x: K an initializer, sorted = 1",
    "plugin-io-dtype": "NvInferRuntime.h 10.3 getOutputDataTypes (no kBOOL/kUINT8); NVIDIA/TensorRT#3959",
    "float64": "TensorRT 10.3 DataType has no double; operators.md 10.x: limited support for DOUBLE",
    "uint8-intermediate": "operators.md 10.x: UINT8 only as network input or output",
    "plugin-attributes": "onnx-tensorrt FallbackPluginImporter (10.x): plugin_version / plugin_namespace",
    "plugin-empty-input": "onnx-tensorrt ModelImporter.cpp (10.x): empty input name -> null ITensor to addPluginV3",
    "plugin-inputs": "edge_sdk/export/OPS.md: each plugin's inputs, their number and element types",
    "plugin-attribute-values": "edge_sdk/export/OPS.md: each op's attributes and their allowed values, which its "
    "plugin checks when it is created",
    "asymmetric-int4-graph": "edge_sdk/export/OPS.md, Quantized matrices: an asymmetric int4 decode graph gives its "
    "matrices to the quantized ops (older exports dequantized them in standard ops)",
    "fp32-weight-copy": "onnx-tensorrt Cast importer + builder constant folding: an fp32 copy in the engine",
    "dq-zero-point": "operators.md 10.x DequantizeLinear: x_zero_point must be zero (symmetric quantization only)",
    "dq-weight-copy": "TensorRT 10.x developer guide, weight-only quantization: DQ of weights must feed MatMul/Gemm",
    "dq-block-int4": "NvInfer.h 10.3 IDequantizeLayer: block dequantization only for 2-D INT4 constants",
}
# The ops whose weight input TensorRT computes from quantized weights directly (weight-only quantization).
WEIGHT_ONLY_CONSUMERS = {"MatMul": (0, 1), "Gemm": (0, 1)}


@dataclass(frozen=True)
class Violation:
    """One rule a graph breaks: rule id (a key of SOURCES), graph file, node name, and what was found."""

    rule: str
    graph: str
    node: str
    message: str

    def __str__(self) -> str:
        return f"{self.graph}: node {self.node!r}: {self.message} [{self.rule}; {SOURCES[self.rule]}]"


@dataclass(frozen=True)
class WeightMemory:
    """Bytes of bundle weights the engine would hold after constant folding, against the bytes the bundle stores for
    the weights its graphs read."""

    engine: int
    bundle_weights: int

    @property
    def ratio(self) -> float:
        return self.engine / self.bundle_weights


def _type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type)


def tensor_types(model: onnx.ModelProto) -> dict[str, str]:
    """Element type name of every tensor of the main graph whose type ONNX shape inference can tell."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {tensor.name: _type_name(tensor.data_type) for tensor in graph.initializer}
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = _type_name(value.type.tensor_type.elem_type)
    return types


def _constant_values(graph: onnx.GraphProto) -> dict[str, TensorProto]:
    """Initializers and Constant outputs by name: what TensorRT imports as weights."""
    constants = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value":
                    constants[node.output[0]] = attribute.t
    return constants


def _numel(tensor: TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))


def _stored_bytes(tensor: TensorProto, elem_type: int) -> int:
    """Bytes of the tensor's elements held as elem_type (INT4 / UINT4 pack two to a byte)."""
    if elem_type in (TensorProto.INT4, TensorProto.UINT4):
        return (_numel(tensor) + 1) // 2
    return _numel(tensor) * helper.tensor_dtype_to_np_dtype(elem_type).itemsize


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}->{','.join(node.output)}"


def _standard_node_violations(
    node: onnx.NodeProto, types: dict[str, str], constants: dict[str, TensorProto], graph: str
) -> Iterable[Violation]:
    name = _node_name(node)
    supported = SUPPORTED_TYPES.get(node.op_type)
    if supported is None:
        yield Violation("unsupported-op", graph, name, f"op {node.op_type} is not in the table of supported ops")
        return
    input_positions, output_positions = _TYPED_TENSORS.get(node.op_type, (tuple(range(len(node.input))), ()))
    typed = [node.input[i] for i in input_positions if i < len(node.input) and node.input[i]]
    typed += [node.output[i] for i in output_positions if i < len(node.output)]
    for tensor in typed:
        found = types.get(tensor)
        # DOUBLE is in no op's list; the float64 rule reports it once per tensor
        if found is not None and found != "DOUBLE" and found not in supported:
            yield Violation(
                "op-dtype",
                graph,
                name,
                f"{node.op_type} on tensor {tensor!r}: expected one of {', '.join(supported)}, found {found}",
            )
    if node.op_type == "TopK":
        yield from _topk_violations(node, constants, graph)
    if node.op_type == "Cast" and node.input[0] in constants:
        source = constants[node.input[0]]
        target = helper.get_attribute_value(next(a for a in node.attribute if a.name == "to"))
        if target == TensorProto.FLOAT and source.data_type != TensorProto.FLOAT:
            copy_bytes = _numel(source) * 4
            yield Violation(
                "fp32-weight-copy",
                graph,
                name,
                f"Cast of constant {node.input[0]!r} ({_type_name(source.data_type)}, {list(source.dims)}) to FLOAT: "
                f"expected weights used as stored, found an fp32 copy of {copy_bytes} bytes",
            )


def _topk_violations(node: onnx.NodeProto, constants: dict[str, TensorProto], graph: str) -> Iterable[Violation]:
    name = _node_name(node)
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("sorted", 1) != 1:
        yield Violation("topk-k", graph, name, f"TopK attribute 'sorted': expected 1, found {attributes['sorted']}")
    k_tensor = constants.get(node.input[1])
    if k_tensor is None:
        yield Violation("topk-k", graph, name, f"TopK input K {node.input[1]!r}: expected an initializer, found none")
        return
    k = int(onnx.numpy_helper.to_array(k_tensor).reshape(-1)[0])
    if k > TOPK_MAX_K:
        yield Violation("topk-k", graph, name, f"TopK K: expected at most {TOPK_MAX_K}, found {k}")


def _custom_node_violations(
    node: onnx.NodeProto, types: dict[str, str], plugin_types: dict[str, str], graph: str
) -> Iterable[Violation]:
    """plugin_types: `types` less the types no plugin takes (PLUGIN_FORBIDDEN_TYPES), which rule plugin-io-dtype
    reports alone."""
    name = _node_name(node)
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plugin_attributes_found = True
    for attribute, expected in (("plugin_version", PLUGIN_VERSION), ("plugin_namespace", PLUGIN_NAMESPACE)):
        value = attributes.get(attribute)
        found = value.decode() if isinstance(value, bytes) else value
        if found != expected:
            plugin_attributes_found = False
            yield Violation(
                "plugin-attributes",
                graph,
                name,
                f"{node.op_type} attribute {attribute!r}: expected {expected!r}, found "
                f"{'none' if found is None else repr(found)}",
            )
    for position, tensor in enumerate(node.input):
        if not tensor:
            yield Violation(
                "plugin-empty-input",
                graph,
                name,
                f"{node.op_type} input {position}: expected an optional input to be left off, found the empty name",
            )
    for role, names in (("input", node.input), ("output", node.output)):
        for tensor in names:
            found = types.get(tensor)
            if found in PLUGIN_FORBIDDEN_TYPES:
                yield Violation(
                    "plugin-io-dtype",
                    graph,
                    name,
                    f"{node.op_type} {role} {tensor!r}: expected a type a plugin can take (FLOAT, FLOAT16, BFLOAT16, "
                    f"INT32, INT64), found {found}",
                )
    if plugin_attributes_found:  # the creator is found: it checks the other attributes' values
        try:
            ops.check_attributes(node)
        except ValueError as error:
            yield Violation("plugin-attribute-values", graph, name, str(error))
    try:
        ops.check_inputs(node, plugin_types)
    except ValueError as error:
        yield Violation("plugin-inputs", graph, name, str(error))


def check_graph(model: onnx.ModelProto, graph: str) -> list[Violation]:
    """Every violation of one graph (`graph` names it in the messages, e.g. prefill.onnx), in node order."""
    types = tensor_types(model)
    plugin_types = {tensor: found for tensor, found in types.items() if found not in PLUGIN_FORBIDDEN_TYPES}
    constants = _constant_values(model.graph)
    violations: list[Violation] = []
    boundary = {value.name for value in (*model.graph.input, *model.graph.output)}
    # a tensor's rules name the node that makes it (or the tensor itself for a graph input or initializer)
    producers = {output: _node_name(node) for node in model.graph.node for output in node.output}
    for tensor, found in types.items():
        where = producers.get(tensor, tensor)
        if found == "DOUBLE":
            violations.append(Violation("float64", graph, where, f"tensor {tensor!r}: expected no DOUBLE, found one"))
        elif found == "UINT8" and tensor not in boundary:
            violations.append(
                Violation(
                    "uint8-intermediate",
                    graph,
                    where,
                    f"tensor {tensor!r}: expected UINT8 only as a graph input or output, found an intermediate",
                )
            )
    for node in model.graph.node:
        if node.domain == DOMAIN:
            violations.extend(_custom_node_violations(node, types, plugin_types, graph))
        else:
            violations.extend(_standard_node_violations(node, types, constants, graph))
        if node.op_type == "DequantizeLinear":
            violations.extend(_dequantize_violations(model, node, constants, types, graph))
    return violations


def _consumers(model: onnx.ModelProto, tensor: str) -> list[tuple[onnx.NodeProto, int]]:
    return [(node, i) for node in model.graph.node for i, name in enumerate(node.input) if name == tensor]


def _folded_to_float(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether TensorRT folds this DequantizeLinear of weights into a float32 constant: some reader of its output
    is not the weight input of a MatMul / Gemm."""
    return any(
        position not in WEIGHT_ONLY_CONSUMERS.get(consumer.op_type, ())
        for consumer, position in _consumers(model, node.output[0])
    )


def _dequantize_violations(
    model: onnx.ModelProto, node: onnx.NodeProto, constants: dict[str, TensorProto], types: dict[str, str], graph: str
) -> Iterable[Violation]:
    name = _node_name(node)
    block_size = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size"), 0)
    found = types.get(node.input[0])
    if block_size and found != "INT4":
        yield Violation(
            "dq-block-int4",
            graph,
            name,
            f"DequantizeLinear with block_size {block_size} of {node.input[0]!r}: expected INT4 codes (TensorRT "
            f"dequantizes blocks of INT4 only), found {found or 'an untyped tensor'}",
        )
    if len(node.input) > 2 and node.input[2]:
        zero_point = constants.get(node.input[2])
        if zero_point is None or np.any(onnx.numpy_helper.to_array(zero_point)):
            found = "a tensor computed at run time" if zero_point is None else "nonzero values"
            yield Violation(
                "dq-zero-point",
                graph,
                name,
                f"DequantizeLinear zero point {node.input[2]!r}: expected 0, found {found}",
            )
    weights = _weight_initializers(model)
    if node.input[0] in weights and _folded_to_float(model, node):
        readers = sorted({consumer.op_type for consumer, _ in _consumers(model, node.output[0])})
        copy_bytes = _numel(weights[node.input[0]]) * 4
        yield Violation(
            "dq-weight-copy",
            graph,
            name,
            f"DequantizeLinear of weights {node.input[0]!r} read by {', '.join(readers)}: expected only MatMul / Gemm "
            f"weight inputs (weights kept quantized), found a float32 copy of {copy_bytes} bytes",
        )


def _weight_initializers(model: onnx.ModelProto) -> dict[str, TensorProto]:
    """The bundle's weights a graph reads: its initializers stored as external data (in weights.safetensors)."""
    return {t.name: t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}


def engine_weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of bundle weights an engine built from the graph holds after constant folding: a weight read only
    through Casts is held once per target type (the folded copies), quantized weights whose DequantizeLinear feeds
    anything but a MatMul / Gemm weight input as float32; a weight any other node reads is held as stored.
    Identical folded copies are counted once, so this is a lower bound when TensorRT keeps duplicates."""
    weights = _weight_initializers(model)
    held: set[tuple[str, int]] = set()
    for node in model.graph.node:
        for position, tensor in enumerate(node.input):
            if tensor not in weights:
                continue
            if node.op_type == "DequantizeLinear" and position == 0 and _folded_to_float(model, node):
                held.add((tensor, TensorProto.FLOAT))
            elif node.op_type == "Cast" and position == 0:
                target = helper.get_attribute_value(next(a for a in node.attribute if a.name == "to"))
                held.add((tensor, target))
            else:
                held.add((tensor, weights[tensor].data_type))
    return sum(_stored_bytes(weights[name], elem_type) for name, elem_type in held)


def weight_memory(models: dict[str, onnx.ModelProto]) -> WeightMemory:
    """WeightMemory of a bundle's graphs ({phase: model}): the engine is built from models[ENGINE_GRAPH]; the bundle's
    weights are those any of the graphs reads."""
    stored: dict[str, int] = {}
    for model in models.values():
        for name, tensor in _weight_initializers(model).items():
            stored[name] = _stored_bytes(tensor, tensor.data_type)
    return WeightMemory(engine_weight_bytes(models[ENGINE_GRAPH]), sum(stored.values()))


def load_graphs(bundle: Bundle) -> dict[str, onnx.ModelProto]:
    """{phase: graph} of an opened bundle, without reading the weights."""
    return {
        phase: onnx.load(str(Path(bundle.graph_path(phase))), load_external_data=False)
        for phase in bundle_format.GRAPH_PHASES
    }


def check_bundle(bundle: Bundle) -> tuple[list[Violation], WeightMemory]:
    """The violations of the graph TensorRT parses (decode.onnx) and the engine's weight memory estimate. An
    asymmetric int4 bundle whose decode graph dequantizes its matrices (an older export) is one violation, naming the
    way out, rather than one per dequantizing node."""
    models = load_graphs(bundle)
    if dequantizes_asymmetric_matrices(bundle):
        violation = Violation("asymmetric-int4-graph", f"{ENGINE_GRAPH}.onnx", "(bundle)", DEQUANTIZING_GRAPH_REASON)
        return [violation], weight_memory(models)
    return check_graph(models[ENGINE_GRAPH], f"{ENGINE_GRAPH}.onnx"), weight_memory(models)
