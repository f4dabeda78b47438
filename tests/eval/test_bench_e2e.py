"""`edge-sdk bench e2e`: decode tokens/s dense and sparse, and the prompt's prefill tokens/s, from the CLI."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edge_sdk.bench.e2e import MAX_PROMPT_FILE_BYTES, read_prompt_file
from edge_sdk.cli import main
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.settings import CalibrationSettings


def bench(*args: str):
    return CliRunner().invoke(main, ["bench", "e2e", *args, "--backend", "cpu", "--threads", "1", "--repeats", "1"])


def test_a_prompt_file_is_prefilled_and_timed(bundle_matrix, tiny_model_dir, tmp_path):
    """The first 40 tokens of the held-out text (more than one block of the C runtime's prefill): the JSON and the
    line say how many prompt tokens were prefilled and at what rate."""
    bundle = bundle_matrix["svd-int4"]
    out = tmp_path / "e2e.json"
    held_out = tiny_model_dir / "held_out.txt"
    result = bench(str(bundle.path), "--prompt-file", str(held_out), "--prompt-tokens", "40", "--tokens", "2",
                   "--json", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["prompt_tokens"] == 40 and len(Tokenizer.from_bundle(bundle).encode(held_out.read_text())) > 40
    assert report["prefill_tokens_per_second"] > 0 and report["dense_tokens_per_second"] > 0
    assert f"prefill {report['prefill_tokens_per_second']:.1f} tok/s (40 prompt tokens)" in result.stdout


def test_a_bundle_without_a_predictor_is_timed_dense_only(tiny_model_dir, tmp_path):
    """Its "sparse" runs would decode densely too, and their ratio to the dense runs is noise, which the command
    printed as a speedup: now it times the dense runs alone and says why there is no sparse figure."""
    bundle = tmp_path / "bundle"
    settings = ExportSettings(dtype="fp32", max_seq_len=64, calibration=CalibrationSettings(predictor="none"))
    export_bundle(tiny_model_dir, bundle, settings)
    result = bench(str(bundle), "--tokens", "2", "--json", str(tmp_path / "e2e.json"))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("cpu: dense ") and "sparse" not in result.stdout
    assert "no sparse run: the bundle has no predictor (exported with --predictor none)" in result.stderr
    report = json.loads((tmp_path / "e2e.json").read_text())
    assert report["speedup"] is None and report["sparse_tokens_per_second"] is None
    assert report["dense_tokens_per_second"] > 0 and report["predictor"] == "none"


def test_a_missing_or_too_long_prompt_is_refused_with_one_line(bundle_matrix, tiny_model_dir, tmp_path):
    bundle = bundle_matrix["svd-fp32"]
    result = bench(str(bundle.path), "--prompt-file", str(tmp_path / "missing.txt"))
    assert result.exit_code == 2
    assert "missing.txt: prompt file not found" in result.output and "Traceback" not in result.output
    os.mkfifo(tmp_path / "fifo")  # the command used to wait on it forever
    result = bench(str(bundle.path), "--prompt-file", str(tmp_path / "fifo"))
    assert result.exit_code == 2 and "fifo: is not a regular file" in result.output, result.output
    result = bench(str(bundle.path), "--prompt-file", str(tiny_model_dir / "held_out.txt"))  # far past 128 positions
    assert result.exit_code == 2
    assert "the bundle serves 128 positions, so a prompt of 1 to 127 tokens is expected" in result.output
    assert "Traceback" not in result.output
    result = bench(str(bundle.path), "--prompt-file", str(tiny_model_dir / "held_out.txt"), "--prompt-tokens", "500")
    assert result.exit_code == 2  # it said "(shorten it, or pass --prompt-tokens)" to a --prompt-tokens 500
    assert "--prompt-tokens 500: the bundle serves 128 positions, so at most 127 prompt tokens" in result.output


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: os.mkfifo(path), "is not a regular file; expected a regular file"),  # would block forever
        (lambda path: path.symlink_to("/dev/zero"), "is not a regular file; expected a regular file"),  # never ends
        (lambda path: path.write_bytes(b""), "prompt file is empty; expected the prompt's text"),
        (lambda path: path.write_bytes(b"x" * (MAX_PROMPT_FILE_BYTES + 1)), "16777217 bytes, more than the 16777216"),
        (lambda path: path.write_bytes(b"def \xff"), "the prompt file is not UTF-8 text (byte 0xff at offset 4)"),
    ],
    ids=["fifo", "device", "empty", "huge", "not-utf8"],
)
def test_a_prompt_file_that_cannot_be_a_prompt_is_refused_before_it_is_read(tmp_path, make, problem):
    path = tmp_path / "prompt.txt"
    make(path)
    with pytest.raises(EdgeSdkError) as refused:
        read_prompt_file(path)
    assert str(refused.value).startswith(f"{path}: {problem}")


def test_a_prompt_file_is_read_as_written(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("def main():\n    ")
    assert read_prompt_file(path) == "def main():\n    "
    with pytest.raises(EdgeSdkError, match=r"missing\.txt: prompt file not found"):
        read_prompt_file(tmp_path / "missing.txt")
