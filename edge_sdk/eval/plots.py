"""PNG pictures of an evaluation (perplexity, per-layer sparsity and recall) and of a sweep's quality-vs-speed
frontier. They draw off-screen on a matplotlib Figure, never opening a window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_sdk.bundle import operating_point_text
from edge_sdk.outputs import PNG_METADATA

_SPARSITY_BARS = (
    ("true_sparsity", "true", "#7f7f7f"),
    ("predicted_sparsity", "predicted", "#1f77b4"),
    ("realized_sparsity", "realized", "#2ca02c"),
)
_RECALL_BARS = (
    ("recall", "recall", "#1f77b4"),
    ("importance_weighted_recall", "importance-weighted recall", "#d62728"),
)
_CROSSING_STYLES = {1.0: ":", 3.0: "--"}


def _grouped_bars(ax, layers: list[dict[str, Any]], bars) -> None:
    """One group of bars per layer, one bar per metric present."""
    present = [bar for bar in bars if bar[0] in layers[0]]
    width = 0.8 / max(1, len(present))
    for offset, (key, label, color) in enumerate(present):
        xs = [layer["layer"] + (offset - (len(present) - 1) / 2) * width for layer in layers]
        ax.bar(xs, [layer[key] for layer in layers], width, label=label, color=color)
    ax.set_xticks([layer["layer"] for layer in layers])
    ax.set_xlabel("layer")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")


def plot_evaluation(result: dict[str, Any], path: str | Path) -> None:
    """Perplexity dense vs sparse; with per-layer statistics, also sparsity and recall bars per layer."""
    from matplotlib.figure import Figure

    layers = result.get("layers") or []
    n_panels = 3 if layers else 1
    figure = Figure(figsize=(5 * n_panels, 4), layout="constrained")
    axes = figure.subplots(1, n_panels, squeeze=False)[0]
    dense, sparse = result["dense_perplexity"], result["sparse_perplexity"]
    bars = axes[0].bar(["dense", "sparse"], [dense, sparse], color=["#7f7f7f", "#1f77b4"])
    axes[0].bar_label(bars, fmt="%.3f")
    axes[0].set_ylim(0, max(dense, sparse) * 1.15)
    axes[0].set_ylabel("held-out perplexity (teacher-forced decode)")
    axes[0].set_title(
        f"{result['perplexity_change_percent']:+.2f}% perplexity, top-1 agreement {result['top1_agreement']:.3f}"
    )
    if layers:
        _grouped_bars(axes[1], layers, _SPARSITY_BARS)
        axes[1].set_ylim(0, 1)
        axes[1].set_ylabel("fraction of (token, neuron) pairs")
        axes[1].set_title("FFN sparsity per layer during decode")
        _grouped_bars(axes[2], layers, _RECALL_BARS)
        low = min(min(layer["recall"], layer["importance_weighted_recall"]) for layer in layers)
        axes[2].set_ylim(max(0.0, low - 0.05), 1.0)
        axes[2].set_title("Recall of truly active neurons per layer")
    figure.suptitle(
        f"{result['bundle']} -- {operating_point_text(result['predictor'], result['sparsity_level'])} on "
        f"{result['backend']}, {result['scored_tokens']} scored tokens"
    )
    figure.savefig(Path(path), dpi=110, format="png", metadata=PNG_METADATA)


def plot_frontier(sweep_result: dict[str, Any], path: str | Path) -> None:
    """Perplexity change against decode speedup, one curve per predictor kind, points labelled by setting;
    a second panel puts the same curves against the mean realized FFN sparsity when it was measured."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    kinds = sweep_result["kinds"]
    with_sparsity = all("mean_realized_sparsity" in p for kind in kinds.values() for p in kind["points"])
    n_panels = 2 if with_sparsity else 1
    figure = Figure(figsize=(7 * n_panels, 5.5), layout="constrained")
    axes = figure.subplots(1, n_panels, squeeze=False)[0]
    colors = colormaps["tab10"]
    x_keys = [("speedup", "decode speedup over dense (x)")]
    if with_sparsity:
        x_keys.append(("mean_realized_sparsity", "mean realized FFN sparsity (up/down rows skipped)"))
    for ax, (x_key, x_label) in zip(axes, x_keys, strict=True):
        for index, (name, kind) in enumerate(kinds.items()):
            points = kind["points"]
            xs = [p[x_key] for p in points]
            ys = [p["perplexity_change_percent"] for p in points]
            ax.plot(xs, ys, marker="o", color=colors(index % 10), label=name)
            for x, y, point in zip(xs, ys, points, strict=True):
                ax.annotate(f"{point['setting']:g}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        for threshold, style in _CROSSING_STYLES.items():
            ax.axhline(threshold, color="black", linestyle=style, linewidth=0.8, label=f"{threshold:g}% loss")
        if x_key == "speedup":
            ax.axvline(1.0, color="#7f7f7f", linewidth=0.8)
        ax.set_yscale("symlog", linthresh=1.0)
        changes = [p["perplexity_change_percent"] for kind in kinds.values() for p in kind["points"]]
        ax.set_ylim(min(0.0, min(changes)) - 0.5, max(max(changes), 3.0) * 2.0)
        ax.set_xlabel(x_label)
        ax.set_ylabel("held-out perplexity change vs dense (%)")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0].set_title("Quality vs decode speed (labels: level / recall target / core beta)")
    if with_sparsity:
        axes[1].set_title("Quality vs realized sparsity")
    figure.suptitle(f"{sweep_result['model']} on {sweep_result['backend']}: sparse decode frontier per predictor")
    figure.savefig(Path(path), dpi=110, format="png", metadata=PNG_METADATA)
