"""Sentence-level core neurons (SparseInfer, semantic variant): one FFN mask per prompt, fixed at prefill.

Token-wise core neurons (the paper's eq. 1): for one token, among the n_pos neurons with a positive gate
activation, the k = ceil(alpha * n_pos) largest; equal activations are ordered by lower neuron index, so
the set is deterministic. Sentence-wise core neurons (eq. 2-3): count, per neuron, the prompt tokens
whose core set contains it; the mask is the ceil(beta * D) neurons with the highest count, equal counts
ordered by larger summed activation (the sum of the neuron's activations over the tokens where it was a
core neuron) and then by lower index. A neuron that is never a token-wise core neuron (count 0) is never
in the mask, so the mask can hold fewer than ceil(beta * D) neurons.

ratio * n is rounded up with the ratio read as the decimal it is written as (alpha=0.7, n=10 gives 7,
not the 8 that float arithmetic would give).

Counts and sums add over tokens, so a chunked prefill can call core_neuron_counts per chunk, add the
results and finish with core_mask_from_counts; core_neuron_mask does exactly that for one tensor.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from edge_sdk.errors import CalibrationError

# Tokens per chunk are chosen so a chunk holds about this many activations (bounds the sort's memory).
_CHUNK_ELEMENTS = 1 << 22


def _check_ratio(name: str, value: float) -> Fraction:
    """A ratio in (0, 1] as the exact decimal it was written as."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0.0 < number <= 1.0:
        raise CalibrationError(f"{name}: expected a fraction in (0, 1], found {value!r}")
    return Fraction(repr(number))


def _ceil_times(ratio: Fraction, n: torch.Tensor) -> torch.Tensor:
    """ceil(ratio * n) for each entry of the int64 tensor n, in exact integer arithmetic."""
    values, inverse = torch.unique(n, return_inverse=True)
    rounded = torch.tensor([math.ceil(ratio * int(v)) for v in values.tolist()], dtype=torch.int64)
    return rounded[inverse]


def core_neuron_counts(gate_activations: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per neuron, how many tokens have it as a token-wise core neuron, and its activation summed over those.

    gate_activations: [T, D] act.gate outputs of the prompt tokens. Returns (counts [D] int64,
    activation_sums [D] float64). See the module docstring for the exact selection rule.
    """
    ratio = _check_ratio("alpha", alpha)
    if gate_activations.dim() != 2:
        raise CalibrationError(
            f"gate_activations: expected a 2-D tensor [tokens, neurons], found shape {tuple(gate_activations.shape)}"
        )
    n_tokens, n_neurons = gate_activations.shape
    counts = torch.zeros(n_neurons, dtype=torch.int64)
    sums = torch.zeros(n_neurons, dtype=torch.float64)
    step = max(1, _CHUNK_ELEMENTS // max(1, n_neurons))
    for start in range(0, n_tokens, step):
        acts = gate_activations[start : start + step].to(torch.float32)  # [t, D]
        if not bool(torch.isfinite(acts).all()):
            raise CalibrationError(
                f"gate_activations: expected finite values, found NaN or inf in tokens {start}..{start + len(acts) - 1}"
            )
        k = _ceil_times(ratio, (acts > 0).sum(1))  # [t]; k <= n_pos, so only positive activations are taken
        order = torch.sort(acts, dim=1, descending=True, stable=True).indices  # equal values: lower index first
        taken_sorted = torch.arange(n_neurons).unsqueeze(0) < k.unsqueeze(1)  # [t, D] by rank
        taken = torch.zeros_like(taken_sorted).scatter_(1, order, taken_sorted)  # [t, D] by neuron
        counts += taken.sum(0)
        sums += torch.where(taken, acts, 0.0).sum(0, dtype=torch.float64)
    return counts, sums


def core_mask_from_counts(counts: torch.Tensor, activation_sums: torch.Tensor, beta: float) -> torch.Tensor:
    """The sentence-wise core neurons from accumulated counts.

    counts: [D] int64 and activation_sums: [D] float from core_neuron_counts (summed over prompt chunks).
    Returns bool [D]: the ceil(beta * D) neurons with the highest count, ties by larger activation sum
    then lower index, leaving out neurons with count 0.
    """
    ratio = _check_ratio("beta", beta)
    if counts.dim() != 1 or activation_sums.shape != counts.shape:
        raise CalibrationError(
            f"activation_sums: expected shape {tuple(counts.shape)} like counts (1-D), "
            f"found {tuple(activation_sums.shape)}"
        )
    n_neurons = counts.shape[0]
    keep = math.ceil(ratio * n_neurons)
    # Lexicographic order by successive stable sorts, least significant key first: index, sum, count.
    order = torch.sort(activation_sums, descending=True, stable=True).indices
    order = order[torch.sort(counts[order], descending=True, stable=True).indices]
    chosen = order[:keep]
    chosen = chosen[counts[chosen] > 0]
    mask = torch.zeros(n_neurons, dtype=torch.bool)
    mask[chosen] = True
    return mask


def core_neuron_mask(gate_activations: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """The FFN mask held for the whole decode of one prompt.

    gate_activations: [T, D] act.gate outputs for the prompt tokens -> bool [D] core neurons.
    alpha: token-wise fraction of the positive activations; beta: fraction of all D neurons kept.
    """
    _check_ratio("beta", beta)
    counts, sums = core_neuron_counts(gate_activations, alpha)
    return core_mask_from_counts(counts, sums, beta)
