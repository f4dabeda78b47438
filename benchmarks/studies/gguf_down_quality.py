"""What the down projection alone costs a bundle made from a quantized GGUF: held-out perplexity of the bundle as
stored, and of the same bundle with every layer's down projection replaced by the GGUF's own values.

A bundle stores W_down neuron-major with its quantization groups along d, so that a skipped neuron skips one row; a
GGUF groups ffn_down along the neurons. An int4 bundle of a Q4_1 file (--int4-scheme asymmetric) reproduces every
other matrix exactly, so the difference between the two figures is the down projection's re-rounding. The windows
and scoring are tied_head_quality.py's (each window's tokens after its first 32, the torch reference on the
dequantized weights).

    .venv/bin/python benchmarks/studies/gguf_down_quality.py MODEL.gguf BUNDLE --text TEXT --tokens 2048
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tied_head_quality import CONTEXT, PROMPT_TOKENS, perplexity

from edge_sdk.bundle import Bundle
from edge_sdk.eval.evaluate import held_out_windows, read_texts
from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the GGUF the bundle was exported from")
    parser.add_argument("bundle", type=Path, help="a dense bundle of it")
    parser.add_argument("--text", type=Path, nargs="+", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()

    bundle = Bundle.open(args.bundle, verify_checksums=False)
    tokenizer = Tokenizer.from_bundle(bundle)
    windows = held_out_windows(
        tokenizer, read_texts(args.text), args.tokens, CONTEXT, PROMPT_TOKENS, vocab_size=bundle.config.vocab_size
    )
    checkpoint = open_checkpoint(args.model)
    model = load_reference_decoder(bundle)
    configure(model, bundle.sparsity.resolve(None, True))
    as_stored = perplexity(model, windows)
    for layer, ffn in enumerate(model.ffns):
        down = checkpoint.tensor(f"model.layers.{layer}.mlp.down_proj.weight", torch.float32)
        ffn.w_down_t = down.T.contiguous()
    with_gguf_down = perplexity(model, windows)
    result = {"bundle": str(args.bundle), "as_stored": as_stored, "with_the_gguf_down_projection": with_gguf_down}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
