"""Instructions the aarch64 build of the CPU kernels executes per call, counted under qemu-user: no aarch64 core
is available to time them, and qemu does not time, but it can log every translated block and every execution of
one (`-d in_asm,exec,nochain`). Counts the executed instructions, and among them the stores of q registers (a
16-lane accumulator spilled to memory shows up there), of one kernel call: the driver run with 3 calls minus with 1,
halved, so the setup cancels out.

    .venv/bin/python benchmarks/aarch64_instruction_count.py [--kinds matvec4,ffn4,...] [--env NAME=VALUE] \
        KERNEL_SOURCE_DIR [KERNEL_SOURCE_DIR ...]

Each KERNEL_SOURCE_DIR is a copy of kernels/cpu (`git archive COMMIT kernels/cpu | tar -x -C DIR` for another
commit's); it is built with the package's flags for armv8.2-a+dotprod (Orin's Cortex-A78AE has the dot product
extension; --march armv8-a for a build without it) and the driver benchmarks/aarch64_instruction_count.c. --env
passes a variable to the kernels, e.g. EDGE_SDK_QUANT_ACTIVATIONS=fp32. Needs gcc-aarch64-linux-gnu,
libc6-arm64-cross and qemu-user. A count is not a time: an out-of-order core overlaps instructions and waits on
memory; use it to compare builds of the same loop.

    .venv/bin/python benchmarks/aarch64_instruction_count.py --command [--env NAME=VALUE] -- BINARY [ARG ...]

counts a whole run of an aarch64 program instead (an `edge_generate` of a cross-built libedge_sdk, say), on qemu's
`-cpu max` with the cross toolchain's libraries, its log streamed through a FIFO (a run of a few billion instructions
would log tens of GB). Two runs that differ in the tokens they generate give the instructions per token.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "aarch64_instruction_count.c"
SYSROOT = Path("/usr/aarch64-linux-gnu")
KINDS = (
    "matvec4",
    "matvec4a",
    "matvec8",
    "ffn4",
    "ffn4a",
    "ffn8",
    "matmul4",
    "matmul4a",
    "matmul8",
    "matvec16",
    "ffn16",
    "svd16",
)
INSTRUCTION = re.compile(r"^0x([0-9a-f]+):\s+[0-9a-f]{8}\s+(.*)$")
EXECUTION = re.compile(r"Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")
Q_STORE = re.compile(r"\b(str|stp|stur)\s+q\d+")


def build(source: Path, binary: Path, march: str) -> None:
    command = ["aarch64-linux-gnu-gcc", "-std=c11", "-O3", f"-march={march}", "-ffp-contract=off",
               "-fopenmp", f"-I{source}", "-o", str(binary), str(DRIVER),
               *map(str, sorted(source.glob("*.c"))), "-lm"]  # fmt: skip
    subprocess.run(command, check=True)


def count(log: Path) -> tuple[int, int]:
    """(executed instructions, executed q-register stores) of a qemu in_asm,exec,nochain log."""
    with log.open(errors="replace") as lines:
        return count_lines(lines)


def count_lines(lines) -> tuple[int, int]:
    """count() of the log's lines, read once, in order."""
    blocks: dict[int, list[int]] = {}
    executions: dict[int, int] = {}
    start = None
    for line in lines:
        found = INSTRUCTION.match(line)
        if found:
            if start is None:
                start = int(found.group(1), 16)
                blocks[start] = [0, 0]
            blocks[start][0] += 1
            blocks[start][1] += bool(Q_STORE.search(found.group(2)))
            continue
        start = None
        executed = EXECUTION.search(line)
        if executed:
            pc = int(executed.group(1), 16)
            executions[pc] = executions.get(pc, 0) + 1
    totals = [0, 0]
    for pc, times in executions.items():
        for k, per_block in enumerate(blocks.get(pc, (0, 0))):
            totals[k] += per_block * times
    return totals[0], totals[1]


def per_call(binary: Path, kind: str, env: list[str], work: Path) -> tuple[int, int]:
    runs = {}
    for calls in (1, 3):
        log = work / f"{kind}-{calls}.log"
        environment = [option for pair in env for option in ("-E", pair)]
        subprocess.run(["qemu-aarch64", "-cpu", "max", "-L", str(SYSROOT), "-E", f"LD_LIBRARY_PATH={SYSROOT / 'lib'}",
                        *environment, "-d", "in_asm,exec,nochain", "-D", str(log), str(binary), kind, str(calls)],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        runs[calls] = count(log)
        log.unlink()
    return tuple((runs[3][k] - runs[1][k]) // 2 for k in range(2))


def count_command(command: list[str], env: list[str]) -> tuple[int, int, int]:
    """(instructions, q-register stores, exit status) of one run of an aarch64 command under qemu."""
    environment = [option for pair in env for option in ("-E", pair)]
    with tempfile.TemporaryDirectory() as work_dir:
        fifo = Path(work_dir) / "log"
        os.mkfifo(fifo)
        qemu = subprocess.Popen(["qemu-aarch64", "-cpu", "max", "-L", str(SYSROOT), "-E",
                                 f"LD_LIBRARY_PATH={SYSROOT / 'lib'}", *environment, "-d", "in_asm,exec,nochain",
                                 "-D", str(fifo), *command], stdout=subprocess.DEVNULL)  # fmt: skip
        with fifo.open(errors="replace") as lines:
            instructions, stores = count_lines(lines)
        return instructions, stores, qemu.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sources_help = "kernel source directories (copies of kernels/cpu); with --command, the command"
    parser.add_argument("sources", nargs="+", help=sources_help)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the kernels (repeatable)")
    parser.add_argument("--march", default="armv8.2-a+dotprod", help="the build's -march (armv8-a: without sdot)")
    parser.add_argument("--command", action="store_true", help="count one run of the command given after --")
    args = parser.parse_args()
    if args.command:
        instructions, stores, status = count_command(args.sources, args.env)
        print(f"{'instructions':>18} {'q stores':>14}  command (exit status {status})")
        print(f"{instructions:18d} {stores:14d}  {' '.join(args.sources)}")
        return status
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        print(f"{'kernels':40} {'kind':9} {'instructions/call':>18} {'q stores/call':>14}")
        for index, source in enumerate(map(Path, args.sources)):
            binary = work / f"driver{index}"
            build(source, binary, args.march)
            for kind in kinds:
                instructions, stores = per_call(binary, kind, args.env, work)
                print(f"{source!s:40} {kind:9} {instructions:18d} {stores:14d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
