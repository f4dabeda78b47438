"""Custom nodes: make_node builds one with every attribute written out, validate_node checks one against its
schema."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from edge_sdk.bundle.graph_ops import DOMAIN
from edge_sdk.export.ops.schemas import (
    DOWN_WEIGHT_FORMATS,
    PLUGIN_ATTRIBUTES,
    SCHEMAS,
    AttributeSpec,
    OpSchema,
    TensorSpec,
)

_ATTRIBUTE_TYPES = {
    "string": onnx.AttributeProto.STRING,
    "float": onnx.AttributeProto.FLOAT,
    "int": onnx.AttributeProto.INT,
}
# The schemas' element types by ONNX's names for them (TensorProto.DataType.Name), as shape inference reports them.
_ONNX_TYPE_NAMES = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "int32": "INT32"}


def _error(node: onnx.NodeProto, message: str) -> ValueError:
    label = f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node"
    return ValueError(f"{label}: {message}")


def _check_attribute_value(node: onnx.NodeProto, spec: AttributeSpec, value: str | float | int) -> None:
    """value: already of spec.type (str, int, or the float32 value as a Python float)."""
    if spec.allowed and value not in spec.allowed:
        allowed = ", ".join(map(repr, spec.allowed))
        raise _error(node, f"attribute {spec.name!r}: expected one of {allowed}, found {value!r}")
    if spec.type != "float":
        return
    if not math.isfinite(value):
        raise _error(node, f"attribute {spec.name!r}: expected a finite float32, found {value!r}")
    if spec.minimum is not None:
        below = value < spec.minimum if spec.minimum_inclusive else value <= spec.minimum
        if below:
            bound = ">=" if spec.minimum_inclusive else ">"
            raise _error(node, f"attribute {spec.name!r}: expected a value {bound} {spec.minimum}, found {value!r}")


def _check_io(node: onnx.NodeProto, schema: OpSchema) -> None:
    _check_input_count(node, schema)
    for spec, name in zip(schema.inputs, node.input, strict=False):
        if not name and not spec.optional:
            raise _error(node, f"input {spec.name!r} is required, found an empty name")
        if not name:
            raise _error(
                node,
                f"optional input {spec.name!r}: expected it left off the end of the inputs, found the empty name "
                "(TensorRT's ONNX parser passes a null tensor to the plugin for an empty name)",
            )
    if len(node.output) != len(schema.outputs) or not all(node.output):
        names = ", ".join(spec.name for spec in schema.outputs)
        raise _error(node, f"expected {len(schema.outputs)} named outputs ({names}), found {list(node.output)}")


def _schema_of(node: onnx.NodeProto) -> OpSchema:
    if node.domain != DOMAIN or node.op_type not in SCHEMAS:
        raise ValueError(
            f"node {node.name!r}: expected an op of domain {DOMAIN!r} ({', '.join(SCHEMAS)}), "
            f"found {node.op_type!r} in domain {node.domain!r}"
        )
    return SCHEMAS[node.op_type]


def _check_input_count(node: onnx.NodeProto, schema: OpSchema) -> None:
    n_required = sum(not spec.optional for spec in schema.inputs)
    if not n_required <= len(node.input) <= len(schema.inputs):
        names = ", ".join(spec.name for spec in schema.inputs)
        # the inputs an attribute value calls for come last (TensorSpec.present_when)
        n_unconditional = sum(spec.present_when is None for spec in schema.inputs)
        conditions = dict.fromkeys(spec.present_when for spec in schema.inputs if spec.present_when)
        with_condition = "".join(f", {len(schema.inputs)} with {key} {value!r}" for key, value in conditions)
        raise _error(
            node,
            f"expected {n_required} to {n_unconditional} inputs{with_condition} ({names}), found {len(node.input)}",
        )


def _is_wanted(spec: TensorSpec, values: Mapping[str, object]) -> bool:
    """Whether the node's attribute values call for a conditional input (TensorSpec.present_when, absent_when)."""
    attribute, value = spec.present_when
    if values.get(attribute) != value:
        return False
    return spec.absent_when is None or values.get(spec.absent_when[0]) != spec.absent_when[1]


def _condition_text(spec: TensorSpec, values: Mapping[str, object]) -> str:
    """The attribute values that decide whether a conditional input is there, as a message states them."""
    attribute, value = spec.present_when
    text = f"{attribute} {value!r}"
    if spec.absent_when is not None:
        text += f" without {spec.absent_when[0]} {spec.absent_when[1]!r}"
    found = f"{attribute} {values.get(attribute)!r}"
    if spec.absent_when is not None and spec.absent_when[0] in values:
        found += f" and {spec.absent_when[0]} {values[spec.absent_when[0]]!r}"
    return f"{text}, found it with {found}"


def _check_conditional_inputs(node: onnx.NodeProto, schema: OpSchema, values: Mapping[str, object]) -> None:
    """The inputs present exactly when an attribute has a value (TensorSpec.present_when: int4_asymmetric's
    minimums, but for an int8 down projection's). Inputs are left off only at the end, so the optional inputs before
    them are given too."""
    for index, spec in enumerate(schema.inputs):
        if spec.present_when is None:
            continue
        wanted, present = _is_wanted(spec, values), index < len(node.input)
        if wanted and not present:
            attribute, value = spec.present_when
            conditional = [s for s in schema.inputs if s.present_when is not None and _is_wanted(s, values)]
            expected = max(schema.inputs.index(s) for s in conditional) + 1
            before = [s.name for s in schema.inputs[:index] if s.optional and s.present_when is None]
            given_too = f"; the optional {', '.join(before)} before them given too" if before else ""
            raise _error(
                node,
                f"{attribute} {value!r}: expected {expected} inputs, {', '.join(s.name for s in conditional)} last"
                f"{given_too} (an omitted input in the middle would be an empty name), found {len(node.input)}",
            )
        if present and not wanted:
            condition = _condition_text(spec, values)
            raise _error(node, f"input {spec.name!r} (input {index}): expected only with {condition}")


def _check_input_types(node: onnx.NodeProto, schema: OpSchema, types: Mapping[str, str]) -> None:
    """Each input whose element type `types` knows (ONNX's name, e.g. FLOAT16) against its schema's types; inputs of
    one type_var must share a type."""
    shared: dict[str, tuple[str, str]] = {}
    for spec, name in zip(schema.inputs, node.input, strict=False):
        found = types.get(name) if name else None
        if found is None:
            continue
        allowed = [_ONNX_TYPE_NAMES[dtype] for dtype in spec.dtypes]
        if found not in allowed:
            raise _error(node, f"input {spec.name!r} ({name!r}): expected type {' or '.join(allowed)}, found {found}")
        if spec.type_var:
            first = shared.setdefault(spec.type_var, (spec.name, found))
            if first[1] != found:
                raise _error(
                    node,
                    f"input {spec.name!r} ({name!r}): expected the type of {first[0]!r} ({spec.type_var}: "
                    f"{first[1]}), found {found}",
                )


def _attribute_values(node: onnx.NodeProto) -> dict[str, object]:
    """The node's attributes by name, strings decoded."""
    values = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def check_inputs(node: onnx.NodeProto, types: Mapping[str, str] | None = None) -> None:
    """Check a custom node's inputs against its schema: their count, the inputs present exactly with an attribute
    value (an int4_asymmetric node's minimums, and thresholds before them) and, for the tensors whose element type
    `types` gives (ONNX's names, e.g. {"x": "FLOAT"}), their types. Empty input names are validate_node's to refuse.

    Raises ValueError naming the op, the node, the input and the expected and found counts or types.
    """
    schema = _schema_of(node)
    _check_input_count(node, schema)
    _check_conditional_inputs(node, schema, _attribute_values(node))
    if types is not None:
        _check_input_types(node, schema, types)


def validate_node(node: onnx.NodeProto, types: Mapping[str, str] | None = None) -> None:
    """Check a custom node against its schema: domain, op type, inputs (check_inputs: their count, the inputs an
    attribute value calls for, and the types `types` gives), outputs and every attribute (check_attributes).

    Raises ValueError naming the op, the node, the attribute and the expected and found values. The plugin
    attributes must be present (TensorRT needs them on the node, not just as function defaults).
    """
    schema = _schema_of(node)
    _check_io(node, schema)
    values = check_attributes(node)
    _check_conditional_inputs(node, schema, values)
    if types is not None:
        _check_input_types(node, schema, types)


def check_attributes(node: onnx.NodeProto) -> dict[str, str | float | int]:
    """Check a custom node's attributes against its schema: each known, of its type and allowed value, the required
    ones present, and the values that go together (activation_threshold with fatrelu, down_weight_format with
    weight_format); returns them by name.

    Raises ValueError naming the op, the node, the attribute and the expected and found values.
    """
    schema = _schema_of(node)
    specs = {spec.name: spec for spec in schema.attributes}
    values: dict[str, str | float | int] = {}
    for attribute in node.attribute:
        spec = specs.get(attribute.name)
        if spec is None:
            raise _error(node, f"unknown attribute {attribute.name!r}; expected only {', '.join(specs)}")
        if attribute.type != _ATTRIBUTE_TYPES[spec.type]:
            found = onnx.AttributeProto.AttributeType.Name(attribute.type).lower()
            raise _error(node, f"attribute {spec.name!r}: expected type {spec.type}, found {found}")
        value = helper.get_attribute_value(attribute)
        values[spec.name] = value.decode() if isinstance(value, bytes) else value
        _check_attribute_value(node, spec, values[spec.name])
    for spec in schema.attributes:
        required = (spec.default is None and not spec.optional) or spec in PLUGIN_ATTRIBUTES
        if required and spec.name not in values:
            raise _error(node, f"attribute {spec.name!r} is required, found none")
    if "activation" in values and values["activation"] != "fatrelu" and values.get("activation_threshold", 0.0):
        raise _error(
            node,
            f"attribute 'activation_threshold': expected 0.0 for activation {values['activation']!r} "
            f"(only fatrelu has a threshold), found {values['activation_threshold']!r}",
        )
    down_format = values.get("down_weight_format")
    if down_format is not None and down_format not in DOWN_WEIGHT_FORMATS.get(values.get("weight_format"), ()):
        allowed = ", ".join(
            f"{down!r} with weight_format {base!r}" for base, wider in DOWN_WEIGHT_FORMATS.items() for down in wider
        )
        raise _error(
            node,
            f"attribute 'down_weight_format': expected it absent, or {allowed}; found {down_format!r} with "
            f"weight_format {values.get('weight_format')!r}",
        )
    return values


def make_node(
    op_type: str,
    inputs: list[str],
    outputs: list[str],
    name: str | None = None,
    **attributes: str | float | int,
) -> onnx.NodeProto:
    """A custom node of domain edge_sdk, validated against SCHEMAS[op_type].

    inputs / outputs: tensor names in schema order (an absent optional input is left off the end; an int4_asymmetric
    node has every input, its minimums last).
    Attributes left out get their defaults written explicitly, plugin_version and plugin_namespace included,
    so every implementation sees the same values. Float attributes are stored as float32: alpha rounded up
    (never less conservative than asked), the others to nearest; an int is accepted for a float (and only an int
    for an int attribute).
    Raises ValueError on an unknown op, a wrong input count, an unknown attribute or a bad value.
    """
    schema = SCHEMAS.get(op_type)
    if schema is None:
        raise ValueError(f"op_type: expected one of {', '.join(SCHEMAS)}, found {op_type!r}")
    values: dict[str, object] = {}
    for spec in schema.attributes:
        value = attributes.get(spec.name, spec.default)
        if value is None:
            continue
        if spec.type == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = _float32_not_below(value) if spec.round_up else float(value)
        values[spec.name] = value
    values.update((key, value) for key, value in attributes.items() if key not in values)
    node = helper.make_node(op_type, inputs, outputs, name=name, domain=DOMAIN, **values)
    validate_node(node)
    return node


def _float32_not_below(value: float) -> float:
    """The smallest float32 >= value (inf past the float32 range)."""
    with np.errstate(over="ignore"):
        stored = np.float32(value)
    if float(stored) < value:
        stored = np.nextafter(stored, np.float32(np.inf))
    return float(stored)
