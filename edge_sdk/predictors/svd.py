"""svd (SVDP): a whitened truncated SVD of W_gate plus a greedy per-neuron bias per level.

mask = (x B^T) A^T + bias[level] > 0, A [D, r], B [r, d], biases [levels, D] (bias = -tau of the greedy
calibration, sparsity/svd_bias.py). The rank is per layer: the smallest of ~2% of D doubling until the layer's
importance-weighted recall on the calibration tokens reaches min_weighted_recall (or the fixed --rank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_sdk.errors import CalibrationError
from edge_sdk.predictors.kind import MaskAndThresholds, PredictorKind, StoredTensor, capacity, check_fraction

if TYPE_CHECKING:
    import torch

    from edge_sdk.export.graph import GraphBuilder
    from edge_sdk.export.graph import _Context as StepContext
    from edge_sdk.model.activation import Activation
    from edge_sdk.model.config import ModelConfig
    from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights
    from edge_sdk.sparsity.settings import CalibrationSettings
    from edge_sdk.sparsity.sparse_model import LayerPredictor


@dataclass(frozen=True)
class SvdSettings:
    """svd's knobs (recorded as CalibrationSettings fields of the same names)."""

    rank: int | None = None  # None = per layer, the smallest of 2% of D, x2, x4, ... meeting min_weighted_recall
    min_weighted_recall: float = 0.998  # automatic rank: importance-weighted recall on calibration tokens
    whiten: bool = True  # False is the naive-SVD ablation
    calibrate_bias: bool = True  # False uses one global threshold per level (the no-bias ablation)


def rank_ladder(settings: CalibrationSettings, config: ModelConfig) -> list[int]:
    """The svd ranks to try, in order: the fixed rank, or about 2% of D doubling up to half of min(d, D)
    (beyond that a low-rank predictor costs about as much as the gate it predicts)."""
    from edge_sdk.sparsity.svd import default_rank

    if settings.rank is not None:
        return [settings.rank]
    limit = min(config.hidden_size, config.intermediate_size)
    ladder = [min(default_rank(config.intermediate_size), limit)]
    while ladder[-1] * 2 <= max(ladder[0], limit // 2):
        ladder.append(ladder[-1] * 2)
    return ladder


class Svd(PredictorKind):
    def check_settings(self, settings: CalibrationSettings, config: ModelConfig) -> None:
        check_fraction("minimum weighted recall", settings.min_weighted_recall)
        if settings.predictor == self.name and settings.rank is not None:
            rank = settings.rank
            limit = min(config.hidden_size, config.intermediate_size)
            if not 1 <= rank <= limit:
                raise CalibrationError(
                    f"rank {rank} is out of range: expected 1 <= rank <= min(d, D) = {limit} "
                    f"(d = {config.hidden_size}, D = {config.intermediate_size})"
                )

    def fit(
        self,
        acts: LayerActivations,
        weights: LayerWeights,
        settings: CalibrationSettings,
        config: ModelConfig,
        factor_dtype: str = "F32",
    ) -> FittedLayer:
        """factor_dtype F16: the factors are rounded as the bundle stores them (with_half_factors) before the rank
        search and the biases see their scores, so the calibrated recall holds for the stored factors."""
        import torch

        from edge_sdk.sparsity.fitting import FittedLayer, weighted_recall
        from edge_sdk.sparsity.svd import fit_svd_predictor, input_gram, with_half_factors
        from edge_sdk.sparsity.svd_bias import calibrate_biases, uniform_biases

        gram = input_gram([acts.x])[0] if settings.whiten else None
        tried = []
        for rank in rank_ladder(settings, config):
            predictor = fit_svd_predictor(weights.w_gate, rank, gram=gram, whiten=settings.whiten, seed=settings.seed)
            if factor_dtype == "F16":
                predictor = with_half_factors(predictor)
            scores = predictor.scores(acts.x)
            if settings.rank is not None:
                break
            level = settings.reference_level
            bias = calibrate_biases(scores, acts.importance, [level])[level]
            recall = weighted_recall(scores + bias > 0, acts)
            tried.append({"rank": rank, "calibration_weighted_recall": recall})
            if recall >= settings.min_weighted_recall:
                break
        levels = settings.layer_levels
        if settings.calibrate_bias:
            biases = calibrate_biases(scores, acts.importance, levels)
        else:
            biases = uniform_biases(scores, levels)
        stacked = torch.stack([biases[level] for level in levels])
        level_index = {level: i for i, level in enumerate(levels)}
        stored = torch.float16 if factor_dtype == "F16" else torch.float32
        return FittedLayer(
            tensors={"svd.a": predictor.a.to(stored), "svd.b": predictor.b.to(stored), "svd.biases": stacked},
            mask=lambda scores, acts, level: scores + stacked[level_index[level]] > 0,
            score=predictor.scores,
            details={
                "rank": predictor.rank,
                "rank_search": tried,
                "whitened": predictor.whitened,
                "regularizer": predictor.regularizer,
                "bias": "greedy" if settings.calibrate_bias else "uniform",
                "factor_dtype": factor_dtype,
            },
            level_tensor="svd.biases",
        )

    def decode_mask(
        self, predictor: LayerPredictor, tokens: torch.Tensor, level_index: int, prefill_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        tensors = predictor.tensors
        scores = (tokens.float() @ tensors["svd.b"].float().T) @ tensors["svd.a"].float().T  # F16 factors widened
        return scores + tensors["svd.biases"][level_index] > 0, None

    def decision_margins(
        self,
        predictor: LayerPredictor,
        x: torch.Tensor,
        level_index: int,
        thresholds: torch.Tensor | None,
        w_gate: torch.Tensor,
        activation: Activation,
    ) -> torch.Tensor | None:
        """|scores + bias| / ((|x| |B|^T) |A|^T + |bias|): the sums whose terms' rounding errors add up to the
        decision's."""
        import torch

        tensors = predictor.tensors
        a, b, bias = tensors["svd.a"].float(), tensors["svd.b"].float(), tensors["svd.biases"][level_index]
        value = (x @ b.T) @ a.T + bias
        scale = (x.abs() @ b.abs().T) @ a.abs().T + bias.abs()
        return value.abs() / scale.clamp_min(torch.finfo(torch.float32).tiny)

    def native_masker(self, predictor: LayerPredictor, kernels: Any) -> Callable[..., MaskAndThresholds]:
        tensors = predictor.tensors
        a_t = tensors["svd.a"].t().contiguous()  # the layout the kernels read, in the stored dtype (F32 or F16)
        b, biases = tensors["svd.b"], tensors["svd.biases"]
        return lambda token, level_index, prefill_row: (kernels.svd_predictor(token, a_t, b, biases[level_index]), None)

    def device_scorer(
        self, predictor: LayerPredictor, d: int, device: torch.device
    ) -> Callable[..., torch.Tensor] | None:
        """x B^T A^T + b in float32 from the unrounded x (backends/cann/gather_ffn.py: why never in fp16)."""
        import torch

        tensors = predictor.tensors
        a = tensors["svd.a"].to(device=device, dtype=torch.float32)  # [D, r]
        b = tensors["svd.b"].to(device=device, dtype=torch.float32)  # [r, d]
        biases = tensors["svd.biases"].to(device=device, dtype=torch.float32)  # [levels, D]

        def scores(x: torch.Tensor, level_index: int, prefill_row: torch.Tensor | None) -> torch.Tensor:
            x_f = x.to(device=device, dtype=torch.float32).unsqueeze(0)  # [1, d], unrounded
            low_rank = ((x_f @ b.T) @ a.T)[0]  # [D] float32
            return low_rank + biases[level_index]

        return scores

    def emit_step_mask(
        self, g: GraphBuilder, layer: int, x2d: str, prompt_rows: str, ctx: StepContext
    ) -> tuple[str, str | None]:
        prefix = f"layers.{layer}"
        bias = g.op("Gather", [g.weight(f"{prefix}.svd.biases"), "sparsity_level"], axis=0)
        inputs = [x2d, g.weight(f"{prefix}.svd.a"), g.weight(f"{prefix}.svd.b"), bias]
        return g.custom("SvdPredictor", inputs, hint="svd_mask"), None


KIND = Svd(
    "svd",
    "SVDP",
    has_levels=True,
    relu_only=True,
    tensors=(
        StoredTensor("a", "F32", ("D", "rank"), factor=True),
        StoredTensor("b", "F32", ("rank", "d"), factor=True),
        StoredTensor("biases", "F32", ("levels", "D")),
        capacity("levels"),
    ),
    gate_first=False,
    knobs=("rank", "min_weighted_recall", "whiten", "calibrate_bias"),
)
