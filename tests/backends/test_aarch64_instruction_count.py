"""benchmarks/aarch64_instruction_count.py: its count of a qemu log, and one run of the tool on the kernels."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks" / "aarch64_instruction_count.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("aarch64_instruction_count", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two translated blocks (3 instructions with one q store; 2 with a q-register pair store and a d store), executed
# 2 and 5 times, and an execution of a block the log never translated (counted as nothing).
LOG = """\
IN: main
0x00400000:  4f000400  movi     v0.4s, #0
0x00400004:  3d8003e0  str      q0, [sp]
0x00400008:  54000041  b.ne     #0x400010

IN:
0x00400010:  ad0007e0  stp      q0, q1, [sp]
0x00400014:  fd0003e0  str      d0, [sp]

Trace 0: 0x7f0000000000 [00000000/0000000000400000/00000000/ff000000] main
Trace 0: 0x7f0000000040 [00000000/0000000000400010/00000000/ff000000]
Trace 0: 0x7f0000000000 [00000000/0000000000400000/00000000/ff000000] main
Trace 0: 0x7f0000000040 [00000000/0000000000400010/00000000/ff000000]
Trace 0: 0x7f0000000040 [00000000/0000000000400010/00000000/ff000000]
Trace 0: 0x7f0000000040 [00000000/0000000000400010/00000000/ff000000]
Trace 0: 0x7f0000000040 [00000000/0000000000400010/00000000/ff000000]
Trace 0: 0x7f0000000080 [00000000/0000000000400100/00000000/ff000000]
"""


def test_count_weighs_each_block_by_its_executions(tmp_path):
    log = tmp_path / "qemu.log"
    log.write_text(LOG)
    instructions, q_stores = load_tool().count(log)
    assert instructions == 2 * 3 + 5 * 2
    assert q_stores == 2 * 1 + 5 * 1  # the d-register store is not a q store


AARCH64_TOOLS = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None
    or shutil.which("qemu-aarch64") is None
    or not Path("/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1").exists(),
    reason="needs gcc-aarch64-linux-gnu, libc6-arm64-cross and qemu-user",
)


@AARCH64_TOOLS
def test_the_tool_counts_a_kernel_call(tmp_path):
    run = subprocess.run([sys.executable, str(TOOL), "--kinds", "ffn8", str(ROOT / "kernels" / "cpu")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    row = run.stdout.strip().splitlines()[-1].split()
    assert row[1] == "ffn8"
    instructions, q_stores = int(row[2]), int(row[3])
    # a sparse FFN over 1024 x 1024 int8 rows at a 10% mask reads about 100 rows of each matrix: 300 rows of 1024
    # codes, at the least one instruction per 16 codes; the setup (the same in both runs) cancels out
    assert 300 * 1024 // 16 < instructions < 10_000_000
    assert 0 <= q_stores < instructions


# N volatile additions, then the exit status argc: the count of a run grows by the loop's instructions per addition
LOOP_PROGRAM = """
#include <stdlib.h>
int main(int argc, char **argv) {
  volatile long sum = 0;
  for (long i = atol(argv[1]); i > 0; i--) sum += i;
  return argc;
}
"""


@AARCH64_TOOLS
def test_the_tool_counts_a_whole_command(tmp_path):
    source, binary = tmp_path / "loop.c", tmp_path / "loop"
    source.write_text(LOOP_PROGRAM)
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", str(binary), str(source)], check=True)
    counts = {}
    for n in (0, 100_000):
        run = subprocess.run([sys.executable, str(TOOL), "--command", "--", str(binary), str(n), "extra argument"],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert run.returncode == 3, run.stderr  # the program's exit status: its argc
        counts[n] = int(run.stdout.strip().splitlines()[-1].split()[0])
    # a volatile load, add and store, the counter's decrement and the branch: 5 or so per addition
    assert 3 * 100_000 <= counts[100_000] - counts[0] <= 10 * 100_000


def test_an_unknown_kind_is_refused():
    run = subprocess.run([sys.executable, str(TOOL), "--kinds", "gemm4", str(ROOT / "kernels" / "cpu")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and "unknown kinds ['gemm4']" in run.stderr
