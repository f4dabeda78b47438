"""The inputs and outputs of a bundle's two graphs: what the exporter declares (export/graph.py builds its value infos
from graph_interface) and what every Python reader checks before it runs a graph (bundle/reader.py), read from the
protobuf wire format without the onnx package.

Both graphs take input_ids and position_ids [batch, seq] int64 and the KV cache past_key_values.{i}.key / .value
[batch, kv_heads, past_seq, head_dim] float32, and give logits [batch, seq, vocab] float32 and
present.{i}.key / .value [batch, kv_heads, total_seq, head_dim] float32; the decode graph also takes sparsity_level
(int64 scalar, the level index) and dense (bool scalar). The predictor kind adds its own values after these (its
decode_inputs, and the outputs its emit_prompt_outputs gives in both graphs, edge_sdk/predictors): a reader refuses a
decode input of a kind whose mask is not fixed at prefill (PredictorKind.fixed_at_prefill, the flag that says the
kind has decode inputs) and prompt outputs that differ between the two graphs.

A value matches when its name, element type and rank are the exporter's, and so is every dimension the exporter
writes as a size (a symbol such as batch matches any dimension). The check reads the graphs' value infos only, never
their weights, so swapped graphs (decode.onnx holding the prefill graph) or a graph that lost an input are refused
when a bundle opens instead of failing inside a runtime. The C runtime checks the same rules with the same messages
(jetson/src/bundle.c, onnx_wire.c; tests/jetson/test_bundle_verdicts.py compares the verdicts).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.bundle import format as bundle_format
from edge_sdk.formats import onnx_wire
from edge_sdk.model.config import ModelConfig

# the element types of the graphs' values, as safetensors dtypes (formats/onnx_wire.py ONNX_TO_SAFETENSORS)
FLOAT, INT64, BOOL = "F32", "I64", "BOOL"

# field numbers (onnx.proto3): GraphProto, ValueInfoProto, TypeProto, TypeProto.Tensor, TensorShapeProto, Dimension
_GRAPH_INPUT, _GRAPH_OUTPUT = 11, 12
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_ELEM_TYPE, _TENSOR_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2
MAX_NAME_SHOWN = 200


@dataclass(frozen=True)
class GraphValue:
    """An input or output of a graph. dtype: its element type as a safetensors dtype (an ONNX type without one:
    "ONNX type N"; None: not a tensor). shape: a size or a symbol per dimension (None: no shape; a dimension with
    neither: "?")."""

    name: str
    dtype: str | None
    shape: tuple[int | str, ...] | None

    def describe(self) -> str:
        if self.dtype is None:
            return "not a tensor"
        if self.shape is None:
            return f"{self.dtype} without a shape"
        return f"{self.dtype} [{', '.join(map(str, self.shape))}] (rank {len(self.shape)})"

    def matches(self, expected: GraphValue) -> bool:
        """The same element type and rank, and the expected sizes where the exporter writes sizes."""
        if self.dtype != expected.dtype or self.shape is None or expected.shape is None:
            return False
        if len(self.shape) != len(expected.shape):
            return False
        return all(isinstance(want, str) or have == want for have, want in zip(self.shape, expected.shape, strict=True))


@dataclass(frozen=True)
class GraphInterface:
    inputs: tuple[GraphValue, ...]
    outputs: tuple[GraphValue, ...]


def graph_interface(config: ModelConfig, phase: str) -> GraphInterface:
    """The inputs and outputs the exporter declares for the graph of `phase` (bundle/format.py GRAPH_PHASES), in its
    order, before those the predictor kind adds."""
    if phase not in bundle_format.GRAPH_PHASES:
        raise ValueError(f"phase: expected one of {', '.join(bundle_format.GRAPH_PHASES)}, found {phase!r}")
    past = ("batch", config.num_kv_heads, "past_seq", config.head_dim)
    total = ("batch", config.num_kv_heads, "total_seq", config.head_dim)
    inputs = [GraphValue("input_ids", INT64, ("batch", "seq")), GraphValue("position_ids", INT64, ("batch", "seq"))]
    outputs = [GraphValue("logits", FLOAT, ("batch", "seq", config.vocab_size))]
    for layer in range(config.num_layers):
        for part in ("key", "value"):
            inputs.append(GraphValue(f"past_key_values.{layer}.{part}", FLOAT, past))
            outputs.append(GraphValue(f"present.{layer}.{part}", FLOAT, total))
    if phase == "decode":
        inputs += [GraphValue("sparsity_level", INT64, ()), GraphValue("dense", BOOL, ())]
    return GraphInterface(tuple(inputs), tuple(outputs))


def read_interface(data: bytes) -> GraphInterface:
    """The inputs and outputs of the main graph of a serialized ModelProto (its value infos; nodes and initializers
    are skipped, not read); onnx_wire.WireError when the bytes are not well-formed."""
    inputs: list[GraphValue] = []
    outputs: list[GraphValue] = []
    for number, wire_type, first, second in onnx_wire.fields(data, 0, len(data)):
        if number != onnx_wire.MODEL_GRAPH or wire_type != onnx_wire.LENGTH:
            continue
        for graph_number, graph_type, value_first, value_second in onnx_wire.fields(data, first, second):
            if graph_type == onnx_wire.LENGTH and graph_number in (_GRAPH_INPUT, _GRAPH_OUTPUT):
                found = inputs if graph_number == _GRAPH_INPUT else outputs
                found.append(_value_info(data, value_first, value_second))
    return GraphInterface(tuple(inputs), tuple(outputs))


def _value_info(data: bytes, first: int, second: int) -> GraphValue:
    name, dtype, shape = "", None, None
    for number, wire_type, value_first, value_second in onnx_wire.fields(data, first, second):
        if number == _VALUE_NAME and wire_type == onnx_wire.LENGTH:
            name = onnx_wire.utf8_text(data, value_first, value_second)
        elif number == _VALUE_TYPE and wire_type == onnx_wire.LENGTH:
            dtype, shape = None, None
            for kind, kind_wire, tensor_first, tensor_second in onnx_wire.fields(data, value_first, value_second):
                if kind == _TYPE_TENSOR and kind_wire == onnx_wire.LENGTH:
                    dtype, shape = _tensor_type(data, tensor_first, tensor_second)
    return GraphValue(name, dtype, shape)


def _tensor_type(data: bytes, first: int, second: int) -> tuple[str, tuple[int | str, ...] | None]:
    element, shape = 0, None
    for number, wire_type, value_first, value_second in onnx_wire.fields(data, first, second):
        if number == _TENSOR_ELEM_TYPE and wire_type == onnx_wire.VARINT:
            element = value_first
        elif number == _TENSOR_SHAPE and wire_type == onnx_wire.LENGTH:
            shape = []
            for dim_number, dim_wire, dim_first, dim_second in onnx_wire.fields(data, value_first, value_second):
                if dim_number == _SHAPE_DIM and dim_wire == onnx_wire.LENGTH:
                    shape.append(_dimension(data, dim_first, dim_second))
    dtype = onnx_wire.ONNX_TO_SAFETENSORS.get(element, f"ONNX type {element}")
    return dtype, None if shape is None else tuple(shape)


def _dimension(data: bytes, first: int, second: int) -> int | str:
    found: int | str = "?"
    for number, wire_type, value_first, value_second in onnx_wire.fields(data, first, second):
        if number == _DIM_VALUE and wire_type == onnx_wire.VARINT:
            found = value_first - (1 << 64) if value_first >= 1 << 63 else value_first
        elif number == _DIM_PARAM and wire_type == onnx_wire.LENGTH:
            found = onnx_wire.utf8_text(data, value_first, value_second)[:MAX_NAME_SHOWN]
    return found


def _shown(name: str) -> str:
    return repr(name[:MAX_NAME_SHOWN])


def _listing(values: tuple[GraphValue, ...]) -> str:
    names = [value.name for value in values]
    if len(names) > 6:
        names = [*names[:3], "...", *names[-2:]]
    return f"{len(values)}: {', '.join(names)}"


def interface_problem(found: GraphInterface, config: ModelConfig, phase: str, kind_inputs: bool) -> str | None:
    """The first way the graph's inputs and outputs differ from the exporter's graph of `phase`, as a message
    (None: they match). kind_inputs: the bundle's predictor kind adds decode inputs (fixed_at_prefill)."""
    expected = graph_interface(config, phase)
    for role, have, want in (("input", found.inputs, expected.inputs), ("output", found.outputs, expected.outputs)):
        by_name: dict[str, GraphValue] = {}
        for value in have:
            if value.name in by_name:
                return f"{role} {_shown(value.name)} is declared twice"
            by_name[value.name] = value
        for value in want:
            actual = by_name.get(value.name)
            if actual is None:
                return f"the {phase} graph's {role} {_shown(value.name)} is missing: expected {value.describe()}"
            if not actual.matches(value):
                return (
                    f"{role} {_shown(value.name)} is {actual.describe()}, expected {value.describe()} as the {phase} "
                    f"graph's"
                )
        names = {value.name for value in want}
        extra = [value for value in have if value.name not in names]
        if extra and role == "input" and (phase == "prefill" or not kind_inputs):
            of = "" if phase == "prefill" else " of a bundle whose predictor takes no decode inputs"
            return (
                f"input {_shown(extra[0].name)} is not an input of the {phase} graph{of} "
                f"(expected its inputs, {_listing(want)})"
            )
    return None


def prompt_outputs_problem(
    prefill: GraphInterface, decode: GraphInterface, config: ModelConfig
) -> tuple[str, str] | None:
    """The outputs the predictor kind adds after the exporter's own (emit_prompt_outputs) are the same in both
    graphs: (the phase of the graph at fault, the first difference as a message), or None."""
    extras = {}
    for phase, found in (("prefill", prefill), ("decode", decode)):
        names = {value.name for value in graph_interface(config, phase).outputs}
        extras[phase] = {value.name: value for value in found.outputs if value.name not in names}
    for phase, other in (("decode", "prefill"), ("prefill", "decode")):
        for name, want in extras[other].items():
            have = extras[phase].get(name)
            if have is None:
                return phase, (
                    f"the {phase} graph's output {_shown(name)} is missing: expected {want.describe()}, as the {other} "
                    f"graph has it (the predictor's outputs are the same in both graphs)"
                )
            if have != want:
                return phase, (
                    f"output {_shown(name)} is {have.describe()}, expected {want.describe()} as the {other} graph's "
                    f"(the predictor's outputs are the same in both graphs)"
                )
    return None
