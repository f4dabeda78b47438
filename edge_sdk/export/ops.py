"""The custom ONNX ops of an edge-sdk bundle: their schemas and reference decompositions (DESIGN 3.3).

Every implementation of an op -- the reference ONNX function here, which ONNX Runtime runs, the TensorRT
plugins, the C kernels -- implements the contract declared in this module: inputs, outputs and attributes
with their types and shapes (SCHEMAS), and the exact semantics, written once as a model-local ONNX function
in standard ops (reference_functions). The exporter builds custom nodes with make_node, attaches
reference_functions() to the model and imports function_opset_imports(); the TensorRT backend removes the
functions again (formats/onnx_wire.without_functions, no onnx needed on a device). OPS.md, the plugin authors'
documentation, embeds schema_markdown(), so this module is the source of truth: `python -m edge_sdk.export.ops`
regenerates it.

The semantics are those of edge_sdk.sparsity: svd.SvdPredictor.scores + bias > 0, signbit.signbit_mask,
and ffn.sparse_ffn with the sequential pipeline.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
from onnx import helper

from edge_sdk.bundle.graph_ops import DOMAIN, OPSET_VERSION, PLUGIN_NAMESPACE, PLUGIN_VERSION
from edge_sdk.model.activation import SUPPORTED_ACTIVATIONS

# The standard ("" domain) opset of the reference functions. ONNX requires a model that uses a function to
# import the same version, so this is the decoder graph's opset too. 19 is the first with Equal on strings
# (the activation selection below) and is inside TensorRT 10's parser range (opsets 9 to 20).
STANDARD_OPSET_VERSION = 19
# onnx 1.23 writes IR version 14 by default, which ONNX Runtime 1.31 refuses; 10 is accepted by both.
IR_VERSION = 10

ACTIVATIONS = SUPPORTED_ACTIVATIONS

FLOAT_TYPES = ("float16", "bfloat16", "float32")

_ATTRIBUTE_TYPES = {"string": onnx.AttributeProto.STRING, "float": onnx.AttributeProto.FLOAT}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an op.

    shape lists the dimension symbols (T tokens, d hidden size, D neurons, r predictor rank, W = ceil(d / 32)).
    dtypes lists the accepted element types; tensors naming the same type_var must share one. An optional
    input is absent only by being left off the end of the node's inputs: TensorRT 10.x's ONNX parser turns an
    empty input name into a null ITensor and hands it to addPluginV3 (onnx-tensorrt ModelImporter.cpp).
    """

    name: str
    shape: tuple[str, ...]
    dtypes: tuple[str, ...]
    doc: str
    type_var: str = ""
    optional: bool = False


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute of an op: its ONNX type ("string" or "float") and the values it may take.

    default None means required. allowed, when non-empty, lists every accepted value. A float is checked
    after rounding to float32 (what the node stores) and must be finite and above minimum (or equal to it
    when minimum_inclusive). round_up: make_node rounds the value up to float32 rather than to nearest, for
    a bound whose calibrated value must not shrink (alpha: a smaller one predicts fewer neurons active).
    """

    name: str
    type: str
    doc: str
    default: str | float | None = None
    allowed: tuple[str, ...] = ()  # string attributes only
    minimum: float | None = None
    minimum_inclusive: bool = True
    round_up: bool = False


@dataclass(frozen=True)
class OpSchema:
    """A custom op in domain edge_sdk: its interface, meaning (doc) and the error other implementations may have.

    tolerance says in words what ERROR_BOUNDS[name] declares in numbers.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: tuple[AttributeSpec, ...]
    doc: str
    tolerance: str


_PLUGIN_ATTRIBUTES = (
    AttributeSpec(
        "plugin_version",
        "string",
        "TensorRT plugin creator version; the parser looks the creator up by op type, version and namespace.",
        default=PLUGIN_VERSION,
        allowed=(PLUGIN_VERSION,),
    ),
    AttributeSpec(
        "plugin_namespace",
        "string",
        "TensorRT plugin creator namespace.",
        default=PLUGIN_NAMESPACE,
        allowed=(PLUGIN_NAMESPACE,),
    ),
)

_X = TensorSpec("x", ("T", "d"), FLOAT_TYPES, "FFN input tokens (the normalised hidden states); T >= 1.", type_var="TX")
# int32, not bool: TensorRT 10.3 plugins can neither output kBOOL / kUINT8 (NvInferRuntime.h 10.3,
# IPluginV3OneBuild::getOutputDataTypes) nor reliably take BOOL / INT8 inputs (NVIDIA/TensorRT#3959).
_MASK = TensorSpec(
    "mask",
    ("T", "D"),
    ("int32",),
    "1 where neuron i is predicted active for token t, 0 elsewhere; consumers treat any nonzero as active.",
)

SCHEMAS: dict[str, OpSchema] = {
    schema.name: schema
    for schema in (
        OpSchema(
            name="SvdPredictor",
            inputs=(
                _X,
                TensorSpec("a", ("D", "r"), ("float32",), "Left factor U_r Sigma_r."),
                TensorSpec("b", ("r", "d"), ("float32",), "Right factor V_r^T S^-1 (whitened)."),
                TensorSpec("bias", ("D",), ("float32",), "Calibrated per-neuron bias (-tau)."),
            ),
            outputs=(_MASK,),
            attributes=_PLUGIN_ATTRIBUTES,
            doc="Low-rank predictor of the gate: mask = ((x b^T) a^T + bias) > 0, computed in float32.",
            tolerance=(
                "Exact except where |score| is within rounding error of 0 (different summation orders): a decision "
                "may differ only where |score| <= bound * max |score|, bound by x's type."
            ),
        ),
        OpSchema(
            name="SignBitPredictor",
            inputs=(
                _X,
                TensorSpec(
                    "packed",
                    ("D", "W"),
                    ("int32",),
                    "Sign bits of W_gate, 32 per word, LSB first: bit j of word k is 1 when w[i, 32k + j] < 0. "
                    "Padding bits past d must be 0.",
                ),
            ),
            outputs=(_MASK,),
            attributes=(
                AttributeSpec(
                    "alpha",
                    "float",
                    "Conservativeness: a neuron is inactive when alpha * N_pos < N_neg; larger keeps more.",
                    minimum=0.0,
                    minimum_inclusive=False,
                    round_up=True,
                ),
                *_PLUGIN_ATTRIBUTES,
            ),
            doc=(
                "Sign-bit predictor: N_neg = #{j < d : signbit(w_ij) != signbit(x_j)}, where x_j has sign bit 1 "
                "when x_j < 0 (0 and -0.0 have 0); N_pos = d - N_neg. mask = not (alpha * N_pos < N_neg), "
                "compared exactly (alpha * N_pos fits a double; do not round it to float)."
            ),
            tolerance=(
                "Exact (bound 0 for every x type): equal to sparsity.signbit.signbit_mask(packed, x, alpha) for the "
                "node's float32 alpha."
            ),
        ),
        OpSchema(
            name="SparseFFN",
            inputs=(
                _X,
                TensorSpec("w_gate", ("D", "d"), FLOAT_TYPES, "Gate projection, neuron-major.", type_var="TW"),
                TensorSpec("w_up", ("D", "d"), FLOAT_TYPES, "Up projection, neuron-major.", type_var="TW"),
                TensorSpec(
                    "w_down_t",
                    ("D", "d"),
                    FLOAT_TYPES,
                    "Down projection transposed: row i is neuron i's.",
                    type_var="TW",
                ),
                _MASK,
                TensorSpec(
                    "thresholds",
                    ("D",),
                    ("float32",),
                    "CHESS per-neuron thresholds: active also needs |a_i| > t_i. Absent means no such condition.",
                    optional=True,
                ),
            ),
            outputs=(TensorSpec("y", ("T", "d"), ("float32",), "FFN output."),),
            attributes=(
                AttributeSpec(
                    "activation",
                    "string",
                    "Gate activation a = act(g): relu, fatrelu (g > t ? g : 0), drelu (relu on gate and up), "
                    "silu (g * sigmoid(g)).",
                    allowed=ACTIVATIONS,
                ),
                AttributeSpec(
                    "activation_threshold",
                    "float",
                    "fatrelu's cut-off t; must be 0 for the other activations.",
                    default=0.0,
                    minimum=0.0,
                ),
                *_PLUGIN_ATTRIBUTES,
            ),
            doc=(
                "One decode step of the sparse gated FFN, sequential pipeline (DESIGN 3.1), float32 math on "
                "float32-converted weights: g = x w_gate^T; a = act(g); active = mask and a != 0 "
                "[and |a| > thresholds]; u = x w_up^T, relu(u) for drelu; h = active ? a * u : 0; "
                "y = h w_down_t. Only active neurons need their w_up and w_down_t rows read."
            ),
            tolerance=(
                "max |y - y_ref| <= bound * max |y_ref|, bound by the weights' type (float32 accumulation in any "
                "order). For int8 / int4 weights (edge_sdk/quant.py, the CPU kernels' edge_cpu_sparse_ffn_q) y_ref is "
                "the reference on the dequantized weights and on the x the kernel computes with (QUANT.md)."
            ),
        ),
    )
}

# The error bound each implementation of an op may have against the reference (edge_sdk.sparsity), by op and by the
# type that decides it (SparseFFN, MatVec: the weights'; the predictors: x's). What a bound bounds is the op's
# tolerance: SparseFFN and MatVec max |y - y_ref| <= bound * max |y_ref|; SvdPredictor the scores around which a
# decision may flip, |score| <= bound * max |score|; SignBitPredictor none (exact). MatVec is no ONNX op: it is the
# CPU kernels' dense projection y = W x (+ bias) (edge_cpu_matvec, edge_cpu_matvec_q), y_ref in float64 on the same
# (dequantized) weights. For quantized weights x is the one the kernel computes with: quantized_activations(x) for
# the integer dot products (plugins/kernels/cpu/QUANT.md), so the bound is fp32 summation order only. The op tests
# (tests/ops) read their tolerances here and nowhere else.
ERROR_BOUNDS: dict[str, dict[str, float]] = {
    "SvdPredictor": {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5},
    "SignBitPredictor": {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0},
    "SparseFFN": {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5, "int8": 1e-5, "int4": 1e-5},
    "MatVec": {"float32": 1e-5, "float16": 1e-5, "int8": 1e-5, "int4": 1e-5},
}


def error_bound(op: str, dtype: str) -> float:
    """ERROR_BOUNDS[op][dtype], or a ValueError naming the op and type that have none."""
    bounds = ERROR_BOUNDS.get(op)
    if bounds is None:
        raise ValueError(f"op: expected one of {', '.join(ERROR_BOUNDS)}, found {op!r}")
    if dtype not in bounds:
        raise ValueError(f"{op}: no error bound declared for type {dtype!r}; declared: {', '.join(bounds)}")
    return bounds[dtype]


def _signature(op: str) -> str:
    """The function header shared by the three decompositions: domain, opsets, attributes with defaults."""
    schema = SCHEMAS[op]
    attributes = []
    for attribute in schema.attributes:
        if attribute.default is None:
            attributes.append(attribute.name)
        elif attribute.type == "string":
            attributes.append(f'{attribute.name}: string = "{attribute.default}"')
        else:
            attributes.append(f"{attribute.name}: float = {attribute.default!r}")
    inputs = ", ".join(spec.name for spec in schema.inputs)
    outputs = ", ".join(spec.name for spec in schema.outputs)
    return (
        f'<domain: "{DOMAIN}", opset_import: ["" : {STANDARD_OPSET_VERSION}]>\n'
        f"{op} <{', '.join(attributes)}>\n({inputs}) => ({outputs})\n"
    )


# Value of bit j of a two's complement int32 word: 2^j, and -2^31 for bit 31. ANDing a word with it isolates
# the bit without shifting signed values (ONNX BitShift only takes unsigned types).
_BIT_VALUES = ", ".join(str(1 << j) for j in range(31)) + f", {-(1 << 31)}"

# The reference decompositions in the ONNX textual syntax (onnx.parser). `@name` reads the node's attribute.
_FUNCTION_BODIES = {
    "SvdPredictor": """{
    xf = Cast <to = 1> (x)                                  # [T, d] float32
    low = Gemm <transB = 1> (xf, b)                         # [T, r] = x b^T
    scores = Gemm <transB = 1> (low, a, bias)               # [T, D] = (x b^T) a^T + bias
    zero = Constant <value_float = 0.0> ()
    fires = Greater (scores, zero)                          # [T, D] bool
    mask = Cast <to = 6> (fires)                            # [T, D] int32 of 0/1
}""",
    "SignBitPredictor": f"""{{
    # unpack the weight sign bits: [D, W] int32 -> [D, d] float32 of 0/1
    bit_values = Constant <value = int32[32] {{{_BIT_VALUES}}}> ()
    axis_last = Constant <value_ints = [-1]> ()
    words = Unsqueeze (packed, axis_last)                   # [D, W, 1]
    word_bits = BitwiseAnd (words, bit_values)              # [D, W, 32]
    int_zero = Constant <value = int32 {{0}}> ()
    bit_clear = Equal (word_bits, int_zero)
    bit_set = Not (bit_clear)
    bits = Cast <to = 1> (bit_set)                          # [D, W, 32]
    flat_shape = Constant <value_ints = [0, -1]> ()
    all_bits = Reshape (bits, flat_shape)                   # [D, 32W]
    d = Shape <start = 1, end = 2> (x)                      # [1] int64
    start = Constant <value_ints = [0]> ()
    axis_one = Constant <value_ints = [1]> ()
    w_neg = Slice (all_bits, start, d, axis_one)            # [D, d], padding bits dropped
    # input sign bits: x_j < 0 (so 0 and -0.0 are non-negative)
    xf = Cast <to = 1> (x)                                  # [T, d]
    zero = Constant <value_float = 0.0> ()
    x_is_neg = Less (xf, zero)
    x_neg = Cast <to = 1> (x_is_neg)                        # [T, d] of 0/1
    # N_neg = popcount(w xor x) = sum(w) + sum(x) - 2 sum(w and x): integers below 2^24, exact in float32
    both = Gemm <transB = 1> (x_neg, w_neg)                 # [T, D]
    w_ones = ReduceSum <keepdims = 0> (w_neg, axis_one)     # [D]
    x_ones = ReduceSum <keepdims = 1> (x_neg, axis_one)     # [T, 1]
    ones = Add (x_ones, w_ones)                             # [T, D]
    two = Constant <value_float = 2.0> ()
    both_twice = Mul (both, two)
    n_neg_f = Sub (ones, both_twice)                        # [T, D]
    # active unless alpha * N_pos < N_neg, compared exactly in double
    n_neg = Cast <to = 11> (n_neg_f)                        # [T, D] float64
    d_double = Cast <to = 11> (d)
    n_pos = Sub (d_double, n_neg)
    alpha_float = Constant <value_float: float = @alpha> ()
    alpha_double = Cast <to = 11> (alpha_float)
    scaled_pos = Mul (alpha_double, n_pos)
    inactive = Less (scaled_pos, n_neg)
    active = Not (inactive)                                 # [T, D] bool
    mask = Cast <to = 6> (active)                           # [T, D] int32 of 0/1
}}""",
    "SparseFFN": """{
    # the activation kind, as booleans selecting between the branches below
    kind = Constant <value_string: string = @activation> ()
    silu_name = Constant <value_string = "silu"> ()
    fatrelu_name = Constant <value_string = "fatrelu"> ()
    drelu_name = Constant <value_string = "drelu"> ()
    is_silu = Equal (kind, silu_name)
    is_fatrelu = Equal (kind, fatrelu_name)
    is_drelu = Equal (kind, drelu_name)
    zero = Constant <value_float = 0.0> ()
    # gate and up projections in float32
    xf = Cast <to = 1> (x)                                  # [T, d]
    gate_w = Cast <to = 1> (w_gate)                         # [D, d]
    up_w = Cast <to = 1> (w_up)                             # [D, d]
    down_w = Cast <to = 1> (w_down_t)                       # [D, d]
    g = Gemm <transB = 1> (xf, gate_w)                      # [T, D]
    u = Gemm <transB = 1> (xf, up_w)                        # [T, D]
    # a = silu(g), or g > cut ? g : 0 with cut = activation_threshold for fatrelu, 0 for relu and drelu
    fatrelu_cut = Constant <value_float: float = @activation_threshold> ()
    cut = Where (is_fatrelu, fatrelu_cut, zero)
    above_cut = Greater (g, cut)
    relu_gate = Where (above_cut, g, zero)
    g_sigmoid = Sigmoid (g)
    silu_gate = Mul (g, g_sigmoid)
    a = Where (is_silu, silu_gate, relu_gate)               # [T, D]
    # up activation: relu for drelu, identity otherwise
    u_relu = Relu (u)
    up = Where (is_drelu, u_relu, u)                        # [T, D]
    # thresholds, or zeros when the optional input is absent (Gemm's missing C counts as 0);
    # |a| > 0 adds nothing to a != 0, so zero thresholds mean no threshold condition
    n_neurons = Shape <start = 0, end = 1> (w_gate)         # [1] = D
    one = Constant <value_ints = [1]> ()
    row_shape = Concat <axis = 0> (one, n_neurons)
    zero_row = ConstantOfShape (row_shape)                  # [1, D] float32
    zero_1x1 = Constant <value = float[1, 1] {0.0}> ()
    t = Gemm (zero_1x1, zero_row, thresholds)            # [1, D]
    # active = mask and a != 0 and |a| > t
    a_is_zero = Equal (a, zero)
    a_nonzero = Not (a_is_zero)
    a_abs = Abs (a)
    above_t = Greater (a_abs, t)
    fires = And (a_nonzero, above_t)
    predicted = Cast <to = 9> (mask)                        # [T, D] bool: nonzero is active
    active = And (predicted, fires)                         # [T, D]
    product = Mul (a, up)
    h = Where (active, product, zero)                       # [T, D]
    y = MatMul (h, down_w)                                  # [T, d]
}""",
}


def reference_functions() -> list[onnx.FunctionProto]:
    """One model-local function per op, to append to ModelProto.functions, so ONNX Runtime runs the custom nodes.

    A function's attributes include plugin_version and plugin_namespace, which the body never reads:
    declaring them is what lets onnx.checker accept them on the node.
    """
    return [onnx.parser.parse_function(_signature(op) + _FUNCTION_BODIES[op]) for op in SCHEMAS]


def function_opset_imports() -> list[onnx.OperatorSetIdProto]:
    """The opsets a model holding these functions must import: edge_sdk and the functions' standard opset."""
    return [helper.make_opsetid(DOMAIN, OPSET_VERSION), helper.make_opsetid("", STANDARD_OPSET_VERSION)]


def _error(node: onnx.NodeProto, message: str) -> ValueError:
    label = f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node"
    return ValueError(f"{label}: {message}")


def _check_attribute_value(node: onnx.NodeProto, spec: AttributeSpec, value: str | float) -> None:
    """value: already of spec.type (str, or the float32 value as a Python float)."""
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
    values: dict[str, str | float] = {}
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
        required = spec.default is None or spec in _PLUGIN_ATTRIBUTES
        if required and spec.name not in values:
            raise _error(node, f"attribute {spec.name!r} is required, found none")
    if node.op_type == "SparseFFN" and values["activation"] != "fatrelu" and values.get("activation_threshold", 0.0):
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
    **attributes: str | float,
) -> onnx.NodeProto:
    """A custom node of domain edge_sdk, validated against SCHEMAS[op_type].

    inputs / outputs: tensor names in schema order (an absent optional input is left off the end).
    Attributes left out get their defaults written explicitly, plugin_version and plugin_namespace included,
    so every implementation sees the same values. Float attributes are stored as float32: alpha rounded up
    (never less conservative than asked), the others to nearest; an int is accepted for a float.
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


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A markdown table; a | inside a cell is escaped so that it does not split the cell."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _tensor_rows(specs: tuple[TensorSpec, ...]) -> list[tuple[str, ...]]:
    return [
        (
            str(index),
            f"`{spec.name}`" + (" (optional)" if spec.optional else ""),
            "[" + ", ".join(spec.shape) + "]",
            ", ".join(spec.dtypes) + (f" ({spec.type_var})" if spec.type_var else ""),
            spec.doc,
        )
        for index, spec in enumerate(specs)
    ]


def _attribute_row(spec: AttributeSpec) -> tuple[str, ...]:
    if spec.allowed:
        allowed = ", ".join(f'"{value}"' for value in spec.allowed)
    elif spec.minimum is not None:
        allowed = f"{'>=' if spec.minimum_inclusive else '>'} {spec.minimum}, finite"
    else:
        allowed = "any"
    if spec.default is None:
        default = "required"
    else:
        default = f'"{spec.default}"' if spec.type == "string" else repr(spec.default)
    return (f"`{spec.name}`", spec.type, default, allowed, spec.doc)


def schema_markdown() -> str:
    """The reference part of OPS.md: per op its meaning, tolerance, tables and reference decomposition."""
    lines = [
        f"Domain `{DOMAIN}`, opset version {OPSET_VERSION}. Reference functions use the standard opset "
        f"{STANDARD_OPSET_VERSION}; models carrying them use IR version {IR_VERSION}.",
    ]
    for op, schema in SCHEMAS.items():
        bounds = ", ".join(f"{dtype} {bound:g}" for dtype, bound in ERROR_BOUNDS[op].items())
        lines += ["", f"### {op}", "", schema.doc, "", f"Tolerance: {schema.tolerance}", "", f"Error bound: {bounds}."]
        lines += ["", "Inputs:", ""]
        lines += _table(("#", "name", "shape", "type", "description"), _tensor_rows(schema.inputs))
        lines += ["", "Outputs:", ""]
        lines += _table(("#", "name", "shape", "type", "description"), _tensor_rows(schema.outputs))
        lines += ["", "Attributes:", ""]
        rows = [_attribute_row(spec) for spec in schema.attributes]
        lines += _table(("name", "type", "default", "allowed", "description"), rows)
        lines += ["", "Reference decomposition:", "", "```", _signature(op) + _FUNCTION_BODIES[op], "```"]
    matvec_bounds = ", ".join(f"{dtype} {bound:g}" for dtype, bound in ERROR_BOUNDS["MatVec"].items())
    lines += [
        "",
        "### MatVec (CPU kernels only, no ONNX op)",
        "",
        "The dense projection y = W x (+ bias) of edge_cpu_matvec / edge_cpu_matvec_q: max |y - y_ref| <= bound * "
        "max |y_ref|, y_ref in float64 on the same (dequantized) weights and the x the kernel computes with "
        f"(QUANT.md). Error bound: {matvec_bounds}.",
    ]
    return "\n".join(lines) + "\n"


_GENERATED_BEGIN = "<!-- BEGIN GENERATED by `python -m edge_sdk.export.ops`: do not edit -->"
_GENERATED_END = "<!-- END GENERATED -->"


def _regenerate_ops_markdown(path: Path) -> None:
    """Replace the generated block of OPS.md with the current schema_markdown()."""
    text = path.read_text()
    head, begin, rest = text.partition(_GENERATED_BEGIN)
    _, end, tail = rest.partition(_GENERATED_END)
    if not begin or not end:
        raise ValueError(f"{path}: expected the markers {_GENERATED_BEGIN!r} and {_GENERATED_END!r}")
    path.write_text(f"{head}{_GENERATED_BEGIN}\n\n{schema_markdown()}\n{_GENERATED_END}{tail}")


if __name__ == "__main__":
    _regenerate_ops_markdown(Path(__file__).with_name("OPS.md"))
