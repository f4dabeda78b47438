"""End-to-end decode speed of a bundle: dense against sparse decoding on the same backend."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edge_sdk.bundle import Bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions, select_backend

DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n    "


def bench_e2e(
    bundle_path: str | Path,
    backend: str | None = None,
    sparsity: float | None = None,
    decode_tokens: int = 64,
    repeats: int = 3,
    threads: int = 0,
    prompt: str = DEFAULT_PROMPT,
) -> dict[str, Any]:
    """Greedy decode tokens/s, dense and sparse, best of `repeats` runs each (same prompt, same token count)."""
    bundle = Bundle.open(bundle_path)
    selection = select_backend(backend)
    ids = Tokenizer.from_bundle(bundle).encode(prompt)
    decode_tokens = min(decode_tokens, bundle.max_seq_len - len(ids))
    results: dict[str, Any] = {
        "bundle": str(bundle.path),
        "backend": selection.backend.name,
        "predictor": bundle.sparsity.predictor,
        "decode_tokens": decode_tokens,
    }
    for mode, dense in (("dense", True), ("sparse", False)):
        engine = selection.backend.load(bundle, EngineOptions(sparsity=sparsity, dense=dense, threads=threads))
        best = float("inf")
        for _ in range(repeats):
            token = int(engine.prefill(ids).argmax())
            started = time.perf_counter()
            for _ in range(decode_tokens):
                token = int(engine.decode(token).argmax())
            best = min(best, time.perf_counter() - started)
        results[f"{mode}_tokens_per_second"] = decode_tokens / best
    results["speedup"] = results["sparse_tokens_per_second"] / results["dense_tokens_per_second"]
    if bundle.sparsity.levels and sparsity is None:
        results["sparsity_level"] = bundle.sparsity.default_level
    else:
        results["sparsity_level"] = sparsity
    return results
