"""Per-layer sparsity levels: what mixing a bundle's calibrated levels across layers would buy.

A bundle runs every layer at one calibrated level (the predicted-inactive fraction of that layer's neurons).
Layers differ: on the fixture, layer 0 is 60% truly sparse and layers 1-3 84-95%, so at a uniform level 0.5
the predictor keeps about ten times more candidates than fire in layers 1-3, and each candidate costs a
gate row. This measures mixes such as `0.5,0.7,0.7,0.7` (layer 0 at 0.5, the others at 0.7): held-out and
validation perplexity against dense, and decode speed against dense, on the CPU backend.

The bundle must have each level in every layer (`--level-allocation uniform`; by default calibration allocates
a model-wide level across layers itself). The runtimes select one row of every layer's biases by the level, so
each mix is measured on a scratch copy of the bundle whose `svd.biases` row of the bundle's lowest level holds,
in each layer, the row of that layer's level in the mix.
The copies exist only for this measurement (in a temporary directory); they are not a supported bundle form.

    .venv/bin/edge-sdk export tests/fixtures/tiny-relu-llama -o out/tiny-relu-llama-uniform \\
        --calib tests/fixtures/tiny-relu-llama/calibration.txt --level-allocation uniform --force
    .venv/bin/python benchmarks/studies/layer_levels.py out/tiny-relu-llama-uniform \\
        --json benchmarks/results/layer-levels-tiny-relu-llama-fp16.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD, MANIFEST_FILE, WEIGHTS_FILE
from edge_sdk.eval.evaluate import held_out_windows, perplexity_change_percent, read_texts, teacher_forced
from edge_sdk.eval.sweep import decode_speed
from edge_sdk.formats.files import sha256_of
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions, select_backend
from edge_sdk.sparsity.collect import read_calibration_texts, token_stream
from edge_sdk.sparsity.settings import DEFAULT_VALIDATION_TOKENS, MIN_VALIDATION_TOKENS
from edge_sdk.sparsity.validation import split_validation

# The fixture's four layers: uniform levels, then layer 0 held at 0.5 or 0.6 while the others go higher.
DEFAULT_MIXES = (
    "0.5,0.5,0.5,0.5",
    "0.6,0.6,0.6,0.6",
    "0.7,0.7,0.7,0.7",
    "0.5,0.6,0.6,0.6",
    "0.5,0.7,0.6,0.6",
    "0.5,0.6,0.7,0.6",
    "0.5,0.6,0.6,0.7",
    "0.5,0.6,0.7,0.7",
    "0.5,0.7,0.7,0.7",
    "0.6,0.7,0.7,0.7",
    "0.5,0.8,0.8,0.8",
)


def _mix(text: str, bundle: Bundle) -> tuple[float, ...]:
    levels = tuple(float(part) for part in text.split(","))
    if len(levels) != bundle.config.num_layers or any(level not in bundle.sparsity.levels for level in levels):
        raise SystemExit(
            f"mix {text!r}: expected {bundle.config.num_layers} levels out of {list(bundle.sparsity.levels)}"
        )
    return levels


def write_mixed_copy(bundle: Bundle, mix: tuple[float, ...], out_dir: Path) -> None:
    """A copy of the bundle whose lowest level's svd.biases row is, in layer l, the row of level mix[l]."""
    shutil.copytree(bundle.path, out_dir)
    weights = out_dir / WEIGHTS_FILE
    levels = list(bundle.sparsity.levels)
    for layer, level in enumerate(mix):
        entry = bundle.header.tensors[f"layers.{layer}.svd.biases"]
        biases = np.memmap(weights, np.float32, "r+", bundle.header.data_start + entry.begin, entry.shape)
        biases[0] = biases[levels.index(level)]
        biases.flush()
    manifest = json.loads((out_dir / MANIFEST_FILE).read_text())
    manifest["files"][WEIGHTS_FILE]["sha256"] = sha256_of(weights, follow_symlinks=False)[1]
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


def validation_windows(bundle: Bundle, calibration: list[Path], context: int) -> list[list[int]]:
    """The validation tokens export held back from the calibration text, cut into windows."""
    fit_tokens = bundle.manifest.raw["sparsity"]["settings"]["max_tokens"]
    texts = read_calibration_texts(calibration)
    tokens = token_stream(Tokenizer.from_bundle(bundle), texts, 10**12, bundle.config.vocab_size)
    validation = split_validation(tokens, fit_tokens, DEFAULT_VALIDATION_TOKENS, MIN_VALIDATION_TOKENS)[1]
    return [validation[start : start + context] for start in range(0, len(validation) - context + 1, context)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path, help="an svd bundle")
    parser.add_argument("--mix", action="append", default=None, help="per-layer levels, e.g. 0.5,0.7,0.7,0.7")
    parser.add_argument("--text", type=Path, nargs="+", default=[Path("tests/fixtures/tiny-relu-llama/held_out.txt")])
    parser.add_argument(
        "--calib", type=Path, nargs="+", default=[Path("tests/fixtures/tiny-relu-llama/calibration.txt")]
    )
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens scored")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15, help="decode timing runs (best of, process CPU time)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    bundle = Bundle.open(args.bundle)
    if bundle.sparsity.predictor != "svd":
        raise SystemExit(f"{args.bundle}: expected an svd bundle, found predictor {bundle.sparsity.predictor!r}")
    levels = list(bundle.sparsity.levels)
    if any(layer.get("layer_levels", levels) != levels for layer in bundle.sparsity.layers):
        raise SystemExit(
            f"{args.bundle}: its levels are allocated across layers; mixes need the level in every layer: "
            "export with --level-allocation uniform"
        )
    mixes = [_mix(text, bundle) for text in args.mix or DEFAULT_MIXES]
    texts = read_texts(args.text)
    windows = {
        "held_out": held_out_windows(
            Tokenizer.from_bundle(bundle),
            texts,
            args.tokens,
            args.context,
            args.prompt_tokens,
            vocab_size=bundle.config.vocab_size,
        ),
        "validation": validation_windows(bundle, args.calib, args.context),
    }
    backend = select_backend("cpu").backend
    dense = backend.load(bundle, EngineOptions.of(bundle, dense=True, threads=1))
    dense_runs = {name: teacher_forced(dense, part, args.prompt_tokens) for name, part in windows.items()}
    points = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, mix in enumerate(mixes):
            copy = Path(scratch) / f"mix-{number}"
            write_mixed_copy(bundle, mix, copy)
            sparse = backend.load(
                Bundle.open(copy), EngineOptions.of(Bundle.open(copy), sparsity=bundle.sparsity.levels[0], threads=1)
            )
            point = {"levels": list(mix)}
            for name, part in windows.items():
                run = teacher_forced(sparse, part, args.prompt_tokens)
                point[f"{name}_perplexity_change_percent"] = perplexity_change_percent(
                    dense_runs[name].perplexity, run.perplexity
                )
            point |= decode_speed(dense, sparse, windows["held_out"][0], args.prompt_tokens, args.repeats, "cpu")
            points.append(point)
            held_out, validation = (point[f"{name}_perplexity_change_percent"] for name in windows)
            print(
                f"{','.join(f'{level:g}' for level in mix):<20} held-out {held_out:+6.2f}%  "
                f"validation {validation:+6.2f}%  speedup {point['speedup']:.3f}x",
                flush=True,
            )
    if args.json is not None:
        result = {
            "benchmark": "layer_levels",
            "bundle": str(args.bundle),
            "dtype": bundle.dtype,
            "backend": "cpu",
            "threads": 1,
            "timer": "cpu",
            "repeats": args.repeats,
            "scored_tokens": {name: int(run.nll.size) for name, run in dense_runs.items()},
            "dense_perplexity": {name: run.perplexity for name, run in dense_runs.items()},
            "points": points,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(with_machine_info(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
