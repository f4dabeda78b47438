"""Generation parameters a user can get wrong, from an adversarial review of `edge-sdk run`, edge_sdk.load and
Session.generate: each is refused in one line naming what was expected, or does what its documentation says."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import edge_sdk
from edge_sdk.cli import main
from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.generator import GenerationStats, Generator, Sampler, SamplingSettings
from edge_sdk.runtime.session import Session

# ids 1 and 3 share the largest logit
TIED_LOGITS = np.array([1.0, 3.0, 2.0, 3.0, -5.0], dtype=np.float32)


@pytest.mark.parametrize("temperature", [1e-310, 5e-324])
def test_a_temperature_too_small_for_the_logits_samples_the_largest_logits(temperature):
    # logits / temperature overflows to inf here; it gave NaN probabilities and always the last id, with warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picked = {Sampler(SamplingSettings(temperature=temperature, seed=seed))(TIED_LOGITS) for seed in range(12)}
        nucleus = Sampler(SamplingSettings(temperature=temperature, top_p=0.5, seed=0))(TIED_LOGITS)
    assert picked == {1, 3}  # the limit of a vanishing temperature: the tied largest logits, equally likely
    assert nucleus == 1  # top-p keeps the smallest set with mass >= 0.5: the tie's lowest id


def test_a_temperature_beyond_the_float_range_is_refused():
    # an int larger than any float passed the check and raised OverflowError at the first token
    with pytest.raises(EdgeSdkError, match=r"temperature: expected a number >= 0 \(0 = greedy\)"):
        SamplingSettings(temperature=10**400)


class OneTokenEngine:
    vocab_size = 2048
    max_seq_len = 64

    def prefill(self, ids: list[int]) -> np.ndarray:
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        logits[1] = 1.0  # eos
        return logits

    decode = prefill

    def reset(self) -> None:
        pass


@pytest.mark.parametrize("prompt", [[0, 87, 290], 5])
def test_a_chat_prompt_must_be_text(tiny_model_dir, prompt):
    # the chat template rendered a list of ids or a number as the text of the user's message
    session = Session.__new__(Session)  # no bundle: only the tokenizer's chat template and a generator are used
    session.tokenizer = Tokenizer.from_dir(tiny_model_dir)
    session.generator = Generator(OneTokenEngine(), session.tokenizer)
    with pytest.raises(
        EdgeSdkError, match=f"prompt: expected the user's message as a string with chat, found {type(prompt).__name__}$"
    ):
        session.generate(prompt, chat=True, max_new_tokens=2)


@pytest.mark.parametrize("backend", ["", None])
def test_load_refuses_a_backend_that_is_not_a_name_before_opening_the_bundle(tmp_path, backend):
    # "" and None selected a backend automatically as "auto" does
    with pytest.raises(EdgeSdkError, match=f"unknown backend {backend!r}; expected one of auto, tensorrt, cann, cpu"):
        edge_sdk.load(tmp_path / "missing", backend=backend)


def test_run_refuses_an_empty_backend_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing"), "--prompt", "x", "--backend", ""])
    assert result.exit_code == 2
    assert result.output == "edge-sdk: error: unknown backend ''; expected one of auto, tensorrt, cann, cpu\n"


@pytest.mark.parametrize("option", [["--top-k", "5"], ["--top-p", "0.9"], ["--seed", "7"]])
def test_a_sampling_option_without_a_temperature_is_refused(option, tmp_path):
    """Greedy decoding (--temperature 0, the default) reads none of them: the command ignored them silently, as if
    the user's seed had been used. Refused before the bundle is read."""
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing"), "--prompt", "x", *option])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"edge-sdk: error: {option[0]}: only sampling reads it, and --temperature 0")
    assert "Traceback" not in result.output
    given = CliRunner().invoke(
        main, ["run", str(tmp_path / "missing"), "--prompt", "x", "--temperature", "0.7", *option]
    )
    assert given.exit_code == 2 and "only sampling reads it" not in given.output  # the missing bundle, next
    assert "missing" in given.output


def test_run_writes_the_models_text_unchanged_through_a_pipe(monkeypatch, tmp_path):
    # click.echo strips ANSI escape sequences when stdout is not a terminal, and only a sequence whole within one
    # piece: the pipe got "red\x1b[0m plain" of the API's "\x1b[31mred\x1b[0m plain"
    pieces = ["\x1b[31mred\x1b", "[0m plain"]

    class StreamingSession:
        def __init__(self):
            self.stats = GenerationStats(1, 2, prefill_seconds=0.1, decode_seconds=0.1, stop_reason="max_new_tokens")
            self.info = {"backend": "cpu", "predictor": None, "sparsity_level": None}

        def generate(self, prompt, **sampling):
            return iter(pieces)

    monkeypatch.setattr(edge_sdk, "load", lambda *args, **kwargs: StreamingSession())
    result = CliRunner().invoke(main, ["run", str(tmp_path), "--prompt", "hi"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "\x1b[31mred\x1b[0m plain\n"
