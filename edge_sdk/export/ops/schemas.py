"""The custom ops' schemas: each op's inputs, outputs and attributes with their types and shapes, what it means,
and the error bound every implementation may have against the reference (ERROR_BOUNDS)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from edge_sdk.bundle.graph_ops import PLUGIN_NAMESPACE, PLUGIN_VERSION
from edge_sdk.model.activation import SUPPORTED_ACTIVATIONS

ACTIVATIONS = SUPPORTED_ACTIVATIONS

FLOAT_TYPES = ("float16", "bfloat16", "float32")
# The quantized weight formats (edge_sdk/quant.py, kernels/cpu/QUANT.md) and their group sizes. "int4_asymmetric" is
# int4's codes with a group minimum beside each scale (manifest int4_scheme "asymmetric"): its nodes take the minimums
# as inputs of their own (TensorSpec.present_when).
ASYMMETRIC_WEIGHT_FORMAT = "int4_asymmetric"
WEIGHT_FORMATS = ("int8", "int4", ASYMMETRIC_WEIGHT_FORMAT)
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an op.

    shape lists the dimension symbols (T tokens, d hidden size, D neurons, r predictor rank, W = ceil(d / 32); for
    quantized matrices v codes per INT32 word, 4 for int8 and 8 for int4, and G the group size; K and N a
    QuantizedMatMul's input and output sizes).
    dtypes lists the accepted element types; tensors naming the same type_var must share one. An optional
    input is absent only by being left off the end of the node's inputs: TensorRT 10.x's ONNX parser turns an
    empty input name into a null ITensor and hands it to addPluginV3 (onnx-tensorrt ModelImporter.cpp).
    present_when (attribute, value): an optional input the node has exactly when that attribute has that value (the
    group minimums, with weight_format "int4_asymmetric"); every input before it is then present too.
    absent_when (attribute, value): an exception to present_when, the input left off when that attribute has that
    value (the down projection's minimums with down_weight_format "int8": int8 rows have none).
    """

    name: str
    shape: tuple[str, ...]
    dtypes: tuple[str, ...]
    doc: str
    type_var: str = ""
    optional: bool = False
    present_when: tuple[str, str] | None = None
    absent_when: tuple[str, str] | None = None


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute of an op: its ONNX type ("string", "float" or "int") and the values it may take.

    default None means required, unless optional: an optional attribute may be left off the node, and its absence
    means what its doc says (the reference function sees the empty string). allowed, when non-empty, lists every
    accepted value. A float is checked after rounding to float32 (what the node stores) and must be finite and
    above minimum (or equal to it when minimum_inclusive). round_up: make_node rounds the value up to float32 rather
    than to nearest, for a bound whose calibrated value must not shrink (alpha: a smaller one predicts fewer neurons
    active).
    """

    name: str
    type: str
    doc: str
    default: str | float | int | None = None
    allowed: tuple[str | int, ...] = ()  # string and int attributes only
    minimum: float | None = None
    minimum_inclusive: bool = True
    round_up: bool = False
    optional: bool = False


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


PLUGIN_ATTRIBUTES = (
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

_ACTIVATION_ATTRIBUTES = (
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
)
_QUANT_ATTRIBUTES = (
    AttributeSpec(
        "weight_format",
        "string",
        "How the codes are stored (kernels/cpu/QUANT.md): int8, one byte per value; int4, one signed "
        "two's-complement nibble per value, byte k of each 32-value block holding value k (low nibble) and 16 + k "
        "(high nibble); int4_asymmetric, int4's codes and nibble order with a minimum per group besides its scale "
        "(the *_mins inputs), value (code + 8) * scale + min.",
        allowed=WEIGHT_FORMATS,
    ),
    AttributeSpec("group_size", "int", "Values per fp16 scale along each row of a matrix.", allowed=GROUP_SIZES),
)
# The down projection may be stored wider than gate and up (manifest down_dtype: int8 rows in an int4 bundle).
DOWN_WEIGHT_FORMATS = {"int4": ("int8",), ASYMMETRIC_WEIGHT_FORMAT: ("int8",)}
_DOWN_WEIGHT_FORMAT = AttributeSpec(
    "down_weight_format",
    "string",
    "How w_down_t's codes are stored where they differ from weight_format: int8 with weight_format int4 or "
    "int4_asymmetric (symmetric int8 rows, so no w_down_t_mins). Absent: weight_format.",
    allowed=tuple(sorted({value for values in DOWN_WEIGHT_FORMATS.values() for value in values})),
    optional=True,
)
_THRESHOLDS = TensorSpec(
    "thresholds",
    ("D",),
    ("float32",),
    "CHESS per-neuron thresholds: active also needs |a_i| > t_i. Absent means no such condition.",
    optional=True,
)
# An asymmetric node's minimums come after thresholds, so thresholds is always given with them (zeros, the same as
# none, where the predictor has no thresholds): an empty input name in the middle would reach the plugin as a null
# tensor (TensorSpec).
_QUANTIZED_THRESHOLDS = replace(
    _THRESHOLDS,
    doc=_THRESHOLDS.doc + " Always present with weight_format int4_asymmetric, whose minimums follow it: zeros [D] "
    "where there are no thresholds (|a| > 0 adds nothing to a != 0).",
)
_SPARSE_FFN_DOC = (
    "One decode step of the sparse gated FFN, sequential pipeline (DESIGN 3.1), float32 math on float32-converted "
    "weights: g = x w_gate^T; a = act(g); active = mask and a != 0 [and |a| > thresholds]; u = x w_up^T, relu(u) "
    "for drelu; h = active ? a * u : 0; y = h w_down_t. Only active neurons need their w_up and w_down_t rows read."
)


def _quantized(
    name: str, shape: tuple[str, str], what: str, fmt: str = "weight_format"
) -> tuple[TensorSpec, TensorSpec]:
    """The two inputs of a quantized matrix [rows, cols] (shape: the symbols of rows and cols): its codes and its
    scales; fmt: the attribute naming their format."""
    rows, cols = shape
    codes = TensorSpec(
        name,
        (rows, f"{cols} / v"),
        ("int32",),
        f"{what}: the codes of {fmt}, v = 4 (int8) or 8 (int4, int4_asymmetric) per INT32 word, "
        "little-endian: the bundle's bytes of the codes as they are stored.",
    )
    scales = TensorSpec(
        f"{name}_scales",
        (rows, f"{cols} / G"),
        ("float16",),
        f"Scale of each group of G = group_size consecutive values of a row of {name}: value j of row i is "
        f"code * {name}_scales[i, j / G], exact in float32 (int4_asymmetric: see {name}_mins).",
    )
    return codes, scales


def _minimums(name: str, shape: tuple[str, str], absent_when: tuple[str, str] | None = None) -> TensorSpec:
    """The group minimums of the quantized matrix `name` [rows, cols], an int4_asymmetric node's input (left off
    where absent_when holds)."""
    rows, cols = shape
    return TensorSpec(
        f"{name}_mins",
        (rows, f"{cols} / G"),
        ("float16",),
        f"Minimum of each group of {name} (int4_asymmetric): value j of row i is (code + 8) * "
        f"{name}_scales[i, j / G] + {name}_mins[i, j / G] in float32, the product exact and the sum rounded once "
        "(edge_sdk.quant.dequantize).",
        optional=True,
        present_when=("weight_format", ASYMMETRIC_WEIGHT_FORMAT),
        absent_when=absent_when,
    )


SCHEMAS: dict[str, OpSchema] = {
    schema.name: schema
    for schema in (
        OpSchema(
            name="SvdPredictor",
            inputs=(
                _X,
                TensorSpec(
                    "a",
                    ("D", "r"),
                    ("float32", "float16"),
                    "Left factor U_r Sigma_r (float16 in bundles whose weights are not fp32, widened to float32).",
                    type_var="TF",
                ),
                TensorSpec(
                    "b", ("r", "d"), ("float32", "float16"), "Right factor V_r^T S^-1 (whitened).", type_var="TF"
                ),
                TensorSpec("bias", ("D",), ("float32",), "Calibrated per-neuron bias (-tau)."),
            ),
            outputs=(_MASK,),
            attributes=PLUGIN_ATTRIBUTES,
            doc="Low-rank predictor of the gate: mask = ((x b^T) a^T + bias) > 0, computed in float32 (float16 "
            "factors widened, never float16 arithmetic).",
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
                *PLUGIN_ATTRIBUTES,
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
                _THRESHOLDS,
            ),
            outputs=(TensorSpec("y", ("T", "d"), ("float32",), "FFN output."),),
            attributes=(*_ACTIVATION_ATTRIBUTES, *PLUGIN_ATTRIBUTES),
            doc=_SPARSE_FFN_DOC,
            tolerance=(
                "max |y - y_ref| <= bound * max |y_ref|, bound by the weights' type (float32 accumulation in any "
                "order)."
            ),
        ),
        OpSchema(
            name="QuantizedSparseFFN",
            inputs=(
                _X,
                *_quantized("w_gate", ("D", "d"), "Gate projection, neuron-major"),
                *_quantized("w_up", ("D", "d"), "Up projection, neuron-major"),
                *_quantized(
                    "w_down_t",
                    ("D", "d"),
                    "Down projection transposed: row i is neuron i's",
                    "down_weight_format (absent: weight_format)",
                ),
                _MASK,
                _QUANTIZED_THRESHOLDS,
                *(_minimums(name, ("D", "d")) for name in ("w_gate", "w_up")),
                _minimums("w_down_t", ("D", "d"), absent_when=("down_weight_format", "int8")),
            ),
            outputs=(TensorSpec("y", ("T", "d"), ("float32",), "FFN output."),),
            attributes=(*_ACTIVATION_ATTRIBUTES, *_QUANT_ATTRIBUTES, _DOWN_WEIGHT_FORMAT, *PLUGIN_ATTRIBUTES),
            doc=(
                "SparseFFN over group-wise quantized rows (int8 / int4 bundles): each matrix is its codes and fp16 "
                "scales (and fp16 group minimums for int4_asymmetric), and the op is SparseFFN on the float32 "
                "matrices they hold (dequantized as edge_sdk.quant.dequantize does). " + _SPARSE_FFN_DOC
            ),
            tolerance=(
                "max |y - y_ref| <= bound * max |y_ref|, y_ref the reference (sparsity/ffn.py) on the dequantized "
                "rows and on the x the implementation computes with: x itself, or for the CPU kernels' integer dot "
                "products x quantized per token (QUANT.md), so the bound is float32 summation order only."
            ),
        ),
        OpSchema(
            name="QuantizedMatMul",
            inputs=(
                TensorSpec("x", ("T", "K"), FLOAT_TYPES, "Input rows (activations); T >= 1.", type_var="TX"),
                *_quantized("w", ("R", "C"), "The quantized matrix W [R, C]: [N, K] when transposed, else [K, N]"),
                _minimums("w", ("R", "C")),
            ),
            outputs=(TensorSpec("y", ("T", "N"), ("float32",), "x W^T (transposed) or x W."),),
            attributes=(
                *_QUANT_ATTRIBUTES,
                AttributeSpec(
                    "transposed",
                    "int",
                    "1: W is [N, K], y = x W^T, each row of W one output's (projections, the LM head, gate and up); "
                    "0: W is [K, N], y = x W, each row one input's (the neuron-major down projection of a dense FFN).",
                    default=1,
                    allowed=(0, 1),
                ),
                *PLUGIN_ATTRIBUTES,
            ),
            doc=(
                "A dense product with a group-wise quantized matrix (int8 / int4 bundles), float32 math on W "
                "dequantized as edge_sdk.quant.dequantize does: y = x W^T (transposed = 1) or y = x W (transposed = "
                "0). Groups always run along W's rows, as the bundle stores them."
            ),
            tolerance=(
                "max |y - y_ref| <= bound * max |y_ref|, y_ref in float64 on the dequantized W and the x the "
                "implementation computes with (float32 summation order only)."
            ),
        ),
    )
}

# The error bound each implementation of an op may have against the reference (edge_sdk.sparsity), by op and by the
# type that decides it (SparseFFN, QuantizedSparseFFN, QuantizedMatMul, MatVec: the weights'; the predictors: x's).
# What a bound bounds is the op's tolerance: SparseFFN, QuantizedSparseFFN, QuantizedMatMul and MatVec
# max |y - y_ref| <= bound * max |y_ref|; SvdPredictor the scores around which a decision may flip,
# |score| <= bound * max |score|; SignBitPredictor none (exact). MatVec is no ONNX op: it is the CPU kernels' dense
# projection y = W x (+ bias) (edge_cpu_matvec, edge_cpu_matvec_q), y_ref in float64 on the same (dequantized)
# weights. For quantized weights x is the one the kernel computes with: quantized_activations(x) for the integer dot
# products of the CPU kernels and of the CUDA QuantizedSparseFFN (kernels/cpu/QUANT.md), x itself for the CUDA
# QuantizedMatMul, so the bound is fp32 summation order only. The op tests (tests/ops) read their tolerances here
# and nowhere else.
ERROR_BOUNDS: dict[str, dict[str, float]] = {
    "SvdPredictor": {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5},
    "SignBitPredictor": {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0},
    "SparseFFN": {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5},
    "QuantizedSparseFFN": {"int8": 1e-5, "int4": 1e-5, "int4_asymmetric": 1e-5},
    "QuantizedMatMul": {"int8": 1e-5, "int4": 1e-5, "int4_asymmetric": 1e-5},
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
