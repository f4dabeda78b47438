"""Calibrate sparsity predictors for a whole model, one layer at a time, and measure them.

This is what `edge-sdk calibrate` runs and what the exporter calls. For each layer it fits the chosen
predictor on the calibration tokens' FFN inputs and evaluates it (on held-out text when given) with
the metrics of sparsity/metrics.py, at every calibrated sparsity level.

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

Predictor tensors are named `layers.{i}.{kind}.{tensor}`:
  svd        a [D, r], b [r, d], biases [levels, D]        (mask = x B^T A^T + biases[level] > 0)
  signbit    packed [D, ceil(d/32)] int32, alpha [1]      (SparseInfer; one alpha per layer)
  threshold  thresholds [levels, D]                       (CHESS; active = |act(g)| > t)
  core       none but capacity: the mask is computed from the prompt at prefill (alpha, beta in the report)
and every kind has {kind}.capacity [levels or 1] int32: the 99th percentile of the per-token predicted-active
count on the calibration tokens, for executors with static shapes. Row k of biases, thresholds and capacity
belongs to model-wide level k: the layer's own level allocated to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edge_sdk import memory, outputs
from edge_sdk.errors import CalibrationError
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.config import ModelConfig
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.loader import load_layer
from edge_sdk.sparsity.collect import (
    DEFAULT_CALIBRATION_TOKENS,
    DEFAULT_CHUNK_TOKENS,
    LayerCapture,
    calibration_chunks,
    read_calibration_texts,
    stream_layers,
    token_chunks,
    token_stream,
)
from edge_sdk.sparsity.core import core_neuron_mask
from edge_sdk.sparsity.ffn import ffn_intermediates
from edge_sdk.sparsity.metrics import layer_metrics
from edge_sdk.sparsity.signbit import calibrate_alpha, pack_sign_bits, signbit_mask
from edge_sdk.sparsity.sparse_model import LayerPredictor
from edge_sdk.sparsity.svd import default_rank, fit_svd_predictor, input_gram
from edge_sdk.sparsity.svd_bias import calibrate_biases
from edge_sdk.sparsity.threshold import fit_channel_thresholds_levels
from edge_sdk.sparsity.validation import (
    DEFAULT_PPL_BUDGET_PERCENT,
    DEFAULT_VALIDATION_TOKENS,
    MIN_VALIDATION_TOKENS,
    VALIDATION_PROMPT_TOKENS,
    LevelValidation,
    split_validation,
)

PREDICTOR_KINDS = ("svd", "signbit", "core", "threshold")
RELU_ONLY_KINDS = ("svd", "signbit", "core")
LEVEL_KINDS = ("svd", "threshold")  # predictors calibrated at several sparsity levels
DEFAULT_LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
REFERENCE_SPARSITY = 0.5  # about the level the rank search and AUROC use while the default is still unknown
LEVEL_ALLOCATIONS = ("importance", "uniform")
# The per-layer levels a model-wide level is allocated from (with the model-wide levels themselves): level 0
# (every neuron a candidate) costs nothing, and 0.95 serves layers that are more than 95% truly sparse.
ALLOCATION_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
MIN_CALIBRATION_TOKENS = 256
CAPACITY_QUANTILE = 0.99
PREDICTORS_FILE, REPORT_FILE, PLOT_FILE = outputs.PREDICTORS_FILES


@dataclass(frozen=True)
class CalibrationSettings:
    """What to calibrate. `sparsity` is the default operating level, None to choose it on validation tokens
    (sparsity/validation.py; predictors with levels only); `levels` are all kept."""

    predictor: str = "svd"
    rank: int | None = None  # svd; None = per layer, the smallest of 2% of D, x2, x4, ... meeting the bar below
    min_weighted_recall: float = 0.998  # svd with automatic rank: importance-weighted recall on calibration tokens
    sparsity: float | None = None
    levels: tuple[float, ...] = DEFAULT_LEVELS
    ppl_budget: float = DEFAULT_PPL_BUDGET_PERCENT  # choosing the level: validation perplexity increase, percent
    validation_tokens: int = DEFAULT_VALIDATION_TOKENS  # choosing the level: at most this many, not fitted on
    whiten: bool = True  # svd; False is the naive-SVD ablation
    calibrate_bias: bool = True  # svd; False uses one global threshold per level (the no-bias ablation)
    recall_target: float = 0.99  # signbit: per-layer alpha reaches this recall on calibration data
    core_alpha: float = 0.4  # core: top fraction of each prompt token's positive activations
    core_beta: float = 0.2  # core: fraction of neurons kept for the decode
    core_prompt_fraction: float = 0.5  # core evaluation: leading share of each chunk used as the prompt
    level_allocation: str = "importance"  # levels with several: across layers, or "uniform" (module docstring)
    max_tokens: int = DEFAULT_CALIBRATION_TOKENS
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    seed: int = 0

    @property
    def chooses_level(self) -> bool:
        """Whether calibration picks the default level from validation perplexity."""
        return self.sparsity is None and self.predictor in LEVEL_KINDS

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

    def rank_ladder(self, config: ModelConfig) -> list[int]:
        """The svd ranks to try, in order: the fixed rank, or about 2% of D doubling up to half of min(d, D)
        (beyond that a low-rank predictor costs about as much as the gate it predicts)."""
        if self.rank is not None:
            return [self.rank]
        limit = min(config.hidden_size, config.intermediate_size)
        ladder = [min(default_rank(config.intermediate_size), limit)]
        while ladder[-1] * 2 <= max(ladder[0], limit // 2):
            ladder.append(ladder[-1] * 2)
        return ladder


def _check_fraction(name: str, value: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= 1):
        raise CalibrationError(f"{name} must be a number in [0, 1], found {value!r}")
    if low_open and value == 0:
        raise CalibrationError(f"{name} must be in (0, 1], found {value!r}")


def validate_settings(config: ModelConfig, settings: CalibrationSettings) -> None:
    """Reject settings that do not fit the model before any work starts."""
    if settings.predictor not in PREDICTOR_KINDS:
        raise CalibrationError(
            f"predictor {settings.predictor!r} is not supported; expected one of {', '.join(PREDICTOR_KINDS)}"
        )
    if settings.predictor in RELU_ONLY_KINDS and not config.activation.is_relu_family:
        raise CalibrationError(
            f"predictor '{settings.predictor}' needs a ReLU-family FFN (relu, fatrelu, drelu) whose inactive "
            f"neurons are exact zeros; this model's hidden_act is {config.activation.kind}: use --predictor threshold"
        )
    if settings.sparsity is not None:
        _check_fraction("sparsity", settings.sparsity)
    if settings.level_allocation not in LEVEL_ALLOCATIONS:
        raise CalibrationError(
            f"level allocation {settings.level_allocation!r} is not supported; expected one of "
            f"{', '.join(LEVEL_ALLOCATIONS)}"
        )
    if settings.sparsity is None and settings.predictor in LEVEL_KINDS and not settings.levels:
        raise CalibrationError("no sparsity levels to choose the default level from: give --levels or --sparsity")
    budget = settings.ppl_budget
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < math.inf:
        raise CalibrationError(f"perplexity budget must be a percentage >= 0, found {budget!r}")
    if settings.validation_tokens < MIN_VALIDATION_TOKENS:
        raise CalibrationError(
            f"validation tokens {settings.validation_tokens} is too few: at least {MIN_VALIDATION_TOKENS} are needed"
        )
    for level in settings.levels:
        _check_fraction("sparsity level", level)
    _check_fraction("recall target", settings.recall_target, low_open=True)
    _check_fraction("core alpha", settings.core_alpha, low_open=True)
    _check_fraction("core beta", settings.core_beta, low_open=True)
    _check_fraction("minimum weighted recall", settings.min_weighted_recall)
    if settings.predictor == "svd" and settings.rank is not None:
        rank = settings.rank
        limit = min(config.hidden_size, config.intermediate_size)
        if not 1 <= rank <= limit:
            raise CalibrationError(
                f"rank {rank} is out of range: expected 1 <= rank <= min(d, D) = {limit} "
                f"(d = {config.hidden_size}, D = {config.intermediate_size})"
            )
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

    @property
    def truly_active(self) -> torch.Tensor:
        return self.gate_act != 0

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


def _weighted_recall(predicted: torch.Tensor, acts: LayerActivations) -> float:
    truly_active = acts.truly_active
    kept = acts.importance[predicted & truly_active].double().sum()
    return float(kept / acts.importance[truly_active].double().sum().clamp_min(1e-300))


def _fit_svd(acts: LayerActivations, weights: LayerWeights, settings, config) -> FittedLayer:
    gram = input_gram([acts.x])[0] if settings.whiten else None
    tried = []
    for rank in settings.rank_ladder(config):
        predictor = fit_svd_predictor(weights.w_gate, rank, gram=gram, whiten=settings.whiten, seed=settings.seed)
        scores = predictor.scores(acts.x)
        if settings.rank is not None:
            break
        level = settings.reference_level
        bias = calibrate_biases(scores, acts.importance, [level])[level]
        recall = _weighted_recall(scores + bias > 0, acts)
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
    return FittedLayer(
        tensors={"svd.a": predictor.a, "svd.b": predictor.b, "svd.biases": stacked},
        mask=lambda scores, acts, level: scores + stacked[level_index[level]] > 0,
        score=predictor.scores,
        details={
            "rank": predictor.rank,
            "rank_search": tried,
            "whitened": predictor.whitened,
            "regularizer": predictor.regularizer,
            "bias": "greedy" if settings.calibrate_bias else "uniform",
        },
        level_tensor="svd.biases",
    )


def _fit_signbit(acts: LayerActivations, weights: LayerWeights, settings, config) -> FittedLayer:
    packed = pack_sign_bits(weights.w_gate)
    d = config.hidden_size
    alpha = calibrate_alpha(packed, acts.x, acts.truly_active, settings.recall_target)
    return FittedLayer(
        tensors={"signbit.packed": packed, "signbit.alpha": torch.tensor([alpha], dtype=torch.float32)},
        mask=lambda scores, acts, level: signbit_mask(packed, acts.x, alpha, d),
        details={"alpha": alpha},
        level_dependent=False,
    )


def _fit_threshold(acts: LayerActivations, weights: LayerWeights, settings, config) -> FittedLayer:
    levels = settings.layer_levels
    fitted = fit_channel_thresholds_levels(acts.gate_act, acts.up_act, levels)
    stacked = torch.stack([fitted[level].thresholds for level in levels])
    level_index = {level: i for i, level in enumerate(levels)}
    return FittedLayer(
        tensors={"threshold.thresholds": stacked},
        mask=lambda scores, acts, level: acts.gate_act.abs() > stacked[level_index[level]],
        level_tensor="threshold.thresholds",
    )


def _fit_core(acts: LayerActivations, weights: LayerWeights, settings, config) -> FittedLayer:
    chunk_len = settings.chunk_tokens

    def mask(scores, acts, level):
        # Each chunk is a sequence: its first tokens are the prompt (dense prefill), whose activations
        # choose the core neurons used for every following (decode) token of that chunk.
        gate_act = acts.gate_act
        chunks = gate_act.view(-1, min(chunk_len, gate_act.shape[0]), gate_act.shape[1])
        prompt_len = max(1, int(chunks.shape[1] * settings.core_prompt_fraction))
        predicted = torch.ones_like(chunks, dtype=torch.bool)
        for index, chunk in enumerate(chunks):
            predicted[index, prompt_len:] = core_neuron_mask(
                chunk[:prompt_len], settings.core_alpha, settings.core_beta
            )
        return predicted.view_as(gate_act)

    return FittedLayer(
        tensors={},
        mask=mask,
        details={"alpha": settings.core_alpha, "beta": settings.core_beta},
        level_dependent=False,
    )


def _levels(fitted: FittedLayer, settings) -> tuple[float, ...]:
    return settings.layer_levels if fitted.level_dependent else (settings.reference_level,)


@dataclass
class LevelStatistics:
    """One layer's predictor at each of its levels (one when it has none), on the calibration tokens."""

    capacity: torch.Tensor  # [levels] int32: the static row count a fixed-shape executor gathers
    sparsity: list[float]  # predicted sparsity
    missed_importance: list[float]  # 1 - importance-weighted recall


def _level_statistics(fitted: FittedLayer, acts: LayerActivations, scores, settings) -> LevelStatistics:
    """Per level: the 99th percentile over calibration tokens of how many neurons the predictor marks active
    (top-k to this capacity instead of a data-dependent nonzero; backends/cann), the predicted sparsity and the
    share of the layer's importance on truly active neurons predicted inactive. Both rise with the level (its
    masks are nested)."""
    if settings.predictor == "core":
        capacity = math.ceil(settings.core_beta * acts.gate_act.shape[1])
        return LevelStatistics(torch.tensor([capacity], dtype=torch.int32), [1.0 - settings.core_beta], [0.0])
    capacities, sparsities, missed_shares = [], [], []
    for level in _levels(fitted, settings):
        predicted = fitted.mask(scores, acts, level)
        per_token = predicted.sum(dim=1, dtype=torch.float64)
        capacities.append(math.ceil(torch.quantile(per_token, CAPACITY_QUANTILE).item()))
        sparsities.append(1.0 - per_token.mean().item() / predicted.shape[1])
        missed_shares.append(1.0 - _weighted_recall(predicted, acts))
    return LevelStatistics(torch.tensor(capacities, dtype=torch.int32), sparsities, missed_shares)


FITTERS = {"svd": _fit_svd, "signbit": _fit_signbit, "threshold": _fit_threshold, "core": _fit_core}


def _evaluate(fitted: FittedLayer, acts: LayerActivations, scores, settings, config) -> dict:
    truly_active = acts.truly_active
    rank = fitted.details.get("rank", 0)

    def metrics_at(level: float, with_auroc: bool) -> dict:
        predicted = fitted.mask(scores, acts, level)
        return layer_metrics(
            truly_active, predicted, acts.importance, scores if with_auroc else None, rank=rank, d=config.hidden_size
        )

    # The AUROC ranks the predictor's scores, so it is computed once, at the reference level; calibrate_model
    # replaces the other top-level metrics by the default level's once that is known.
    result = metrics_at(settings.reference_level, with_auroc=True)
    if fitted.level_dependent:
        result["per_level"] = {f"{level:g}": metrics_at(level, with_auroc=False) for level in settings.layer_levels}
    return result


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


@dataclass
class CalibrationResult:
    tensors: dict[str, torch.Tensor]
    report: dict[str, Any]


def fitting_chunks(
    checkpoint: Checkpoint | GgufCheckpoint, settings: CalibrationSettings, calibration_files: Sequence[str | Path]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids [C, L] of the calibration text the predictors are fitted on, and [C', L] of the validation tokens
    held back from them when the default level is to be chosen (None when it is not, or the text is too short)."""
    tokenizer = checkpoint.tokenizer()
    chunk_tokens = min(settings.chunk_tokens, checkpoint.config.max_position_embeddings)
    texts = read_calibration_texts(calibration_files)
    if not settings.chooses_level:
        return calibration_chunks(tokenizer, texts, settings.max_tokens, chunk_tokens, MIN_CALIBRATION_TOKENS), None
    stream = token_stream(tokenizer, texts, settings.max_tokens + settings.validation_tokens)
    fit, held = split_validation(stream, settings.max_tokens, settings.validation_tokens, MIN_CALIBRATION_TOKENS)
    return token_chunks(fit, chunk_tokens, MIN_CALIBRATION_TOKENS), token_chunks(held, chunk_tokens) if held else None


def calibrate_model(
    checkpoint: Checkpoint | GgufCheckpoint,
    settings: CalibrationSettings,
    calibration_files: Sequence[str | Path],
    evaluation_files: Sequence[str | Path] = (),
    on_layer: Callable[[int], None] | None = None,
    on_layer_validated: Callable[[int], None] | None = None,
) -> CalibrationResult:
    """Fit the predictor of every layer on the calibration text; evaluate on held-out text when given. Without
    a given default level (settings.sparsity None), choose it on validation tokens of the calibration text
    that the predictors are not fitted on (sparsity/validation.py). on_layer(i) is called after layer i is
    fitted, on_layer_validated(i) after the validation streams went through it (a second pass over the layers).

    checkpoint is the model the bundle holds: for int8 / int4 the exporter passes its quantized weights
    (export/quantized_checkpoint.py), so the predictors see the hidden states the runtimes will compute and the
    default level's budget is measured from the quantized dense model (quantization and sparsity errors add up)."""
    config = checkpoint.config
    validate_settings(config, settings)
    check_calibration_memory(config, settings, evaluating=bool(evaluation_files))
    torch.manual_seed(settings.seed)
    tokenizer = checkpoint.tokenizer()
    chunk_tokens = min(settings.chunk_tokens, config.max_position_embeddings)
    settings = CalibrationSettings(**{**asdict(settings), "chunk_tokens": chunk_tokens})
    chunks, held = fitting_chunks(checkpoint, settings, calibration_files)
    validation = None
    if held is not None:
        validation = LevelValidation(checkpoint, held, settings.all_levels, VALIDATION_PROMPT_TOKENS)
    streams = [stream_layers(checkpoint, chunks)]
    if evaluation_files:
        eval_chunks = calibration_chunks(
            tokenizer, read_calibration_texts(evaluation_files), settings.max_tokens, chunk_tokens, chunk_tokens
        )
        streams.append(stream_layers(checkpoint, eval_chunks))

    fits: list[tuple[FittedLayer, dict[str, Any]]] = []
    sparsity_curves: list[list[float]] = []  # per layer, per layer level: calibration statistics
    cost_curves: list[list[float]] = []
    for captures in zip(*streams, strict=True):
        calibration = captures[0]
        weights = LayerWeights.of(calibration)
        acts = LayerActivations.compute(
            calibration.ffn_input, weights, config.activation, keep_up=settings.predictor == "threshold"
        )
        fitted = FITTERS[settings.predictor](acts, weights, settings, config)
        acts.up_act = None
        scores = fitted.score(acts.x)
        statistics = _level_statistics(fitted, acts, scores, settings)
        fitted.tensors[f"{settings.predictor}.capacity"] = statistics.capacity
        sparsity_curves.append(statistics.sparsity)
        cost_curves.append(statistics.missed_importance)
        layer_report = {"layer": calibration.index, **fitted.details}
        if len(captures) > 1:
            del acts, scores
            held_out = LayerWeights.of(captures[1])
            acts = LayerActivations.compute(captures[1].ffn_input, held_out, config.activation)
            scores = fitted.score(acts.x)
        layer_report |= _evaluate(fitted, acts, scores, settings, config)
        del acts, scores
        fits.append((fitted, layer_report))
        if on_layer is not None:
            on_layer(calibration.index)

    tensors: dict[str, torch.Tensor] = {}
    layers = []
    allocation = _allocation(settings, sparsity_curves, cost_curves, len(fits))
    for index, (fitted, layer_report) in enumerate(fits):
        layer_tensors = _allocated_tensors(fitted, settings, allocation, index)
        tensors |= {f"layers.{index}.{name}": tensor.contiguous() for name, tensor in layer_tensors.items()}
        layer_report["capacity"] = layer_tensors[f"{settings.predictor}.capacity"].tolist()
        if allocation is not None:
            layer_report["per_level"] = _allocated_metrics(layer_report["per_level"], settings, allocation, index)
        layers.append(layer_report)
        if validation is not None:
            # the allocation needs every layer's curves first, so validation reads each layer again, one at a time
            validation.advance(load_layer(checkpoint, index), LayerPredictor(settings.predictor, layer_tensors))
            if on_layer_validated is not None:
                on_layer_validated(index)

    default_level, choice = _default_level(settings, validation)
    # a dense default has no metrics of its own: the per-layer figures are the mildest level's
    metrics_level = settings.all_levels[0] if default_level is None else default_level
    for layer in layers:
        if "per_level" in layer:
            layer |= layer["per_level"][f"{metrics_level:g}"]
    report = {
        "model": str(checkpoint.model_dir),
        "architecture": config.architecture,
        "activation": config.activation.kind,
        "predictor": settings.predictor,
        "settings": asdict(settings),
        "levels": list(settings.all_levels),
        "default_level": default_level,
        "default_level_choice": choice,
        "metrics_level": metrics_level,
        "calibration_tokens": int(chunks.numel()),
        "evaluated_on": "held-out" if evaluation_files else "calibration",
        "layers": layers,
    }
    return CalibrationResult(tensors, report)


def _allocation(
    settings: CalibrationSettings, sparsity_curves: list[list[float]], cost_curves: list[list[float]], n_layers: int
) -> dict[float, list[int]] | None:
    """Per model-wide level, each layer's index into settings.layer_levels; None for predictors without levels."""
    if settings.predictor not in LEVEL_KINDS:
        return None
    if settings.level_allocation == "uniform":
        return {level: [settings.layer_levels.index(level)] * n_layers for level in settings.all_levels}
    return allocate_levels(settings.all_levels, sparsity_curves, cost_curves)


def _allocated_tensors(
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


def _allocated_metrics(
    per_layer_level: dict[str, dict], settings: CalibrationSettings, allocation: dict[float, list[int]], layer: int
) -> dict[str, dict]:
    """A layer's metrics per model-wide level, from those at its own levels, naming the level allocated."""
    metrics = {}
    for level in settings.all_levels:
        layer_level = settings.layer_levels[allocation[level][layer]]
        metrics[f"{level:g}"] = {"layer_level": layer_level, **per_layer_level[f"{layer_level:g}"]}
    return metrics


def _default_level(
    settings: CalibrationSettings, validation: LevelValidation | None
) -> tuple[float | None, dict[str, Any]]:
    """The default operating level (None: dense) and how it was set, for the report."""
    if settings.sparsity is not None:
        return settings.sparsity, {"method": "given"}
    if not settings.chooses_level:
        return settings.reference_level, {"method": f"nominal ({settings.predictor} has no calibrated levels)"}
    if validation is None:
        return settings.reference_level, {
            "method": "fallback",
            "reason": f"the calibration text leaves fewer than {MIN_VALIDATION_TOKENS} validation tokens beside the "
            f"{MIN_CALIBRATION_TOKENS} needed for fitting; give more text or --sparsity",
        }
    choice = validation.choose(settings.ppl_budget)
    return choice.level, choice.to_report()


def predictor_metadata(report: dict[str, Any]) -> dict[str, str]:
    """safetensors metadata (string values) that makes predictors.safetensors self-describing."""
    return {
        "format": outputs.PREDICTORS_FORMAT,
        "predictor": report["predictor"],
        "levels": json.dumps(report["levels"]),
        "default_level": json.dumps(report["default_level"]),
        "settings": json.dumps(report["settings"]),
    }


def check_output_dir(
    out_dir: str | Path, force: bool, model_dir: str | Path, inputs: Sequence[str | Path] = ()
) -> outputs.Target:
    """The predictors directory's location, checked before any work starts (edge_sdk.outputs: --force replaces only
    an earlier edge-sdk predictors directory)."""
    sources = (("input model", model_dir), *(("input file", path) for path in inputs))
    return outputs.check_target(out_dir, outputs.PREDICTORS, replace=force, inputs=sources)


def write_calibration(result: CalibrationResult, target: outputs.Target) -> Path:
    """Write predictors.safetensors, report.json and report.png to a checked target; all or nothing."""
    from edge_sdk.sparsity.report import write_report_plot

    with outputs.staged_output(target) as staging:
        save_file(result.tensors, str(staging / PREDICTORS_FILE), metadata=predictor_metadata(result.report))
        (staging / REPORT_FILE).write_text(json.dumps(result.report, indent=2, allow_nan=False) + "\n")
        write_report_plot(result.report, staging / PLOT_FILE)
    return target.path
