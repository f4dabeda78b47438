"""What the neuron-major down projection costs a quantized bundle: held-out perplexity with W_down's groups along
the hidden size (each neuron's row of W_down^T, the layout that lets a skipped neuron skip one row: every edge-sdk
int8 / int4 bundle) against groups along the neurons (GGUF's layout: each output's row of W_down, as llama.cpp's
Q8_0 and Q4_0 store it), every other matrix quantized the same way in both.

The weights are an fp16 bundle's, quantized here with edge_sdk.quant (round-to-nearest, the given format and group
size) and scored as benchmarks/studies/tied_head_quality.py scores a bundle (the torch reference, one teacher-forced
forward per window of `edge-sdk eval`). gguf-py's Q8_0 rounding (codes from the unrounded scale, ties away from zero)
gave the same figures to within 0.01 on SmolLM2, so the layout is the difference that matters.

    .venv/bin/python benchmarks/studies/down_axis_quality.py B-fp16 --format int8 --text TEXT --tokens 2048
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tied_head_quality import CONTEXT, PROMPT_TOKENS, perplexity

from edge_sdk import quant
from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.eval.evaluate import held_out_windows, read_texts
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder


def rounded(weight: torch.Tensor, format: str, group_size: int) -> torch.Tensor:
    """weight [rows, cols] quantized in groups along its rows and dequantized."""
    return torch.from_numpy(quant.dequantize(quant.quantize(weight.numpy(), format, group_size)))


def dense_model(bundle: Bundle):
    """The bundle's torch reference decoder, dense."""
    model = load_reference_decoder(bundle)
    configure(model, bundle.sparsity.resolve(None, True))
    return model


def quantized_perplexity(bundle: Bundle, windows, format: str, group_size: int, down_along_neurons: bool) -> float:
    model = dense_model(bundle)
    decoder = model.decoder
    with torch.no_grad():
        decoder.embed_tokens.weight.copy_(rounded(decoder.embed_tokens.weight, format, group_size))
        for layer in decoder.layers:
            attention = layer.self_attn
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
                projection.weight.copy_(rounded(projection.weight, format, group_size))
            mlp = layer.mlp
            mlp.w_gate.copy_(rounded(mlp.w_gate, format, group_size))
            mlp.w_up.copy_(rounded(mlp.w_up, format, group_size))
            if down_along_neurons:  # W_down's rows: one per output, groups of neurons
                mlp.w_down_t.copy_(rounded(mlp.w_down_t.T.contiguous(), format, group_size).T)
            else:  # W_down^T's rows: one per neuron, groups of outputs
                mlp.w_down_t.copy_(rounded(mlp.w_down_t, format, group_size))
    return perplexity(model, windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path, help="an fp16 (or fp32) bundle of the model")
    parser.add_argument("--format", choices=quant.FORMATS, default="int8")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--text", type=Path, nargs="+", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    bundle = Bundle.open(args.bundle, verify_checksums=False)
    if bundle.manifest.group_size is not None:
        parser.error(f"{args.bundle}: a quantized bundle; give the fp16 or fp32 bundle of the model")
    windows = held_out_windows(
        Tokenizer.from_bundle(bundle),
        read_texts(args.text),
        args.tokens,
        CONTEXT,
        PROMPT_TOKENS,
        vocab_size=bundle.config.vocab_size,
    )
    results = {"unquantized": perplexity(dense_model(bundle), windows)}
    for name, along_neurons in (("down neuron-major (edge-sdk)", False), ("down along neurons (GGUF)", True)):
        results[name] = quantized_perplexity(bundle, windows, args.format, args.group_size, along_neurons)
        print(json.dumps({"variant": name, "perplexity": results[name]}), flush=True)
    if args.json is not None:
        report = {"bundle": str(args.bundle), "format": args.format, "group_size": args.group_size, "results": results}
        args.json.write_text(json.dumps(with_machine_info(report), indent=2) + "\n")


if __name__ == "__main__":
    main()
