"""What a calibration is asked to do: CalibrationSettings, its checks against the model, and the memory it needs.

CalibrationSettings is also the record of a calibration: report.json, predictors.safetensors' metadata and a
bundle's manifest store its fields as they are, in this order. The fields are the settings every kind shares and
each kind's knobs; a knob's default, meaning and range check belong to its kind (the settings dataclass and
check_settings of edge_sdk/predictors/<kind>.py), and its field here takes the default from there.

No torch: the CLI reads its option defaults from here on a device install too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_sdk import memory, predictors
from edge_sdk.bundle.manifest import MAX_LEVELS
from edge_sdk.errors import CalibrationError
from edge_sdk.model.config import ModelConfig
from edge_sdk.predictors.core import CoreSettings
from edge_sdk.predictors.kind import check_fraction
from edge_sdk.predictors.signbit import SignBitSettings
from edge_sdk.predictors.svd import SvdSettings

DEFAULT_CALIBRATION_TOKENS = 20_000  # the SVDP paper's ~112 few-shot samples
DEFAULT_CHUNK_TOKENS = 512
DEFAULT_LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
REFERENCE_SPARSITY = 0.5  # about the level the rank search and AUROC use while the default is still unknown
LEVEL_ALLOCATIONS = ("importance", "uniform")
# The per-layer levels a model-wide level is allocated from (with the model-wide levels themselves): level 0
# (every neuron a candidate) costs nothing, and 0.95 serves layers that are more than 95% truly sparse.
ALLOCATION_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
MIN_CALIBRATION_TOKENS = 256
# choosing the default level (sparsity/validation.py)
DEFAULT_PPL_BUDGET_PERCENT = 0.5  # half of the "under 1% loss" goal, leaving room for text unlike the validation
DEFAULT_VALIDATION_TOKENS = 2048
MIN_VALIDATION_TOKENS = 128  # one chunk: the prompt plus 95 scored tokens
# The fields that choose and allocate the sparsity levels, which only the kinds calibrated at levels read
LEVEL_FIELDS = ("sparsity", "levels", "ppl_budget", "validation_tokens", "level_allocation")


@dataclass(frozen=True)
class CalibrationSettings:
    """What to calibrate. `sparsity` is the default operating level, None to choose it on validation tokens
    (sparsity/validation.py; predictors with levels only); `levels` are all kept."""

    predictor: str = "svd"
    rank: int | None = SvdSettings.rank
    min_weighted_recall: float = SvdSettings.min_weighted_recall
    sparsity: float | None = None
    levels: tuple[float, ...] = DEFAULT_LEVELS
    ppl_budget: float = DEFAULT_PPL_BUDGET_PERCENT  # choosing the level: validation perplexity increase, percent
    validation_tokens: int = DEFAULT_VALIDATION_TOKENS  # choosing the level: at most this many, not fitted on
    whiten: bool = SvdSettings.whiten
    calibrate_bias: bool = SvdSettings.calibrate_bias
    recall_target: float = SignBitSettings.recall_target
    core_alpha: float = CoreSettings.alpha
    core_beta: float = CoreSettings.beta
    core_prompt_fraction: float = CoreSettings.prompt_fraction
    level_allocation: str = "importance"  # levels with several: across layers, or "uniform" (sparsity/levels.py)
    max_tokens: int = DEFAULT_CALIBRATION_TOKENS
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    seed: int = 0

    @property
    def kind(self) -> predictors.PredictorKind:
        return predictors.kind(self.predictor)

    @property
    def chooses_level(self) -> bool:
        """Whether calibration picks the default level from validation perplexity."""
        return self.sparsity is None and self.predictor in predictors.LEVEL_KINDS

    @property
    def reference_level(self) -> float:
        """The given default level; while it is to be chosen, the calibrated level nearest REFERENCE_SPARSITY."""
        if self.sparsity is not None:
            return self.sparsity
        return min(self.all_levels, key=lambda level: abs(level - REFERENCE_SPARSITY), default=REFERENCE_SPARSITY)

    @property
    def all_levels(self) -> tuple[float, ...]:
        """The calibrated levels, sorted, always including a given default operating level."""
        given = () if self.sparsity is None else (self.sparsity,)
        return tuple(sorted({round(level, 6) for level in (*self.levels, *given)}))

    @property
    def layer_levels(self) -> tuple[float, ...]:
        """The levels each layer is fitted at: the allocation grid and the model-wide levels, or those alone."""
        if self.level_allocation == "uniform":
            return self.all_levels
        return tuple(sorted({*ALLOCATION_GRID, *self.all_levels}))


def kinds_reading(field: str) -> tuple[str, ...]:
    """The calibrated predictor kinds whose calibration reads this CalibrationSettings field: a kind's own knob, a
    level field (LEVEL_FIELDS), or a field every kind reads."""
    knob_owners = tuple(name for name in predictors.CALIBRATED_KINDS if field in predictors.kind(name).knobs)
    if knob_owners:
        return knob_owners
    if field in LEVEL_FIELDS:
        return predictors.LEVEL_KINDS
    return predictors.CALIBRATED_KINDS


def validate_settings(config: ModelConfig, settings: CalibrationSettings) -> None:
    """Reject settings that do not fit the model before any work starts."""
    if settings.predictor not in predictors.CALIBRATED_KINDS:
        raise CalibrationError(
            f"predictor {settings.predictor!r} is not supported; expected one of "
            f"{', '.join(predictors.CALIBRATED_KINDS)}"
        )
    if not predictors.serves(settings.predictor, config.activation):
        raise CalibrationError(
            f"predictor '{settings.predictor}' needs {predictors.NEEDS_EXACT_ZEROS}; this model's hidden_act is "
            f"{config.activation.kind}: use --predictor threshold"
        )
    if settings.sparsity is not None:
        check_fraction("sparsity", settings.sparsity)
    if settings.level_allocation not in LEVEL_ALLOCATIONS:
        raise CalibrationError(
            f"level allocation {settings.level_allocation!r} is not supported; expected one of "
            f"{', '.join(LEVEL_ALLOCATIONS)}"
        )
    if settings.chooses_level and not settings.levels:
        raise CalibrationError("no sparsity levels to choose the default level from: give --levels or --sparsity")
    budget = settings.ppl_budget
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < math.inf:
        raise CalibrationError(f"perplexity budget must be a percentage >= 0, found {budget!r}")
    if settings.validation_tokens < MIN_VALIDATION_TOKENS:
        raise CalibrationError(
            f"validation tokens {settings.validation_tokens} is too few: at least {MIN_VALIDATION_TOKENS} are needed"
        )
    for level in settings.levels:
        check_fraction("sparsity level", level)
    if len(settings.all_levels) > MAX_LEVELS:
        raise CalibrationError(
            f"{len(settings.all_levels)} distinct sparsity levels (--levels with --sparsity) are too many: a bundle "
            f"holds at most {MAX_LEVELS}"
        )
    for kind in predictors.KINDS.values():  # every kind's knobs are recorded, so every kind checks its own
        kind.check_settings(settings, config)
    if settings.max_tokens < MIN_CALIBRATION_TOKENS:
        raise CalibrationError(
            f"calibration tokens {settings.max_tokens} is too few: at least {MIN_CALIBRATION_TOKENS} are needed"
        )


def check_calibration_memory(config: ModelConfig, settings: CalibrationSettings, evaluating: bool) -> None:
    """Refuse, with the figure, a token count whose activations do not fit: the residual stream and FFN inputs of
    every calibration token (and held-out token) [N, d], about five [N, D] float32 intermediates of the layer being
    fitted (gate activations, importance, up activations, scores, masks), the validation streams (dense and one
    per level), and one layer's weights twice in float32."""
    d, n_neurons, tokens = config.hidden_size, config.intermediate_size, settings.max_tokens
    held_out = tokens if evaluating else 0
    validation = settings.validation_tokens * (1 + len(settings.all_levels)) if settings.chooses_level else 0
    activations = 4 * (2 * d * (tokens + held_out) + 5 * n_neurons * tokens + d * validation)
    weights = 4 * (2 * 3 * d * n_neurons + 4 * d * d + config.vocab_size * d)
    memory.require(
        f"calibrating on {tokens} tokens",
        activations + weights,
        f"activations {activations / memory.GIB:.2f} GiB, weights {weights / memory.GIB:.2f} GiB",
        "use fewer --tokens (20000 suffice for a 7B model)",
    )
