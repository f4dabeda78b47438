"""Build the bundle's two ONNX graphs with onnx.helper: prefill (dense FFN, standard ops only) and
decode (predictor + SparseFFN custom ops). Both read the same initializers, stored once in
weights.safetensors and referenced through ONNX external data.

The decode graph also runs a prompt: on an empty cache (past_seq = 0) its FFN is prefill's dense FFN over every
row, otherwise the predictor and SparseFFN (`_step_ffn`); the branch not taken gets zero rows. TensorRT builds one
engine from it with a prompt profile and a decode profile, so the engine holds the weights once
(plugins/tensorrt/JETSON.md). ONNX Runtime and the C runtime run prefill.onnx for prompts.

Inputs of both graphs (bundle/graph_io.py declares them and the outputs; Bundle.open checks every graph against it):
  input_ids [batch, seq] int64, position_ids [batch, seq] int64 (= past_seq + 0..seq-1),
  past_key_values.{i}.key / .value [batch, kv_heads, past_seq, head_dim] float32
Outputs: logits [batch, seq, vocab] float32, present.{i}.key / .value [batch, kv_heads, past_seq + seq, head_dim].
Decode adds: sparsity_level int64 scalar (index into the calibrated levels; svd and threshold),
dense bool scalar (true = every neuron predicted active), and the inputs the predictor kind adds
(PredictorKind.decode_inputs: core_mask.{i} [batch, D] int32, 1 = core neuron, for core).
Every mask is int32 (1 = predicted active): no BOOL tensor crosses a plugin boundary (OPS.md).
Each kind emits its own part (edge_sdk/predictors/<kind>.py): the decode step's mask and thresholds
(emit_step_mask) and what a prompt's dense FFN outputs for it (emit_prompt_outputs: for core, core_activations.{i}
[batch, seq, D] float32, the prompt's gate activations, from which the runtime picks each layer's core neurons on
the host; the decode graph's are those of its prompt rows: [batch, 0, D] on a decode step).

Activations are float32 between the matrix products; every weight is read as stored (no Cast of a weight: TensorRT
would fold it into an fp32 copy in the engine). A product with an fp16/bf16 matrix casts its activation to the
matrix's type, multiplies in that type and casts the result back to float32 (`_matmul`); the embedding rows are
gathered as stored and then cast. Norm weights, biases and the RoPE tables are F32 in a bundle (bundle/layout.py)
and are used as they are. SparseFFN takes its weights as stored (fp16/bf16/fp32).

Quantized bundles (int8 / int4, bundle/layout.py) import standard opset 21 (DequantizeLinear's block_size), and every
quantized matrix is read as its codes and its fp16 scales:
- decode.onnx, the graph TensorRT builds its engine from, gives every product with a quantized matrix to a custom op:
  QuantizedMatMul for the projections, the LM head and a prompt's dense FFN (the neuron-major down rows with
  transposed = 0), QuantizedSparseFFN for a decode step's FFN. Both take the codes as INT32 words, an INT32 initializer
  [rows, row bytes / 4] over the bundle's I8 / U8 bytes (`_word_initializer`), and the scales (and an asymmetric int4
  matrix's minimums) as stored (OPS.md, "Quantized matrices"): each matrix is one initializer read by plugins only, so
  the engine holds it once, as stored, and no DequantizeLinear is left for TensorRT 10.3 (which dequantizes blocks
  only for INT4 with positive scales). ONNX Runtime runs the ops' reference functions, which dequantize exactly as
  prefill.onnx does.
- prefill.onnx, which only ONNX Runtime and the C runtime read, keeps the matrices in standard ops: DequantizeLinear
  (codes, Cast(scales) to float32, axis 1, block_size = the group size) feeding Gemm (`_matmul`) -- float32 scales,
  so every product code * scale is exact and the graph computes with the very matrix edge_sdk.quant.dequantize gives.
  int8 codes are INT8 initializers over the bundle's I8 bytes; packed int4 codes, signed nibbles, are INT4
  [rows, cols] initializers over the bundle's U8 bytes, whose ONNX element order (element 2k low nibble, 2k+1 high
  nibble of byte k) is a permutation of the Q4_0 block order inside each 32-value block: a Gather on the columns
  restores it.
- The LM head may be stored in a wider format than the other matrices (int8 in an int4 bundle: manifest head_dtype);
  every read of a quantized matrix takes its format from the matrix's own stored dtype (I8 or U8) and its own
  minimums, the custom ops' weight_format attribute included, so the head's nodes are int8 nodes in an otherwise int4
  (or int4_asymmetric) graph. So may the FFN down projections (int8 in an int4 bundle: manifest down_dtype): the
  prompt FFN's down product is an int8 QuantizedMatMul, and QuantizedSparseFFN says so in `down_weight_format`; an
  int8 down projection has no minimums, so an int4_asymmetric node then takes 11 inputs.
- A tied model's embedding is its LM head, stored quantized like it: decode.onnx looks the tokens' rows up in its
  INT32 words and scales and dequantizes them in standard integer ops (`GraphBuilder.dequantized_rows`),
  prefill.onnx gathers them from the LM head's DequantizeLinear output.
- Asymmetric int4 bundles (int4_scheme "asymmetric": group minimums, value (code + 8) * scale + min): decode.onnx's
  custom nodes take weight_format "int4_asymmetric" and each matrix's minimums after its other inputs, so a
  QuantizedSparseFFN node takes thresholds too, one shared float32 zeros [D] initializer where the predictor has none
  (OPS.md: an omitted input in the middle would reach the plugin as a null tensor); a tied lookup adds the gathered
  rows' minimums. prefill.onnx dequantizes in standard ops (`GraphBuilder.dequantized`: the codes through
  DequantizeLinear with scale 1, then the group's scale and minimum).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_sdk import predictors, quant
from edge_sdk.bundle import graph_io
from edge_sdk.bundle.layout import MINS_SUFFIX, SCALES_SUFFIX, quantized_format
from edge_sdk.export import ops
from edge_sdk.model.config import ModelConfig

ONNX_DTYPES = {
    "F32": TensorProto.FLOAT,
    "F16": TensorProto.FLOAT16,
    "BF16": TensorProto.BFLOAT16,
    "I32": TensorProto.INT32,
    "I8": TensorProto.INT8,
    "INT4": TensorProto.INT4,  # packed int4 codes, U8 in weights.safetensors (_int4_initializer)
    "I64": TensorProto.INT64,  # the graphs' token, position and level inputs (bundle/graph_io.py)
    "BOOL": TensorProto.BOOL,
}
INT4_BLOCK = 32
NEGATIVE_INFINITY = float("-inf")


@dataclass(frozen=True)
class ExternalTensor:
    """Where an initializer's bytes live inside weights.safetensors."""

    name: str
    dtype: str  # safetensors dtype: F32 | F16 | BF16 | I32
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    length: int


@dataclass(frozen=True)
class GraphSpec:
    """What the graphs need to know besides the model config."""

    config: ModelConfig
    weights_file: str
    tensors: dict[str, ExternalTensor]
    predictor: str  # a kind of edge_sdk.predictors
    layer_attributes: tuple[dict[str, float], ...] = ()  # per layer, the kind's node attributes (graph_attributes)
    quant_format: str | None = None  # int8 | int4 for quantized bundles (the head's own may be wider: matrix_format)
    group_size: int | None = None

    @property
    def kind(self) -> predictors.PredictorKind:
        return predictors.kind(self.predictor)


def _int4_initializer(tensor: ExternalTensor, location: str) -> TensorProto:
    """Packed int4 codes, U8 [rows, cols / 2] in weights.safetensors, as the signed INT4 [rows, cols] they hold."""
    rows, width = tensor.shape
    return external_initializer(
        ExternalTensor(tensor.name, "INT4", (rows, 2 * width), tensor.offset, tensor.length), location
    )


def _word_initializer(tensor: ExternalTensor, location: str) -> TensorProto:
    """Quantized codes, I8 [rows, cols] or U8 [rows, cols / 2] in weights.safetensors, as the INT32 words
    [rows, row bytes / 4] the quantized custom ops take: the same bytes (row bytes are a multiple of 16)."""
    rows, row_bytes = tensor.shape
    return external_initializer(
        ExternalTensor(tensor.name, "I32", (rows, row_bytes // 4), tensor.offset, tensor.length), location
    )


def int4_onnx_columns(cols: int) -> np.ndarray:
    """int64 [cols]: entry j is the ONNX INT4 element index of value j of a Q4_0-ordered row (QUANT.md): value
    32b + k (k < 16) is the low nibble of byte 16b + k, element 32b + 2k; value 32b + 16 + k its high nibble."""
    value = np.arange(cols)
    block, within = value // INT4_BLOCK, value % INT4_BLOCK
    return (block * INT4_BLOCK + 2 * (within % 16) + within // 16).astype(np.int64)


def external_initializer(tensor: ExternalTensor, location: str) -> TensorProto:
    proto = TensorProto()
    proto.name = tensor.name
    proto.data_type = ONNX_DTYPES[tensor.dtype]
    proto.dims.extend(tensor.shape)
    proto.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(tensor.offset)), ("length", str(tensor.length))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value
    return proto


class GraphBuilder:
    """Accumulates nodes with unique names; small helpers keep the decoder code close to its formulas.

    quantized_ops: products with quantized matrices go to the custom ops QuantizedMatMul / QuantizedSparseFFN (the
    decode graph of an int8 / int4 bundle, asymmetric int4 included) instead of DequantizeLinear -> Gemm."""

    def __init__(self, spec: GraphSpec, quantized_ops: bool = False):
        self.spec = spec
        self.quantized_ops = quantized_ops and spec.quant_format is not None
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.used_weights: set[str] = set()
        self.int4_codes: set[str] = set()
        self.code_words: set[str] = set()
        self.dequantized_matrices: dict[str, str] = {}
        self.shared_zero_thresholds: str | None = None
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1, **attributes) -> str:
        names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.fresh(f"{op_type}"), **attributes))
        return names[0] if outputs == 1 else names

    def custom(self, op_type: str, inputs: list[str], hint: str, **attributes) -> str:
        output = self.fresh(hint)
        self.nodes.append(ops.make_node(op_type, inputs, [output], name=self.fresh(op_type), **attributes))
        return output

    def every_neuron_mask(self, x2d: str) -> str:
        """An int32 mask [T, D] of ones for the rows of x2d [T, d]: every neuron a candidate."""
        every = helper.make_tensor("every", TensorProto.INT32, [1], [1])
        rows = self.op("Shape", [x2d], start=0, end=1)
        shape = self.op("Concat", [rows, self.ints(self.spec.config.intermediate_size)], axis=0)
        return self.op("ConstantOfShape", [shape], value=every)

    def constant(self, value: np.ndarray, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, *values: int) -> str:
        return self.constant(np.array(values, dtype=np.int64), "ints")

    def weight(self, name: str) -> str:
        """An initializer from weights.safetensors, as stored."""
        if name not in self.spec.tensors:
            raise KeyError(f"weights.safetensors has no tensor '{name}'")
        self.used_weights.add(name)
        return name

    def weight_f32(self, name: str) -> str:
        """An F32 initializer from weights.safetensors (vectors: norms, biases, RoPE tables); anything else is an
        error, because a Cast of a weight becomes an fp32 copy of it in a TensorRT engine."""
        stored = self.weight(name)
        found = self.spec.tensors[name].dtype
        if found != "F32":
            raise ValueError(f"weights.safetensors tensor '{name}': expected dtype F32, found {found}")
        return stored

    def weight_type(self, name: str) -> int:
        """The ONNX element type of a weight as stored."""
        return ONNX_DTYPES[self.spec.tensors[name].dtype]

    def dequantized(self, name: str) -> str:
        """A quantized matrix [rows, cols] as float32: DequantizeLinear over its codes and float32 scales (once per
        graph: a tied embedding's lookup and the LM head read the same node). An asymmetric int4 matrix: its codes
        through DequantizeLinear with scale 1 (exact), then (code + 8) * scale + min per group, as quant.dequantize
        computes it (the product exact, one rounding)."""
        if name in self.dequantized_matrices:
            return self.dequantized_matrices[name]
        group_size = self.spec.group_size
        scales = self.op("Cast", [self.weight(name + SCALES_SUFFIX)], hint=f"{name}.scales.f32", to=TensorProto.FLOAT)
        if name + MINS_SUFFIX in self.spec.tensors:
            matrix = self._asymmetric_values(name, scales)
        else:
            matrix = self.op(
                "DequantizeLinear", [self.weight(name), scales], hint=f"{name}.f32", axis=1, block_size=group_size
            )
        if self.matrix_format(name) == "int4":
            self.int4_codes.add(name)
            columns = int4_onnx_columns(2 * self.spec.tensors[name].shape[1])
            matrix = self.op("Gather", [matrix, self.constant(columns, "int4_columns")], axis=1)
        self.dequantized_matrices[name] = matrix
        return matrix

    def _asymmetric_values(self, name: str, scales: str) -> str:
        """(code + 8) * scale + min [rows, cols] float32 of an asymmetric int4 matrix, in ONNX INT4's element order
        (a permutation within each 32-value block, so each group keeps its values)."""
        rows, width = self.spec.tensors[name].shape
        cols, group_size = 2 * width, self.spec.group_size
        one = self.constant(np.array(1.0, dtype=np.float32), "unit_scale")
        codes = self.op("DequantizeLinear", [self.weight(name), one], hint=f"{name}.codes.f32")
        groups = self.op("Reshape", [codes, self.ints(rows, cols // group_size, group_size)])
        offset = self.constant(np.array(quant.INT4_MIN_OFFSET, dtype=np.float32), "int4_min_offset")
        steps = self.op("Add", [groups, offset])
        mins = self.op("Cast", [self.weight(name + MINS_SUFFIX)], hint=f"{name}.mins.f32", to=TensorProto.FLOAT)
        values = self.op(
            "Add",
            [
                self.op("Mul", [steps, self.op("Unsqueeze", [scales, self.ints(2)])]),
                self.op("Unsqueeze", [mins, self.ints(2)]),
            ],
        )
        return self.op("Reshape", [values, self.ints(rows, cols)], hint=f"{name}.f32")

    def dequantized_rows(self, name: str, rows: str) -> str:
        """Rows [T] int64 of a quantized matrix [rows, cols] as float32 [T, cols], read from its codes as INT32 words
        (the view QuantizedMatMul takes, so the graph holds the matrix once) and its fp16 scales, in standard integer
        ops TensorRT and ONNX Runtime both run (no bit operations: TensorRT has none on INT32).

        A word w holds `per_word` codes of `bits` bits, code k in bits [k bits, (k + 1) bits) (little-endian bytes;
        int4: nibble memory order, which is ONNX INT4's element order). Every division is of non-negative values,
        so truncating and flooring agree: the sign bit is taken out first (low = w + 2^31 for w < 0, in two steps
        that never leave int32's range), digit k is low / 2^(k bits) mod 2^bits, plus 2^(bits - 1) for the top
        digit of a negative word, and a digit u is the code u - 2^bits * (u / 2^(bits - 1)) (two's complement).
        Each value is then code * scale in float32, exact, as DequantizeLinear computes it; an asymmetric int4 matrix's
        (code + 8) * scale, exact, plus the group's minimum, rounded once, as quant.dequantize computes it."""
        bits = 8 if self.matrix_format(name) == "int8" else 4
        per_word, base, half = 32 // bits, 1 << bits, 1 << (bits - 1)

        def int32(value, hint: str = "const") -> str:
            return self.constant(np.array(value, dtype=np.int32), hint)

        words = self.op("Gather", [self.weight(name), rows], hint=f"{name}.rows", axis=0)  # [T, W] int32
        self.code_words.add(name)
        negative = self.op("Less", [words, int32(0)])
        sign = self.op("Unsqueeze", [self.op("Cast", [negative], to=TensorProto.INT32), self.ints(2)])  # [T, W, 1]
        lifted = self.op("Add", [words, self.op("Where", [negative, int32(np.iinfo(np.int32).max), int32(0)])])
        low = self.op("Add", [self.op("Unsqueeze", [lifted, self.ints(2)]), sign])  # [T, W, 1] in [0, 2^31)
        places = int32([1 << (bits * k) for k in range(per_word)], "digit_places")
        shifted = self.op("Div", [low, places])  # [T, W, per_word]
        top_digit = int32([0] * (per_word - 1) + [half], "sign_digit_place")
        remainder = self.op("Sub", [shifted, self.op("Mul", [self.op("Div", [shifted, int32(base)]), int32(base)])])
        digits = self.op("Add", [remainder, self.op("Mul", [sign, top_digit])])  # unsigned, in [0, base)
        codes = self.op("Sub", [digits, self.op("Mul", [self.op("Div", [digits, int32(half)]), int32(base)])])
        cols = self.spec.tensors[name].shape[1] * (8 // bits)
        codes = self.op("Reshape", [codes, self.ints(-1, cols)])
        if bits == 4:
            codes = self.op("Gather", [codes, self.constant(int4_onnx_columns(cols), "int4_columns")], axis=1)
        group_size = self.spec.group_size
        values = self.op(
            "Reshape", [self.op("Cast", [codes], to=TensorProto.FLOAT), self.ints(-1, cols // group_size, group_size)]
        )

        def group_rows(part: str) -> str:  # [T, cols / G, 1] float32: the rows' scales or minimums
            gathered = self.op("Gather", [self.weight(name + part), rows], hint=f"{name}{part}.rows", axis=0)
            return self.op("Unsqueeze", [self.op("Cast", [gathered], to=TensorProto.FLOAT), self.ints(2)])

        if name + MINS_SUFFIX in self.spec.tensors:
            offset = self.constant(np.array(quant.INT4_MIN_OFFSET, dtype=np.float32), "int4_min_offset")
            steps = self.op("Mul", [self.op("Add", [values, offset]), group_rows(SCALES_SUFFIX)])
            values = self.op("Add", [steps, group_rows(MINS_SUFFIX)])
        else:
            values = self.op("Mul", [values, group_rows(SCALES_SUFFIX)])
        return self.op("Reshape", [values, self.ints(-1, cols)], hint=f"{name}.rows.f32")

    def quantized(self, name: str) -> list[str]:
        """A quantized matrix as the quantized custom ops take it: its codes as INT32 words and its fp16 scales (its
        minimums are inputs of their own, after the op's others: `minimums`)."""
        self.code_words.add(name)
        return [self.weight(name), self.weight(name + SCALES_SUFFIX)]

    def minimums(self, name: str) -> list[str]:
        """The fp16 group minimums of an asymmetric int4 matrix as the quantized custom ops take them, or none."""
        return [self.weight(name + MINS_SUFFIX)] if name + MINS_SUFFIX in self.spec.tensors else []

    def zero_thresholds(self) -> str:
        """float32 zeros [D]: the thresholds of a QuantizedSparseFFN node that takes minimums and whose predictor has
        none (the same as none, OPS.md), one initializer that every layer's node reads."""
        if self.shared_zero_thresholds is None:
            zeros = np.zeros(self.spec.config.intermediate_size, dtype=np.float32)
            self.shared_zero_thresholds = self.constant(zeros, "zero_thresholds")
        return self.shared_zero_thresholds

    def matrix_format(self, name: str) -> str:
        """The format (int8 | int4) a quantized matrix's codes are stored in."""
        return quantized_format(self.spec.tensors[name].dtype)

    def quantized_layout(self, name: str) -> dict[str, str | int]:
        """The weight_format and group_size attributes of a quantized custom op reading matrix `name`: its stored
        format, int4_asymmetric for an int4 matrix with minimums."""
        asymmetric = name + MINS_SUFFIX in self.spec.tensors
        weight_format = ops.ASYMMETRIC_WEIGHT_FORMAT if asymmetric else self.matrix_format(name)
        return {"weight_format": weight_format, "group_size": self.spec.group_size}

    def external_initializers(self) -> list[TensorProto]:
        both = self.code_words & self.int4_codes
        if both:  # one initializer per name: a graph reads a matrix either way, never both
            raise ValueError(f"weights {sorted(both)} are read both as INT4 codes and as INT32 words in one graph")

        def initializer(name: str) -> TensorProto:
            if name in self.code_words:
                return _word_initializer(self.spec.tensors[name], self.spec.weights_file)
            if name in self.int4_codes:
                return _int4_initializer(self.spec.tensors[name], self.spec.weights_file)
            return external_initializer(self.spec.tensors[name], self.spec.weights_file)

        return [initializer(name) for name in sorted(self.used_weights)]


def _rms_norm(g: GraphBuilder, x: str, weight: str, eps: float) -> str:
    # x: [..., d] float32 -> x / sqrt(mean(x^2) + eps) * weight
    mean_square = g.op("ReduceMean", [g.op("Mul", [x, x]), g.ints(-1)], keepdims=1)
    denominator = g.op("Sqrt", [g.op("Add", [mean_square, g.constant(np.array(eps, dtype=np.float32))])])
    return g.op("Mul", [g.op("Div", [x, denominator]), g.weight_f32(weight)])


def _matmul(g: GraphBuilder, x2d: str, weight: str, transposed: bool) -> str:
    """x2d [T, in] float32 times a stored matrix ([out, in] when transposed, else [in, out]) -> [T, out] float32.

    The matrix is read in its bundle dtype: for fp16/bf16 the activation is cast to it and the product cast back.
    The product's accumulation is the executor's: TensorRT's fp16/bf16 GEMM kernels and ONNX Runtime's CPU MatMul
    take fp16 inputs; its output is rounded to fp16/bf16 once, before the cast back to float32. Everything that
    needs more range or precision stays float32: the residual stream, RMSNorm's mean of squares, attention scores
    and softmax, the KV cache, the bias adds and the logits after the cast."""
    if weight + ".scales" in g.spec.tensors and g.quantized_ops:  # the QuantizedMatMul plugin, reading the codes
        inputs = [x2d, *g.quantized(weight), *g.minimums(weight)]
        layout = g.quantized_layout(weight)
        return g.custom("QuantizedMatMul", inputs, hint=weight, transposed=int(transposed), **layout)
    if weight + ".scales" in g.spec.tensors:  # DequantizeLinear -> Gemm in standard ops (prefill.onnx)
        return g.op("Gemm", [x2d, g.dequantized(weight)], hint=weight, transB=int(transposed))
    stored = g.weight(weight)
    weight_type = g.weight_type(weight)
    if weight_type == TensorProto.FLOAT:
        return g.op("Gemm", [x2d, stored], hint=weight, transB=int(transposed))
    cast = g.op("Cast", [x2d], hint=f"{weight}.input", to=weight_type)
    product = g.op("Gemm", [cast, stored], hint=weight, transB=int(transposed))
    return g.op("Cast", [product], hint=f"{weight}.f32", to=TensorProto.FLOAT)


def _linear(g: GraphBuilder, x2d: str, name: str, bias: bool = False) -> str:
    # x2d: [T, in]; weight [out, in] as Hugging Face stores it -> [T, out]; the F32 bias added in float32
    product = _matmul(g, x2d, f"{name}.weight", transposed=True)
    return g.op("Add", [product, g.weight_f32(f"{name}.bias")]) if bias else product


def _rotate_half(g: GraphBuilder, x: str, half: int) -> str:
    # x: [B, H, S, hd] -> cat(-x[..., half:], x[..., :half])
    first = g.op("Slice", [x, g.ints(0), g.ints(half), g.ints(-1)])
    second = g.op("Slice", [x, g.ints(half), g.ints(2 * half), g.ints(-1)])
    return g.op("Concat", [g.op("Neg", [second]), first], axis=-1)


def _rope(g: GraphBuilder, x: str, cos: str, sin: str, head_dim: int) -> str:
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [_rotate_half(g, x, head_dim // 2), sin])])


@dataclass
class _Context:
    """Values every layer reads: shapes, RoPE rows for this step's positions, the attention bias."""

    batch_seq: str  # [2] int64: (B, S)
    tokens: str  # [1] int64: B*S
    cos: str  # [B, 1, S, hd]
    sin: str
    attention_bias: str  # [S, L] float32: 0 where allowed, -inf elsewhere


def _context(g: GraphBuilder, config: ModelConfig) -> _Context:
    batch_seq = g.op("Shape", ["input_ids"])
    tokens = g.op("ReduceProd", [batch_seq], keepdims=1)
    cos = g.op("Unsqueeze", [g.op("Gather", [g.weight("rope.cos"), "position_ids"]), g.ints(1)])
    sin = g.op("Unsqueeze", [g.op("Gather", [g.weight("rope.sin"), "position_ids"]), g.ints(1)])
    # Causal (and sliding-window) mask over past + new positions; queries sit at past_seq + 0..seq-1.
    past = g.op("Squeeze", [g.op("Shape", ["past_key_values.0.key"], start=2, end=3), g.ints(0)])
    seq = g.op("Squeeze", [g.op("Shape", ["input_ids"], start=1, end=2), g.ints(0)])
    total = g.op("Add", [past, seq])
    one = g.constant(np.array(1, dtype=np.int64))
    key_positions = g.op("Unsqueeze", [g.op("Range", [g.constant(np.array(0, dtype=np.int64)), total, one]), g.ints(0)])
    query_positions = g.op("Unsqueeze", [g.op("Range", [past, total, one]), g.ints(1)])
    allowed = g.op("LessOrEqual", [key_positions, query_positions])  # [S, L]
    if config.sliding_window is not None:
        window_start = g.op("Sub", [query_positions, g.constant(np.array(config.sliding_window, dtype=np.int64))])
        allowed = g.op("And", [allowed, g.op("Greater", [key_positions, window_start])])
    bias = g.op(
        "Where",
        [
            allowed,
            g.constant(np.array(0.0, dtype=np.float32)),
            g.constant(np.array(NEGATIVE_INFINITY, dtype=np.float32)),
        ],
    )
    return _Context(batch_seq, tokens, cos, sin, bias)


def _prompt_rows(g: GraphBuilder, ctx: _Context) -> str:
    """[1] int64: B*S on an empty KV cache (a prompt), else 0 (a decode step)."""
    past = g.op("Shape", ["past_key_values.0.key"], start=2, end=3)
    return g.op("Where", [g.op("Less", [past, g.ints(1)]), ctx.tokens, g.ints(0)])


def _attention(g: GraphBuilder, config: ModelConfig, layer: int, x2d: str, ctx: _Context) -> tuple[str, str, str]:
    """Self-attention with KV cache: x2d [T, d] -> (out [T, d], present key, present value)."""
    prefix = f"layers.{layer}.self_attn"
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim

    def heads_first(projection: str, count: int) -> str:
        # [T, count*hd] -> [B, count, S, hd]
        shaped = g.op("Reshape", [projection, g.op("Concat", [ctx.batch_seq, g.ints(count, head_dim)], axis=0)])
        return g.op("Transpose", [shaped], perm=[0, 2, 1, 3])

    q = heads_first(_linear(g, x2d, f"{prefix}.q_proj", config.qkv_bias), heads)
    k = heads_first(_linear(g, x2d, f"{prefix}.k_proj", config.qkv_bias), kv_heads)
    v = heads_first(_linear(g, x2d, f"{prefix}.v_proj", config.qkv_bias), kv_heads)
    q, k = _rope(g, q, ctx.cos, ctx.sin, head_dim), _rope(g, k, ctx.cos, ctx.sin, head_dim)
    present_key = f"present.{layer}.key"
    present_value = f"present.{layer}.value"
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{layer}.key", k], [present_key], axis=2))
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{layer}.value", v], [present_value], axis=2))

    def repeat_kv(cache: str) -> str:
        # [B, Hkv, L, hd] -> [B, H, L, hd]: each kv head serves H / Hkv query heads (GQA)
        if heads == kv_heads:
            return cache
        expanded = g.op("Expand", [g.op("Unsqueeze", [cache, g.ints(2)]), g.ints(1, 1, heads // kv_heads, 1, 1)])
        return g.op("Reshape", [expanded, g.ints(0, heads, -1, head_dim)])

    keys_t = g.op("Transpose", [repeat_kv(present_key)], perm=[0, 1, 3, 2])
    scale = g.constant(np.array(1.0 / math.sqrt(head_dim), dtype=np.float32))
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, keys_t]), scale]), ctx.attention_bias])
    weights = g.op("Softmax", [scores], axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [weights, repeat_kv(present_value)])], perm=[0, 2, 1, 3])
    context2d = g.op("Reshape", [context, g.ints(-1, heads * head_dim)])
    return _linear(g, context2d, f"{prefix}.o_proj", config.o_bias), present_key, present_value


def _activation_gate(g: GraphBuilder, config: ModelConfig, gate: str) -> str:
    activation = config.activation
    if activation.kind == "silu":
        return g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    if activation.kind == "fatrelu":
        threshold = g.constant(np.array(activation.threshold, dtype=np.float32))
        zero = g.constant(np.array(0.0, dtype=np.float32))
        return g.op("Where", [g.op("Greater", [gate, threshold]), gate, zero])
    return g.op("Relu", [gate])


def _dense_ffn(
    g: GraphBuilder,
    config: ModelConfig,
    layer: int,
    x2d: str,
    rows: str,
    ctx: _Context,
    outputs: list[onnx.ValueInfoProto],
) -> str:
    """Prefill FFN in standard ops: x2d [T, d] (a prompt's rows; rows: [1] int64 = T) -> [T, d], and the outputs the
    predictor kind adds (core: the gate activations)."""
    prefix = f"layers.{layer}.mlp"
    gate = _activation_gate(g, config, _linear(g, x2d, f"{prefix}.gate_proj"))
    up = _linear(g, x2d, f"{prefix}.up_proj")
    if config.activation.kind == "drelu":
        up = g.op("Relu", [up])
    hidden = g.op("Mul", [gate, up])
    g.spec.kind.emit_prompt_outputs(g, layer, gate, rows, ctx, outputs)
    return _matmul(g, hidden, f"{prefix}.down_proj.weight_t", transposed=False)


def _step_ffn(
    g: GraphBuilder,
    config: ModelConfig,
    layer: int,
    x2d: str,
    prompt_rows: str,
    ctx: _Context,
    outputs: list[onnx.ValueInfoProto],
) -> str:
    """The decode graph's FFN: x2d [T, d] -> [T, d], the dense FFN on a prompt's rows (prompt_rows, _prompt_rows),
    the predictor and SparseFFN on a decode step's; the other branch gets zero rows, so one graph (one TensorRT
    engine, one copy of the weights) serves both without control flow."""
    end = g.constant(np.array([np.iinfo(np.int64).max], dtype=np.int64))
    prompt = g.op("Slice", [x2d, g.ints(0), prompt_rows, g.ints(0)])
    step = g.op("Slice", [x2d, prompt_rows, end, g.ints(0)])
    dense = _dense_ffn(g, config, layer, prompt, prompt_rows, ctx, outputs)
    return g.op("Concat", [dense, _sparse_ffn(g, config, layer, step, prompt_rows, ctx)], axis=0)


def _sparse_ffn(g: GraphBuilder, config: ModelConfig, layer: int, x2d: str, prompt_rows: str, ctx: _Context) -> str:
    """Decode FFN: the layer's predictor mask (its kind's emit_step_mask), then the SparseFFN custom op: x2d [T, d]
    (a decode step's rows, those of the B*S tokens after the prompt_rows) -> [T, d]."""
    prefix = f"layers.{layer}"
    mask, thresholds = g.spec.kind.emit_step_mask(g, layer, x2d, prompt_rows, ctx)
    # dense decoding predicts every neuron active; the mask stays int32 into the plugin (OPS.md, the mask)
    mask = g.op("Where", ["dense", g.constant(np.array(1, dtype=np.int32)), mask])
    matrices = [f"{prefix}.mlp.gate_proj.weight", f"{prefix}.mlp.up_proj.weight", f"{prefix}.mlp.down_proj.weight_t"]
    activation = config.activation
    attributes = {"activation": activation.kind}
    if activation.kind == "fatrelu":
        attributes["activation_threshold"] = activation.threshold
    minimums: list[str] = []
    if g.quantized_ops:  # codes and scales of each matrix (OPS.md, QuantizedSparseFFN)
        op, weights = "QuantizedSparseFFN", [name for matrix in matrices for name in g.quantized(matrix)]
        attributes |= g.quantized_layout(matrices[0])  # gate and up share the bundle's format
        if g.matrix_format(matrices[2]) != g.matrix_format(matrices[0]):  # int8 down rows (manifest down_dtype)
            attributes["down_weight_format"] = g.matrix_format(matrices[2])
        minimums = [name for matrix in matrices for name in g.minimums(matrix)]
    else:
        op, weights = "SparseFFN", [g.weight(matrix) for matrix in matrices]
    if minimums and thresholds is None:  # the minimums follow thresholds, never an empty name before them
        thresholds = g.zero_thresholds()
    inputs = [x2d, *weights, mask]
    if thresholds is not None:
        inputs.append(thresholds)
    return g.custom(op, [*inputs, *minimums], hint="sparse_ffn", **attributes)


def _embedding(g: GraphBuilder, config: ModelConfig) -> str:
    """The input tokens' embedding rows [T, d] float32. A quantized embedding (a tied model's, which is its LM head
    too): in decode.onnx the rows of its INT32 words dequantized (GraphBuilder.dequantized_rows), in prefill.onnx the
    rows of the LM head's dequantized matrix (ONNX's Gather takes no INT4)."""
    name = "embed_tokens.weight"
    if name + ".scales" in g.spec.tensors:
        ids = g.op("Reshape", ["input_ids", g.ints(-1)])  # [T]
        if g.quantized_ops:
            return g.dequantized_rows(name, ids)
        return g.op("Gather", [g.dequantized(name), ids], hint="embeddings.f32")
    embeddings = g.op("Gather", [g.weight(name), "input_ids"])  # [B, S, d] as stored
    if g.weight_type(name) != TensorProto.FLOAT:
        embeddings = g.op("Cast", [embeddings], hint="embeddings.f32", to=TensorProto.FLOAT)
    return g.op("Reshape", [embeddings, g.ints(-1, config.hidden_size)])


def _io(config: ModelConfig, decode: bool, kind: predictors.PredictorKind) -> tuple[list, list]:
    """The graph's value infos: the interface bundle/graph_io.py defines for its phase (which Bundle.open checks),
    then the decode inputs the predictor kind adds; the kind's prompt outputs are added as its FFNs are built."""
    interface = graph_io.graph_interface(config, "decode" if decode else "prefill")
    inputs = [_value_info(value) for value in interface.inputs]
    outputs = [_value_info(value) for value in interface.outputs]
    if decode:
        inputs += kind.decode_inputs(config)
    return inputs, outputs


def _value_info(value: graph_io.GraphValue) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, ONNX_DTYPES[value.dtype], list(value.shape))


def build_graph(spec: GraphSpec, decode: bool) -> onnx.ModelProto:
    """The prefill (decode=False) or decode (decode=True) decoder graph."""
    config = spec.config
    g = GraphBuilder(spec, quantized_ops=decode)
    inputs, outputs = _io(config, decode, spec.kind)
    ctx = _context(g, config)
    hidden = _embedding(g, config)  # [T, d]
    ffn: Callable[[int, str], str]
    if decode:
        prompt_rows = _prompt_rows(g, ctx)
        ffn = lambda layer, x: _step_ffn(g, config, layer, x, prompt_rows, ctx, outputs)  # noqa: E731
    else:
        ffn = lambda layer, x: _dense_ffn(g, config, layer, x, ctx.tokens, ctx, outputs)  # noqa: E731
    for layer in range(config.num_layers):
        prefix = f"layers.{layer}"
        normed = _rms_norm(g, hidden, f"{prefix}.input_layernorm.weight", config.rms_norm_eps)
        attention, _, _ = _attention(g, config, layer, normed, ctx)
        hidden = g.op("Add", [hidden, attention])
        normed = _rms_norm(g, hidden, f"{prefix}.post_attention_layernorm.weight", config.rms_norm_eps)
        hidden = g.op("Add", [hidden, ffn(layer, normed)])
    final = _rms_norm(g, hidden, "norm.weight", config.rms_norm_eps)
    lm_head = "embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    logits2d = _matmul(g, final, lm_head, transposed=True)
    logits_shape = g.op("Concat", [ctx.batch_seq, g.ints(config.vocab_size)], axis=0)
    g.nodes.append(helper.make_node("Reshape", [logits2d, logits_shape], ["logits"]))

    graph = helper.make_graph(
        g.nodes,
        "edge_sdk_decode" if decode else "edge_sdk_prefill",
        inputs,
        outputs,
        initializer=g.external_initializers() + g.initializers,
    )
    # a model and the functions it calls import one version of the standard domain: 21 for quantized bundles
    opset = ops.STANDARD_OPSET_VERSION if spec.quant_format is None else ops.QUANTIZED_OPSET_VERSION
    model = helper.make_model(
        graph,
        opset_imports=ops.function_opset_imports(opset),
        functions=ops.reference_functions(opset) if decode else [],
        producer_name="edge-sdk",
    )
    model.ir_version = ops.IR_VERSION
    return model
