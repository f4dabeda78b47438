"""Channel-wise thresholds for SiLU FFNs (CHESS), so that models without exact zeros can skip neurons.

CHESS scores an activation by its estimated contribution |a_up_i * a_gate_i| with |a_up_i| replaced by its
calibration mean (eq. 5-7): score_i(n) = E|up_i| * |gate_act_i(n)|. The global threshold t is the
sparsity-quantile of all N*D calibration scores (eq. 8-9: the smallest score t with F(t) >= sparsity,
i.e. the k-th smallest score for k = ceil(sparsity * N * D); t = -inf for sparsity 0). Per channel,
t_i = t / E|up_i|, and at run time neuron i is active when |act(g_i)| > t_i (eq. 10). A channel whose up
projection was exactly zero on every calibration token gets t_i = +inf: it never fires.

The quantile is exact and needs no sort of the N*D scores (20000 tokens x 11008 neurons is 220M values):
scores are >= 0, so their float32 bit patterns order like their values, and a two-pass radix select
(a histogram of the high 16 bits, then of the low 16 bits inside the bucket that holds the k-th score)
finds it while holding only one chunk of scores at a time. All levels share the same two passes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import torch

from edge_sdk.errors import CalibrationError

# Rows per chunk are chosen so a chunk holds about this many scores.
_CHUNK_ELEMENTS = 1 << 22
_HALF_BITS = 16
_HALF_BUCKETS = 1 << _HALF_BITS
# Non-negative float32 values have the sign bit clear, so their high halves lie in 0 .. 2^15 - 1.
_HIGH_BUCKETS = 1 << (_HALF_BITS - 1)


@dataclass
class ChannelThresholds:
    """Per-channel activation thresholds of one FFN layer at one sparsity level."""

    thresholds: torch.Tensor  # [D] float32 t_i; +inf for channels that never fire
    mean_abs_up: torch.Tensor  # [D] float32 E|up_i| over the calibration tokens
    global_threshold: float  # t, the score quantile; -inf at sparsity 0

    def active_mask(self, gate_act: torch.Tensor) -> torch.Tensor:
        """gate_act: [..., D] act.gate(W_gate x) -> bool [..., D], True where |gate_act_i| > t_i."""
        return gate_act.abs().to(torch.float32) > self.thresholds


def _check_inputs(gate_act: torch.Tensor, up: torch.Tensor) -> None:
    if gate_act.dim() != 2 or gate_act.numel() == 0:
        raise CalibrationError(
            f"gate_act: expected a non-empty 2-D tensor [tokens, neurons], found shape {tuple(gate_act.shape)}"
        )
    if up.shape != gate_act.shape:
        raise CalibrationError(f"up: expected shape {tuple(gate_act.shape)} like gate_act, found {tuple(up.shape)}")


def _check_level(level: float) -> float:
    try:
        number = float(level)
    except (TypeError, ValueError):
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise CalibrationError(f"sparsity: expected a level in [0, 1], found {level!r}")
    return number


def _finite_chunks(name: str, values: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield float32 row chunks of values: [N, D], raising CalibrationError on NaN or inf."""
    step = max(1, _CHUNK_ELEMENTS // values.shape[1])
    for start in range(0, values.shape[0], step):
        chunk = values[start : start + step].to(torch.float32)
        if not bool(torch.isfinite(chunk).all()):
            raise CalibrationError(
                f"{name}: expected finite values, found NaN or inf in rows {start}..{start + len(chunk) - 1}"
            )
        yield chunk


def _score_bits(gate_act: torch.Tensor, mean_abs_up: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield the int32 bit patterns of score chunks E|up_i| * |gate_act_i(n)|, flattened."""
    for chunk in _finite_chunks("gate_act", gate_act):
        yield (mean_abs_up * chunk.abs()).view(torch.int32).flatten()


def _kth_smallest_scores(gate_act: torch.Tensor, mean_abs_up: torch.Tensor, ranks: list[int]) -> list[float]:
    """The ranks[j]-th smallest score (1-based, 1 <= rank <= N*D) for each j, by two-pass radix select."""
    high_counts = torch.zeros(_HIGH_BUCKETS, dtype=torch.int64)
    for bits in _score_bits(gate_act, mean_abs_up):
        high_counts += torch.bincount(bits >> _HALF_BITS, minlength=_HIGH_BUCKETS)
    high_cumulative = high_counts.cumsum(0)
    rank_tensor = torch.tensor(ranks, dtype=torch.int64)
    buckets = torch.searchsorted(high_cumulative, rank_tensor)  # first bucket whose cumulative count >= rank
    below = torch.where(buckets > 0, high_cumulative[(buckets - 1).clamp(min=0)], 0)
    wanted, slots = torch.unique(buckets, return_inverse=True)
    slot_of_bucket = torch.full((_HIGH_BUCKETS,), -1, dtype=torch.int64)
    slot_of_bucket[wanted] = torch.arange(len(wanted))
    low_counts = torch.zeros(len(wanted) * _HALF_BUCKETS, dtype=torch.int64)
    for bits in _score_bits(gate_act, mean_abs_up):
        slot = slot_of_bucket[bits >> _HALF_BITS]
        kept = slot >= 0
        low = (bits[kept] & (_HALF_BUCKETS - 1)).to(torch.int64)
        low_counts += torch.bincount(slot[kept] * _HALF_BUCKETS + low, minlength=len(low_counts))
    low_cumulative = low_counts.view(len(wanted), _HALF_BUCKETS).cumsum(1)
    values = []
    for j in range(len(ranks)):
        low = int(torch.searchsorted(low_cumulative[slots[j]], rank_tensor[j] - below[j]))
        bits = torch.tensor([(int(buckets[j]) << _HALF_BITS) | low], dtype=torch.int32)
        values.append(float(bits.view(torch.float32)))
    return values


def fit_channel_thresholds_levels(
    gate_act: torch.Tensor, up: torch.Tensor, levels: Iterable[float]
) -> dict[float, ChannelThresholds]:
    """Channel thresholds for several sparsity levels from one pass over the calibration data.

    gate_act: [N, D] act.gate(W_gate x); up: [N, D] act.up(W_up x), both over the same N calibration tokens.
    levels: target sparsities in [0, 1]. Returns {level: ChannelThresholds}; thresholds never decrease
    as the level grows. With tied scores, the fraction of calibration scores <= t can exceed the level.
    """
    _check_inputs(gate_act, up)
    levels = [_check_level(level) for level in levels]
    n_tokens, n_neurons = gate_act.shape
    abs_up_sum = torch.zeros(n_neurons, dtype=torch.float64)
    for chunk in _finite_chunks("up", up):
        abs_up_sum += chunk.abs().sum(0, dtype=torch.float64)
    mean_abs_up = (abs_up_sum / n_tokens).to(torch.float32)
    n_scores = n_tokens * n_neurons
    ranks = {level: math.ceil(Fraction(repr(level)) * n_scores) for level in levels}
    positive_ranks = sorted({rank for rank in ranks.values() if rank > 0})
    quantiles = {0: -math.inf}
    if positive_ranks:
        quantiles.update(zip(positive_ranks, _kth_smallest_scores(gate_act, mean_abs_up, positive_ranks), strict=True))
    fitted = {}
    for level in levels:
        threshold = quantiles[ranks[level]]
        per_channel = torch.where(mean_abs_up > 0, torch.tensor(threshold, dtype=torch.float32) / mean_abs_up, math.inf)
        fitted[level] = ChannelThresholds(per_channel, mean_abs_up.clone(), threshold)
    return fitted


def fit_channel_thresholds(gate_act: torch.Tensor, up: torch.Tensor, sparsity: float) -> ChannelThresholds:
    """Channel thresholds of one layer at one sparsity level (see fit_channel_thresholds_levels).

    gate_act: [N, D] act.gate(W_gate x); up: [N, D] act.up(W_up x); sparsity: in [0, 1].
    """
    level = _check_level(sparsity)
    return fit_channel_thresholds_levels(gate_act, up, [level])[level]
