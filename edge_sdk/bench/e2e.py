"""End-to-end speed of a bundle: dense against sparse decoding on the same backend, and the prompt's prefill."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_sdk import predictors
from edge_sdk.bundle import Bundle, LevelChoice
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats.files import decode_utf8, read_bounded
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions, select_backend

DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n    "
# Far more text than any bundle's positions take; the bound keeps a huge file from filling memory before it is cut.
MAX_PROMPT_FILE_BYTES = 16 << 20


def read_prompt_file(path: str | Path) -> str:
    """The text of a --prompt-file: a regular file (a FIFO would block and a device never end) of at most
    MAX_PROMPT_FILE_BYTES of UTF-8 text, not empty."""
    path = Path(path)
    if not path.exists():
        raise EdgeSdkError(f"{path}: prompt file not found")
    data = read_bounded(path, MAX_PROMPT_FILE_BYTES, follow_symlinks=True)
    if not data:
        raise EdgeSdkError(f"{path}: prompt file is empty; expected the prompt's text")
    return decode_utf8(data, path, "prompt file")


def bench_e2e(
    bundle_path: str | Path,
    backend: str | None = None,
    sparsity: float | None = None,
    decode_tokens: int = 64,
    repeats: int = 3,
    threads: int = 0,
    prompt: str = DEFAULT_PROMPT,
    on_progress: Callable[[str, int, int], None] | None = None,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """Greedy decode tokens/s, dense and sparse, best of `repeats` runs each (same prompt, same token count), and the
    prompt's prefill tokens/s, best of every run's prefill (prefill is dense in both modes).

    prompt_tokens: take the prompt's first that many tokens (all when None). The runs alternate dense, sparse,
    dense, ... so that load from other processes hits both alike. on_progress(phase, done, total) is called after
    each run. When the operating point decodes densely (a bundle without a predictor, or one whose default is dense
    and no `sparsity` is given) only dense runs are timed: the sparse figures and the speedup are None, and
    `no_sparse_run` says why, rather than a ratio of two dense runs that is noise."""
    bundle = Bundle.open(bundle_path)
    choice = bundle.sparsity.resolve(sparsity)  # raises, naming the calibrated levels, before any work
    ids = Tokenizer.from_bundle(bundle).encode(prompt)[:prompt_tokens]
    if prompt_tokens is not None and len(ids) == prompt_tokens >= bundle.max_seq_len:
        raise EdgeSdkError(  # the option is what is too long ("pass --prompt-tokens" read as if it had not been)
            f"--prompt-tokens {prompt_tokens}: the bundle serves {bundle.max_seq_len} positions, so at most "
            f"{bundle.max_seq_len - 1} prompt tokens are expected"
        )
    if not ids or len(ids) >= bundle.max_seq_len:
        raise EdgeSdkError(
            f"prompt: {len(ids)} tokens; the bundle serves {bundle.max_seq_len} positions, so a prompt of 1 to "
            f"{bundle.max_seq_len - 1} tokens is expected (shorten it, or pass --prompt-tokens)"
        )
    selection = select_backend(backend, bundle, threads)
    decode_tokens = min(decode_tokens, bundle.max_seq_len - len(ids))
    results: dict[str, Any] = {
        "bundle": str(bundle.path),
        "backend": selection.backend.name,
        "predictor": bundle.sparsity.predictor,
        "prompt_tokens": len(ids),
        "decode_tokens": decode_tokens,
        "repeats": repeats,
        "threads": threads,
    }
    no_sparse_run = _why_no_sparse_run(bundle, choice)
    modes = (("dense", True),) if no_sparse_run else (("dense", True), ("sparse", False))
    engines = {
        mode: selection.backend.load(bundle, EngineOptions(replace(choice, dense=dense), threads))
        for mode, dense in modes
    }
    best = {mode: float("inf") for mode in engines}
    best_prefill = float("inf")
    runs = 0
    for _ in range(repeats):
        for mode, engine in engines.items():
            started = time.perf_counter()
            logits = engine.prefill(ids)
            best_prefill = min(best_prefill, time.perf_counter() - started)
            token = int(logits.argmax())
            started = time.perf_counter()
            for _ in range(decode_tokens):
                token = int(engine.decode(token).argmax())
            best[mode] = min(best[mode], time.perf_counter() - started)
            runs += 1
            if on_progress is not None:
                on_progress("decode runs", runs, len(engines) * repeats)
    for mode, seconds in best.items():
        results[f"{mode}_tokens_per_second"] = decode_tokens / seconds
    if no_sparse_run:
        results |= {"sparse_tokens_per_second": None, "speedup": None, "no_sparse_run": no_sparse_run}
    else:
        results["speedup"] = results["sparse_tokens_per_second"] / results["dense_tokens_per_second"]
    results["prefill_tokens_per_second"] = len(ids) / best_prefill
    # "dense": the bundle's default is dense decoding (no level was within its export's perplexity budget)
    results["sparsity_level"] = choice.reported
    return results


def _why_no_sparse_run(bundle: Bundle, choice: LevelChoice) -> str | None:
    """Why the chosen operating point has nothing sparse to time, or None when it has."""
    sparsity = bundle.sparsity
    if sparsity.predictor == predictors.NO_PREDICTOR:
        return "the bundle has no predictor (exported with --predictor none), so every run decodes densely"
    if choice.dense:
        levels = ", ".join(f"{level:g}" for level in sparsity.levels)
        return (
            "the bundle's default is dense decoding (no calibrated level was within its export's perplexity "
            f"budget); pass --sparsity with one of its levels ({levels}) to time sparse decoding"
        )
    return None
