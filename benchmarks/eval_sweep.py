"""Quality-vs-speed sweep of every predictor kind on a model (issue #8; SVDP Table 1 and Table 3 shapes).

Exports one bundle per predictor kind (per recall target for signbit, per beta for core), evaluates each
setting's teacher-forced held-out perplexity against dense on the same backend, times sparse against
dense decode, and writes the sweep JSON, the frontier PNG and a markdown fragment with the tables:

    .venv/bin/python benchmarks/eval_sweep.py

The defaults reproduce benchmarks/results/eval-sweep-tiny-relu-llama.{json,png,md} on the committed
fixture. One thread by default: the fixture's per-token ops are tiny, and on a shared machine more threads
than free cores slow them down by an order of magnitude. Decode is timed in process CPU time by default,
which other jobs on a shared machine barely disturb (wall-clock best-of-5 ratios varied by +-15% there);
--timer wall measures what an application sees.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from edge_sdk.eval import SWEEP_KINDS, format_sweep_markdown, sweep
from edge_sdk.eval.sweep import DEFAULT_CORE_BETAS, DEFAULT_RECALL_TARGETS

RESULTS = Path("benchmarks/results")
DEFAULT_LEVELS = (0.3, 0.5, 0.7, 0.8, 0.9)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("tests/fixtures/tiny-relu-llama"))
    parser.add_argument("--calib", type=Path, default=None, help="default: MODEL/calibration.txt")
    parser.add_argument("--text", type=Path, default=None, help="held-out text; default: MODEL/held_out.txt")
    parser.add_argument("--name", default=None, help="results file stem suffix; default: the model directory's name")
    parser.add_argument("--predictors", default=",".join(SWEEP_KINDS))
    parser.add_argument("--levels", type=_floats, default=DEFAULT_LEVELS)
    parser.add_argument("--recall-targets", type=_floats, default=DEFAULT_RECALL_TARGETS)
    parser.add_argument("--core-betas", type=_floats, default=DEFAULT_CORE_BETAS)
    parser.add_argument("--calib-tokens", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=3072, help="held-out tokens evaluated")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timing runs per setting (best of)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=("wall", "cpu"), default="cpu", help="cpu: process CPU time (one thread)")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="weights of the exported bundles")
    parser.add_argument("--bundles", type=Path, default=None, help="where bundles go; default: a temporary directory")
    args = parser.parse_args()

    stem = f"eval-sweep-{args.name or args.model.name}"
    paths = {suffix: RESULTS / f"{stem}.{suffix}" for suffix in ("json", "png", "md")}
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def progress(kind: str, point: dict) -> None:
        print(
            f"[{time.perf_counter() - started:6.0f}s] {kind:<14} {point['setting']:<6g} "
            f"ppl {point['perplexity_change_percent']:+8.2f}%  top-1 {point['top1_agreement']:.4f}  "
            f"speedup {point['speedup']:.3f}x  "
            f"realized sparsity {point.get('mean_realized_sparsity', float('nan')):.3f}",
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="eval-sweep-") as scratch:
        result = sweep(
            args.model,
            [args.calib or args.model / "calibration.txt"],
            [args.text or args.model / "held_out.txt"],
            args.bundles or Path(scratch),
            predictors=tuple(args.predictors.split(",")),
            levels=args.levels,
            recall_targets=args.recall_targets,
            core_betas=args.core_betas,
            backend=args.backend,
            calibration_tokens=args.calib_tokens,
            max_tokens=args.tokens,
            context=args.context,
            prompt_tokens=args.prompt_tokens,
            speed_repeats=args.repeats,
            timer=args.timer,
            threads=args.threads,
            dtype=args.dtype,
            force=True,
            json_path=paths["json"],
            plot_path=paths["png"],
            on_point=progress,
        )
    command = shlex.join([".venv/bin/python", "benchmarks/eval_sweep.py", *sys.argv[1:]])
    paths["md"].write_text(format_sweep_markdown(result, command))
    print(f"{time.perf_counter() - started:.0f}s; wrote " + ", ".join(str(path) for path in paths.values()))


if __name__ == "__main__":
    main()
