"""Greedy per-neuron bias calibration (SVDP Algorithm 2), every requested sparsity level in one pass.

The predictor marks neuron i inactive for a token when its score s (the SVD predictor's output) satisfies
s <= tau_i; the stored bias is b_i = -tau_i, so the runtime rule is "active when s + b > 0". Predicting a
truly active neuron inactive costs its importance w = |act.gate(g) * act.up(u)|^2 * ||W_down[:, i]||^2, the
squared norm of the output contribution it would have made. For each neuron, the tokens are sorted by score;
raising tau_i by one step of eta tokens costs the importance of those tokens. Starting from the free prefix
(tokens scored below every token with positive importance), the greedy repeatedly takes the cheapest next
step over all neurons until the predicted-inactive fraction of (neuron, token) pairs reaches the level.

Semantics fixed here (the paper leaves them open, except the free prefix: Algorithm 2 starts at tau_i = s_(k_i), the
first positive-importance token included without its cost; here that token stays active, which is what the loss the
greedy minimises counts, one pair per neuron):

- Steps sit on a grid: neuron i's k-th step ends at k0_i + k * eta tokens (k0_i = its free prefix), capped
  at N. Ties: tau must separate distinct score values, because every token with s <= tau is predicted
  inactive. A step boundary inside a run of equal scores is moved up to the end of that run (so a step may
  take more than eta tokens, and a later step may take none); the free prefix ends before the run holding
  the first positive-importance token. Thus the inactive count per neuron is exactly the cut position.
- tau_i is the score of the last token consumed. A neuron with nothing consumed (no free prefix, never
  advanced) gets tau_i = min_score - margin, margin = 1e-3 * (max_score - min_score) (at least one fp32
  step), so every calibration token has s + b > 0 and a little headroom below.
- Level s stops at the first greedy step after which the inactive fraction is >= s; a level already met by
  the free prefixes (level 0 always) returns the starting biases.
- Ties between equal step costs go to the lowest neuron index, a neuron's equal-cost steps in order.

Greedy as a sort: with a priority queue keyed by (next step cost, neuron index), a neuron's step is taken
exactly when the running maximum of its step costs up to that step is the smallest outstanding such value,
so the queue's pop order equals a stable sort of all steps by (running-max cost, neuron, step). That sort is
done here in one vectorised pass, O(D (N log N) + K log K) with K = D * ceil(N / eta) steps, and reproduces
the queue of Algorithm 2 step for step.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import ffn_intermediates

# Default step size: N // _STEPS_PER_NEURON tokens, so each neuron has about this many greedy steps.
_STEPS_PER_NEURON = 256
# Elements per [rows, columns] block of the chunked loops: bounds their extra memory (calibration holds
# about 40 bytes per element of each block in flight, so ~170 MiB per thread) while keeping overhead small.
_CHUNK_ELEMENTS = 1 << 22
# Headroom below a neuron's smallest calibration score, relative to its score range, when nothing is inactive.
_FLOOR_MARGIN = 1e-3
# Low bits of a widened float64 score that carry the token index in _sorted_block.
_INDEX_BITS = 29
_INDEX_MASK = (1 << _INDEX_BITS) - 1


def neuron_importance(
    x: torch.Tensor,  # [T, d]
    w_gate: torch.Tensor,  # [D, d]
    w_up: torch.Tensor,  # [D, d]
    w_down_t: torch.Tensor,  # [D, d], W_down transposed
    activation: Activation,
) -> torch.Tensor:
    """Importance of neuron i on token t: |act.gate(g_i) * act.up(u_i)|^2 * ||w_down_t[i]||^2, [T, D] float32.

    It is the squared norm of the neuron's contribution to the FFN output, i.e. the damage of predicting
    it inactive on that token (SVDP eq. 13). Computed in token chunks; weights are upcast to fp32 once.
    """
    if x.dim() != 2 or w_gate.dim() != 2 or x.shape[1] != w_gate.shape[1]:
        raise CalibrationError(
            f"x: expected shape [T, d] with d = w_gate.shape[1], found x {list(x.shape)}, w_gate {list(w_gate.shape)}"
        )
    for name, w in (("w_up", w_up), ("w_down_t", w_down_t)):
        if w.shape != w_gate.shape:
            raise CalibrationError(
                f"{name}: expected shape {list(w_gate.shape)} (same as w_gate), found {list(w.shape)}"
            )
    n_tokens, n_neurons = x.shape[0], w_gate.shape[0]
    w_gate, w_up = w_gate.to(torch.float32), w_up.to(torch.float32)
    down_norm_sq = w_down_t.to(torch.float32).square().sum(dim=1)  # [D]
    importance = torch.empty(n_tokens, n_neurons, dtype=torch.float32)
    chunk = max(1, _CHUNK_ELEMENTS // n_neurons)
    for start in range(0, n_tokens, chunk):
        gate_act, up_act = ffn_intermediates(x[start : start + chunk], w_gate, w_up, activation)
        importance[start : start + chunk] = gate_act.mul_(up_act).square_().mul_(down_norm_sq)
    return importance


def predicted_inactive_fraction(
    scores: torch.Tensor,  # [N, D]
    bias: torch.Tensor,  # [D]
) -> float:
    """Fraction of (token, neuron) pairs the biased predictor marks inactive: scores + bias <= 0 in fp32."""
    if scores.dim() != 2 or list(bias.shape) != [scores.shape[1]]:
        raise CalibrationError(
            f"bias: expected shape [{scores.shape[-1]}] for scores {list(scores.shape)}, found {list(bias.shape)}"
        )
    bias = bias.to(torch.float32)
    chunk = max(1, _CHUNK_ELEMENTS // scores.shape[1])
    inactive = sum(
        int((scores[start : start + chunk].to(torch.float32) + bias <= 0).count_nonzero())
        for start in range(0, scores.shape[0], chunk)
    )
    return inactive / scores.numel()


def _sorted_block(
    scores: torch.Tensor,  # [N, B] one block of neurons
    importance: torch.Tensor,  # [N, B]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each neuron's tokens by score: (scores [B, N] float32, cumulative importance [B, N] float64).

    cumulative[:, k - 1] = C(k), the importance of the k lowest-scored tokens; float64 keeps small steps
    exact (a step over zero-importance tokens costs exactly 0). Pure numpy, which releases the GIL, so
    blocks run in parallel threads.

    The argsort packs the token index into the 29 low mantissa bits a float32 score gains when widened to
    float64: the value moves by less than one float32 step, so distinct scores keep their order, equal ones
    stay adjacent, and one vectorised float64 value sort does the work of an argsort several times faster;
    clearing the bits again gives back the sorted scores exactly. Non-finite scores become NaN (or stay
    -inf) and sort to an end of their row, where they are caught.
    """
    packed = np.array(scores.detach().to(torch.float32).numpy().T, dtype=np.float64, order="C")  # [B, N]
    packed.view(np.int64)[...] |= np.arange(packed.shape[1], dtype=np.int64)
    packed.sort(axis=1)
    if not np.isfinite(packed[:, [0, -1]]).all():
        raise CalibrationError("scores: contains NaN or infinite values")
    order = packed.view(np.int64) & _INDEX_MASK
    packed.view(np.int64)[...] &= ~_INDEX_MASK  # back to the exact widened scores
    s_sorted = packed.astype(np.float32)
    del packed
    w = np.ascontiguousarray(importance.detach().to(torch.float32).numpy().T)  # [B, N]
    if not w.min() >= 0:
        raise CalibrationError("importance: expected values >= 0, found negative or NaN entries")
    cumulative = np.take_along_axis(w, order, axis=1).astype(np.float64)
    np.cumsum(cumulative, axis=1, out=cumulative)
    if not np.isfinite(cumulative[:, -1]).all():
        raise CalibrationError("importance: contains infinite values")
    return torch.from_numpy(s_sorted), torch.from_numpy(cumulative)


def _neuron_steps(
    s_sorted: torch.Tensor,  # [B, N] float32, each row ascending
    cumulative: torch.Tensor,  # [B, N] float64, C(k) at column k - 1
    eta: int,
    n_steps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each neuron's greedy steps: (free [B], cost [B, J] float64, consumed [B, J], tau [B, J + 1] float32).

    Cut c_0 is the free prefix, cut c_k the k-th grid point snapped up to the end of its tie run; step k
    goes from c_{k-1} to c_k, consuming c_k - c_{k-1} tokens at the importance they carry. Steps that start
    at N cost +inf (never taken). tau[:, k] is the threshold after k steps.
    """
    n_tokens = s_sorted.shape[1]

    def cost_below(cut: torch.Tensor) -> torch.Tensor:  # C(cut) for cut: [B, K] in 0..N
        return torch.where(cut > 0, cumulative.gather(1, (cut - 1).clamp(min=0)), 0.0)

    # Free prefix: every token scored strictly below the first token with positive importance.
    first_positive = torch.searchsorted(cumulative, cumulative.new_zeros(cumulative.shape[0], 1), side="right")
    has_positive = first_positive[:, 0] < n_tokens
    below_first = torch.searchsorted(s_sorted, s_sorted.gather(1, first_positive.clamp(max=n_tokens - 1)), side="left")
    free = torch.where(has_positive, below_first[:, 0], n_tokens)  # [B]

    grid = (free[:, None] + eta * torch.arange(1, n_steps + 1)).clamp_(max=n_tokens)  # [B, J], >= 1
    snapped = torch.searchsorted(s_sorted, s_sorted.gather(1, grid - 1), side="right")  # end of tie run
    cuts = torch.cat([free[:, None], snapped], dim=1)  # [B, J + 1], nondecreasing
    consumed = cuts.diff(dim=1)
    cost = cost_below(cuts[:, 1:]) - cost_below(cuts[:, :-1])
    cost.masked_fill_(cuts[:, :-1] >= n_tokens, math.inf)

    s_min, s_max = s_sorted[:, :1], s_sorted[:, -1:]
    floor = torch.minimum(s_min - _FLOOR_MARGIN * (s_max - s_min), torch.nextafter(s_min, s_min.new_tensor(-math.inf)))
    tau = torch.where(cuts > 0, s_sorted.gather(1, (cuts - 1).clamp(min=0)), floor)
    return free, cost, consumed, tau


def _all_neuron_steps(
    scores: torch.Tensor, importance: torch.Tensor, eta: int, n_steps: int
) -> list[tuple[torch.Tensor, ...]]:
    """_neuron_steps for every block of neurons; the numpy sorts of one wave of blocks run in parallel threads."""
    n_tokens, n_neurons = scores.shape
    block = max(1, _CHUNK_ELEMENTS // n_tokens)
    starts = list(range(0, n_neurons, block))
    workers = max(1, torch.get_num_threads())
    steps = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for wave in range(0, len(starts), workers):
            sorted_blocks = pool.map(
                lambda i: _sorted_block(scores[:, i : i + block], importance[:, i : i + block]),
                starts[wave : wave + workers],
            )
            steps.extend(_neuron_steps(s_sorted, cumulative, eta, n_steps) for s_sorted, cumulative in sorted_blocks)
    return steps


def calibrate_biases(
    scores: torch.Tensor,  # [N, D] predictor outputs on the calibration tokens (SvdPredictor.scores)
    importance: torch.Tensor,  # [N, D] neuron_importance on the same tokens
    levels: Iterable[float],
    *,
    eta: int | None = None,
) -> dict[float, torch.Tensor]:
    """Per-neuron biases b = -tau reaching each target predicted sparsity in `levels` (SVDP Algorithm 2).

    Returns {level: bias [D] float32}; with that bias the fraction of calibration pairs with
    scores + bias <= 0 is the first value >= level the greedy reaches. eta: tokens per greedy step,
    default max(1, N // 256). See the module docstring for ties, level 0 and the floor margin.
    """
    levels = list(levels)
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0.0 <= level <= 1.0:
            raise CalibrationError(f"levels: each target sparsity must be a number in [0, 1], found {level!r}")
    if not levels:
        raise CalibrationError("levels: expected at least one target sparsity, found none")
    if scores.dim() != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
        raise CalibrationError(f"scores: expected a non-empty [N, D] tensor, found shape {list(scores.shape)}")
    if importance.shape != scores.shape:
        raise CalibrationError(
            f"importance: expected shape {list(scores.shape)} (as scores), found {list(importance.shape)}"
        )
    if scores.shape[0] > 1 << _INDEX_BITS:
        raise CalibrationError(
            f"scores: at most 2^{_INDEX_BITS} calibration tokens are supported, found {scores.shape[0]}"
        )
    if eta is not None and (isinstance(eta, bool) or not isinstance(eta, int) or eta < 1):
        raise CalibrationError(f"eta: expected an integer >= 1, found {eta!r}")
    n_tokens, n_neurons = scores.shape
    eta = max(1, n_tokens // _STEPS_PER_NEURON) if eta is None else eta
    n_steps = math.ceil(n_tokens / eta)

    # free: [D], cost: [D, J], consumed: [D, J], tau: [D, J + 1]
    free, cost, consumed, tau = map(torch.cat, zip(*_all_neuron_steps(scores, importance, eta, n_steps), strict=True))
    free_total = int(free.sum())

    # Queue order of Algorithm 2 = stable sort by (running max of the neuron's step costs, neuron, step).
    queue_order = torch.sort(cost.cummax(dim=1).values.flatten(), stable=True).indices
    owner = queue_order // n_steps
    total = n_tokens * n_neurons
    fraction = (free_total + consumed.flatten()[queue_order].cumsum(0)).to(torch.float64) / total
    steps_taken = torch.zeros(n_neurons, dtype=torch.int64)
    taken, biases = 0, {}
    for level in sorted(set(levels)):
        target = 0 if free_total / total >= level else int(torch.searchsorted(fraction, float(level))) + 1
        steps_taken += torch.bincount(owner[taken:target], minlength=n_neurons)
        taken = target
        biases[level] = -tau.gather(1, steps_taken[:, None])[:, 0]
    return {level: biases[level].clone() for level in levels}


def uniform_biases(scores: torch.Tensor, levels: Sequence[float]) -> dict[float, torch.Tensor]:
    """One threshold shared by all neurons per level (SVDP's "without bias calibration" ablation).

    scores: [N, D]. The threshold is the level-quantile of all scores, so the fraction of pairs with
    score + bias <= 0 is at least the level; level 0 puts every calibration pair above the threshold.
    """
    flat = scores.flatten()
    biases = {}
    for level in levels:
        k = math.ceil(level * flat.numel())
        tau = flat.min() - 1.0 if k == 0 else flat.kthvalue(k).values
        biases[level] = torch.full((scores.shape[1],), -float(tau), dtype=torch.float32)
    return biases
