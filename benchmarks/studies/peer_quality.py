"""Held-out perplexity of edge-sdk bundles and llama.cpp GGUFs of the same model, on the same token windows: what a
user gives up in quality for the bytes of each format, on either runtime.

edge-sdk's figure is the dense one, computed as benchmarks/studies/tied_head_quality.py computes it (the torch
reference on the bundle's dequantized weights, one teacher-forced forward per window; equal to `edge-sdk eval`'s
dense figure). llama.cpp's comes from llama-cpp-python (the `peer` extra) with `logits_all`: each window evaluated
in one call, the same positions scored (each window's tokens after its first 32) against the same next tokens. The
windows are `edge-sdk eval`'s (held_out_windows: `--tokens` tokens of the text, windows of 256), tokenized by the
first bundle's tokenizer: a GGUF must share its vocabulary (benchmarks/peer_llamacpp.py writes such GGUFs from the
checkpoint a bundle was exported from; the checkpoint's own GGUF shares it too).

    .venv/bin/python benchmarks/studies/peer_quality.py --bundles B-fp16 B-int8 B-int4 \
        --ggufs model-F16.gguf model-Q8_0.gguf model-Q4_0.gguf SOURCE.gguf --text TEXT --tokens 2048 --json OUT
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from tied_head_quality import CONTEXT, PROMPT_TOKENS, perplexity

from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.eval.evaluate import held_out_windows, read_texts
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder


def llama_cpp_perplexity(path: Path, windows: list[list[int]], threads: int) -> float:
    """exp(mean next-token NLL) of llama.cpp on the GGUF at `path`, over the positions tied_head_quality scores."""
    from llama_cpp import Llama

    model = Llama(
        model_path=str(path),
        n_ctx=CONTEXT,
        n_batch=CONTEXT,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        verbose=False,
    )
    total, count = 0.0, 0
    for window in windows:
        model.reset()
        model.eval(window[:-1])
        logits = np.asarray(model.scores[PROMPT_TOKENS : len(window) - 1], dtype=np.float64)  # [scored, vocab]
        targets = np.asarray(window[PROMPT_TOKENS + 1 :])
        top = logits.max(axis=1, keepdims=True)
        log_normalizer = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        total += float((log_normalizer - logits[np.arange(len(targets)), targets]).sum())
        count += len(targets)
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, nargs="+", required=True, help="edge-sdk bundles (dense figure)")
    parser.add_argument("--ggufs", type=Path, nargs="*", default=[], help="llama.cpp files of the same model")
    parser.add_argument("--text", type=Path, nargs="+", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    first = Bundle.open(args.bundles[0], verify_checksums=False)
    windows = held_out_windows(
        Tokenizer.from_bundle(first),
        read_texts(args.text),
        args.tokens,
        CONTEXT,
        PROMPT_TOKENS,
        vocab_size=first.config.vocab_size,
    )
    scored = sum(len(window) - PROMPT_TOKENS - 1 for window in windows)
    results = []
    for path in args.bundles:
        bundle = Bundle.open(path, verify_checksums=False)
        model = load_reference_decoder(bundle)
        configure(model, bundle.sparsity.resolve(None, True))
        row = {
            "runtime": "edge-sdk",
            "file": str(path),
            "dtype": bundle.dtype,
            "head_dtype": bundle.manifest.lm_head_dtype,
            "down_dtype": bundle.manifest.ffn_down_dtype,
            "int4_scheme": bundle.manifest.int4_scheme,
        }
        row["perplexity"] = perplexity(model, windows)
        print(json.dumps(row), flush=True)
        results.append(row)
    for path in args.ggufs:
        row = {
            "runtime": "llama.cpp",
            "file": str(path),
            "perplexity": llama_cpp_perplexity(path, windows, args.threads),
        }
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json is not None:
        report = {"text": [str(t) for t in args.text], "tokens": args.tokens, "scored": scored, "results": results}
        args.json.write_text(json.dumps(with_machine_info(report), indent=2) + "\n")


if __name__ == "__main__":
    main()
