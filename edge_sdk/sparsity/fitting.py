"""What fitting one layer's predictor works on and what it gives: the layer's FFN weights, one pass of its gate and
up GEMMs over the calibration tokens, and the fitted predictor (its tensors and masks, and the statistics of a
predictor whose statistics are set rather than measured).

The fits that make a FittedLayer are the kinds' (edge_sdk/predictors/<kind>.py); sparsity/levels.py measures and
allocates their levels, sparsity/pipeline.py runs them layer by layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from edge_sdk.sparsity.collect import LayerCapture
from edge_sdk.sparsity.ffn import ffn_intermediates


@dataclass
class LayerWeights:
    """One layer's FFN weights in fp32, W_down neuron-major."""

    w_gate: torch.Tensor  # [D, d]
    w_up: torch.Tensor  # [D, d]
    w_down_t: torch.Tensor  # [D, d]

    @classmethod
    def of(cls, capture: LayerCapture) -> LayerWeights:
        mlp = capture.block.mlp
        return cls(mlp.gate_proj.weight.float(), mlp.up_proj.weight.float(), mlp.down_proj.weight.float().T)


@dataclass
class LayerActivations:
    """One pass of a layer's gate and up GEMMs over a set of tokens, and what fitting and metrics derive from it.

    At 7B shapes with 20k tokens each GEMM pass is ~1.8 TFLOP, so it is done once per token set and shared."""

    x: torch.Tensor  # [N, d] FFN inputs
    gate_act: torch.Tensor  # [N, D] act.gate(W_gate x)
    importance: torch.Tensor  # [N, D] |act.gate(g) * act.up(u)|^2 ||W_down[:, i]||^2 (calibrate.neuron_importance)
    up_act: torch.Tensor | None = None  # [N, D] act.up(W_up x), kept only when a fitter needs it

    @cached_property
    def truly_active(self) -> torch.Tensor:
        return self.gate_act != 0

    @cached_property
    def truly_active_count(self) -> int:
        return int(self.truly_active.count_nonzero())

    @cached_property
    def true_importance_mass(self) -> float:
        """The importance the truly active pairs carry (float64 sum): every level's recall divides by it."""
        return float(self.importance[self.truly_active].sum(dtype=torch.float64))

    @classmethod
    def compute(cls, x: torch.Tensor, weights: LayerWeights, activation, keep_up: bool = False) -> LayerActivations:
        gate_act, up_act = ffn_intermediates(x, weights.w_gate, weights.w_up, activation)
        down_norm_sq = weights.w_down_t.square().sum(dim=1)  # [D]
        importance = (gate_act * up_act).square_().mul_(down_norm_sq)
        return cls(x, gate_act, importance, up_act if keep_up else None)


@dataclass
class FittedLayer:
    """A layer's fitted predictor: its tensors; `score` gives its raw scores on [N, d] inputs (None for
    predictors without one) and `mask` turns (scores, activations, level) into predicted-active [N, D]."""

    tensors: dict[str, torch.Tensor]
    mask: Callable[[torch.Tensor | None, LayerActivations, float], torch.Tensor]
    score: Callable[[torch.Tensor], torch.Tensor | None] = lambda x: None
    details: dict[str, Any] = field(default_factory=dict)
    level_dependent: bool = True
    level_tensor: str | None = None  # the tensor with one row per level of settings.layer_levels
    statistics: LevelStatistics | None = None  # set, not measured (core: its setting fixes its sparsity)


@dataclass
class LevelStatistics:
    """One layer's predictor at each of its levels (one when it has none), on the calibration tokens."""

    capacity: torch.Tensor  # [levels] int32: the static row count a fixed-shape executor gathers
    sparsity: list[float]  # predicted sparsity
    missed_importance: list[float]  # 1 - importance-weighted recall


def weighted_recall(predicted: torch.Tensor, acts: LayerActivations) -> float:
    """The share of the truly active neurons' importance that predicted [N, D] keeps."""
    kept = float(acts.importance[predicted & acts.truly_active].sum(dtype=torch.float64))
    return kept / max(acts.true_importance_mass, 1e-300)
