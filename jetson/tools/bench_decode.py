"""Decode speed of the C runtime (edge_generate) against the CPU backend's torch engine on one bundle and threads.

    .venv/bin/python jetson/tools/bench_decode.py BUNDLE --edge-generate build/jetson/edge_generate \
        [--tokens 128] [--threads 1] [--repeats 3]

Both run greedy from the same prompt for the same number of tokens; decode tokens/s counts the decode steps
(the first token comes from the prefill) over their time, best of --repeats runs. The generated ids must agree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time

import numpy as np
from edge_sdk.backends.cpu.backend import ENGINE_ENV

import edge_sdk
from edge_sdk.model.tokenizer import Tokenizer

PROMPT = "class Namespace(object):\n    def __init__(self"


def python_decode(bundle: str, tokens: int, threads: int) -> tuple[list[int], float]:
    # the CPU backend's torch engine: by default the backend itself decodes through the C runtime
    os.environ[ENGINE_ENV] = "torch"
    session = edge_sdk.load(bundle, backend="cpu", threads=threads)
    engine = session.engine
    ids = Tokenizer.from_dir(bundle).encode(PROMPT)
    generated = [int(np.argmax(engine.prefill(ids)))]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        generated.append(int(np.argmax(engine.decode(generated[-1]))))
    return generated, (tokens - 1) / (time.perf_counter() - start)


def c_decode(binary: str, bundle: str, tokens: int, threads: int) -> tuple[list[int], float]:
    command = [binary, bundle, PROMPT, "-n", str(tokens), "--threads", str(threads), "--ids", "--no-verify"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    speed = float(re.search(r"decode ([0-9.]+) tokens/s", result.stderr).group(1))
    return [int(token) for token in result.stdout.split()], speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--edge-generate", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    python_runs = [python_decode(args.bundle, args.tokens, args.threads) for _ in range(args.repeats)]
    c_runs = [c_decode(args.edge_generate, args.bundle, args.tokens, args.threads) for _ in range(args.repeats)]
    python_ids, c_ids = python_runs[0][0], c_runs[0][0]
    python_speed = max(speed for _, speed in python_runs)
    c_speed = max(speed for _, speed in c_runs)
    print(f"bundle {args.bundle}, {args.tokens} tokens, {args.threads} threads, best of {args.repeats}")
    print(f"python cpu backend: {python_speed:8.1f} decode tokens/s")
    print(f"C runtime         : {c_speed:8.1f} decode tokens/s  ({c_speed / python_speed:.1f}x)")
    print(f"same greedy ids   : {python_ids == c_ids}")


if __name__ == "__main__":
    main()
