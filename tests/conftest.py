"""Shared fixtures: the committed tiny model, and its bundles, exported once per session for every test."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TINY_MODEL = FIXTURES / "tiny-relu-llama"
# The bundles every engine test runs: one name per (predictor kind, weight dtype), calibrated small (rank 16,
# 2048 tokens, levels 0.5 and 0.8) so the whole matrix exports in seconds. The default level is given (0.5): chosen
# on validation, no level of so small a calibration is within the budget, and the default would be dense.
BUNDLE_MATRIX = {
    "svd-fp32": ("svd", "fp32"),
    "svd-fp16": ("svd", "fp16"),
    "signbit-fp32": ("signbit", "fp32"),
    "core-fp16": ("core", "fp16"),
    "threshold-fp32": ("threshold", "fp32"),
    "none-fp32": ("none", "fp32"),
    "svd-int8": ("svd", "int8"),
    "svd-int4": ("svd", "int4"),
}
MATRIX_LEVELS = (0.5, 0.8)
MATRIX_MAX_SEQ_LEN = 128


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The committed tiny ReLU Llama (tests/fixtures/tiny-relu-llama, trained by its script)."""
    return TINY_MODEL


class BundleMatrix:
    """The tiny model's bundles by BUNDLE_MATRIX name, each exported on first use and shared by the session.
    Tests read them and never change them (copy one first)."""

    def __init__(self, root: Path):
        self.root = root
        self._opened: dict = {}

    def __getitem__(self, name: str):
        if name not in self._opened:
            from edge_sdk.export.exporter import ExportSettings, export_bundle
            from edge_sdk.sparsity.settings import CalibrationSettings

            predictor, dtype = BUNDLE_MATRIX[name]
            calibration = CalibrationSettings(
                predictor=predictor, rank=16, max_tokens=2048, levels=MATRIX_LEVELS, sparsity=MATRIX_LEVELS[0]
            )
            settings = ExportSettings(dtype=dtype, max_seq_len=MATRIX_MAX_SEQ_LEN, calibration=calibration)
            self._opened[name] = export_bundle(TINY_MODEL, self.root / name, settings, [TINY_MODEL / "calibration.txt"])
        return self._opened[name]

    def path(self, name: str) -> Path:
        return self[name].path


@pytest.fixture(scope="session")
def bundle_matrix(tmp_path_factory) -> BundleMatrix:
    return BundleMatrix(tmp_path_factory.mktemp("bundle-matrix"))
