"""Held-out evaluation of bundles (sparse against dense decode) and quality-vs-speed sweeps over predictors."""

from edge_sdk.eval.evaluate import EvalError, evaluate_bundle
from edge_sdk.eval.sweep import SWEEP_KINDS, format_sweep_markdown, frontier_crossing, sweep

__all__ = ["SWEEP_KINDS", "EvalError", "evaluate_bundle", "format_sweep_markdown", "frontier_crossing", "sweep"]
