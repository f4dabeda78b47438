"""How much the default-level choice depends on which text validates it.

Export picks the default level on validation tokens of the calibration text (edge_sdk/sparsity/validation.py).
This measures the same thing, with a bundle's own predictors, on several slices of a text: the perplexity change
of every calibrated level, teacher-forced with dense prompts, per slice, and the level the rule would choose on it.

    .venv/bin/edge-sdk export tests/fixtures/tiny-relu-llama -o out/tiny-relu-llama \\
        --calib tests/fixtures/tiny-relu-llama/calibration.txt --force
    .venv/bin/python benchmarks/studies/validation_slices.py out/tiny-relu-llama \\
        --text tests/fixtures/tiny-relu-llama/calibration.txt --start 20000 \\
        --json benchmarks/results/validation-slices-tiny-relu-llama.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.loader import load_layer
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import bundle_predictors
from edge_sdk.sparsity.collect import read_calibration_texts, token_chunks, token_stream
from edge_sdk.sparsity.settings import DEFAULT_PPL_BUDGET_PERCENT, DEFAULT_VALIDATION_TOKENS
from edge_sdk.sparsity.validation import VALIDATION_PROMPT_TOKENS, LevelValidation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path, help="an svd or threshold bundle (fp32 weights are read from --model)")
    parser.add_argument("--model", type=Path, default=Path("tests/fixtures/tiny-relu-llama"))
    parser.add_argument("--text", type=Path, nargs="+", required=True)
    parser.add_argument("--start", type=int, default=0, help="first token of the first slice")
    parser.add_argument("--slice-tokens", type=int, default=DEFAULT_VALIDATION_TOKENS)
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--budget", type=float, default=DEFAULT_PPL_BUDGET_PERCENT, help="percent")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    bundle = Bundle.open(args.bundle)
    predictors, levels = bundle_predictors(bundle), bundle.sparsity.levels
    checkpoint = Checkpoint(args.model)
    tokens = token_stream(
        Tokenizer.from_dir(args.model), read_calibration_texts(args.text), 10**12, checkpoint.config.vocab_size
    )
    slices = []
    for start in range(args.start, len(tokens) - args.slice_tokens + 1, args.slice_tokens):
        chunks = token_chunks(tokens[start : start + args.slice_tokens], args.chunk_tokens)
        validation = LevelValidation(checkpoint, chunks, levels, VALIDATION_PROMPT_TOKENS)
        for index, layer_predictor in enumerate(predictors):
            validation.advance(load_layer(checkpoint, index), layer_predictor)
        choice = validation.choose(args.budget)
        slices.append({"start": start, **choice.to_report()})
        changes = "  ".join(
            f"{level} {change:+6.2f}%" for level, change in slices[-1]["perplexity_change_percent"].items()
        )
        print(
            f"tokens {start:>7}-{start + args.slice_tokens:<7} dense {choice.dense_perplexity:8.3f}  {changes}  "
            f"-> {choice.level:g}"
        )
    if args.json is not None:
        result = {
            "benchmark": "validation_slices",
            "bundle": str(args.bundle),
            "bundle_default_level": bundle.sparsity.default_level,
            "text": [str(path) for path in args.text],
            "slice_tokens": args.slice_tokens,
            "chunk_tokens": args.chunk_tokens,
            "slices": slices,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(with_machine_info(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
