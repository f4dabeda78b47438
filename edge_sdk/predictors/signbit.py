"""signbit (SparseInfer, Jetson): the sign bits of W_gate packed 32 per int32 word, and one alpha per layer.

Per row, XOR + popcount of the packed sign bits of W_gate and x counts the products predicted negative; a neuron is
predicted inactive when alpha * N_pos < N_neg (sparsity/signbit.py). alpha is calibrated per layer to reach
recall_target on the calibration tokens. One operating point: no levels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_sdk.predictors.kind import MaskAndThresholds, PredictorKind, StoredTensor, capacity, check_fraction

if TYPE_CHECKING:
    import torch

    from edge_sdk.export.graph import GraphBuilder
    from edge_sdk.export.graph import _Context as StepContext
    from edge_sdk.model.config import ModelConfig
    from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights
    from edge_sdk.sparsity.settings import CalibrationSettings
    from edge_sdk.sparsity.sparse_model import LayerPredictor


@dataclass(frozen=True)
class SignBitSettings:
    """signbit's knob (recorded as the CalibrationSettings field of the same name)."""

    recall_target: float = 0.99  # per-layer alpha reaches this recall on calibration data


class SignBit(PredictorKind):
    def check_settings(self, settings: CalibrationSettings, config: ModelConfig) -> None:
        check_fraction("recall target", settings.recall_target, low_open=True)

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
        from edge_sdk.sparsity.signbit import calibrate_alpha, pack_sign_bits, signbit_mask

        packed = pack_sign_bits(weights.w_gate)
        d = config.hidden_size
        stored = torch.tensor([calibrate_alpha(packed, acts.x, acts.truly_active, settings.recall_target)])
        stored = stored.to(torch.float32)
        alpha = float(stored[0])  # the statistics are the stored (float32) alpha's, the one every runtime reads
        return FittedLayer(
            tensors={"signbit.packed": packed, "signbit.alpha": stored},
            mask=lambda scores, acts, level: signbit_mask(packed, acts.x, alpha, d),
            details={"alpha": alpha},
            level_dependent=False,
        )

    def decode_mask(
        self, predictor: LayerPredictor, tokens: torch.Tensor, level_index: int, prefill_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        from edge_sdk.sparsity.signbit import signbit_mask

        tensors = predictor.tensors
        return signbit_mask(tensors["signbit.packed"], tokens.float(), float(tensors["signbit.alpha"][0])), None

    def native_masker(self, predictor: LayerPredictor, kernels: Any) -> Callable[..., MaskAndThresholds]:
        packed, alpha = predictor.tensors["signbit.packed"], float(predictor.tensors["signbit.alpha"][0])
        return lambda token, level_index, prefill_row: (kernels.signbit_predictor(token, packed, alpha), None)

    def device_scorer(
        self, predictor: LayerPredictor, d: int, device: torch.device
    ) -> Callable[..., torch.Tensor] | None:
        from edge_sdk.sparsity.signbit import DeviceSignBit

        tensors = predictor.tensors
        signbit = DeviceSignBit(tensors["signbit.packed"], float(tensors["signbit.alpha"][0]), d, device)
        return lambda x, level_index, prefill_row: signbit.scores(x.to(device))

    def graph_attributes(self, tensor: Callable[[str], torch.Tensor]) -> dict[str, float]:
        return {"alpha": float(tensor("alpha")[0])}

    def emit_step_mask(
        self, g: GraphBuilder, layer: int, x2d: str, prompt_rows: str, ctx: StepContext
    ) -> tuple[str, str | None]:
        alpha = g.spec.layer_attributes[layer]["alpha"]
        packed = g.weight(f"layers.{layer}.signbit.packed")
        return g.custom("SignBitPredictor", [x2d, packed], hint="signbit_mask", alpha=alpha), None


KIND = SignBit(
    "signbit",
    "SparseInfer (Jetson)",
    has_levels=False,
    relu_only=True,
    tensors=(
        StoredTensor("packed", "I32", ("D", "words")),
        StoredTensor("alpha", "F32", (1,), finite=True),
        capacity(1),
    ),
    gate_first=False,
    knobs=("recall_target",),
)
