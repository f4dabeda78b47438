"""A layer's predictor at its levels, and how a model-wide level is allocated across the layers.

A sparsity level is the model-wide predicted sparsity: the mean over layers of the fraction of neurons the
predictor marks inactive on the calibration tokens. Layers differ in how much of that they take at what cost
(on the fixture, layer 0 is 60% truly sparse and layers 1-3 84-95%), so by default a level is allocated across
layers rather than applied to each ("importance"): every layer is fitted on a grid of its own levels, each grid
level's cost is the importance the predictor misses there -- 1 - importance-weighted recall, the share of the
layer's FFN output (SVDP's |act(g) u|^2 ||W_down[:, i]||^2) from truly active neurons predicted inactive -- and
a model-wide level takes in every layer the most aggressive grid level whose cost stays within one common
bound, the smallest bound that reaches the level: every layer keeps the same share of its FFN output. "uniform"
gives every layer the level itself, as the SVDP paper does (its ablations compare predictors at equal per-layer
sparsity).

The cost is measured on the layer's own FFN output, not on the residual stream after the layer: a layer whose
FFN output is a small share of the stream looked nearly free that way, took the most aggressive levels and lost
more perplexity than uniform levels (benchmarks/README.md, "Where a sparse fp16 token goes, and per-layer levels").

Row k of a kind's level tensor (svd.biases, threshold.thresholds) and of its capacity belongs to model-wide level
k: the layer's own level allocated to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LevelStatistics, weighted_recall
from edge_sdk.sparsity.settings import CalibrationSettings

CAPACITY_QUANTILE = 0.99


def fitted_levels(fitted: FittedLayer, settings: CalibrationSettings) -> tuple[float, ...]:
    """The levels a fitted layer has: each layer level, or the reference level alone for a predictor without."""
    return settings.layer_levels if fitted.level_dependent else (settings.reference_level,)


def level_statistics(
    fitted: FittedLayer, acts: LayerActivations, scores: torch.Tensor | None, settings: CalibrationSettings
) -> LevelStatistics:
    """Per level: the 99th percentile over calibration tokens of how many neurons the predictor marks active
    (top-k to this capacity instead of a data-dependent nonzero; backends/cann), the predicted sparsity and the
    share of the layer's importance on truly active neurons predicted inactive. Both rise with the level (its
    masks are nested). A predictor whose statistics are set (fitted.statistics) gives those."""
    if fitted.statistics is not None:
        return fitted.statistics
    capacities, sparsities, missed_shares = [], [], []
    for level in fitted_levels(fitted, settings):
        predicted = fitted.mask(scores, acts, level)
        per_token = predicted.count_nonzero(dim=1).to(torch.float64)
        capacities.append(math.ceil(torch.quantile(per_token, CAPACITY_QUANTILE).item()))
        sparsities.append(1.0 - per_token.mean().item() / predicted.shape[1])
        missed_shares.append(1.0 - weighted_recall(predicted, acts))
    return LevelStatistics(torch.tensor(capacities, dtype=torch.int32), sparsities, missed_shares)


def allocate_levels(
    levels: Sequence[float], sparsities: Sequence[Sequence[float]], costs: Sequence[Sequence[float]]
) -> dict[float, list[int]]:
    """Per model-wide level, each layer's index into its own levels (the allocation of the module docstring).

    sparsities, costs: [layers][layer levels], each layer's predicted sparsity and missed importance share at
    its levels in increasing order. A bound admits in each layer its last level whose cost is within it; the
    smallest bound whose admitted levels average a predicted sparsity of at least the model-wide level is taken
    (the layers' most aggressive levels when no bound reaches it)."""
    # a running maximum makes the costs monotone where rounding in the sums left a step down
    costs = [torch.tensor(layer, dtype=torch.float64).cummax(dim=0).values for layer in costs]
    layer_sparsities = [torch.tensor(layer, dtype=torch.float64) for layer in sparsities]
    bounds = torch.unique(torch.cat(costs))  # sorted

    def admitted(bound: torch.Tensor) -> list[int]:
        return [max(int(torch.searchsorted(cost, bound, right=True)) - 1, 0) for cost in costs]

    def mean_sparsity(indices: list[int]) -> float:
        return sum(float(layer[i]) for layer, i in zip(layer_sparsities, indices, strict=True)) / len(indices)

    allocation = {}
    for level in levels:
        low, high = 0, len(bounds) - 1  # the smallest bound index reaching the level (the largest when none does)
        while low < high:
            middle = (low + high) // 2
            if mean_sparsity(admitted(bounds[middle])) >= level - 1e-12:
                high = middle
            else:
                low = middle + 1
        allocation[level] = admitted(bounds[low])
    return allocation


def allocation_for(
    settings: CalibrationSettings, sparsity_curves: list[list[float]], cost_curves: list[list[float]], n_layers: int
) -> dict[float, list[int]] | None:
    """Per model-wide level, each layer's index into settings.layer_levels; None for predictors without levels."""
    if not settings.kind.has_levels:
        return None
    if settings.level_allocation == "uniform":
        return {level: [settings.layer_levels.index(level)] * n_layers for level in settings.all_levels}
    return allocate_levels(settings.all_levels, sparsity_curves, cost_curves)


def allocated_tensors(
    fitted: FittedLayer, settings: CalibrationSettings, allocation: dict[float, list[int]] | None, layer: int
) -> dict[str, torch.Tensor]:
    """A layer's predictor tensors with one row per model-wide level: the rows of its allocated levels."""
    if allocation is None:
        return fitted.tensors
    rows = torch.tensor([allocation[level][layer] for level in settings.all_levels])
    selected = dict(fitted.tensors)
    for name in (fitted.level_tensor, f"{settings.predictor}.capacity"):
        selected[name] = fitted.tensors[name][rows]
    return selected


def allocated_metrics(
    per_layer_level: dict[str, dict], settings: CalibrationSettings, allocation: dict[float, list[int]], layer: int
) -> dict[str, dict]:
    """A layer's metrics per model-wide level, from those at its own levels, naming the level allocated."""
    metrics = {}
    for level in settings.all_levels:
        layer_level = settings.layer_levels[allocation[level][layer]]
        metrics[f"{level:g}"] = {"layer_level": layer_level, **per_layer_level[f"{layer_level:g}"]}
    return metrics
