"""The custom ops' reference decompositions: one model-local ONNX function per op in standard ops, which ONNX
Runtime runs in place of the custom node."""

from __future__ import annotations

import onnx
import onnx.parser
from onnx import helper

from edge_sdk.bundle.graph_ops import DOMAIN, OPSET_VERSION
from edge_sdk.export.ops.schemas import SCHEMAS

# The standard ("" domain) opset of the reference functions. ONNX requires a model that uses a function to
# import the same version, so this is the decoder graph's opset too. 19 is the first with Equal on strings
# (the activation selection below) and is inside TensorRT 10's parser range (opsets 9 to 20).
STANDARD_OPSET_VERSION = 19
# The quantized ops' functions dequantize with DequantizeLinear's block_size, new in opset 21; a model holding them
# (an int8 / int4 bundle's graphs) imports 21 for the graph and every function (the float ops' bodies use no op that
# changed from 19 to 21).
QUANTIZED_OPSET_VERSION = 21
QUANTIZED_OPS = ("QuantizedSparseFFN", "QuantizedMatMul")
# onnx 1.23 writes IR version 14 by default, which ONNX Runtime 1.31 refuses; 10 is accepted by both.
IR_VERSION = 10


def signature(op: str, opset: int | None = None) -> str:
    """The function header of an op's decomposition: domain, standard opset (by default the lowest the op's body
    needs), attributes with defaults."""
    schema = SCHEMAS[op]
    if opset is None:
        opset = QUANTIZED_OPSET_VERSION if op in QUANTIZED_OPS else STANDARD_OPSET_VERSION
    attributes = []
    for attribute in schema.attributes:
        if attribute.optional:  # absent from the node: the empty string
            attributes.append(f'{attribute.name}: {attribute.type} = ""')
        elif attribute.default is None:
            attributes.append(attribute.name)
        elif attribute.type == "string":
            attributes.append(f'{attribute.name}: string = "{attribute.default}"')
        else:
            attributes.append(f"{attribute.name}: {attribute.type} = {attribute.default!r}")
    inputs = ", ".join(spec.name for spec in schema.inputs)
    outputs = ", ".join(spec.name for spec in schema.outputs)
    return (
        f'<domain: "{DOMAIN}", opset_import: ["" : {opset}]>\n'
        f"{op} <{', '.join(attributes)}>\n({inputs}) => ({outputs})\n"
    )


# Value of bit j of a two's complement int32 word: 2^j, and -2^31 for bit 31. ANDing a word with it isolates
# the bit without shifting signed values (ONNX BitShift only takes unsigned types).
_BIT_VALUES = ", ".join(str(1 << j) for j in range(31)) + f", {-(1 << 31)}"

# The reference decompositions in the ONNX textual syntax (onnx.parser). `@name` reads the node's attribute.
FUNCTION_BODIES = {
    "SvdPredictor": """{
    xf = Cast <to = 1> (x)                                  # [T, d] float32
    af = Cast <to = 1> (a)                                  # [D, r] float32 (float16 factors widened, exactly)
    bf = Cast <to = 1> (b)                                  # [r, d] float32
    low = Gemm <transB = 1> (xf, bf)                        # [T, r] = x b^T
    scores = Gemm <transB = 1> (low, af, bias)              # [T, D] = (x b^T) a^T + bias
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


# Quantized matrices (QuantizedSparseFFN, QuantizedMatMul) arrive as INT32 words holding the bundle's bytes. The
# decompositions turn them back into int8 codes with integer ops only (BitShift takes no signed types): ANDing a word
# with a byte's mask and dividing by its place value is exact, and adding 256 then Mod 256 gives the byte 0..255; an
# int8 code is that byte as two's complement, an int4 block's 16 bytes hold values k (low nibbles) and 16 + k (high
# nibbles), each nibble as two's complement. DequantizeLinear with block_size (opset 21) then multiplies code and
# float32 scale, exactly, into the float32 matrix edge_sdk.quant.dequantize gives.
# int4_asymmetric adds a group minimum: (code + 8) * scale, exact (DequantizeLinear with zero point -8), plus the
# minimum, rounded once, as quant.dequantize computes it. The minimums are optional inputs that symmetric nodes leave
# off, and most ops reject an absent input, so the body reads them only as the optional bias B of a
# LayerNormalization over all-zero X (normalized, 0) with scale -0.0: 0 * (-0.0) + B is B exactly, a -0.0 minimum
# included, and -0.0 where B is absent. (Gemm's optional C, as thresholds are read, would need a float16 Gemm, for
# which ONNX Runtime's CPU provider has no kernel of its own; and 0 * 0 + C loses the sign of a -0.0 minimum.) An If
# on weight_format computes only the format's matrix, so a symmetric node's is DequantizeLinear's, as before.
_FORMAT_CONSTANTS = """
    # the weight format, and the constants of the unpacking below
    weight_kind = Constant <value_string: string = @weight_format> ()
    int4_name = Constant <value_string = "int4"> ()
    asymmetric_name = Constant <value_string = "int4_asymmetric"> ()
    is_symmetric_int4 = Equal (weight_kind, int4_name)
    is_asymmetric = Equal (weight_kind, asymmetric_name)
    is_int4 = Or (is_symmetric_int4, is_asymmetric)           # int4's nibbles, with or without minimums
    axis_end = Constant <value_ints = [-1]> ()
    byte_masks = Constant <value = int32[4] {255, 65280, 16711680, -16777216}> ()
    byte_units = Constant <value = int32[4] {1, 256, 65536, 16777216}> ()
    int_256 = Constant <value = int32 {256}> ()
    int_128 = Constant <value = int32 {128}> ()
    int_16 = Constant <value = int32 {16}> ()
    int_8 = Constant <value = int32 {8}> ()
    code_block_shape = Constant <value_ints = [0, -1, 16, 2]> ()
    code_row_shape = Constant <value_ints = [0, -1]> ()
"""


def _dequantized(codes: str, matrix: str, int4: str = "is_int4", asymmetric: str = "is_asymmetric") -> str:
    """Body lines making `matrix` [R, C] float32 from the inputs `codes` [R, C / v] INT32, `codes`_scales and, for
    int4_asymmetric, `codes`_mins; int4, asymmetric: the body's booleans saying the matrix's format."""
    p = codes
    return f"""
    # {codes} [R, C / v] INT32 words -> {matrix} [R, C] float32
    {p}_words = Unsqueeze ({codes}, axis_end)               # [R, C / v, 1]
    {p}_masked = BitwiseAnd ({p}_words, byte_masks)         # [R, C / v, 4]
    {p}_shifted = Div ({p}_masked, byte_units)              # exact: bytes 0..2 as 0..255, byte 3 as -128..127
    {p}_lifted = Add ({p}_shifted, int_256)
    {p}_bytes = Mod ({p}_lifted, int_256)                   # [R, C / v, 4]: the bytes, 0..255
    {p}_codes = If ({int4}) <
        then_branch = {p}_nibbles () => (int8[?, ?] {p}_int4) {{
            {p}_low = Mod ({p}_bytes, int_16)
            {p}_high = Div ({p}_bytes, int_16)
            {p}_low_lift = Add ({p}_low, int_8)
            {p}_low_wrap = Mod ({p}_low_lift, int_16)
            {p}_low_code = Sub ({p}_low_wrap, int_8)        # the low nibble as two's complement
            {p}_high_lift = Add ({p}_high, int_8)
            {p}_high_wrap = Mod ({p}_high_lift, int_16)
            {p}_high_code = Sub ({p}_high_wrap, int_8)
            {p}_low_end = Unsqueeze ({p}_low_code, axis_end)
            {p}_high_end = Unsqueeze ({p}_high_code, axis_end)
            {p}_pairs = Concat <axis = -1> ({p}_low_end, {p}_high_end)  # [R, C / 8, 4, 2]
            {p}_blocks = Reshape ({p}_pairs, code_block_shape)  # [R, C / 32, 16, 2]: each byte, low and high
            {p}_ordered = Transpose <perm = [0, 1, 3, 2]> ({p}_blocks)  # values k, then 16 + k, of each block
            {p}_flat = Reshape ({p}_ordered, code_row_shape)     # [R, C]
            {p}_int4 = Cast <to = 3> ({p}_flat)
        }},
        else_branch = {p}_signed_bytes () => (int8[?, ?] {p}_int8) {{
            {p}_lift = Add ({p}_bytes, int_128)
            {p}_wrap = Mod ({p}_lift, int_256)
            {p}_centred = Sub ({p}_wrap, int_128)           # the byte as two's complement
            {p}_row = Reshape ({p}_centred, code_row_shape)      # [R, C]
            {p}_int8 = Cast <to = 3> ({p}_row)
        }}
    >
    {p}_scale32 = Cast <to = 1> ({codes}_scales)
    # the minimums (absent from a symmetric node): LayerNormalization's optional bias, 0 * (-0.0) + min = min
    {p}_group_shape = Shape ({codes}_scales)                # [2] = R, C / G
    {p}_zeros16 = ConstantOfShape <value = float16[1] {{0}}> ({p}_group_shape)
    {p}_negative_zeros16 = ConstantOfShape <value = float16[1] {{32768}}> ({p}_group_shape)  # bits 0x8000: -0.0
    {p}_min16 = LayerNormalization <axis = 0> ({p}_zeros16, {p}_negative_zeros16, {codes}_mins)  # [R, C / G]
    {matrix} = If ({asymmetric}) <
        then_branch = {p}_with_minimums () => (float[?, ?] {p}_asymmetric) {{
            {p}_offset = ConstantOfShape <value = int8[1] {{-8}}> ({p}_group_shape)  # zero point -8: code + 8
            {p}_steps = DequantizeLinear <axis = 1, block_size: int = @group_size> ({p}_codes, {p}_scale32, {p}_offset)
            {p}_min32 = Cast <to = 1> ({p}_min16)
            {p}_code_shape = Shape ({p}_codes)
            {p}_ones = ConstantOfShape <value = int8[1] {{1}}> ({p}_code_shape)
            {p}_min_values = DequantizeLinear <axis = 1, block_size: int = @group_size> ({p}_ones, {p}_min32)
            {p}_asymmetric = Add ({p}_steps, {p}_min_values)  # (code + 8) * scale exact, + min rounded once
        }},
        else_branch = {p}_scaled () => (float[?, ?] {p}_symmetric) {{
            {p}_symmetric = DequantizeLinear <axis = 1, block_size: int = @group_size> ({p}_codes, {p}_scale32)
        }}
    >
"""


# down_weight_format "int8" (int8 rows under int4 gate and up rows, no minimums), read from the words' shapes: int8 down
# rows have twice as many words per row as the int4 gate rows, and every other allowed node has equal widths. The
# body does not read the optional attribute: an absent one needs the function's default (attribute_proto), which
# ONNX Runtime binds but onnx's own inliner (onnx.inliner) and ReferenceEvaluator (1.23) drop, leaving a Constant
# without a value.
_DOWN_FORMAT_CONSTANTS = """
    gate_words = Shape <start = 1, end = 2> (w_gate)        # [1] = d / v
    down_words = Shape <start = 1, end = 2> (w_down_t)      # [1] = d / 4 for int8 down rows under int4 ones
    same_words = Equal (gate_words, down_words)
    down_as_weights = Squeeze (same_words)                  # scalar: the down rows in weight_format
    down_is_int4 = And (is_int4, down_as_weights)
    down_is_asymmetric = And (is_asymmetric, down_as_weights)
"""


def _quantized_sparse_ffn_body() -> str:
    """SparseFFN's body on the three dequantized matrices in place of its Casts of float weights."""
    lines = FUNCTION_BODIES["SparseFFN"].strip().removeprefix("{").removesuffix("}").splitlines()
    casts = ("gate_w = Cast", "up_w = Cast", "down_w = Cast")
    kept = "\n".join(line for line in lines if not line.strip().startswith(casts))
    dequantized = (
        _dequantized("w_gate", "gate_w")
        + _dequantized("w_up", "up_w")
        + _dequantized("w_down_t", "down_w", "down_is_int4", "down_is_asymmetric")
    )
    return "{" + _FORMAT_CONSTANTS + _DOWN_FORMAT_CONSTANTS + dequantized + kept + "\n}"


FUNCTION_BODIES["QuantizedSparseFFN"] = _quantized_sparse_ffn_body()
FUNCTION_BODIES["QuantizedMatMul"] = (
    "{"
    + _FORMAT_CONSTANTS
    + _dequantized("w", "matrix")
    + """
    xf = Cast <to = 1> (x)                                  # [T, K]
    y = Gemm <transB: int = @transposed> (xf, matrix)       # [T, N]: x W^T (transposed = 1) or x W
}"""
)


def reference_functions(opset: int = STANDARD_OPSET_VERSION) -> list[onnx.FunctionProto]:
    """One model-local function per op, to append to ModelProto.functions, so ONNX Runtime runs the custom nodes.

    opset: the model's standard opset, which every function imports: STANDARD_OPSET_VERSION (float bundles: the
    float ops), or QUANTIZED_OPSET_VERSION (int8 / int4 bundles: every op, the quantized ones included).
    A function's attributes include plugin_version and plugin_namespace, which the body never reads:
    declaring them is what lets onnx.checker accept them on the node.
    """
    if opset not in (STANDARD_OPSET_VERSION, QUANTIZED_OPSET_VERSION):
        raise ValueError(f"opset: expected {STANDARD_OPSET_VERSION} or {QUANTIZED_OPSET_VERSION}, found {opset}")
    ops = [op for op in SCHEMAS if opset == QUANTIZED_OPSET_VERSION or op not in QUANTIZED_OPS]
    return [onnx.parser.parse_function(signature(op, opset) + FUNCTION_BODIES[op]) for op in ops]


def function_opset_imports(opset: int = STANDARD_OPSET_VERSION) -> list[onnx.OperatorSetIdProto]:
    """The opsets a model holding reference_functions(opset) must import: edge_sdk and that standard opset."""
    return [helper.make_opsetid(DOMAIN, OPSET_VERSION), helper.make_opsetid("", opset)]
