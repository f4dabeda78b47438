"""Held-out perplexity of int8 / int4 bundles of a model with tied embeddings: the shared matrix quantized (format
version 3), or kept int8 in an int4 bundle (`--head-dtype int8`, format version 4), against the fp16 embedding / LM
head of earlier bundles, and against the fp16 model.

Dense, computed by the torch reference on each bundle's dequantized weights (load_reference_decoder), one
teacher-forced forward per window over the windows `edge-sdk eval` scores (held_out_windows: `--tokens` tokens in
windows of 256, each scored after its first 32): equal to `edge-sdk eval`'s dense figure, and far faster than
token-by-token decoding on a loaded machine. "fp16 head" is the same bundle with the embedding replaced by the
checkpoint's matrix rounded to fp16, which is exactly what a format version 2 bundle held (every other matrix is
quantized the same way in both versions).

    edge-sdk export MODEL -o B-int4 --dtype int4 --head-dtype int4 --predictor none [--max-seq-len 512]
    edge-sdk export MODEL -o B-int4-head-int8 --dtype int4 --head-dtype int8 --predictor none [--max-seq-len 512]
    .venv/bin/python benchmarks/studies/tied_head_quality.py MODEL B-fp16 B-int8 B-int4 B-int4-head-int8 \
        --text TEXT --tokens 2048

(benchmarks/record_results.py adds `--int4-scheme symmetric --down-dtype int4` to both int4 exports of SmolLM2's
Q4_1 file, whose auto defaults are asymmetric with int8 down rows.)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.eval.evaluate import held_out_windows, read_texts
from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder

CONTEXT, PROMPT_TOKENS = 256, 32


@torch.inference_mode()
def perplexity(model, windows: list[list[int]]) -> float:
    """exp(mean next-token NLL) over each window's positions PROMPT_TOKENS .. end - 1, as edge-sdk eval scores."""
    total, count = 0.0, 0
    for window in windows:
        model.reset()
        logits = model.prefill(torch.tensor([window[:-1]]))[0].float()  # [S - 1, V]
        targets = torch.tensor(window[PROMPT_TOKENS + 1 :])
        nll = torch.nn.functional.cross_entropy(logits[PROMPT_TOKENS:], targets, reduction="sum")
        total, count = total + float(nll), count + len(targets)
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the checkpoint directory or GGUF the bundles were exported from")
    parser.add_argument("bundles", type=Path, nargs="+", help="dense bundles of the model (fp16, int8, int4)")
    parser.add_argument("--text", type=Path, nargs="+", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    checkpoint = open_checkpoint(args.model)
    if not checkpoint.config.tie_word_embeddings:
        parser.error(f"{args.model}: the model's embeddings are not tied")
    fp16_embedding = checkpoint.tensor("model.embed_tokens.weight", torch.float16).float()
    results = []
    for path in args.bundles:
        bundle = Bundle.open(path, verify_checksums=False)
        windows = held_out_windows(
            Tokenizer.from_bundle(bundle),
            read_texts(args.text),
            args.tokens,
            CONTEXT,
            32,
            vocab_size=bundle.config.vocab_size,
        )
        model = load_reference_decoder(bundle)
        configure(model, bundle.sparsity.resolve(None, True))
        row = {
            "bundle": str(path),
            "dtype": bundle.dtype,
            "head_dtype": bundle.manifest.lm_head_dtype,
            "scored": sum(len(w) - PROMPT_TOKENS - 1 for w in windows),
        }
        row["perplexity"] = perplexity(model, windows)
        if bundle.manifest.group_size is not None:  # the format version 2 layout: the tied matrix in fp16
            decoder = model.decoder
            decoder.embed_tokens.weight = torch.nn.Parameter(fp16_embedding, requires_grad=False)
            decoder.lm_head.weight = decoder.embed_tokens.weight
            row["perplexity_fp16_head"] = perplexity(model, windows)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json is not None:
        report = {"model": str(args.model), "text": [str(t) for t in args.text], "tokens": args.tokens}
        args.json.write_text(json.dumps(with_machine_info(report | {"results": results}), indent=2) + "\n")


if __name__ == "__main__":
    main()
