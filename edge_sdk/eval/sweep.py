"""Quality-vs-speed sweeps: every predictor kind at every setting, exported, evaluated and timed.

One bundle is exported per predictor kind, or per setting for kinds without calibrated levels: signbit
sweeps its recall target (the per-layer alpha is fitted to it at calibration) and core its beta (the
bundle manifest's core_beta, which no EngineOptions field overrides at run time). The SVDP ablations
are svd bundles calibrated with whiten=False or calibrate_bias=False. Each setting is evaluated like
evaluate_bundle (teacher-forced held-out perplexity, sparse against dense on the same backend) and its
decode speed is timed against dense on the same engine options, giving one quality-vs-speed curve per
kind and where it crosses 1% and 3% perplexity loss. That is the shape of the SVDP paper's Table 1 and
ablation (Table 3) on our models.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edge_sdk import outputs
from edge_sdk import predictors as predictor_kinds
from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.eval.evaluate import (
    DEFAULT_CONTEXT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    EvalError,
    Progress,
    check_window_settings,
    held_out_windows,
    layer_means,
    perplexity_change_percent,
    read_texts,
    reference_layer_statistics,
    teacher_forced,
    top1_agreement,
    window_counter,
)
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.activation import Activation
from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.runtime.backends import EngineOptions, select_backend
from edge_sdk.runtime.engine import Engine
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder
from edge_sdk.sparsity.collect import read_calibration_texts
from edge_sdk.sparsity.settings import DEFAULT_LEVELS, CalibrationSettings

DEFAULT_RECALL_TARGETS = (0.999, 0.99, 0.95, 0.9)
DEFAULT_CORE_BETAS = (0.5, 0.4, 0.3, 0.2, 0.1)
DEFAULT_CALIBRATION_TOKENS = 4096
DEFAULT_SPEED_REPEATS = 5
CROSSING_THRESHOLDS = (1.0, 3.0)  # perplexity loss in percent
TARGET_PERPLEXITY_PERCENT = 1.0  # issue #8: within 1% of dense ...
TARGET_SPEEDUP = 1.5  # ... while decoding >= 1.5x faster, at the default operating point
# How decode time is measured: wall clock (what an application sees), or this process's CPU time, which
# other processes on a shared machine barely disturb (meaningful with one thread only: it adds up threads).
TIMERS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class SweepKind:
    """A curve of the sweep: the exported predictor, the setting it sweeps and its calibration switches."""

    predictor: str
    setting: str  # "level" (one bundle, its calibrated levels) | "recall_target" | "core_beta" (one bundle each)
    whiten: bool = True
    calibrate_bias: bool = True
    level_allocation: str = "importance"
    description: str = ""


SWEEP_KINDS = {
    "svd": SweepKind("svd", "level", description="SVDP: whitened low-rank predictor + greedy per-neuron bias"),
    "svd-no-whiten": SweepKind("svd", "level", whiten=False, description="SVDP ablation: naive SVD of W_gate"),
    "svd-no-bias": SweepKind("svd", "level", calibrate_bias=False, description="SVDP ablation: one global threshold"),
    "svd-uniform": SweepKind(
        "svd", "level", level_allocation="uniform", description="SVDP with the level itself in every layer"
    ),
    "signbit": SweepKind("signbit", "recall_target", description="SparseInfer sign bits, alpha fit to a recall"),
    "core": SweepKind("core", "core_beta", description="SparseInfer core neurons fixed at prefill"),
    "threshold": SweepKind("threshold", "level", description="CHESS channel-wise thresholds (dense gate)"),
}


def frontier_crossing(
    settings: Sequence[float], speedups: Sequence[float], changes: Sequence[float], threshold_percent: float
) -> dict[str, Any]:
    """Where a curve, walked from its mildest setting to its most aggressive, first rises above
    threshold_percent perplexity loss.

    status "crossed": setting and speedup interpolated linearly between the last point at or below the
    threshold and the first point above it; "not reached": no point is above it; "exceeded at the mildest
    setting": already the first point is above it. The last two carry no setting or speedup.
    """
    if not settings or not len(settings) == len(speedups) == len(changes):
        raise EvalError(
            f"a frontier needs one speedup and one perplexity change per setting, found {len(settings)} settings, "
            f"{len(speedups)} speedups and {len(changes)} changes"
        )
    result: dict[str, Any] = {"threshold_percent": threshold_percent, "setting": None, "speedup": None}
    for index, change in enumerate(changes):
        if change <= threshold_percent:
            continue
        if index == 0:
            return result | {"status": "exceeded at the mildest setting"}
        below = changes[index - 1]
        fraction = (threshold_percent - below) / (change - below)
        return result | {
            "status": "crossed",
            "setting": settings[index - 1] + fraction * (settings[index] - settings[index - 1]),
            "speedup": speedups[index - 1] + fraction * (speedups[index] - speedups[index - 1]),
        }
    return result | {"status": "not reached"}


def decode_speed(
    dense: Engine, sparse: Engine, window: Sequence[int], prompt_tokens: int, repeats: int, timer: str = "wall"
) -> dict[str, float]:
    """Decode tokens/s of two engines on the same teacher-forced tokens, best of `repeats` runs each; the
    runs alternate so that load from other processes hits both alike. timer: a key of TIMERS."""
    clock = TIMERS[timer]
    best = {"dense": math.inf, "sparse": math.inf}
    for _ in range(repeats):
        for mode, engine in (("dense", dense), ("sparse", sparse)):
            engine.prefill(list(window[:prompt_tokens]))
            started = clock()
            for token in window[prompt_tokens:]:
                engine.decode(int(token))
            best[mode] = min(best[mode], clock() - started)
    steps = len(window) - prompt_tokens
    speed = {f"{mode}_tokens_per_second": steps / seconds for mode, seconds in best.items()}
    return speed | {"speedup": speed["sparse_tokens_per_second"] / speed["dense_tokens_per_second"]}


def _ordered_settings(kind: SweepKind, levels, recall_targets, core_betas) -> list[float]:
    """A kind's settings from mildest to most aggressive: levels ascending, recall targets and betas descending."""
    if kind.setting == "level":
        return sorted(levels)
    return sorted(recall_targets if kind.setting == "recall_target" else core_betas, reverse=True)


def _calibration(kind: SweepKind, value: float | None, levels, tokens: int, rank: int | None) -> CalibrationSettings:
    settings = CalibrationSettings(
        predictor=kind.predictor,
        rank=rank,
        levels=tuple(levels),
        whiten=kind.whiten,
        calibrate_bias=kind.calibrate_bias,
        level_allocation=kind.level_allocation,
        max_tokens=tokens,
    )
    if kind.setting == "recall_target":
        return replace(settings, recall_target=value)
    if kind.setting == "core_beta":
        return replace(settings, core_beta=value)
    return settings


def _validate(predictors, levels, recall_targets, core_betas, speed_repeats: int, timer: str, threads: int) -> None:
    if speed_repeats < 1:
        raise EvalError(f"speed repeats must be at least 1, found {speed_repeats}")
    if timer not in TIMERS:
        raise EvalError(f"timer {timer!r} is not one of {', '.join(TIMERS)}")
    if timer == "cpu" and threads != 1:
        raise EvalError(f"timer 'cpu' adds up the CPU time of all threads: it needs threads=1, found {threads}")
    if predictors is not None:
        unknown = [name for name in predictors if name not in SWEEP_KINDS]
        if unknown or not predictors:
            raise EvalError(
                f"sweep predictors {', '.join(map(repr, unknown)) or '(none)'} not known; expected some of "
                f"{', '.join(SWEEP_KINDS)}"
            )
    used = {SWEEP_KINDS[name].setting for name in (SWEEP_KINDS if predictors is None else predictors)}
    for setting, values in (("level", levels), ("recall_target", recall_targets), ("core_beta", core_betas)):
        if setting not in used:
            continue
        if not values:
            raise EvalError(f"sweep {setting.replace('_', ' ')}s: expected at least one value, found none")
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise EvalError(f"sweep {setting.replace('_', ' ')}: expected a number in (0, 1], found {value!r}")


def served_kinds(predictors: Sequence[str] | None, activation: Activation) -> tuple[str, ...]:
    """The sweep's kinds for a model with this FFN activation: those named, each of which must serve it, or (None)
    every kind that does (svd, its ablations, signbit and core need a ReLU-family FFN's exact zeros)."""
    if predictors is None:
        return tuple(name for name, kind in SWEEP_KINDS.items() if predictor_kinds.serves(kind.predictor, activation))
    refused = [name for name in predictors if not predictor_kinds.serves(SWEEP_KINDS[name].predictor, activation)]
    if refused:
        served = served_kinds(None, activation)
        raise EvalError(
            f"sweep predictors {', '.join(refused)} need {predictor_kinds.NEEDS_EXACT_ZEROS}; this model's hidden_act "
            f"is {activation.kind}: it can sweep {', '.join(served)}"
        )
    return tuple(predictors)


def sweep_inputs(
    model_dir: str | Path, calibration_files: Sequence[str | Path], text_files: Sequence[str | Path]
) -> tuple[tuple[str, str | Path], ...]:
    """A sweep's inputs, (noun, path), which none of its outputs may be or lie inside."""
    return (
        ("model", model_dir),
        *(("calibration file", path) for path in calibration_files),
        *(("text file", path) for path in text_files),
    )


def sweep(
    model_dir: str | Path,
    calibration_files: Sequence[str | Path],
    text_files: Sequence[str | Path],
    out_dir: str | Path,
    predictors: Sequence[str] | None = None,
    levels: Sequence[float] = DEFAULT_LEVELS,
    recall_targets: Sequence[float] = DEFAULT_RECALL_TARGETS,
    core_betas: Sequence[float] = DEFAULT_CORE_BETAS,
    backend: str | None = "cpu",
    calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    rank: int | None = None,
    dtype: str = "fp32",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    context: int = DEFAULT_CONTEXT,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    speed_repeats: int = DEFAULT_SPEED_REPEATS,
    timer: str = "wall",
    threads: int = 0,
    layer_stats: bool = True,
    force: bool = False,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    command: str | None = None,
    on_point: Callable[[str, dict[str, Any]], None] | None = None,
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """Export, evaluate and time each predictor kind (predictors; None: every kind the model's FFN activation
    serves, served_kinds) at every setting; returns the sweep result.

    Bundles go to out_dir/bundles/<kind>[-<setting>] (points name them relative to out_dir), published with the
    reports, none if the sweep stops first; force replaces an earlier sweep's bundles directory whole. The result
    is written to json_path and its frontier plot to plot_path (default out_dir/sweep.json and out_dir/sweep.png),
    and its tables to markdown_path when given (format_sweep_markdown, naming command), all three or none.
    levels: calibrated sparsity levels swept by svd, its ablations and threshold; recall_targets: signbit;
    core_betas: core. calibration_tokens / rank / dtype: export settings (rank None = per-layer automatic);
    max_tokens / context / prompt_tokens: the held-out windows; speed_repeats: decode timing runs per setting
    (best of); timer: "wall" clock or process "cpu" time (threads=1 only) for that timing; layer_stats:
    per-layer sparsity and recall on the torch reference. on_point(kind, point) is called after each
    measured setting; on_progress(phase, done, total) after each calibrated layer and each decoded window.
    """
    _validate(predictors, levels, recall_targets, core_betas, speed_repeats, timer, threads)
    out_dir = Path(out_dir)
    json_path = out_dir / "sweep.json" if json_path is None else Path(json_path)
    plot_path = out_dir / "sweep.png" if plot_path is None else Path(plot_path)
    report_inputs = sweep_inputs(model_dir, calibration_files, text_files)
    bundles_path = out_dir / "bundles"
    outputs.check_reports(
        (json_path, plot_path, markdown_path), (*report_inputs, ("sweep's bundles directory", bundles_path))
    )

    def bundle_values(name: str) -> list[float | None]:
        kind = SWEEP_KINDS[name]
        return [None] if kind.setting == "level" else list(_ordered_settings(kind, levels, recall_targets, core_betas))

    def bundle_name(name: str, value: float | None) -> str:
        return name if value is None else f"{name}-{value:g}"

    checkpoint = open_checkpoint(model_dir)
    predictors = served_kinds(predictors, checkpoint.config.activation)
    # The bundles are one output, staged until the reports are written: a sweep stopped or failing part-way leaves
    # nothing, and --force replaces an earlier sweep's bundles whole.
    bundles_target = outputs.check_target(bundles_path, outputs.SWEEP_BUNDLES, replace=force, inputs=report_inputs)

    read_calibration_texts(calibration_files)
    texts = read_texts(text_files)
    check_window_settings(context, prompt_tokens, checkpoint.config.max_position_embeddings)
    selection = select_backend(backend, threads=threads)
    windows = held_out_windows(
        checkpoint.tokenizer(), texts, max_tokens, context, prompt_tokens, vocab_size=checkpoint.config.vocab_size
    )

    with outputs.staged_output(bundles_target) as staged_bundles:
        kinds: dict[str, Any] = {}
        for name in predictors:
            kind = SWEEP_KINDS[name]
            settings = _ordered_settings(kind, levels, recall_targets, core_betas)
            points = []
            default_level = None
            for value in bundle_values(name):
                calibration = _calibration(kind, value, levels, calibration_tokens, rank)
                export = ExportSettings(dtype=dtype, max_seq_len=context, calibration=calibration)
                bundle_dir = staged_bundles / bundle_name(name, value)
                layers = checkpoint.config.num_layers
                calibrated = _layer_counter(on_progress, f"{bundle_dir.name}: calibrating", layers)
                validating = on_progress if calibration.chooses_level else None
                validated = _layer_counter(validating, f"{bundle_dir.name}: validating levels", layers)
                bundle = export_bundle(
                    model_dir,
                    bundle_dir,
                    export,
                    calibration_files,
                    on_layer_calibrated=calibrated,
                    on_layer_validated=validated,
                )
                default_level = bundle.sparsity.default_level
                for level, point in _measure_bundle(
                    bundle,
                    selection.backend,
                    settings if value is None else [None],
                    windows,
                    prompt_tokens,
                    speed_repeats,
                    timer,
                    threads,
                    layer_stats,
                    on_progress,
                ):
                    point = {
                        "setting": level if value is None else value,
                        "bundle": f"bundles/{bundle_dir.name}",
                        **point,
                    }
                    points.append(point)
                    if on_point is not None:
                        on_point(name, point)
            crossings = {
                f"{threshold:g}%": frontier_crossing(
                    [p["setting"] for p in points],
                    [p["speedup"] for p in points],
                    [p["perplexity_change_percent"] for p in points],
                    threshold,
                )
                for threshold in CROSSING_THRESHOLDS
            }
            kinds[name] = {
                "predictor": kind.predictor,
                "setting": kind.setting,
                "whiten": kind.whiten,
                "calibrate_bias": kind.calibrate_bias,
                "description": kind.description,
                "default_level": default_level,
                "points": points,
                "crossings": crossings,
            }

        result = with_machine_info(
            {
                "benchmark": "eval_sweep",
                "model": str(model_dir),
                "backend": selection.backend.name,
                "backend_reason": selection.reason,
                "calibration_files": [str(file) for file in calibration_files],
                "text_files": [str(file) for file in text_files],
                "settings": {
                    "calibration_tokens": calibration_tokens,
                    "rank": rank,
                    "dtype": dtype,
                    "max_tokens": max_tokens,
                    "context": context,
                    "prompt_tokens": prompt_tokens,
                    "speed_repeats": speed_repeats,
                    "timer": timer,
                    "threads": threads,
                },
                "windows": len(windows),
                "scored_tokens": sum(len(window) - prompt_tokens - 1 for window in windows),
                "speed_tokens": len(windows[0]) - prompt_tokens,
                "kinds": kinds,
                "target": default_point_target(kinds),
            }
        )
        from edge_sdk.eval.plots import plot_frontier

        outputs.write_reports(
            [
                (json_path, lambda path: path.write_text(outputs.report_json(result))),
                (plot_path, lambda path: plot_frontier(result, path)),
                (
                    markdown_path,
                    lambda path: path.write_text(outputs.MARKDOWN_HEADER + format_sweep_markdown(result, command)),
                ),
            ],
            report_inputs,
        )
    return result


def _layer_counter(on_progress: Progress | None, phase: str, total: int) -> Callable[[int], None] | None:
    """An on_layer_calibrated callback that reports phase's layers done out of total (0 at once)."""
    if on_progress is None:
        return None
    on_progress(phase, 0, total)
    done = itertools.count(1)
    return lambda _layer: on_progress(phase, next(done), total)


def _measure_bundle(
    bundle: Bundle,
    backend,
    levels: Sequence[float | None],
    windows: list[list[int]],
    prompt_tokens: int,
    speed_repeats: int,
    timer: str,
    threads: int,
    layer_stats: bool,
    on_progress: Progress | None = None,
) -> Iterator[tuple[float | None, dict[str, Any]]]:
    """(level, measurement) per level of one bundle: perplexity against dense (run once per bundle), top-1
    agreement, decode speed against dense and, with layer_stats, the reference's per-layer statistics."""
    dense = backend.load(bundle, EngineOptions.of(bundle, dense=True, threads=threads))
    name = bundle.path.name
    dense_run = teacher_forced(dense, windows, prompt_tokens, window_counter(on_progress, f"{name}: dense", windows))
    reference = load_reference_decoder(bundle) if layer_stats else None
    for level in levels:
        options = EngineOptions.of(bundle, level, threads=threads)
        sparse = backend.load(bundle, options)
        phase = f"{name}: {'default' if level is None else f'{level:g}'}"
        sparse_run = teacher_forced(sparse, windows, prompt_tokens, window_counter(on_progress, phase, windows))
        point = {
            "dense_perplexity": dense_run.perplexity,
            "sparse_perplexity": sparse_run.perplexity,
            "perplexity_change_percent": perplexity_change_percent(dense_run.perplexity, sparse_run.perplexity),
            "top1_agreement": top1_agreement(sparse_run, dense_run),
            **decode_speed(dense, sparse, windows[0], prompt_tokens, speed_repeats, timer),
        }
        if reference is not None:
            configure(reference, options.level)
            counter = window_counter(on_progress, f"{phase} layer statistics", windows)
            layers = reference_layer_statistics(reference, bundle, windows, prompt_tokens, counter)[0]
            point |= {f"mean_{key}": mean for key, mean in layer_means(layers).items()}
            point["layers"] = layers
        yield level, point


def default_point_target(kinds: dict[str, Any]) -> dict[str, Any]:
    """Issue #8's target at the default operating point (svd at the level its export chose by default):
    perplexity within 1% of dense and decode at least 1.5x faster than dense."""
    svd = kinds.get("svd", {})
    level = svd.get("default_level")
    target: dict[str, Any] = {
        "predictor": "svd",
        "level": level,
        "max_perplexity_change_percent": TARGET_PERPLEXITY_PERCENT,
        "min_speedup": TARGET_SPEEDUP,
    }
    if svd.get("points") and level is None:
        # dense decoding is the default: as good as dense, and no faster
        return target | {
            "level": "dense",
            "perplexity_change_percent": 0.0,
            "speedup": 1.0,
            "perplexity_met": True,
            "speedup_met": False,
            "status": "not met (the default is dense: no level was within the export's perplexity budget)",
        }
    points = [p for p in svd.get("points", []) if level is not None and abs(p["setting"] - level) < 1e-9]
    if not points:
        return target | {"status": "not measured (the sweep has no svd point at the default level)"}
    point = points[0]
    quality_met = point["perplexity_change_percent"] <= TARGET_PERPLEXITY_PERCENT
    speed_met = point["speedup"] >= TARGET_SPEEDUP
    return target | {
        "perplexity_change_percent": point["perplexity_change_percent"],
        "speedup": point["speedup"],
        "perplexity_met": quality_met,
        "speedup_met": speed_met,
        "status": "met" if quality_met and speed_met else "not met",
    }


_TIMER_TEXT = {"wall": "wall-clock time", "cpu": "process CPU time"}


def _crossing_text(crossing: dict[str, Any], setting: str) -> str:
    if crossing["status"] == "crossed":
        return f"{crossing['speedup']:.3f}x at {setting} {crossing['setting']:.3f}"
    return crossing["status"]


def _threads_text(threads: int) -> str:
    return "every core" if threads == 0 else f"{threads} thread" + ("s" if threads > 1 else "")


def format_sweep_markdown(result: dict[str, Any], command: str | None = None) -> str:
    """A markdown fragment of a sweep: per kind, setting -> perplexity change, top-1 agreement, speedup (and
    realized sparsity when measured); the 1% / 3% crossings; the default-point target; the command."""
    settings = result["settings"]
    lines = [
        f"Model `{result['model']}`, backend `{result['backend']}`, {result['scored_tokens']} scored held-out tokens "
        f"({result['windows']} windows of up to {settings['context']} tokens, {settings['prompt_tokens']}-token dense "
        f"prefill each), {settings['calibration_tokens']} calibration tokens per export, {settings['dtype']} weights. "
        f"Speedup: sparse over dense decode tokens/s on the same engine options ({_threads_text(settings['threads'])}, "
        f"{_TIMER_TEXT[settings['timer']]}), best of {settings['speed_repeats']} alternating runs of "
        f"{result['speed_tokens']} teacher-forced decode steps. "
        f"Measured {result['date']} at commit {result['commit']} on {result['machine']['cpu']} "
        f"({result['machine']['cores']} cores).",
        "",
    ]
    for name, kind in result["kinds"].items():
        with_sparsity = "mean_realized_sparsity" in kind["points"][0]
        header = f"| {kind['setting'].replace('_', ' ')} | ppl change % | top-1 agreement | decode speedup |"
        rule = "|---:|---:|---:|---:|"
        if with_sparsity:
            header += " realized sparsity | weighted recall |"
            rule += "---:|---:|"
        lines += [f"**{name}** ({kind['description']})", "", header, rule]
        for point in kind["points"]:
            row = (
                f"| {point['setting']:g} | {point['perplexity_change_percent']:+.2f} | {point['top1_agreement']:.4f} "
                f"| {point['speedup']:.3f}x |"
            )
            if with_sparsity:
                row += f" {point['mean_realized_sparsity']:.3f} | {point['mean_importance_weighted_recall']:.4f} |"
            lines.append(row)
        lines.append("")
    lines += ["**Frontier crossings** (interpolated speedup and setting where perplexity loss first exceeds it)", ""]
    thresholds = [f"{threshold:g}%" for threshold in CROSSING_THRESHOLDS]
    lines += ["| kind | " + " | ".join(f"{t} loss" for t in thresholds) + " |", "|---|" + "---|" * len(thresholds)]
    for name, kind in result["kinds"].items():
        setting = kind["setting"].replace("_", " ")
        lines.append(
            f"| {name} | " + " | ".join(_crossing_text(kind["crossings"][t], setting) for t in thresholds) + " |"
        )
    target = result["target"]
    level = target["level"]
    level = "" if level is None else f" {level}" if isinstance(level, str) else f" {level:g}"
    lines += [
        "",
        f"**Target** (svd at its default level{level}: perplexity within "
        f"{target['max_perplexity_change_percent']:g}% of dense and decode >= {target['min_speedup']:g}x): "
        f"{target['status']}",
    ]
    if "speedup" in target:
        lines[-1] += f" -- {target['perplexity_change_percent']:+.2f}% perplexity, {target['speedup']:.3f}x decode."
    if command:
        lines += ["", "Reproduce:", "", "```bash", command, "```"]
    return "\n".join(lines) + "\n"
