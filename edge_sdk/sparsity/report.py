"""A one-page PNG of a bundle's predictor quality report, readable at a glance.

The report is the dict written to report.json: {"model", "predictor", "levels", "layers": [per-layer
metrics from metrics.layer_metrics plus "layer", optionally "per_level": {level: metrics}]}. Every
metric key is optional; what is missing is simply not drawn.
"""

from __future__ import annotations

import math
from pathlib import Path

from edge_sdk.outputs import PNG_METADATA

_SPARSITY_KEYS = (
    ("true_sparsity", "true", "#7f7f7f", "--"),
    ("predicted_sparsity", "predicted", "#1f77b4", "-"),
    ("realized_sparsity", "realized", "#2ca02c", "-"),
)
_RECALL_KEYS = (
    ("recall", "recall", "#1f77b4", "-"),
    ("importance_weighted_recall", "importance-weighted recall", "#d62728", "-"),
    ("auroc", "AUROC", "#9467bd", "--"),
)


def _values(layers: list[dict], key: str) -> list[float]:
    """Per-layer values of key, NaN where a layer lacks it (matplotlib leaves NaN points out)."""
    return [math.nan if layer.get(key) is None else float(layer[key]) for layer in layers]


def _has(values: list[float]) -> bool:
    return any(not math.isnan(v) for v in values)


def _plot_lines(ax, layers: list[dict], x: list[float], keys) -> None:
    """One line per metric key present, y zoomed to the drawn values (and never above 1 + margin)."""
    drawn = []
    for key, label, color, style in keys:
        values = _values(layers, key)
        if _has(values):
            ax.plot(x, values, style, marker="o", markersize=3, label=label, color=color)
            drawn += [v for v in values if not math.isnan(v)]
    if drawn:
        low = min(drawn)
        margin = max(0.005, (1.0 - low) * 0.1)
        ax.set_ylim(max(0.0, low - margin), 1.0 + margin / 2)
    ax.set_xlabel("layer")
    ax.grid(alpha=0.3)


def _level_points(layer: dict) -> dict[str, tuple[float, float]]:
    """{level: (predicted sparsity, importance-weighted recall)} of one layer's per_level metrics."""
    return {
        level: (float(m["predicted_sparsity"]), float(m["importance_weighted_recall"]))
        for level, m in layer.get("per_level", {}).items()
        if m.get("predicted_sparsity") is not None and m.get("importance_weighted_recall") is not None
    }


def _plot_levels(ax, layers: list[dict], colormap) -> None:
    curves = [(layer.get("layer", i), _level_points(layer)) for i, layer in enumerate(layers)]
    curves = [(name, points) for name, points in curves if points]
    for i, (_, points) in enumerate(curves):
        xs, ys = zip(*sorted(points.values()), strict=True)
        ax.plot(xs, ys, color=colormap(i / max(1, len(curves) - 1)), linewidth=0.8, alpha=0.6)
    by_level: dict[str, list[tuple[float, float]]] = {}
    for _, points in curves:
        for level, point in points.items():
            by_level.setdefault(level, []).append(point)
    mean_points = sorted(
        (sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)) for pts in by_level.values()
    )
    ax.plot(
        *zip(*mean_points, strict=True), color="black", linewidth=2.2, marker="o", label="mean over layers, per level"
    )
    first, last = curves[0][0], curves[-1][0]
    ax.set_title(f"Importance-weighted recall vs predicted sparsity (thin: layers {first} to {last}, dark to light)")
    ax.set_xlabel("predicted sparsity")
    ax.set_ylabel("importance-weighted recall")


def write_report_plot(report: dict, path: str | Path) -> None:
    """Write a PNG summarising report (model, predictor, per-layer metrics) to path.

    Panels: true / predicted / realized sparsity per layer; recall, importance-weighted recall and AUROC
    per layer; when layers carry per_level metrics, importance-weighted recall against predicted sparsity.
    Needs matplotlib (a test / report extra); it draws off-screen, never opening a window.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    layers = list(report.get("layers", []))
    x = [float(layer.get("layer", i)) for i, layer in enumerate(layers)]
    with_levels = any(_level_points(layer) for layer in layers)
    n_panels = 3 if with_levels else 2
    figure = Figure(figsize=(11, 3.6 * n_panels), layout="constrained")
    axes = figure.subplots(n_panels, 1)
    _plot_lines(axes[0], layers, x, _SPARSITY_KEYS)
    axes[0].set_ylabel("sparsity")
    axes[0].set_title("Sparsity per layer (realized = after the gate drops the predictor's false positives)")
    _plot_lines(axes[1], layers, x, _RECALL_KEYS)
    axes[1].set_ylabel("recall / AUROC")
    axes[1].set_title("Recall of truly active neurons per layer")
    if with_levels:
        _plot_levels(axes[2], layers, colormaps["viridis"])
        axes[2].grid(alpha=0.3)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    subtitle = []
    ratios = [v for v in _values(layers, "multiply_count_ratio") if not math.isnan(v)]
    if ratios:
        subtitle.append(f"FFN multiplies: {100 * sum(ratios) / len(ratios):.1f}% of dense (mean over layers)")
    if report.get("levels"):
        subtitle.append("levels: " + ", ".join(str(level) for level in report["levels"]))
    title = f"{report.get('model', '?')} -- predictor: {report.get('predictor', '?')}"
    figure.suptitle("\n".join([title, *subtitle]), fontsize="large")
    figure.savefig(Path(path), dpi=110, format="png", metadata=PNG_METADATA)
