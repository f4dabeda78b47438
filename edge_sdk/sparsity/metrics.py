"""Predictor quality per layer, as in the SVDP paper: sparsities, recall, AUROC and FFN multiply counts.

All statistics are over (token, neuron) pairs of one layer's calibration or evaluation tokens. In the
sequential pipeline (DESIGN 3.1) the gate projection runs for every predicted-active neuron and drops the
predictor's false positives, so the up and down projections run only for neurons that are both predicted
and truly active: that is the realized sparsity s', which is >= the predicted sparsity s.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from edge_sdk.errors import CalibrationError

# AUROC is computed on a fixed-seed sample of this many pairs when a layer has more (sorting 220M pairs
# would need several GB); the sample's standard error is about 1e-4 at this size.
AUROC_MAX_PAIRS = 4_000_000
_AUROC_SEED = 0


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact area under the ROC curve: the Mann-Whitney probability that a positive outscores a negative.

    scores: [...] float; labels: [...] bool of the same shape. A tied (positive, negative) pair counts
    1/2. Returns NaN when all labels are equal (the AUROC is undefined).
    """
    if scores.shape != labels.shape:
        raise CalibrationError(f"labels: expected shape {tuple(scores.shape)} like scores, found {tuple(labels.shape)}")
    # Sorted in their own dtype (float16 and bfloat16 widened, exactly): the ranks and ties are the scores'. numpy
    # sorts values alone, twice as fast as torch.sort with its indices here.
    values = scores.detach().flatten()
    if values.dtype not in (torch.float32, torch.float64):
        values = values.to(torch.float64)
    values = values.numpy()
    positive = labels.flatten().to(torch.bool).numpy()
    n_positive = int(np.count_nonzero(positive))
    n_negative = positive.size - n_positive
    if n_positive == 0 or n_negative == 0:
        return math.nan
    positives, negatives = np.sort(values[positive]), np.sort(values[~positive])
    # Each positive beats the negatives below it and ties (half) with the equal ones: the negatives left of its
    # insertion point plus those left of its last one count the wins twice.
    twice_wins = int(np.searchsorted(negatives, positives, side="left").sum(dtype=np.int64)) + int(
        np.searchsorted(negatives, positives, side="right").sum(dtype=np.int64)
    )
    return twice_wins / (2 * n_positive * n_negative)


def multiply_count(
    d: int, D: int, rank: int, predicted_sparsity: float, realized_sparsity: float
) -> tuple[float, float]:
    """FFN multiplies per token (SVDP eq. 5): (sparse with predictor, dense 3dD).

    sparse = r(d + D) for a rank-r predictor (0 for the sign-bit, core and threshold predictors)
           + d(1 - s)D for the gate rows of predicted-active neurons
           + 2d(1 - s')D for the up and down rows of the neurons still active after the gate.
    """
    sparse = rank * (d + D) + d * (1 - predicted_sparsity) * D + 2 * d * (1 - realized_sparsity) * D
    return float(sparse), float(3 * d * D)


def _check_mask(name: str, mask: torch.Tensor, shape: torch.Size | None) -> None:
    if mask.dtype != torch.bool or mask.dim() != 2 or (shape is not None and mask.shape != shape):
        expected = f"shape {tuple(shape)}" if shape is not None else "2-D [tokens, neurons]"
        raise CalibrationError(f"{name}: expected a bool tensor of {expected}, found {mask.dtype} {tuple(mask.shape)}")


def _sample_pairs(n_pairs: int) -> torch.Tensor | None:
    """Fixed-seed indices (with replacement) of AUROC_MAX_PAIRS pairs, or None when all pairs fit."""
    if n_pairs <= AUROC_MAX_PAIRS:
        return None
    generator = torch.Generator().manual_seed(_AUROC_SEED)
    return torch.randint(n_pairs, (AUROC_MAX_PAIRS,), generator=generator)


def layer_metrics(
    truly_active: torch.Tensor,
    predicted_active: torch.Tensor,
    importance: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    *,
    rank: int = 0,
    d: int | None = None,
    true_totals: tuple[int, float] | None = None,
) -> dict:
    """How well one layer's predictor does on N tokens.

    truly_active, predicted_active: [N, D] bool; importance: [N, D] float neuron importance w (SVDP
    Algorithm 2: |act(g) * u|^2 ||W_down[:, i]||^2), or None for equal weights; scores: [N, D] float
    predictor scores, higher meaning more likely active, for the AUROC; rank: predictor rank r; d: model
    width, which enables the multiply-count ratio.

    Returns plain floats: true_sparsity, predicted_sparsity, realized_sparsity (1 - mean(predicted & true)),
    recall (of truly active pairs; 1.0 when none is), importance_weighted_recall (importance mass of the
    truly active pairs that were predicted; equals recall when importance is None, 1.0 when the truly
    active pairs carry no importance), and when requested auroc (None when every pair has the same label;
    on a fixed-seed sample of AUROC_MAX_PAIRS pairs for larger layers) and multiply_count_ratio (eq. 5
    over the dense 3dD).

    true_totals: (truly active pair count, their importance mass as a float64 sum of importance[truly_active]),
    when the caller has them: every level of a layer shares them, and at 7B shapes each is a pass over 220M pairs.
    """
    _check_mask("truly_active", truly_active, None)
    _check_mask("predicted_active", predicted_active, truly_active.shape)
    n_pairs = truly_active.numel()
    if n_pairs == 0:
        raise CalibrationError("truly_active: expected at least one (token, neuron) pair, found none")
    hits = predicted_active & truly_active
    # count_nonzero: a bool tensor's sum() widens every element to int64 first, 25x slower on a layer's pairs
    n_predicted, n_hits = (int(mask.count_nonzero()) for mask in (predicted_active, hits))
    n_true = int(truly_active.count_nonzero()) if true_totals is None else true_totals[0]
    metrics = {
        "true_sparsity": 1.0 - n_true / n_pairs,
        "predicted_sparsity": 1.0 - n_predicted / n_pairs,
        "realized_sparsity": 1.0 - n_hits / n_pairs,
        "recall": n_hits / n_true if n_true else 1.0,
    }
    if importance is None:
        metrics["importance_weighted_recall"] = metrics["recall"]
    else:
        if importance.shape != truly_active.shape:
            raise CalibrationError(
                f"importance: expected shape {tuple(truly_active.shape)}, found {tuple(importance.shape)}"
            )
        true_mass = float(importance[truly_active].sum(dtype=torch.float64)) if true_totals is None else true_totals[1]
        hit_mass = float(importance[hits].sum(dtype=torch.float64))
        metrics["importance_weighted_recall"] = hit_mass / true_mass if true_mass > 0 else 1.0
    if scores is not None:
        if scores.shape != truly_active.shape:
            raise CalibrationError(f"scores: expected shape {tuple(truly_active.shape)}, found {tuple(scores.shape)}")
        sample = _sample_pairs(n_pairs)
        flat_scores, flat_labels = scores.flatten(), truly_active.flatten()
        if sample is not None:
            flat_scores, flat_labels = flat_scores[sample], flat_labels[sample]
        auroc = roc_auc(flat_scores, flat_labels)
        metrics["auroc"] = None if math.isnan(auroc) else auroc
    if d is not None:
        sparse, dense = multiply_count(
            d, truly_active.shape[1], rank, metrics["predicted_sparsity"], metrics["realized_sparsity"]
        )
        metrics["multiply_count_ratio"] = sparse / dense
    return metrics
