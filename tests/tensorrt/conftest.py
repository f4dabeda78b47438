"""Small bundles of the committed tiny model for the TensorRT backend tests (fp16 weights, max_seq_len 64)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.sparsity.settings import CalibrationSettings

BUNDLE_KINDS = ("svd", "core")


@pytest.fixture(scope="session")
def trt_bundles(tiny_model_dir, tmp_path_factory):
    """{predictor kind: opened bundle} for an SVD bundle and a core bundle."""
    root = tmp_path_factory.mktemp("trt-bundles")
    # the default level is given: chosen on validation, this small calibration would make the default dense
    calibration = CalibrationSettings(rank=16, max_tokens=2048, levels=(0.5, 0.8), sparsity=0.5)
    paths = {}
    for kind in BUNDLE_KINDS:
        settings = ExportSettings(dtype="fp16", max_seq_len=64, calibration=replace(calibration, predictor=kind))
        paths[kind] = export_bundle(tiny_model_dir, root / kind, settings, [tiny_model_dir / "calibration.txt"])
    return paths
