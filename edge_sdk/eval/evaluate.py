"""Held-out quality of a bundle's sparse decode against its dense decode on the same backend.

Sparsity only acts in decode (prefill is dense, DESIGN.md 1), so a full-sequence forward would measure
nothing. The held-out text is cut into windows of `context` tokens; each window's first `prompt_tokens`
are prefilled (dense, and where the core predictor picks its neurons), then the remaining tokens are fed
one decode step at a time (teacher forcing) and the log-probability of the next held-out token is scored
after every step. The same windows run through the backend's engine twice, sparse and dense
(EngineOptions with a dense operating point); perplexity and top-1 agreement come from those engines.

Per-layer predictor statistics are measured during the same teacher-forced decode on the torch reference
(sparsity/sparse_model.py), whose FFN decode inputs are hooked: gate activations, neuron importance
(SVDP eq. 13) and the predictor's mask give metrics.layer_metrics per window, pooled over windows so the
memory stays bounded by one window.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_sdk import outputs
from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats.files import read_utf8_text
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions, select_backend
from edge_sdk.runtime.engine import Engine
from edge_sdk.sparsity.bundle_model import TorchEngine, configure, load_reference_decoder
from edge_sdk.sparsity.collect import token_stream
from edge_sdk.sparsity.ffn import ffn_intermediates
from edge_sdk.sparsity.metrics import layer_metrics
from edge_sdk.sparsity.sparse_model import SparseDecoder, SparseFeedForward
from edge_sdk.sparsity.svd_bias import neuron_importance

DEFAULT_MAX_TOKENS = 4096
DEFAULT_CONTEXT = 256
DEFAULT_PROMPT_TOKENS = 32
# metrics.layer_metrics keys that are fractions of (token, neuron) pairs, or affine in such fractions,
# hence pooled over windows as pair-weighted means.
_PAIR_WEIGHTED_KEYS = ("true_sparsity", "predicted_sparsity", "realized_sparsity", "multiply_count_ratio")
LAYER_STAT_KEYS = (
    "true_sparsity",
    "predicted_sparsity",
    "realized_sparsity",
    "recall",
    "importance_weighted_recall",
    "multiply_count_ratio",
)


class EvalError(EdgeSdkError):
    """Evaluation input (held-out text, window sizes, sweep settings) is not usable."""


def read_texts(files: Sequence[str | Path]) -> list[str]:
    """The held-out documents: one per plain-text file, read as UTF-8."""
    if not files:
        raise EvalError("no held-out text given: pass at least one text file (--text FILE)")
    texts = []
    for file in map(Path, files):
        if not file.is_file():
            found = "is not a regular file" if file.exists() else "not found"
            raise EvalError(f"{file}: held-out text file {found}")
        text = read_utf8_text(file, "held-out text file", EvalError)
        if not text.strip():
            raise EvalError(f"{file}: held-out text file is empty")
        texts.append(text)
    return texts


def check_window_settings(context: int, prompt_tokens: int, max_seq_len: int) -> None:
    """A window must fit the bundle's KV cache and leave at least one scored decode step after its prompt."""
    if prompt_tokens < 1:
        raise EvalError(f"prompt tokens must be at least 1 (the prefill needs a token), found {prompt_tokens}")
    if context < prompt_tokens + 2:
        raise EvalError(
            f"context {context} is too short: it needs the {prompt_tokens} prompt tokens plus at least 2 more "
            f"(one decode step and the token it predicts)"
        )
    if context > max_seq_len:
        raise EvalError(f"context {context} exceeds the bundle's max_seq_len {max_seq_len}: use --context <= it")


def held_out_windows(
    tokenizer: Tokenizer, texts: Sequence[str], max_tokens: int, context: int, prompt_tokens: int, *, vocab_size: int
) -> list[list[int]]:
    """Token windows: the documents (each with its bos) concatenated, cut into windows of `context` tokens,
    at most `max_tokens` tokens in all; text shorter than one window gives one shorter window, and so does the
    remainder after the last full window, unless it is too short to score a token (fewer than prompt_tokens + 2),
    so every token read after a window's prompt is scored. Every id is below the model's vocab_size."""
    stream = token_stream(tokenizer, texts, max_tokens, vocab_size)
    usable = len(stream)
    if usable < prompt_tokens + 2:
        raise EvalError(
            f"held-out text gives {usable} tokens (max tokens {max_tokens}); at least {prompt_tokens + 2} are needed "
            f"for one prompt of {prompt_tokens} tokens and one scored decode step"
        )
    length = min(context, usable)
    windows = [stream[start : start + length] for start in range(0, usable, length)]
    if len(windows[-1]) < prompt_tokens + 2:  # a remainder that holds no scored decode step
        windows.pop()
    return windows


@dataclass
class TeacherForcedRun:
    """Per scored position, in window order: the next token's negative log-likelihood and the argmax."""

    nll: np.ndarray  # [N] float64
    top1: np.ndarray  # [N] int64

    @property
    def perplexity(self) -> float:
        return math.exp(float(self.nll.mean()))


def next_token_nll(logits: np.ndarray, target: int) -> float:
    """-log softmax(logits)[target], in float64. logits: [V]."""
    values = np.asarray(logits, dtype=np.float64)
    peak = values.max()
    return float(peak + math.log(np.exp(values - peak).sum()) - values[target])


# on_progress(phase, done, total): a long step reports how far it is, for the CLI's progress bars
Progress = Callable[[str, int, int], None]


def window_counter(on_progress: Progress | None, phase: str, windows: Sequence) -> Callable[[], None] | None:
    """An on_window callback that reports phase's windows done out of len(windows) (0 at once); None without
    on_progress."""
    if on_progress is None:
        return None
    on_progress(phase, 0, len(windows))
    done = itertools.count(1)
    return lambda: on_progress(phase, next(done), len(windows))


def teacher_forced(
    engine: Engine, windows: Sequence[Sequence[int]], prompt_tokens: int, on_window: Callable[[], None] | None = None
) -> TeacherForcedRun:
    """Prefill each window's first prompt_tokens, then decode its tokens one at a time, scoring after each
    decode step the log-probability of the token that follows (positions prompt_tokens + 1 .. end).
    on_window() is called after each window."""
    nll, top1 = [], []
    for window in windows:
        engine.prefill(list(window[:prompt_tokens]))
        for position in range(prompt_tokens, len(window) - 1):
            logits = engine.decode(int(window[position]))
            if not np.isfinite(logits).all():
                raise EvalError(
                    f"decoding gave logits that are not finite numbers (nan or inf) at position {position} of a "
                    f"held-out window: the bundle's weights hold such values, or overflow its dtype"
                )
            nll.append(next_token_nll(logits, int(window[position + 1])))
            top1.append(int(np.argmax(logits)))
        if on_window is not None:
            on_window()
    return TeacherForcedRun(np.array(nll, dtype=np.float64), np.array(top1, dtype=np.int64))


def top1_agreement(first: TeacherForcedRun, second: TeacherForcedRun) -> float:
    """Fraction of scored positions where both runs put the highest logit on the same token."""
    if first.top1.shape != second.top1.shape:
        raise EvalError(f"runs scored different positions: {first.top1.shape[0]} and {second.top1.shape[0]}")
    return float((first.top1 == second.top1).mean())


def pool_layer_metrics(parts: Sequence[tuple[dict[str, float], int, float]]) -> dict[str, float]:
    """Combine metrics.layer_metrics results of disjoint token sets into those of their union.

    parts: (metrics, number of (token, neuron) pairs, importance mass of the truly active pairs) per set.
    Sparsities and the multiply-count ratio are pair-weighted means, recall is weighted by the truly active
    pairs and importance-weighted recall by the truly active importance mass, which is what layer_metrics
    gives on the concatenated tensors.
    """
    if not parts:
        raise EvalError("no decode tokens were recorded for the per-layer statistics")
    total_pairs = sum(n_pairs for _, n_pairs, _ in parts)
    pooled = {}
    for key in _PAIR_WEIGHTED_KEYS:
        if key in parts[0][0]:
            pooled[key] = sum(metrics[key] * n_pairs for metrics, n_pairs, _ in parts) / total_pairs
    true_pairs = [(1.0 - metrics["true_sparsity"]) * n_pairs for metrics, n_pairs, _ in parts]
    pooled["recall"] = _weighted_mean([metrics["recall"] for metrics, _, _ in parts], true_pairs)
    pooled["importance_weighted_recall"] = _weighted_mean(
        [metrics["importance_weighted_recall"] for metrics, _, _ in parts], [mass for _, _, mass in parts]
    )
    return pooled


def _weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """Weighted mean; 1.0 (nothing to miss) when every weight is zero, as layer_metrics defines recall."""
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total if total > 0 else 1.0


class DecodeStatisticsRecorder:
    """Forward hooks on a reference SparseDecoder's FFNs that record, at every decode step, which neurons are
    truly active (act.gate(g) != 0), which the predictor marks active, and their importance; `end_window`
    turns the buffered steps into one layer_metrics result per layer."""

    def __init__(self, model: SparseDecoder, rank: list[int], hidden_size: int):
        self.rank, self.hidden_size = rank, hidden_size
        self.steps: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = [[] for _ in model.ffns]
        self.parts: list[list[tuple[dict[str, float], int, float]]] = [[] for _ in model.ffns]
        self.handles = [ffn.register_forward_hook(partial(self._record, index)) for index, ffn in enumerate(model.ffns)]

    def _record(self, index: int, ffn: SparseFeedForward, args: tuple, output: torch.Tensor) -> None:
        if ffn.phase != "decode":
            return
        tokens = args[0].reshape(-1, args[0].shape[-1]).float()  # [T, d]
        mask, thresholds = ffn._decode_mask(tokens)  # [T, D], CHESS thresholds [D] or None
        gate_act = ffn_intermediates(tokens, ffn.w_gate, ffn.w_up, ffn.activation)[0]  # [T, D]
        predicted = mask if thresholds is None else mask & (gate_act.abs() > thresholds)
        importance = neuron_importance(tokens, ffn.w_gate, ffn.w_up, ffn.w_down_t, ffn.activation)  # [T, D]
        self.steps[index].append((gate_act != 0, predicted, importance))

    def end_window(self) -> None:
        for index, steps in enumerate(self.steps):
            if not steps:
                continue
            truly_active, predicted, importance = (torch.cat(parts) for parts in zip(*steps, strict=True))
            true_mass = float(importance[truly_active].sum(dtype=torch.float64))
            true_totals = (int(truly_active.count_nonzero()), true_mass)
            metrics = layer_metrics(
                truly_active, predicted, importance, rank=self.rank[index], d=self.hidden_size, true_totals=true_totals
            )
            self.parts[index].append((metrics, truly_active.numel(), true_mass))
            steps.clear()

    def results(self) -> list[dict[str, Any]]:
        return [{"layer": index, **pool_layer_metrics(parts)} for index, parts in enumerate(self.parts)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _predictor_ranks(model: SparseDecoder) -> list[int]:
    """Per layer the predictor's rank r (svd.a is [D, r]); 0 for predictors without a low-rank product."""
    return [
        int(ffn.predictor.tensors["svd.a"].shape[1]) if "svd.a" in ffn.predictor.tensors else 0 for ffn in model.ffns
    ]


def reference_layer_statistics(
    model: SparseDecoder,
    bundle: Bundle,
    windows: Sequence[Sequence[int]],
    prompt_tokens: int,
    on_window: Callable[[], None] | None = None,
) -> tuple[list[dict[str, Any]], TeacherForcedRun]:
    """Per-layer predictor statistics over the teacher-forced decode of the windows on the reference decoder
    (configured by the caller), and the reference's own scored run. on_window() is called after each window."""
    recorder = DecodeStatisticsRecorder(model, _predictor_ranks(model), bundle.config.hidden_size)
    engine = TorchEngine(model, bundle.max_seq_len)
    nll, top1 = [], []
    try:
        for window in windows:
            run = teacher_forced(engine, [window], prompt_tokens)
            recorder.end_window()
            if on_window is not None:
                on_window()
            nll.append(run.nll)
            top1.append(run.top1)
    finally:
        recorder.remove()
    return recorder.results(), TeacherForcedRun(np.concatenate(nll), np.concatenate(top1))


def layer_means(layers: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Unweighted mean over layers of each per-layer statistic."""
    return {key: float(np.mean([layer[key] for layer in layers])) for key in LAYER_STAT_KEYS if key in layers[0]}


def perplexity_change_percent(dense: float, sparse: float) -> float:
    return 100.0 * (sparse / dense - 1.0)


def evaluate_bundle(
    bundle_path: str | Path,
    text_files: Sequence[str | Path],
    backend: str | None = None,
    sparsity: float | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    context: int | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    threads: int = 0,
    layer_stats: bool = True,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """Held-out perplexity of the bundle's sparse decode against its dense decode on one backend.

    backend: a backend name, or None/"auto" for the first available ($EDGE_SDK_BACKEND applies); sparsity:
    a calibrated level, None for the bundle's default; max_tokens: held-out tokens read; context: window
    length (None: min(256, the bundle's max_seq_len)); prompt_tokens: each window's dense prefill;
    layer_stats: also measure per-layer sparsity and recall on the torch reference; on_progress(phase, done,
    total): called after each window of each phase. Returns the result dict (also written to json_path, and
    drawn to plot_path, when given).
    """
    report_inputs = (("bundle", bundle_path), *(("text file", text) for text in text_files))
    outputs.check_reports((json_path, plot_path), report_inputs)
    bundle = Bundle.open(bundle_path)
    texts = read_texts(text_files)
    choice = bundle.sparsity.resolve(sparsity)  # raises, naming the calibrated levels, before any work
    max_seq_len = bundle.max_seq_len
    context = min(DEFAULT_CONTEXT, max_seq_len) if context is None else context
    check_window_settings(context, prompt_tokens, max_seq_len)
    selection = select_backend(backend, bundle, threads)
    windows = held_out_windows(
        Tokenizer.from_bundle(bundle), texts, max_tokens, context, prompt_tokens, vocab_size=bundle.config.vocab_size
    )

    runs = {}
    for mode, dense in (("dense", True), ("sparse", False)):
        engine = selection.backend.load(bundle, EngineOptions(replace(choice, dense=dense), threads))
        runs[mode] = teacher_forced(
            engine, windows, prompt_tokens, window_counter(on_progress, f"{mode} decode", windows)
        )
    result: dict[str, Any] = {
        "bundle": str(bundle.path),
        "backend": selection.backend.name,
        "backend_reason": selection.reason,
        "predictor": bundle.sparsity.predictor,
        "sparsity_level": choice.reported,
        "text_files": [str(file) for file in text_files],
        "context": context,
        "prompt_tokens": prompt_tokens,
        "windows": len(windows),
        "scored_tokens": int(runs["dense"].nll.size),
        "dense_perplexity": runs["dense"].perplexity,
        "sparse_perplexity": runs["sparse"].perplexity,
        "perplexity_change_percent": perplexity_change_percent(runs["dense"].perplexity, runs["sparse"].perplexity),
        "top1_agreement": top1_agreement(runs["sparse"], runs["dense"]),
    }
    if layer_stats:
        reference = load_reference_decoder(bundle)
        configure(reference, choice)
        counter = window_counter(on_progress, "layer statistics", windows)
        layers, reference_run = reference_layer_statistics(reference, bundle, windows, prompt_tokens, counter)
        result["reference_sparse_perplexity"] = reference_run.perplexity
        result["layers"] = layers
        result["layer_means"] = layer_means(layers)
    result = with_machine_info(result)
    from edge_sdk.eval.plots import plot_evaluation

    outputs.write_reports(
        [
            (json_path, lambda path: path.write_text(outputs.report_json(result))),
            (plot_path, lambda path: plot_evaluation(result, path)),
        ],
        report_inputs,
    )
    return result
