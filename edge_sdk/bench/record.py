"""What every benchmark result file carries: the machine, the date and the commit it measured."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from edge_sdk import __version__, outputs
from edge_sdk.native import load_cpu_kernels

COMMIT_ENV = "EDGE_SDK_RECORD_COMMIT"
# The checkout edge-sdk runs from (an editable install's repository root), whose commit a result names; an installed
# package's directory is no checkout, and the repository the user's current directory is in is not edge-sdk's.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _commit() -> str | None:
    """HEAD's short hash, with "-dirty" when tracked files other than the recorded results (benchmarks/results,
    rewritten by the runs themselves) differ from it: the figures then measured code that no commit holds. A copied
    work tree whose .git is another commit's (scripts/gpu_check.sh on a lent machine) names its commit in
    EDGE_SDK_RECORD_COMMIT, which is recorded as given."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]

    def git(*args: str) -> str:
        command = ["git", "-C", str(SOURCE_ROOT), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=10).stdout.strip()

    try:
        # edge-sdk's own checkout only: from a package installed in a virtual environment inside the user's project,
        # git would find (and a result would name) the user's repository
        if Path(git("rev-parse", "--show-toplevel")).resolve() != SOURCE_ROOT.resolve():
            return None
        head = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no", "--", ":(top,exclude)benchmarks/results")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if changes else "")


def machine_description() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    description = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")  # recorded when the benchmark ran through torch; never imported for this
    if torch is not None:
        description |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if load_cpu_kernels.cache_info().currsize:  # the kernels' instruction set, when the benchmark ran them
        description["cpu_kernels_isa"] = load_cpu_kernels().edge_cpu_isa().decode()
    return description


def with_machine_info(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        **payload,
        "machine": machine_description(),
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        outputs.REPORT_PRODUCER_FIELD: __version__,  # with machine and date, what marks a JSON report as ours
    }
