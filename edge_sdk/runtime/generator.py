"""Text generation on top of an Engine: sampling settings, a seeded sampler, and a Generator that streams
token ids or text pieces with stop conditions (eos, stop strings, max_new_tokens, max_seq_len)."""

from __future__ import annotations

import math
import threading
import time
from collections import abc
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.engine import Engine

REPLACEMENT_CHARACTER = "\ufffd"
# A character whose last bytes have not been generated yet decodes to at most 3 U+FFFD: one with a byte-level
# decoder (from_utf8_lossy), one per byte with a byte-fallback decoder, and a UTF-8 character has at most 4 bytes.
MAX_INCOMPLETE_CHARACTER_REPLACEMENTS = 3
MAX_SEED = 2**64 - 1  # the seeds numpy's PCG64 and the C sampler both take


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """Whether a number is finite as the float the sampler computes with (an int beyond 1.8e308 is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class SamplingSettings:
    """How to pick each new token and when to stop.

    temperature 0 is greedy decoding; top_k 0 and top_p 1 turn those filters off. Generation stops at the first
    eos token (unless stop_on_eos is False), when the text contains one of the stop strings (the stop string and
    anything after it are not emitted), after max_new_tokens tokens, or when the engine's sequence is full.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_on_eos: bool = True

    def __post_init__(self) -> None:
        if not _is_integer(self.max_new_tokens) or self.max_new_tokens < 0:
            raise EdgeSdkError(f"max_new_tokens: expected an integer >= 0, found {self.max_new_tokens!r}")
        if not _is_number(self.temperature) or not self.temperature >= 0 or not _is_finite(self.temperature):
            raise EdgeSdkError(f"temperature: expected a number >= 0 (0 = greedy), found {self.temperature!r}")
        if not _is_integer(self.top_k) or self.top_k < 0:
            raise EdgeSdkError(f"top_k: expected an integer >= 0 (0 = off), found {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise EdgeSdkError(f"top_p: expected a number in (0, 1] (1 = off), found {self.top_p!r}")
        if not isinstance(self.stop_on_eos, bool):
            raise EdgeSdkError(f"stop_on_eos: expected True or False, found {self.stop_on_eos!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED
        ):
            raise EdgeSdkError(f"seed: expected an integer in [0, 2^64 - 1] or None, found {self.seed!r}")
        if isinstance(self.stop, str):
            raise EdgeSdkError(f"stop: expected a tuple of strings, found the string {self.stop!r}")
        if not isinstance(self.stop, (tuple, list)):
            raise EdgeSdkError(f"stop: expected a tuple of strings, found {self.stop!r}")
        stop = tuple(self.stop)  # accept a list; the dataclass is frozen, so it must hold a hashable tuple
        for text in stop:
            if not isinstance(text, str) or not text:
                raise EdgeSdkError(f"stop: expected non-empty strings, found {text!r}")
        object.__setattr__(self, "stop", stop)


class Sampler:
    """Picks the next token from logits [vocab]; the same seed gives the same tokens.

    Greedy (temperature 0) is argmax with ties going to the lowest id. Otherwise the logits are divided by the
    temperature, filtered by top-k, then by top-p over the renormalized distribution (as Hugging Face does), and
    sampled with numpy's PCG64 generator. Filtering orders tokens by probability descending, ties by lowest id.
    """

    def __init__(self, settings: SamplingSettings) -> None:
        self.settings = settings
        self._rng = np.random.Generator(np.random.PCG64(settings.seed))

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float64)  # [vocab]
        if self.settings.temperature == 0:
            return int(np.argmax(logits))
        with np.errstate(over="ignore"):
            scaled = logits / self.settings.temperature
        if not np.isfinite(scaled.max()):
            # A temperature so small that logit / temperature overflows (5e-308 for logits about 10): inf - inf
            # made the probabilities NaN. Scaled from the largest logit instead, which is then 0 and the others
            # finite or -inf (probability 0): the limit of a vanishing temperature, the largest logits, as the C
            # sampler's double division gives. Only here, so that every other temperature's tokens for a seed
            # stay those of earlier versions.
            with np.errstate(over="ignore"):
                scaled = (logits - logits.max()) / self.settings.temperature
        ids = self._top_k_ids(scaled)  # [n] ascending
        if self.settings.top_p < 1:
            ids = ids[np.argsort(-scaled[ids], kind="stable")]  # probability descending, ties by lowest id
        probs = np.exp(scaled[ids] - scaled[ids].max())
        probs /= probs.sum()
        if self.settings.top_p < 1:
            kept = int(np.searchsorted(np.cumsum(probs), self.settings.top_p)) + 1  # smallest prefix with mass >= p
            ids, probs = ids[:kept], probs[:kept]
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return int(ids[min(index, ids.size - 1)])

    def _top_k_ids(self, scaled: np.ndarray) -> np.ndarray:
        """Ids of the top_k highest logits (ties at the cut go to the lowest ids), or all ids when top-k is off."""
        top_k = self.settings.top_k
        if top_k == 0 or top_k >= scaled.size:
            return np.arange(scaled.size)
        kth_largest = np.partition(scaled, scaled.size - top_k)[scaled.size - top_k]
        above = np.flatnonzero(scaled > kth_largest)
        tied = np.flatnonzero(scaled == kth_largest)[: top_k - above.size]
        return np.sort(np.concatenate([above, tied]))


@dataclass
class GenerationStats:
    """What one generation did and how fast.

    generated_tokens counts the emitted ids (not the eos); decode_steps counts engine.decode calls, which is what
    decode_seconds times (the first new token comes from the prefill logits).
    """

    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str  # "eos" | "stop_string" | "max_new_tokens" | "max_seq_len"
    decode_steps: int = 0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


class _IncrementalDecoder:
    """Turns generated ids into text pieces whose concatenation is tokenizer.decode(ids).

    A byte-level token can end inside a UTF-8 character, which then decodes to U+FFFD until its last byte arrives,
    so trailing replacement characters (at most MAX_INCOMPLETE_CHARACTER_REPLACEMENTS of them) are held back until
    the next token or flush(). Anything before them is final, so invalid bytes a model really produced are emitted
    once anything follows them. A byte-fallback decoder (SentencePiece's <0xNN> tokens) is different: while a run of
    byte tokens ends in an unfinished character it decodes the whole run to U+FFFD, characters already emitted
    included, so such text waits until the run decodes again or ends. (A run that stays invalid is the one case where
    the pieces differ from decode(ids): decode turns the whole run into U+FFFD, the pieces keep the valid characters
    emitted before the invalid bytes.) Only a window of recent ids is decoded (as in vLLM): it starts at the ids of
    the previous piece that decode to some text, so decoders that strip a leading space see the same context (a
    window starting at a skipped special token would strip the next token's space).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._window_start = 0  # decoding starts here
        self._window_read = 0  # ids before this were emitted when the window last ended cleanly
        self._window_text = ""  # the part of decode(ids[window_start:]) already emitted

    def push(self, token: int) -> str:
        self._ids.append(token)
        return self._advance(final=False)

    def flush(self) -> str:
        """Everything not yet emitted, including replacement characters of an unfinished character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        text = self._tokenizer.decode(self._ids[self._window_start :])
        trailing = len(text) - len(text.rstrip(REPLACEMENT_CHARACTER))
        if trailing and not final and not text.startswith(self._window_text):
            return ""  # a byte-fallback run replaced emitted characters: its last character is unfinished
        end = len(text) if final else len(text) - min(trailing, MAX_INCOMPLETE_CHARACTER_REPLACEMENTS)
        piece = text[len(self._window_text) : end]
        if end > len(self._window_text):
            self._window_text = text[:end]
        if end == len(text):
            read = self._tokenizer.decode(self._ids[self._window_read :])
            if read:  # else the window keeps its start: ids[window_read:] are skipped special tokens
                self._window_start, self._window_text = self._window_read, read
            else:
                self._window_text = text
            self._window_read = len(self._ids)
        return piece


class _StopStrings:
    """Cuts text at the first stop string; holds back a tail that could still grow into one.

    Stop strings can span token boundaries, so text ending in a prefix of a stop string waits for more text.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = stop
        self._held = ""
        self.found = False

    def push(self, text: str) -> str:
        """The part of held + text that is certainly before any stop string; sets found at a stop string."""
        pending = self._held + text
        # Held text is the longest tail that is a prefix of a stop string, so no stop string starts before it.
        starts = [index for index in (pending.find(stop) for stop in self._stop) if index >= 0]
        if starts:
            self.found, self._held = True, ""
            return pending[: min(starts)]
        held = self._longest_stop_prefix_tail(pending)
        self._held = pending[len(pending) - held :]
        return pending[: len(pending) - held]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_tail(self, text: str) -> int:
        longest = max((len(stop) for stop in self._stop), default=1) - 1
        for length in range(min(longest, len(text)), 0, -1):
            if any(stop.startswith(text[-length:]) for stop in self._stop):
                return length
        return 0


class Generator:
    """Generates from one Engine, one sequence at a time; last_stats describes the last finished generation.

    last_stats is None while a generation runs and stays None if the caller stops iterating before the end.
    """

    def __init__(self, engine: Engine, tokenizer: Tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.last_stats: GenerationStats | None = None
        # held by the generation running on the engine (its sequence, KV cache): a second one, from another thread
        # or interleaved in one, would feed the same cache and corrupt both
        self._running = threading.Lock()

    def generate_ids(self, prompt_ids: list[int], settings: SamplingSettings) -> Iterator[int]:
        """Yield each new token id (an eos that stops generation is not yielded).

        The prompt is checked now, not at the first next(): EdgeSdkError when it is empty, has ids outside the
        engine's vocabulary, or leaves no room for a new token in the engine's max_seq_len.
        """
        self._check_prompt(prompt_ids)
        self.last_stats = None
        stats = self._new_stats(prompt_ids)
        return self._finish_ids(self._sample(prompt_ids, settings, stats), stats)

    def stream(
        self, prompt: str | list[int], settings: SamplingSettings, *, add_bos: bool | None = None
    ) -> Iterator[str]:
        """Yield the generated text in pieces as they become decodable; their concatenation is
        tokenizer.decode(generated ids), cut before the first stop string.

        A text prompt is encoded with tokenizer.encode(prompt, add_bos); a list of ids is used as is.
        """
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt, add_bos=add_bos)
        elif isinstance(prompt, (list, tuple)):
            prompt_ids = list(prompt)
        else:
            raise EdgeSdkError(f"prompt: expected a string or a list of token ids, found {type(prompt).__name__}")
        self._check_prompt(prompt_ids)
        self.last_stats = None
        stats = self._new_stats(prompt_ids)
        return self._text_pieces(self._sample(prompt_ids, settings, stats), settings, stats)

    def _finish_ids(self, tokens: abc.Generator[int, None, None], stats: GenerationStats) -> Iterator[int]:
        yield from tokens
        self.last_stats = stats

    def _text_pieces(
        self, tokens: abc.Generator[int, None, None], settings: SamplingSettings, stats: GenerationStats
    ) -> Iterator[str]:
        decoder = _IncrementalDecoder(self.tokenizer)
        stops = _StopStrings(settings.stop)
        for token in tokens:
            piece = stops.push(decoder.push(token))
            if stops.found:
                tokens.close()
                break
            if piece:
                yield piece
        else:
            piece = stops.push(decoder.flush())
            if not stops.found:
                piece += stops.flush()
        if stops.found:
            stats.stop_reason = "stop_string"
        self.last_stats = stats
        if piece:
            yield piece

    def _sample(
        self, prompt_ids: list[int], settings: SamplingSettings, stats: GenerationStats
    ) -> abc.Generator[int, None, None]:
        """The decoding loop (_decode_loop) while holding the engine: EdgeSdkError at the first next() when another
        generation holds it."""
        if settings.max_new_tokens == 0:
            stats.stop_reason = "max_new_tokens"
            return
        if not self._running.acquire(blocking=False):
            raise EdgeSdkError(
                "session busy: another generation on this session has not finished (one sequence at a time: "
                "finish or close the other's iterator first, or load a session per thread)"
            )
        try:
            yield from self._decode_loop(prompt_ids, settings, stats)
        finally:
            self._running.release()

    def _decode_loop(
        self, prompt_ids: list[int], settings: SamplingSettings, stats: GenerationStats
    ) -> abc.Generator[int, None, None]:
        """Prefill, then sample and decode one token at a time until a stop condition.

        The last token is never fed to the engine, so the sequence (prompt + new tokens) fills at most max_seq_len.
        """
        sampler = Sampler(settings)
        eos_ids = set(self.tokenizer.eos_token_ids) if settings.stop_on_eos else set()
        start = time.perf_counter()
        logits = self.engine.prefill(prompt_ids)
        stats.prefill_seconds = time.perf_counter() - start
        while True:
            token = sampler(logits)
            if token in eos_ids:
                stats.stop_reason = "eos"
                return
            stats.generated_tokens += 1
            yield token
            if stats.generated_tokens == settings.max_new_tokens:
                stats.stop_reason = "max_new_tokens"
                return
            if stats.prompt_tokens + stats.generated_tokens >= self.engine.max_seq_len:
                stats.stop_reason = "max_seq_len"
                return
            start = time.perf_counter()
            logits = self.engine.decode(token)
            stats.decode_seconds += time.perf_counter() - start
            stats.decode_steps += 1

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EdgeSdkError("prompt: expected at least one token, found an empty prompt")
        not_ids = [token for token in prompt_ids if not _is_integer(token)]
        if not_ids:
            raise EdgeSdkError(f"prompt: expected integer token ids, found {not_ids[0]!r}")
        outside = [token for token in prompt_ids if not 0 <= token < self.engine.vocab_size]
        if outside:
            raise EdgeSdkError(f"prompt: expected token ids in [0, {self.engine.vocab_size}), found {outside[:5]}")
        if len(prompt_ids) >= self.engine.max_seq_len:
            raise EdgeSdkError(
                f"prompt: {len(prompt_ids)} tokens, but the engine's max_seq_len is {self.engine.max_seq_len} "
                "and must leave room for at least one new token; shorten the prompt"
            )

    @staticmethod
    def _new_stats(prompt_ids: list[int]) -> GenerationStats:
        # stop_reason is set by _sample (or _text_pieces) before the stats are published as last_stats
        return GenerationStats(
            prompt_tokens=len(prompt_ids), generated_tokens=0, prefill_seconds=0.0, decode_seconds=0.0, stop_reason=""
        )
