"""The predictors directory `edge-sdk calibrate` writes: predictors.safetensors (self-describing through its
metadata), report.json and report.png, published whole or not at all (edge_sdk.outputs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_sdk import outputs
from edge_sdk.export.safetensors_writer import SafetensorsWriter, TensorSpec
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


def write_calibration(result: CalibrationResult, target: outputs.Target) -> Path:
    """Write predictors.safetensors, report.json and report.png to a checked target; all or nothing."""
    from edge_sdk.sparsity.report import write_report_plot

    with outputs.staged_output(target) as staging:
        # written through Python's file I/O, not safetensors' save_file: a full disk then raises OSError, which
        # staged_output reports as one line, and the file gets the umask's mode like every other output
        specs = [TensorSpec(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in result.tensors.items()]
        with SafetensorsWriter(staging / PREDICTORS_FILE, specs, metadata=predictor_metadata(result.report)) as writer:
            for spec in writer.order:
                writer.write(spec.name, result.tensors[spec.name])
        (staging / REPORT_FILE).write_text(json.dumps(result.report, indent=2, allow_nan=False) + "\n")
        write_report_plot(result.report, staging / PLOT_FILE)
    return target.path
