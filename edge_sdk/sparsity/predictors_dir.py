"""The predictors directory `edge-sdk calibrate` writes: predictors.safetensors (self-describing through its
metadata), report.json and report.png, published whole or not at all (edge_sdk.outputs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from edge_sdk import outputs
from edge_sdk.sparsity.pipeline import CalibrationResult

PREDICTORS_FILE, REPORT_FILE, PLOT_FILE = outputs.PREDICTORS_FILES


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
    return outputs.check_model_output(
        out_dir, outputs.PREDICTORS, replace=force, model_dir=model_dir, input_files=inputs
    )


def write_calibration(result: CalibrationResult, target: outputs.Target) -> Path:
    """Write predictors.safetensors, report.json and report.png to a checked target; all or nothing."""
    from edge_sdk.sparsity.report import write_report_plot

    with outputs.staged_output(target) as staging:
        save_file(result.tensors, str(staging / PREDICTORS_FILE), metadata=predictor_metadata(result.report))
        (staging / REPORT_FILE).write_text(json.dumps(result.report, indent=2, allow_nan=False) + "\n")
        write_report_plot(result.report, staging / PLOT_FILE)
    return target.path
