"""Custom nodes: make_node builds one with every attribute written out, validate_node checks one against its
schema."""

from __future__ import annotations

import math
import numbers

import numpy as np
import onnx
from onnx import helper

from edge_sdk.bundle.graph_ops import DOMAIN
from edge_sdk.export.ops.schemas import PLUGIN_ATTRIBUTES, SCHEMAS, AttributeSpec, OpSchema

_ATTRIBUTE_TYPES = {
    "string": onnx.AttributeProto.STRING,
    "float": onnx.AttributeProto.FLOAT,
    "int": onnx.AttributeProto.INT,
}


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
    n_required = sum(not spec.optional for spec in schema.inputs)
    if not n_required <= len(node.input) <= len(schema.inputs):
        names = ", ".join(spec.name for spec in schema.inputs)
        raise _error(node, f"expected {n_required} to {len(schema.inputs)} inputs ({names}), found {len(node.input)}")
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


def validate_node(node: onnx.NodeProto) -> None:
    """Check a custom node against its schema: domain, op type, inputs, outputs and every attribute.

    Raises ValueError naming the op, the node, the attribute and the expected and found values. The plugin
    attributes must be present (TensorRT needs them on the node, not just as function defaults).
    """
    if node.domain != DOMAIN or node.op_type not in SCHEMAS:
        raise ValueError(
            f"node {node.name!r}: expected an op of domain {DOMAIN!r} ({', '.join(SCHEMAS)}), "
            f"found {node.op_type!r} in domain {node.domain!r}"
        )
    schema = SCHEMAS[node.op_type]
    _check_io(node, schema)
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
        required = spec.default is None or spec in PLUGIN_ATTRIBUTES
        if required and spec.name not in values:
            raise _error(node, f"attribute {spec.name!r} is required, found none")
    if "activation" in values and values["activation"] != "fatrelu" and values.get("activation_threshold", 0.0):
        raise _error(
            node,
            f"attribute 'activation_threshold': expected 0.0 for activation {values['activation']!r} "
            f"(only fatrelu has a threshold), found {values['activation_threshold']!r}",
        )


def make_node(
    op_type: str,
    inputs: list[str],
    outputs: list[str],
    name: str | None = None,
    **attributes: str | float | int,
) -> onnx.NodeProto:
    """A custom node of domain edge_sdk, validated against SCHEMAS[op_type].

    inputs / outputs: tensor names in schema order (an absent optional input is left off the end).
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
