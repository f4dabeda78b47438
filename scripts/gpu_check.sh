#!/usr/bin/env bash
# The GPU side of edge-sdk, on any machine with an NVIDIA GPU, in one command from the repository root (after
# scripts/setup.sh):
#
#     bash scripts/gpu_check.sh
#
# 1. builds the package's native libraries with the CUDA kernels for this GPU's architecture only
#    (nvidia-smi --query-gpu=compute_cap, e.g. 8.7 -> EDGE_SDK_CUDA_ARCHITECTURES=87);
# 2. runs the tests marked `gpu`: tests/gpu (every CUDA kernel, the quantized ones included, asymmetric int4 rows too,
#    against the reference, bit-identical repeats, CUDA graph capture) and the CUDA column of the op table (tests/ops);
# 3. runs the tests marked `tensorrt` (where TensorRT is installed: `edge-sdk build` and libedge_sdk's TensorRT engine
#    on fixture bundles, fp16, int8 and int4, against ONNX Runtime; the op table's TensorRT column: each op's one-node
#    graph through the plugins; they skip, saying why, without TensorRT);
# 4. runs benchmarks/cuda_ffn.py at LLaMA-2-7B shapes (d 4096, D 11008) for fp16, int8, int4, asymmetric int4
#    and asymmetric int4 with int8 down rows (groups of 32);
# 5. runs tests/gpu again under compute-sanitizer, once per tool: memcheck, racecheck, synccheck (last: the slowest
#    steps, so that a check cut short by a time limit still has its tests and figures);
# 6. writes everything (commit, GPU, driver, CUDA, each step's status, time and figures) to
#    benchmarks/results/gpu-check-<gpu>.json, and keeps each step's log under benchmarks/results/gpu-check-logs/.
#
# Every step runs even when an earlier one failed (a failed build is the exception: nothing after it could run);
# the exit status is 0 when every step passed, 1 otherwise. Without an NVIDIA GPU it exits 2 with one line.
# GPU_CHECK_BASELINE=REV also builds the CUDA kernels of git revision REV for this GPU and runs each benchmark with them
# right before the current build's (steps baseline-build, baseline-<dtype>): a kernel change measured side by side on
# the same card in one run (a revision from before the asymmetric int4 minimums took the quantized launchers' arguments
# in another order: its quantized baselines fail with cudaErrorInvalidValue, baseline-fp16 alone runs).
# GPU_CHECK_PROFILE=1 runs Nsight Compute (ncu, clocks left as they are) over benchmarks/cuda_kernel_calls.py and
# records each kernel's duration, throughputs, registers, occupancy and ncu's main stall finding (step profile; skipped
# without ncu).
# GPU_CHECK_DTYPES="int8 int4 ..." runs step 4 for these of its weight types only (a short lease: the kernels a change
# touched).
# GPU_CHECK_STEP_SECONDS=N stops any step after N seconds (recorded as failed, "timed_out": true), so that a check on
# a machine lent for a few minutes still writes its record; GPU_CHECK_COMMIT names the commit the tree holds where its
# git metadata is not the tree's own (a copied work tree): it is recorded as given, without the git status check.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PYTHON=.venv/bin/python

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi not found); run it on a machine with one" >&2
    exit 2
fi
if ! GPU_NAME=$(nvidia-smi --id=0 --query-gpu=name --format=csv,noheader 2>/dev/null) || [ -z "$GPU_NAME" ]; then
    echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi lists none); run it on a machine with one" >&2
    exit 2
fi
if [ ! -x "$PYTHON" ]; then
    echo "gpu_check.sh: $PYTHON not found; run bash scripts/setup.sh first" >&2
    exit 2
fi

COMPUTE_CAP=$(nvidia-smi --id=0 --query-gpu=compute_cap --format=csv,noheader)
DRIVER=$(nvidia-smi --id=0 --query-gpu=driver_version --format=csv,noheader)
ARCH=${COMPUTE_CAP//./}
# one GPU, the one described above, for every step
export CUDA_VISIBLE_DEVICES=0
SLUG=$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
RESULTS=benchmarks/results
LOGS=$RESULTS/gpu-check-logs/$SLUG
OUTPUT=$RESULTS/gpu-check-$SLUG.json
# what is checked, taken before the steps write their logs into the work tree
COMMIT=${GPU_CHECK_COMMIT:-}
if [ -z "$COMMIT" ]; then
    # "-dirty" as edge_sdk/bench/record.py marks it: tracked files other than the recorded results differ from HEAD
    COMMIT=$(git rev-parse --verify --quiet HEAD 2>/dev/null || echo unknown)
    if [ -n "$(git status --porcelain --untracked-files=no -- ':(top,exclude)benchmarks/results' 2>/dev/null)" ]; then
        COMMIT="$COMMIT-dirty"
    fi
fi
# the benchmarks' own records (edge_sdk/bench/record.py) name the same commit
export EDGE_SDK_RECORD_COMMIT=$COMMIT
mkdir -p "$LOGS"
STEPS=$(mktemp)
SCRATCH=$(mktemp -d)
trap 'rm -f "$STEPS"; rm -rf "$SCRATCH"' EXIT

# run_step NAME COMMAND...: runs COMMAND with its output in $LOGS/NAME.log and records NAME, passed|failed, the exit
# status and the seconds it took (tab-separated) in $STEPS.
run_step() {
    local name=$1
    shift
    local log=$LOGS/$name.log start end status rc
    echo "gpu_check.sh: $name ..." >&2
    start=$(date +%s)
    if [ -n "${GPU_CHECK_STEP_SECONDS:-}" ]; then
        timeout --kill-after=10 "$GPU_CHECK_STEP_SECONDS" "$@" >"$log" 2>&1
    else
        "$@" >"$log" 2>&1
    fi
    rc=$?
    end=$(date +%s)
    status=passed
    [ "$rc" -eq 0 ] || status=failed
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((end - start))" >>"$STEPS"
    echo "gpu_check.sh: $name $status (exit $rc, $((end - start)) s; log $log)" >&2
    return "$rc"
}

skip_step() {
    printf '%s\t%s\t%s\t%s\n' "$1" skipped "" 0 >>"$STEPS"
}

SANITIZER_TOOLS=(memcheck racecheck synccheck)
# benchmarks/cuda_ffn.py's weight types, one step each: --dtype, then -asymmetric adds --asymmetric and -down-int8
# --down-dtype int8 (an int4 bundle exported with --int4-scheme asymmetric --down-dtype int8)
BENCHMARK_DTYPES=(fp16 int8 int4 int4-asymmetric int4-asymmetric-down-int8)
if [ -n "${GPU_CHECK_DTYPES:-}" ]; then
    read -r -a BENCHMARK_DTYPES <<<"$GPU_CHECK_DTYPES"
fi
SANITIZER=$(command -v compute-sanitizer || true)
if [ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    SANITIZER=/usr/local/cuda/bin/compute-sanitizer
fi

BASELINE_LIBRARY=
if [ -n "${GPU_CHECK_BASELINE:-}" ]; then
    # the kernel library alone, from REV's sources (CMakeLists.txt, kernels/, plugins/)
    if run_step baseline-build bash -c 'mkdir -p "$1/src" && git archive "$2" CMakeLists.txt kernels plugins |
        tar -x -C "$1/src" && cmake -S "$1/src" -B "$1/build" -DEDGE_SDK_CUDA_ARCHITECTURES="$3" &&
        cmake --build "$1/build" --target edge_cuda_kernels --parallel' _ "$SCRATCH" "$GPU_CHECK_BASELINE" "$ARCH"; then
        BASELINE_LIBRARY=$SCRATCH/build/plugins/kernels/libedge_cuda_kernels.so
    fi
fi
NCU=
if [ -n "${GPU_CHECK_PROFILE:-}" ]; then
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
fi

if run_step build "$PYTHON" -m pip install --no-deps -e . \
    -C "cmake.define.EDGE_SDK_CUDA_ARCHITECTURES=$ARCH"; then
    run_step gpu-tests "$PYTHON" -m pytest -q -rs -m gpu tests/gpu tests/ops --junitxml="$LOGS/gpu-tests.xml"
    run_step tensorrt-tests "$PYTHON" -m pytest -q -rs -m tensorrt tests/tensorrt tests/ops \
        --junitxml="$LOGS/tensorrt-tests.xml"
    for dtype in "${BENCHMARK_DTYPES[@]}"; do
        weights=(--dtype "${dtype%%-*}")
        [[ $dtype != *-asymmetric* ]] || weights+=(--asymmetric)
        [[ $dtype != *-down-int8 ]] || weights+=(--down-dtype int8)
        if [ -n "$BASELINE_LIBRARY" ]; then
            run_step "baseline-$dtype" env EDGE_SDK_CUDA_KERNELS="$BASELINE_LIBRARY" "$PYTHON" benchmarks/cuda_ffn.py \
                --d 4096 --D 11008 "${weights[@]}" --json "$LOGS/baseline-$dtype.json"
        fi
        run_step "benchmark-$dtype" "$PYTHON" benchmarks/cuda_ffn.py --d 4096 --D 11008 "${weights[@]}" \
            --json "$LOGS/benchmark-$dtype.json"
    done
    if [ -n "${GPU_CHECK_PROFILE:-}" ] && [ -z "$NCU" ]; then
        skip_step profile
    elif [ -n "$NCU" ]; then
        # a report, then its per-kernel details as CSV (ncu's own messages stay out of the CSV)
        run_step profile bash -c '"$1" --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section Occupancy --section LaunchStats -f -o "$3/profile" "$2" \
            benchmarks/cuda_kernel_calls.py && "$1" --import "$3/profile.ncu-rep" --csv --page details >"$4"' \
            _ "$NCU" "$PYTHON" "$SCRATCH" "$LOGS/profile.csv"
    fi
    for tool in "${SANITIZER_TOOLS[@]}"; do
        if [ -z "$SANITIZER" ]; then
            skip_step "sanitizer-$tool"
            continue
        fi
        # --error-exitcode: a sanitizer finding fails the step even when every test passed
        run_step "sanitizer-$tool" "$SANITIZER" --tool "$tool" --target-processes all --error-exitcode 86 \
            "$PYTHON" -m pytest -q -m gpu tests/gpu --junitxml="$LOGS/sanitizer-$tool.xml"
    done
else
    for name in gpu-tests tensorrt-tests "${BENCHMARK_DTYPES[@]/#/benchmark-}" "${SANITIZER_TOOLS[@]/#/sanitizer-}"; do
        skip_step "$name"
    done
    [ -z "${GPU_CHECK_PROFILE:-}" ] || skip_step profile
fi

CUDA_VERSION=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')

"$PYTHON" - "$STEPS" "$LOGS" "$OUTPUT" "$COMMIT" "$GPU_NAME" "$COMPUTE_CAP" "$DRIVER" "${CUDA_VERSION:-unknown}" \
    "${SANITIZER:-not found}" <<'EOF'
"""Assemble the JSON record from the steps file, the junit reports, the sanitizer logs and the benchmark JSON."""
import csv
import datetime
import json
import os
import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

steps_file, logs, output, commit, gpu, capability, driver, cuda, sanitizer = sys.argv[1:]
logs = Path(logs)


def junit_counts(path: Path) -> dict:
    if not path.is_file():
        return {}
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


# ncu's details page: per kernel launch (ID), these (section, metric) values, and the stall its WarpStateStats rule
# names ("... spends N cycles being stalled waiting for ...")
PROFILE_METRICS = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "memory_pct",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_pct",
    ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"): "l1_pct",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): "cycles_per_issue",
}
TIME_UNITS_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def profile_kernels(path: Path) -> list:
    kernels = {}
    for row in csv.DictReader(path.open(newline="")):
        # "void unnamed>::gate_kernel<unnamed>::QuantRows<3>>(const float *, ...)" -> "gate_kernel<QuantRows<3>>"
        name = re.sub(r"^void ", "", row["Kernel Name"].split("(")[0])
        kernel = kernels.setdefault(row["ID"], {"kernel": re.sub(r"[A-Za-z_>]*::", "", name)})
        field = PROFILE_METRICS.get((row["Section Name"], row["Metric Name"]))
        if field is not None:
            value = float(row["Metric Value"].replace(",", ""))
            if field == "duration":
                field, value = "duration_us", value * TIME_UNITS_US.get(row["Metric Unit"], float("nan"))
            kernel[field] = value
        description = row.get("Rule Description") or ""
        if row.get("Rule Name") == "CPIStall" and "being stalled" in description:
            kernel.setdefault("stall", description.split(". ")[0])
    return [kernels[key] for key in sorted(kernels, key=int)]


steps = {}
for line in Path(steps_file).read_text().splitlines():
    name, status, exit_code, seconds = line.split("\t")
    step = {"status": status, "exit_code": int(exit_code) if exit_code else None, "seconds": int(seconds)}
    if step["exit_code"] in (124, 137):
        step["timed_out"] = True
    log = logs / f"{name}.log"
    if log.is_file():
        step["log"] = str(log)
    if name in ("gpu-tests", "tensorrt-tests") or name.startswith("sanitizer-"):
        step["tests"] = junit_counts(logs / f"{name}.xml")
    if name.startswith("sanitizer-") and log.is_file():
        # memcheck and synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed (N
        # errors, W warnings)"
        text = log.read_text(errors="replace")
        summaries = re.findall(r"ERROR SUMMARY: (\d+) error", text)
        summaries += re.findall(r"hazards displayed \((\d+) error", text)
        step["sanitizer_errors"] = sum(int(count) for count in summaries) if summaries else None
    if name.startswith(("benchmark-", "baseline-")) and (logs / f"{name}.json").is_file():
        step["results"] = json.loads((logs / f"{name}.json").read_text())
    if name == "profile" and (logs / "profile.csv").is_file():
        step["kernels"] = profile_kernels(logs / "profile.csv")
    steps[name] = step

try:  # the host, as every benchmark result names it (tests/bench/test_record.py checks the committed ones)
    from edge_sdk.bench.record import machine_description

    machine = machine_description()
except ImportError:
    machine = {"cpu": "unknown (edge_sdk not importable)", "cores": os.cpu_count()}
record = {
    "commit": commit,
    "date": datetime.date.today().isoformat(),
    "machine": machine,
    "gpu": gpu,
    "compute_capability": capability,
    "driver": driver,
    "cuda": cuda,
    "compute_sanitizer": sanitizer,
    "steps": steps,
    "passed": all(step["status"] == "passed" for step in steps.values()),
}
Path(output).write_text(json.dumps(record, indent=2) + "\n")
print(f"gpu_check.sh: wrote {output}", file=sys.stderr)
sys.exit(0 if record["passed"] else 1)
EOF
