"""Calibrate sparsity predictors for a whole model, one layer at a time, and measure them.

This is what `edge-sdk calibrate` runs and what the exporter calls. For each layer it fits the chosen predictor
(its kind's fit, edge_sdk/predictors/<kind>.py) on the calibration tokens' FFN inputs, measures it at each of its
levels (sparsity/levels.py) and evaluates it (on held-out text when given) with the metrics of
sparsity/metrics.py; then it allocates the model-wide levels across the layers (sparsity/levels.py) and, unless a
default level is given, chooses one on validation tokens the predictors are not fitted on (sparsity/validation.py).

Predictor tensors are named `layers.{i}.{kind}.{tensor}` (each kind's, edge_sdk/predictors/<kind>.py), and every
kind has {kind}.capacity [levels or 1] int32: the 99th percentile of the per-token predicted-active count on the
calibration tokens, for executors with static shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.config import ModelConfig
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.loader import load_layer
from edge_sdk.sparsity.collect import (
    LayerCapture,
    calibration_chunks,
    read_calibration_texts,
    stream_layers,
    token_chunks,
    token_stream,
)
from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights, LevelStatistics
from edge_sdk.sparsity.levels import allocated_metrics, allocated_tensors, allocation_for, level_statistics
from edge_sdk.sparsity.metrics import layer_metrics
from edge_sdk.sparsity.settings import (
    MIN_CALIBRATION_TOKENS,
    CalibrationSettings,
    check_calibration_memory,
    validate_settings,
)
from edge_sdk.sparsity.sparse_model import LayerPredictor
from edge_sdk.sparsity.validation import (
    VALIDATION_PROMPT_TOKENS,
    LevelValidation,
    default_level,
    split_validation,
    validation_chunks,
)


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
    vocab_size = checkpoint.config.vocab_size
    if not settings.chooses_level:
        chunks = calibration_chunks(
            tokenizer, texts, settings.max_tokens, chunk_tokens, MIN_CALIBRATION_TOKENS, vocab_size=vocab_size
        )
        return chunks, None
    stream = token_stream(tokenizer, texts, settings.max_tokens + settings.validation_tokens, vocab_size)
    fit, held = split_validation(stream, settings.max_tokens, settings.validation_tokens, MIN_CALIBRATION_TOKENS)
    validation = validation_chunks(held, chunk_tokens) if held else None
    return token_chunks(fit, chunk_tokens, MIN_CALIBRATION_TOKENS), validation


def calibrate_model(
    checkpoint: Checkpoint | GgufCheckpoint,
    settings: CalibrationSettings,
    calibration_files: Sequence[str | Path],
    evaluation_files: Sequence[str | Path] = (),
    on_layer: Callable[[int], None] | None = None,
    on_layer_validated: Callable[[int], None] | None = None,
    factor_dtype: str = "F32",
    unquantized: Checkpoint | GgufCheckpoint | None = None,
) -> CalibrationResult:
    """Fit the predictor of every layer on the calibration text; evaluate on held-out text when given. Without
    a given default level (settings.sparsity None), choose it on validation tokens of the calibration text
    that the predictors are not fitted on (sparsity/validation.py). on_layer(i) is called after layer i is
    fitted, on_layer_validated(i) after the validation streams went through it (a second pass over the layers).

    checkpoint is the model the bundle holds: for int8 / int4 the exporter passes its quantized weights
    (export/quantized_checkpoint.py), so the predictors see the hidden states the runtimes will compute and the
    default level's budget is measured from the quantized dense model (quantization and sparsity errors add up).
    factor_dtype: the dtype the bundle stores the predictor's low-rank factors in (bundle/format.py
    predictor_factor_dtype), which the fit rounds them to before the biases and the default level see them.
    unquantized: for a quantized checkpoint, the model before quantization: the validation then also measures its
    dense perplexity, and the level choice reports what quantization cost (quantization_change_percent)."""
    config = checkpoint.config
    validate_settings(config, settings)
    check_calibration_memory(config, settings, evaluating=bool(evaluation_files))
    torch.manual_seed(settings.seed)
    chunk_tokens = min(settings.chunk_tokens, config.max_position_embeddings)
    settings = CalibrationSettings(**{**asdict(settings), "chunk_tokens": chunk_tokens})
    chunks, held = fitting_chunks(checkpoint, settings, calibration_files)
    validation = reference = None
    if held is not None:
        validation = LevelValidation(checkpoint, held, settings.all_levels, VALIDATION_PROMPT_TOKENS)
        if unquantized is not None and settings.sparsity is None and settings.chooses_level:
            # the dense stream alone, through the unquantized weights, beside the level choice's
            reference = LevelValidation(unquantized, held, (), VALIDATION_PROMPT_TOKENS)
    streams = [stream_layers(checkpoint, chunks)]
    if evaluation_files:
        texts = read_calibration_texts(evaluation_files)
        eval_chunks = calibration_chunks(
            checkpoint.tokenizer(), texts, settings.max_tokens, chunk_tokens, chunk_tokens, vocab_size=config.vocab_size
        )
        streams.append(stream_layers(checkpoint, eval_chunks))

    fits: list[tuple[FittedLayer, dict[str, Any]]] = []
    statistics: list[LevelStatistics] = []  # per layer, at its layer levels, on the calibration tokens
    for captures in zip(*streams, strict=True):
        fitted, layer_statistics, layer_report = _fit_layer(captures, settings, config, factor_dtype)
        fits.append((fitted, layer_report))
        statistics.append(layer_statistics)
        if on_layer is not None:
            on_layer(captures[0].index)

    tensors: dict[str, torch.Tensor] = {}
    layers = []
    sparsity_curves = [layer.sparsity for layer in statistics]
    cost_curves = [layer.missed_importance for layer in statistics]
    allocation = allocation_for(settings, sparsity_curves, cost_curves, len(fits))
    for index, (fitted, layer_report) in enumerate(fits):
        layer_tensors = allocated_tensors(fitted, settings, allocation, index)
        tensors |= {f"layers.{index}.{name}": tensor.contiguous() for name, tensor in layer_tensors.items()}
        layer_report["capacity"] = layer_tensors[f"{settings.predictor}.capacity"].tolist()
        if allocation is not None:
            layer_report["per_level"] = allocated_metrics(layer_report["per_level"], settings, allocation, index)
        layers.append(layer_report)
        if validation is not None:
            # the allocation needs every layer's curves first, so validation reads each layer again, one at a time
            predictor = LayerPredictor(settings.predictor, layer_tensors)
            validation.advance(load_layer(checkpoint, index), predictor)
            if reference is not None:
                reference.advance(load_layer(unquantized, index), predictor)
            if on_layer_validated is not None:
                on_layer_validated(index)

    level, choice = default_level(settings, validation)
    if reference is not None:  # exists only where the level is chosen on validation, so choice has its dense figure
        unquantized_perplexity = reference.perplexities()[None]
        choice["unquantized_dense_perplexity"] = unquantized_perplexity
        choice["quantization_change_percent"] = 100.0 * (choice["dense_perplexity"] / unquantized_perplexity - 1.0)
    # a dense default has no metrics of its own: the per-layer figures are the mildest level's
    metrics_level = settings.all_levels[0] if level is None else level
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
        "default_level": level,
        "default_level_choice": choice,
        "metrics_level": metrics_level,
        "calibration_tokens": int(chunks.numel()),
        "evaluated_on": "held-out" if evaluation_files else "calibration",
        "layers": layers,
    }
    return CalibrationResult(tensors, report)


def _fit_layer(
    captures: tuple[LayerCapture, ...], settings: CalibrationSettings, config: ModelConfig, factor_dtype: str
) -> tuple[FittedLayer, LevelStatistics, dict[str, Any]]:
    """One layer's predictor fitted on its calibration capture (captures[0]), its statistics at its levels there,
    and its report, evaluated on the held-out capture when there is one (captures[1])."""
    calibration = captures[0]
    weights = LayerWeights.of(calibration)
    keep_up = settings.kind.ranks_by_up
    acts = LayerActivations.compute(calibration.ffn_input, weights, config.activation, keep_up=keep_up)
    fitted = settings.kind.fit(acts, weights, settings, config, factor_dtype=factor_dtype)
    acts.up_act = None
    scores = fitted.score(acts.x)
    statistics = level_statistics(fitted, acts, scores, settings)
    fitted.tensors[f"{settings.predictor}.capacity"] = statistics.capacity
    layer_report = {"layer": calibration.index, **fitted.details}
    if len(captures) > 1:
        del acts, scores
        held_out = LayerWeights.of(captures[1])
        acts = LayerActivations.compute(captures[1].ffn_input, held_out, config.activation)
        scores = fitted.score(acts.x)
    layer_report |= _evaluate(fitted, acts, scores, settings, config)
    return fitted, statistics, layer_report


def _evaluate(
    fitted: FittedLayer,
    acts: LayerActivations,
    scores: torch.Tensor | None,
    settings: CalibrationSettings,
    config: ModelConfig,
) -> dict:
    truly_active = acts.truly_active
    rank = fitted.details.get("rank", 0)

    def metrics_at(level: float, with_auroc: bool) -> dict:
        predicted = fitted.mask(scores, acts, level)
        return layer_metrics(
            truly_active,
            predicted,
            acts.importance,
            scores if with_auroc else None,
            rank=rank,
            d=config.hidden_size,
            true_totals=(acts.truly_active_count, acts.true_importance_mass),
        )

    # The AUROC ranks the predictor's scores, so it is computed once, at the reference level; calibrate_model
    # replaces the other top-level metrics by the default level's once that is known.
    result = metrics_at(settings.reference_level, with_auroc=True)
    if fitted.level_dependent:
        result["per_level"] = {f"{level:g}": metrics_at(level, with_auroc=False) for level in settings.layer_levels}
    return result
