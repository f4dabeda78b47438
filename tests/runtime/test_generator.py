"""Sampling, stop conditions and streamed text of the Generator, on fake engines and the fixture tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.generator import Generator, Sampler, SamplingSettings

REPLACEMENT_CHARACTER = "\ufffd"
PROMPT = [5, 6, 7, 8]


class ScriptedEngine:
    """Puts all probability on the next token of a script, and checks the generator feeds back exactly those
    tokens and never holds more than max_seq_len positions."""

    def __init__(self, script: list[int], vocab_size: int, max_seq_len: int = 1024) -> None:
        self.script = script
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.sequence: list[int] = []
        self.steps = 0  # logits returned since prefill = tokens the generator has sampled

    def prefill(self, ids: list[int]) -> np.ndarray:
        assert len(ids) <= self.max_seq_len
        self.sequence, self.steps = list(ids), 0
        return self._logits()

    def decode(self, token: int) -> np.ndarray:
        assert token == self.script[self.steps - 1], "the generator must feed back the token it sampled"
        self.sequence.append(token)
        assert len(self.sequence) <= self.max_seq_len
        return self._logits()

    def reset(self) -> None:
        self.sequence, self.steps = [], 0

    def _logits(self) -> np.ndarray:
        assert self.steps < len(self.script), "the generator asked for a token past the script"
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        logits[self.script[self.steps]] = 10.0
        self.steps += 1
        return logits


class BigramEngine:
    """Seeded random logits that depend on the last token, so sampled sequences depend on the sampler's seed."""

    def __init__(self, vocab_size: int = 32, max_seq_len: int = 256) -> None:
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.table = np.random.default_rng(0).normal(size=(vocab_size, vocab_size)).astype(np.float32)

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.table[ids[-1]]

    def decode(self, token: int) -> np.ndarray:
        return self.table[token]

    def reset(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


def scripted(tokenizer: Tokenizer, script: list[int], max_seq_len: int = 1024) -> tuple[Generator, ScriptedEngine]:
    engine = ScriptedEngine(script, tokenizer.vocab_size, max_seq_len)
    return Generator(engine, tokenizer), engine


def frequencies(settings: SamplingSettings, logits: np.ndarray, draws: int) -> dict[int, float]:
    sampler = Sampler(settings)
    counts = np.bincount([sampler(logits) for _ in range(draws)], minlength=logits.size)
    return {token: count / draws for token, count in enumerate(counts) if count}


# --- Sampler -------------------------------------------------------------------------------------------------


def test_greedy_picks_the_argmax_and_breaks_ties_by_lowest_id():
    sampler = Sampler(SamplingSettings(seed=123))
    assert sampler(np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)) == 1
    assert sampler(np.array([-1.0, -2.0, -1.0], dtype=np.float32)) == 0
    assert sampler(np.array([0.0, 1.0, 2.0, 2.5], dtype=np.float32)) == 3


def test_seeded_sampling_is_reproducible_and_seeds_differ():
    logits = np.random.default_rng(1).normal(size=50).astype(np.float32)

    def draws(seed):
        sampler = Sampler(SamplingSettings(temperature=1.0, seed=seed))
        return [sampler(logits) for _ in range(100)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert len(set(draws(7))) > 5  # really sampling, not greedy


def test_top_k_1_and_a_tiny_top_p_are_greedy():
    rng = np.random.default_rng(2)
    top_k_1 = Sampler(SamplingSettings(temperature=1.5, top_k=1, seed=0))
    tiny_top_p = Sampler(SamplingSettings(temperature=1.5, top_p=1e-9, seed=0))
    for _ in range(50):
        logits = rng.normal(size=40).astype(np.float32)
        logits[rng.integers(40, size=2)] = logits.max() + 1.0  # a tie (or a single maximum) above the rest
        expected = int(np.argmax(logits))
        assert top_k_1(logits) == expected
        assert tiny_top_p(logits) == expected


PROBABILITIES = np.array([0.1, 0.4, 0.3, 0.2])


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected"),
    [
        (2, 1.0, {1: 4 / 7, 2: 3 / 7}),
        (0, 0.65, {1: 4 / 7, 2: 3 / 7}),  # 0.4 + 0.3 >= 0.65
        (0, 0.75, {1: 4 / 9, 2: 3 / 9, 3: 2 / 9}),  # 0.4 + 0.3 < 0.75 <= 0.9
        (3, 0.75, {1: 4 / 7, 2: 3 / 7}),  # top-p over top-k's renormalized 4/9 + 3/9 >= 0.75
    ],
)
def test_top_k_and_top_p_keep_exactly_the_nucleus(top_k, top_p, expected):
    settings = SamplingSettings(temperature=1.0, top_k=top_k, top_p=top_p, seed=3)
    found = frequencies(settings, np.log(PROBABILITIES).astype(np.float32), draws=10_000)
    assert set(found) == set(expected)
    for token, probability in expected.items():
        assert found[token] == pytest.approx(probability, abs=0.025)


def test_top_k_ties_at_the_cut_keep_the_lowest_ids():
    settings = SamplingSettings(temperature=1.0, top_k=2, seed=4)
    found = frequencies(settings, np.array([1.0, 2.0, 2.0, 2.0], dtype=np.float32), draws=2_000)
    assert set(found) == {1, 2}
    assert found[1] == pytest.approx(0.5, abs=0.05)


def test_temperature_scales_the_logits():
    settings = SamplingSettings(temperature=2.0, seed=5)
    found = frequencies(settings, np.log(np.array([1.0, 3.0])).astype(np.float32), draws=10_000)
    assert found[1] == pytest.approx(math.sqrt(3) / (1 + math.sqrt(3)), abs=0.025)  # not 0.75 as at temperature 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", -1),
        ("temperature", -0.5),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("stop", "###"),
        ("stop", ("ok", "")),
        ("stop", None),
        ("max_new_tokens", 2.5),  # a float never equals the count: it would switch the limit off
        ("max_new_tokens", float("inf")),
        ("max_new_tokens", float("nan")),
        ("max_new_tokens", True),
        ("top_k", 2.5),
        ("temperature", "1"),
        ("top_p", None),
        ("stop_on_eos", "no"),
    ],
)
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(EdgeSdkError, match=field) as raised:
        SamplingSettings(**{field: value})
    assert "expected" in str(raised.value) and "found" in str(raised.value)


# --- Stop conditions ----------------------------------------------------------------------------------------


def test_stops_at_eos_without_emitting_it(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    generator, engine = scripted(tokenizer, [40, 41, eos, 42])
    tokens = generator.generate_ids(PROMPT, SamplingSettings())
    assert next(tokens) == 40
    assert generator.last_stats is None  # still running
    assert list(tokens) == [41]
    stats = generator.last_stats
    assert (stats.stop_reason, stats.prompt_tokens, stats.generated_tokens, stats.decode_steps) == ("eos", 4, 2, 2)
    assert stats.prefill_seconds > 0 and stats.decode_seconds > 0 and stats.decode_tokens_per_second > 0
    assert engine.sequence == [*PROMPT, 40, 41]


def test_eos_is_an_ordinary_token_without_stop_on_eos(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    generator, _ = scripted(tokenizer, [40, eos, 42])
    assert list(generator.generate_ids(PROMPT, SamplingSettings(max_new_tokens=3, stop_on_eos=False))) == [40, eos, 42]
    assert generator.last_stats.stop_reason == "max_new_tokens"


def test_stops_after_max_new_tokens_without_an_extra_decode(tokenizer):
    generator, engine = scripted(tokenizer, [40, 41, 42, 43, 44])
    assert list(generator.generate_ids(PROMPT, SamplingSettings(max_new_tokens=3))) == [40, 41, 42]
    assert generator.last_stats.stop_reason == "max_new_tokens"
    assert engine.sequence == [*PROMPT, 40, 41]  # the last token is never fed to the engine


def test_stops_when_the_sequence_reaches_max_seq_len(tokenizer):
    generator, engine = scripted(tokenizer, [40, 41, 42, 43, 44], max_seq_len=7)
    assert list(generator.generate_ids(PROMPT, SamplingSettings())) == [40, 41, 42]  # 4 + 3 = 7 positions
    assert generator.last_stats.stop_reason == "max_seq_len"
    assert len(engine.sequence) == 6


def test_a_prompt_longer_than_max_seq_len_is_refused_at_once(tokenizer):
    generator, _ = scripted(tokenizer, [40], max_seq_len=8)
    with pytest.raises(EdgeSdkError, match=r"9 tokens.*max_seq_len is 8"):
        generator.generate_ids(list(range(10, 19)), SamplingSettings())
    with pytest.raises(EdgeSdkError, match="max_seq_len is 8"):
        generator.stream("word " * 20, SamplingSettings())


def test_prompt_ids_outside_the_vocabulary_are_refused(tokenizer):
    generator, _ = scripted(tokenizer, [40])
    with pytest.raises(EdgeSdkError, match="token ids in"):
        generator.generate_ids([5, tokenizer.vocab_size], SamplingSettings())


def test_text_prompts_are_encoded_with_or_without_bos(tokenizer):
    for add_bos, expected in ((None, [tokenizer.bos_token_id, 4]), (False, [4])):
        generator, engine = scripted(tokenizer, [tokenizer.eos_token_ids[0]])
        assert list(generator.stream("#", SamplingSettings(), add_bos=add_bos)) == []
        assert engine.sequence == expected


SENTENCE = " the cat sat on the mat. Then more"


def test_a_stop_string_spanning_tokens_cuts_the_text(tokenizer):
    ids = tokenizer.encode(SENTENCE, add_bos=False)
    ends = np.cumsum([len(tokenizer.decode([token])) for token in ids])  # ASCII: each token's text is exact
    stop = "t on t"
    start, end = SENTENCE.index(stop), SENTENCE.index(stop) + len(stop)
    assert sum(start < boundary < end for boundary in ends) >= 2  # starts and ends inside tokens
    generator, engine = scripted(tokenizer, [*ids, tokenizer.eos_token_ids[0]])

    pieces = list(generator.stream(PROMPT, SamplingSettings(stop=("never", stop))))

    assert "".join(pieces) == SENTENCE[:start] == " the cat sa"
    completing = int(np.searchsorted(ends, end)) + 1  # tokens up to the one that completes the stop string
    assert generator.last_stats.stop_reason == "stop_string"
    assert generator.last_stats.generated_tokens == engine.steps == completing


def test_text_that_only_looks_like_a_stop_string_is_emitted(tokenizer):
    ids = tokenizer.encode(SENTENCE, add_bos=False)
    generator, _ = scripted(tokenizer, [*ids, tokenizer.eos_token_ids[0]])
    # "at. X" and "more!" match the text's "at. " and its final "more" until the following characters
    pieces = list(generator.stream(PROMPT, SamplingSettings(stop=("at. X", "more!"))))
    assert "".join(pieces) == SENTENCE
    assert generator.last_stats.stop_reason == "eos"


# --- Streamed text ------------------------------------------------------------------------------------------

MULTIBYTE = "naïve — 中文 🙂"


def test_streamed_multibyte_text_is_exact_and_arrives_per_character(tokenizer):
    ids = tokenizer.encode(MULTIBYTE, add_bos=False)
    assert len(tokenizer.encode("🙂", add_bos=False)) > 1  # one character split across tokens
    assert any(REPLACEMENT_CHARACTER in tokenizer.decode([token]) for token in ids)
    generator, engine = scripted(tokenizer, [*ids, tokenizer.eos_token_ids[0]])

    pieces, sampled_at_piece = [], []
    for piece in generator.stream(PROMPT, SamplingSettings()):
        pieces.append(piece)
        sampled_at_piece.append(engine.steps)

    assert "".join(pieces) == MULTIBYTE == tokenizer.decode(ids)
    assert not any(REPLACEMENT_CHARACTER in piece for piece in pieces)
    for count, sampled in enumerate(sampled_at_piece, start=1):
        # everything decodable is emitted as soon as its last token is sampled, nothing more
        assert "".join(pieces[:count]) == tokenizer.decode(ids[:sampled]).rstrip(REPLACEMENT_CHARACTER)


def test_invalid_bytes_are_emitted_instead_of_held_back(tokenizer):
    continuation_byte = 109  # decodes to U+FFFD alone and in any run: 0xAF never starts a character
    assert tokenizer.decode([continuation_byte] * 3) == REPLACEMENT_CHARACTER * 3
    script = [continuation_byte] * 12 + tokenizer.encode("ok", add_bos=False)
    generator, engine = scripted(tokenizer, [*script, tokenizer.eos_token_ids[0]])

    pieces, first_piece_at = [], None
    for piece in generator.stream(PROMPT, SamplingSettings()):
        pieces.append(piece)
        first_piece_at = first_piece_at or engine.steps

    assert first_piece_at <= 5  # not stuck behind more than 4 tokens
    assert "".join(pieces) == tokenizer.decode(script) == REPLACEMENT_CHARACTER * 12 + "ok"


def test_seeded_generation_is_reproducible(tokenizer):
    def run(seed):
        generator = Generator(BigramEngine(), tokenizer)
        return list(
            generator.generate_ids(
                [3], SamplingSettings(max_new_tokens=30, temperature=1.0, seed=seed, stop_on_eos=False)
            )
        )

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_a_prompt_must_be_text_or_integer_token_ids(tokenizer):
    generator, _ = scripted(tokenizer, [40])
    with pytest.raises(EdgeSdkError, match="prompt: expected a string or a list of token ids, found bytes"):
        generator.stream(b"hello", SamplingSettings())  # not read as the ids 104, 101, ...
    with pytest.raises(EdgeSdkError, match=r"prompt: expected integer token ids, found 4\.0"):
        generator.generate_ids([5, 4.0], SamplingSettings())


def test_a_second_generation_while_one_runs_is_refused_and_the_first_goes_on(tokenizer):
    generator, engine = scripted(tokenizer, [40, 41, 42, 43])
    first = generator.generate_ids(PROMPT, SamplingSettings(max_new_tokens=3))
    assert next(first) == 40
    second = generator.generate_ids(PROMPT, SamplingSettings(max_new_tokens=3))
    with pytest.raises(EdgeSdkError, match="session busy: another generation on this session has not finished"):
        next(second)
    assert list(first) == [41, 42] and engine.sequence == [*PROMPT, 40, 41]  # its cache untouched
    engine.reset()
    engine.script = [50, 51]
    for token in generator.generate_ids(PROMPT, SamplingSettings()):  # leaving a loop early frees the engine
        assert token == 50
        break
    engine.reset()
    assert list(generator.generate_ids(PROMPT, SamplingSettings(max_new_tokens=2))) == [50, 51]


@pytest.fixture(scope="module")
def llama2_tokenizer(tmp_path_factory) -> Tokenizer:
    """SentencePiece BPE with byte fallback and the decoder's strip of the first space (Llama-2's tokenizer.json)."""
    from ..model.tokenizer_files import save_llama2_style

    directory = tmp_path_factory.mktemp("llama2-tokenizer")
    save_llama2_style(directory)
    return Tokenizer.from_dir(directory)


def byte_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    return [tokenizer.backend.library.token_to_id(f"<0x{byte:02X}>") for byte in text.encode()]


def streamed(tokenizer: Tokenizer, script: list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], Generator]:
    generator, _ = scripted(tokenizer, [*script, 3])
    settings = SamplingSettings(max_new_tokens=len(script), stop=stop, stop_on_eos=False)
    return list(generator.stream(PROMPT, settings)), generator


def test_byte_fallback_characters_in_one_run_stream_without_replacement_characters(llama2_tokenizer):
    # a byte-fallback decoder turns the whole run <0xE2><0x82><0xAC><0xF0>... into U+FFFD until the emoji's last byte
    script = byte_tokens(llama2_tokenizer, "€😀東京")
    assert llama2_tokenizer.decode(script[:4]) == REPLACEMENT_CHARACTER * 4
    pieces, _ = streamed(llama2_tokenizer, script)
    assert pieces == ["€", "😀", "東", "京"]
    pieces, generator = streamed(llama2_tokenizer, script, stop=("😀",))
    assert pieces == ["€"] and generator.last_stats.stop_reason == "stop_string"
    assert generator.last_stats.generated_tokens == 7


def test_a_skipped_special_token_keeps_the_next_words_space(llama2_tokenizer):
    vocab = llama2_tokenizer.backend.library.get_vocab()
    words = [vocab["▁class▁"], vocab["▁in▁"]]
    for special in (0, 1, 2):  # <unk>, <s>, </s>: skipped in the text
        script = [words[0], special, words[1]]
        pieces, _ = streamed(llama2_tokenizer, script)
        assert "".join(pieces) == llama2_tokenizer.decode(script) == "class  in "
