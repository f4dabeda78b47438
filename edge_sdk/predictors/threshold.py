"""threshold (CHESS): channel-wise thresholds for SiLU (and any) FFNs; no predictor before the gate.

The gate is computed densely; neuron i is active when |act(g_i)| > t_i, with one row of thresholds per level
(sparsity/threshold.py fits them from the gate and up activations of the calibration tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_sdk.predictors.kind import MaskAndThresholds, PredictorKind, StoredTensor, capacity

if TYPE_CHECKING:
    import torch

    from edge_sdk.export.graph import GraphBuilder
    from edge_sdk.export.graph import _Context as StepContext
    from edge_sdk.model.activation import Activation
    from edge_sdk.model.config import ModelConfig
    from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights
    from edge_sdk.sparsity.settings import CalibrationSettings
    from edge_sdk.sparsity.sparse_model import LayerPredictor


class Threshold(PredictorKind):
    def fit(
        self,
        acts: LayerActivations,
        weights: LayerWeights,
        settings: CalibrationSettings,
        config: ModelConfig,
        factor_dtype: str = "F32",
    ) -> FittedLayer:
        import torch

        from edge_sdk.sparsity.fitting import FittedLayer
        from edge_sdk.sparsity.threshold import fit_channel_thresholds_levels

        levels = settings.layer_levels
        fitted = fit_channel_thresholds_levels(acts.gate_act, acts.up_act, levels)
        stacked = torch.stack([fitted[level].thresholds for level in levels])
        level_index = {level: i for i, level in enumerate(levels)}
        return FittedLayer(
            tensors={"threshold.thresholds": stacked},
            mask=lambda scores, acts, level: acts.gate_act.abs() > stacked[level_index[level]],
            level_tensor="threshold.thresholds",
        )

    def decode_mask(
        self, predictor: LayerPredictor, tokens: torch.Tensor, level_index: int, prefill_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return None, predictor.tensors["threshold.thresholds"][level_index]

    def decision_margins(
        self,
        predictor: LayerPredictor,
        x: torch.Tensor,
        level_index: int,
        thresholds: torch.Tensor | None,
        w_gate: torch.Tensor,
        activation: Activation,
    ) -> torch.Tensor | None:
        """||act(g)| - t| / (|x| |W_gate|^T), inf where t = 0."""
        import torch

        if thresholds is None:
            return None
        gate = x @ w_gate.to(torch.float32).T
        value = activation.gate(gate).abs() - thresholds.float()
        scale = x.abs() @ w_gate.to(torch.float32).abs().T
        margins = value.abs() / scale.clamp_min(torch.finfo(torch.float32).tiny)
        # a zero threshold adds no condition: the neuron's output is continuous at a = 0, nothing can jump
        return torch.where(thresholds > 0, margins, torch.inf)

    def native_masker(self, predictor: LayerPredictor, kernels: Any) -> Callable[..., MaskAndThresholds]:
        thresholds = predictor.tensors["threshold.thresholds"]
        return lambda token, level_index, prefill_row: (None, thresholds[level_index].contiguous())

    def device_thresholds(self, predictor: LayerPredictor, device: torch.device) -> torch.Tensor | None:
        import torch

        return predictor.tensors["threshold.thresholds"].to(device=device, dtype=torch.float32)  # [levels, D]

    def emit_step_mask(
        self, g: GraphBuilder, layer: int, x2d: str, prompt_rows: str, ctx: StepContext
    ) -> tuple[str, str | None]:
        import numpy as np

        mask = g.every_neuron_mask(x2d)
        level = g.op("Gather", [g.weight(f"layers.{layer}.threshold.thresholds"), "sparsity_level"], axis=0)
        zero = g.constant(np.zeros(g.spec.config.intermediate_size, dtype=np.float32))
        return mask, g.op("Where", ["dense", zero, level])  # dense decoding: no threshold condition


KIND = Threshold(
    "threshold",
    "CHESS",
    has_levels=True,
    relu_only=False,
    tensors=(StoredTensor("thresholds", "F32", ("levels", "D")), capacity("levels")),
    ranks_by_up=True,
)
