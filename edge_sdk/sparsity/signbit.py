"""Sign-bit predictor (SparseInfer, Jetson): guess sign(W_gate_i . x) from sign bits alone.

Each product w_ij * x_j is negative exactly when the sign bits of w_ij and x_j differ, so XOR of the
packed sign bits followed by popcount counts the negative products N_neg of a row; N_pos = d - N_neg.
Following the paper's eq. (2), neuron i is predicted inactive when

    alpha * N_pos < N_neg

and active otherwise (ties count as active). A larger alpha demands more negative products before a
neuron is skipped, so alpha > 1 is more conservative (predicts more neurons active, a superset of what a
smaller alpha predicts) and alpha < 1 more aggressive. The paper's CUDA listing writes the comparison
with the opposite skip polarity; the text, eq. (2) and its stated "alpha > 1.0 is more conservative"
agree with the rule above, which is the one implemented here.

Sign convention: an element is negative when it compares < 0. Zero, +0.0 and -0.0 all count as
non-negative (bit 0), so a -0.0 weight or input, whose IEEE sign bit is set, packs as 0 here; a
device that packs raw IEEE sign bits must normalise -0.0 first to match.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

from edge_sdk.errors import CalibrationError

BITS_PER_WORD = 32
# Up to this many tokens, N_neg is computed as XOR + popcount; above it, with one matmul of unpacked bits.
_XOR_MAX_TOKENS = 16
# Elements per intermediate tensor, so that memory stays bounded for long calibration runs.
_CHUNK_ELEMENTS = 1 << 24

_SHIFTS = torch.arange(BITS_PER_WORD, dtype=torch.int32)
# Value of bit j in a two's complement int32: 2^j, and -2^31 for bit 31. Any partial sum stays in range.
_BIT_VALUES = torch.tensor([1 << j for j in range(BITS_PER_WORD - 1)] + [-(1 << 31)], dtype=torch.int32)
_POPCOUNT16 = torch.tensor([bin(v).count("1") for v in range(1 << 16)], dtype=torch.int32)


def words_for(d: int) -> int:
    """Number of int32 words holding d sign bits."""
    return (d + BITS_PER_WORD - 1) // BITS_PER_WORD


def pack_sign_bits(w: torch.Tensor) -> torch.Tensor:
    """Pack the sign bits of w, 32 per int32 word.

    w: [..., d] float (a weight matrix [R, d] or inputs [T, d]) -> [..., ceil(d/32)] int32.
    Bit j (LSB first) of word k is 1 when w[..., 32k + j] < 0. Padding bits past d are 0. Words are
    two's complement, so a word whose bit 31 is set is a negative int32.
    """
    d = w.shape[-1]
    n_words = words_for(d)
    negative = torch.nn.functional.pad((w < 0).to(torch.int32), (0, n_words * BITS_PER_WORD - d))
    return (negative.unflatten(-1, (n_words, BITS_PER_WORD)) * _BIT_VALUES).sum(-1, dtype=torch.int32)


def _unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """packed: [R, W] int32 -> [R, 32W] float32 of 0/1 sign bits (LSB first within each word)."""
    return ((packed.unsqueeze(-1) >> _SHIFTS) & 1).flatten(-2).to(torch.float32)


def _popcount_rows(words: torch.Tensor) -> torch.Tensor:
    """words: [..., W] int32 -> [...] int32 set bits per row, via a 16-bit lookup table."""
    halves = words.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [..., 2W] in 0..65535
    return _POPCOUNT16[halves].sum(-1, dtype=torch.int32)


def _check_packed(name: str, packed: torch.Tensor, d: int) -> None:
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise CalibrationError(f"{name}: expected a 2-D int32 tensor, found {packed.dim()}-D {packed.dtype}")
    if packed.shape[1] != words_for(d):
        raise CalibrationError(f"{name}: expected {words_for(d)} words per row for d={d}, found {packed.shape[1]}")


def negative_product_counts(packed_w: torch.Tensor, packed_x: torch.Tensor, d: int) -> torch.Tensor:
    """Number of element-wise products w_ij * x_j predicted negative, per (token, row).

    packed_w: [D, W] int32 sign bits of W_gate; packed_x: [T, W] int32 sign bits of the inputs;
    d: the unpacked length (W = ceil(d/32)). Returns N_neg [T, D] int32 = popcount(row XOR x) summed over
    the words; padding bits are 0 in both operands, so they never count.

    For a few tokens (decode) this is XOR + a popcount table, what the kernels do. For many tokens
    (calibration) the same integers come from popcount(a ^ b) = popcount(a) + popcount(b) - 2 popcount(a & b),
    whose last term summed over words is a dot product of unpacked bits: one float32 matmul, exact
    because every partial sum is an integer below 2^24.
    """
    _check_packed("packed_w", packed_w, d)
    _check_packed("packed_x", packed_x, d)
    if d >= 1 << 24:
        raise CalibrationError(f"d: expected fewer than 2^24 input features, found {d}")
    n_tokens, n_rows = packed_x.shape[0], packed_w.shape[0]
    counts = torch.empty(n_tokens, n_rows, dtype=torch.int32)
    if n_tokens <= _XOR_MAX_TOKENS:
        step = max(1, _CHUNK_ELEMENTS // max(1, packed_w.numel()))
        for start in range(0, n_tokens, step):
            xor = packed_w.unsqueeze(0) ^ packed_x[start : start + step].unsqueeze(1)  # [t, D, W]
            counts[start : start + step] = _popcount_rows(xor)
        return counts
    bits_w = _unpack_bits(packed_w)  # [D, 32W]
    ones_w = bits_w.sum(1)
    step = max(1, _CHUNK_ELEMENTS // max(1, bits_w.shape[1], n_rows))
    for start in range(0, n_tokens, step):
        bits_x = _unpack_bits(packed_x[start : start + step])  # [t, 32W]
        both = bits_x @ bits_w.T  # [t, D]
        counts[start : start + step] = (bits_x.sum(1, keepdim=True) + ones_w - 2 * both).to(torch.int32)
    return counts


def _counts_for_inputs(packed_w: torch.Tensor, x: torch.Tensor, d: int | None) -> tuple[torch.Tensor, int]:
    """x: [T, d] -> (N_neg [T, D] int32, d) after checking d against x."""
    if x.dim() != 2:
        raise CalibrationError(f"x: expected a 2-D tensor [tokens, d], found shape {tuple(x.shape)}")
    if d is None:
        d = x.shape[1]
    elif d != x.shape[1]:
        raise CalibrationError(f"x: expected {d} features (d), found {x.shape[1]}")
    return negative_product_counts(packed_w, pack_sign_bits(x), d), d


def _active_from_counts(n_neg: torch.Tensor, d: int, alpha: float) -> torch.Tensor:
    """n_neg: [...] int32 -> [...] bool, active unless alpha * N_pos < N_neg (compared in float64)."""
    n_neg = n_neg.to(torch.float64)
    return ~(alpha * (d - n_neg) < n_neg)


def signbit_mask(packed_w: torch.Tensor, x: torch.Tensor, alpha: float, d: int | None = None) -> torch.Tensor:
    """Predict which neurons fire for each input token.

    packed_w: [D, W] int32 from pack_sign_bits(W_gate); x: [T, d] or [d] float FFN inputs; alpha: the
    layer's conservativeness (>= 1 predicts more neurons active). Returns bool [T, D] (or [D] for a
    1-D x), True where the neuron is predicted active, i.e. not (alpha * N_pos < N_neg).
    """
    if x.dim() == 1:
        return signbit_mask(packed_w, x.unsqueeze(0), alpha, d)[0]
    n_neg, d = _counts_for_inputs(packed_w, x, d)
    return _active_from_counts(n_neg, d, float(alpha))


def calibrate_alpha(
    packed_w: torch.Tensor,
    x: torch.Tensor,
    truly_active: torch.Tensor,
    recall_target: float,
    *,
    alpha_range: tuple[float, float] = (0.5, 2.0),
) -> float:
    """The most aggressive alpha whose recall of truly active (token, neuron) pairs reaches recall_target.

    packed_w: [D, W] int32 sign bits of W_gate; x: [T, d] calibration inputs; truly_active: [T, D] bool,
    act.gate(W_gate x) != 0. A pair is predicted active iff alpha >= N_neg / N_pos (its critical alpha;
    +inf when N_pos = 0), so recall only grows with alpha and the answer is exact: the k-th smallest
    critical alpha among the truly active pairs, k = ceil(recall_target * #truly active), rounded up to a
    float32 value and nudged up by float32 ulps where needed so that signbit_mask's float64 comparison keeps k
    pairs active. float32 because that is the alpha every runtime compares with: the bundle stores signbit.alpha
    as F32, the C and CUDA kernels take a float, the ONNX function a float attribute; a float64 alpha rounded to
    float32 below a critical ratio N_neg / N_pos would turn every pair at that ratio inactive at run time.

    The result is clipped to alpha_range: its low end when even that reaches the target (or nothing is
    active), its high end when even that does not -- the caller reports the shortfall, e.g. through
    metrics.layer_metrics on the returned alpha.
    """
    low, high = (float(v) for v in alpha_range)
    if not (0.0 <= low <= high < math.inf):
        raise CalibrationError(f"alpha_range: expected 0 <= low <= high < inf, found {alpha_range}")
    if not 0.0 < recall_target <= 1.0:
        raise CalibrationError(f"recall_target: expected a value in (0, 1], found {recall_target}")
    n_neg, d = _counts_for_inputs(packed_w, x, None)
    if truly_active.shape != n_neg.shape or truly_active.dtype != torch.bool:
        raise CalibrationError(
            f"truly_active: expected a bool tensor of shape {tuple(n_neg.shape)}, "
            f"found {truly_active.dtype} {tuple(truly_active.shape)}"
        )
    neg = n_neg[truly_active].to(torch.float64)
    needed = math.ceil(Fraction(repr(float(recall_target))) * neg.numel())
    if needed == 0:
        return low
    pos = d - neg
    critical = torch.where(pos > 0, neg / pos, torch.full_like(neg, math.inf))
    alpha = float(torch.kthvalue(critical, needed).values)
    if alpha > high:
        return high
    alpha = _float32_at_least(alpha)
    while int(_active_from_counts(neg, d, alpha).sum()) < needed:
        alpha = _next_float32(alpha)
    return min(max(alpha, low), high)


def _float32_at_least(value: float) -> float:
    """The smallest float32 value >= value (a finite float64), as a float."""
    rounded = np.float32(value)
    if float(rounded) < value:
        rounded = np.nextafter(rounded, np.float32(np.inf))
    return float(rounded)


def _next_float32(value: float) -> float:
    """The next float32 value above the float32 value `value`."""
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def signbit_max_negatives(d: int, alpha: float) -> int:
    """The largest count of negative products N_neg that sparsity/signbit.signbit_mask predicts active.

    The rule there is: active unless alpha * (d - N_neg) < N_neg, compared in float64. The left side falls
    and the right side grows with N_neg, so the active counts are exactly 0..this value, and the device
    compares integers instead of doubles (float64 is slow or missing on NPUs)."""
    negatives = torch.arange(d + 1, dtype=torch.float64)
    predicted_active = ~(float(alpha) * (d - negatives) < negatives)
    return int(predicted_active.sum()) - 1


def _popcount32(words: torch.Tensor) -> torch.Tensor:
    """words: int32 -> their set-bit counts (int32), by SWAR bit arithmetic.

    The sign bit is counted apart so that every intermediate stays non-negative: no int32 overflow on any
    device. In-place steps keep the temporaries few (each is as large as the packed W_gate)."""
    counts = words & 0x7FFFFFFF
    counts -= (counts >> 1).bitwise_and_(0x55555555)  # 2-bit fields: 0..2
    counts = (counts & 0x33333333).add_((counts >> 2).bitwise_and_(0x33333333))  # 4-bit fields: 0..4
    counts += counts >> 4
    counts &= 0x0F0F0F0F  # bytes: 0..8
    counts += counts >> 8
    counts += counts >> 16
    counts &= 0x3F  # 0..31
    return counts + (words < 0)


class DeviceSignBit:
    """The sign-bit predictor in torch integer ops on the weights' device (the gather executor's, on an NPU or
    GPU): pack x's sign bits, XOR with W_gate's packed bits, popcount per row."""

    def __init__(self, packed: torch.Tensor, alpha: float, d: int, device: torch.device):
        self.packed = packed.to(device=device, dtype=torch.int32)  # [D, W] sign bits of W_gate
        self.d = d
        self.max_negatives = signbit_max_negatives(d, alpha)
        self.bit_values = _BIT_VALUES.to(device)  # [32]

    def negatives(self, x: torch.Tensor) -> torch.Tensor:
        """x: [d] -> N_neg [D] int32, the products W_gate_ij * x_j predicted negative per row."""
        words = self.packed.shape[1]
        negative = F.pad((x < 0).to(torch.int32), (0, words * BITS_PER_WORD - self.d))  # [32W]; -0.0 is not < 0
        packed_x = (negative.view(words, BITS_PER_WORD) * self.bit_values).sum(-1, dtype=torch.int32)  # [W]
        return _popcount32(self.packed ^ packed_x).sum(-1, dtype=torch.int32)  # XOR: [D, W]

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x: [d] -> [D] float32, positive exactly where signbit_mask predicts the neuron active."""
        return (self.max_negatives + 1 - self.negatives(x)).to(torch.float32)
