"""A device install: `pip install edge-sdk` without extras, in a fresh virtual environment, has no torch and no onnx
yet runs a bundle end to end (the CPU backend through libedge_sdk), and the commands that need the export extra say
which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import edge_sdk
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.sparsity.settings import CalibrationSettings

REPO = Path(__file__).resolve().parents[2]
PROMPT = "def main(argv=None):"
EXPORT_ONLY = ("torch", "onnx", "onnxruntime", "safetensors", "matplotlib")


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def device_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("device-install")
    venv = root / "venv"
    created = run(sys.executable, "-m", "venv", venv)
    assert created.returncode == 0, created.stderr
    install = run(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        f"--config-settings=build-dir={root / 'build'}",
        "--config-settings=cmake.define.EDGE_SDK_CUDA=OFF",
        REPO,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def bundle(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("device-bundle") / "bundle"
    export_bundle(
        tiny_model_dir,
        out,
        ExportSettings(dtype="fp16", max_seq_len=64, calibration=CalibrationSettings(predictor="none")),
    )
    return out


@pytest.mark.slow
def test_the_runtime_install_has_no_torch_or_onnx_and_runs_a_bundle(device_venv, bundle):
    installed = run(device_venv / "bin" / "python", "-m", "pip", "list", "--format=freeze").stdout.lower()
    assert not [package for package in EXPORT_ONLY if f"\n{package}==" in f"\n{installed}"], installed
    result = run(device_venv / "bin" / "edge-sdk", "run", bundle, "--prompt", PROMPT, "--max-new-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert "decode in the C runtime libedge_sdk" in result.stderr
    expected = "".join(edge_sdk.load(bundle, backend="cpu").generate(PROMPT, max_new_tokens=12))
    assert result.stdout == expected + "\n"
    assert run(device_venv / "bin" / "edge-sdk", "verify", bundle, "--files-only").returncode == 0
    assert run(device_venv / "bin" / "edge-sdk", "doctor").returncode == 0


@pytest.mark.slow
def test_importing_the_runtime_loads_no_torch(device_venv, bundle):
    code = (
        "import sys, edge_sdk, edge_sdk.cli, edge_sdk.runtime.session, edge_sdk.bundle.archive\n"
        f"session = edge_sdk.load({str(bundle)!r})\n"
        "''.join(session.generate('x', max_new_tokens=2))\n"
        f"print([m for m in {EXPORT_ONLY!r} if m in sys.modules])\n"
    )
    result = run(device_venv / "bin" / "python", "-c", code, cwd=device_venv)  # not the source tree
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "needs"),
    [
        (["verify", "BUNDLE"], "Comparing the bundle's graphs with the torch reference (skip it with --files-only)"),
        (["export", "MODEL", "-o", "OUT"], "`edge-sdk export`"),
        (["info", "MODEL"], "`edge-sdk info`"),
        (["eval", "BUNDLE", "--text", "TEXT"], "`edge-sdk eval`"),
    ],
)
def test_commands_of_the_export_extra_name_it(device_venv, bundle, tiny_model_dir, tmp_path, args, needs):
    values = {
        "BUNDLE": bundle,
        "MODEL": tiny_model_dir,
        "OUT": tmp_path / "out",
        "TEXT": tiny_model_dir / "held_out.txt",
    }
    result = run(device_venv / "bin" / "edge-sdk", *(values.get(arg, arg) for arg in args))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        == f"edge-sdk: error: {needs} needs torch, which this install lacks: pip install 'edge-sdk[export]'"
    )
