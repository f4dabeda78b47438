"""Time and memory of building one layer's SVD predictor with calibrated biases (SVDP Algorithms 1 and 2).

Synthetic but LLM-shaped: by default a LLaMA-2-7B FFN (d=4096, D=11008) with rank 256 and 20000
calibration tokens. Inputs are anisotropic (x = z diag(scales) M + mean, a decaying spectrum), W_gate has
decaying column scales, so whitening and truncation have something to do, and ~90% of gates are zero.
Prints a table of stage timings, the randomized-vs-exact SVD quality on a smaller shape, the calibrated
levels, and peak RSS.

    PYTHONPATH=. .venv/bin/python benchmarks/build_predictor_layer.py
    PYTHONPATH=. .venv/bin/python benchmarks/build_predictor_layer.py --d 512 --D 1376 --rank 32 --tokens 4000
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import torch

from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.svd import SvdPredictor, fit_svd_predictor, input_gram
from edge_sdk.sparsity.svd_bias import calibrate_biases, neuron_importance, predicted_inactive_fraction

LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CHUNK_TOKENS = 2048


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=4096, help="hidden size")
    parser.add_argument("--D", type=int, default=11008, help="intermediate size (neurons)")
    parser.add_argument("--rank", type=int, default=256, help="predictor rank")
    parser.add_argument("--tokens", type=int, default=20000, help="calibration tokens N")
    parser.add_argument("--compare-d", type=int, default=1024, help="hidden size of the randomized-vs-exact check")
    parser.add_argument("--compare-D", type=int, default=2752, help="neurons of the randomized-vs-exact check")
    parser.add_argument("--compare-rank", type=int, default=64, help="rank of the randomized-vs-exact check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return parser.parse_args()


def synthetic_layer(d: int, n_neurons: int, n_tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """x: [N, d] anisotropic inputs with a mean offset; w_gate, w_up, w_down_t: [D, d] float32.

    W_gate's component along the input mean is set so that each gate is positive on about 10% of tokens,
    the activation sparsity of ProSparse-style ReLU models.
    """
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=generator) / d**0.5  # [d, d]
    scales = torch.logspace(0, -2, d)  # input spectrum decays over two orders of magnitude
    mean = torch.randn(d, generator=generator) * scales.mean()  # [d]
    x = torch.empty(n_tokens, d)
    for start in range(0, n_tokens, CHUNK_TOKENS):
        rows = min(CHUNK_TOKENS, n_tokens - start)
        x[start : start + rows] = (torch.randn(rows, d, generator=generator) * scales) @ mixing + mean
    column_scales = torch.logspace(0, -1, d)[torch.randperm(d, generator=generator)]
    w_gate = torch.randn(n_neurons, d, generator=generator) * (column_scales / d**0.5)
    gate_std = ((x[:1024] - mean) @ w_gate.T).std(dim=0)  # [D]
    w_gate += torch.outer(-1.28 * gate_std - w_gate @ mean, mean / mean.dot(mean))  # P(g > 0) ~= 10%
    w_up = torch.randn(n_neurons, d, generator=generator) / d**0.5
    w_down_t = torch.randn(n_neurons, d, generator=generator) / n_neurons**0.5
    return x, w_gate, w_up, w_down_t


def calibration_error(predictor: SvdPredictor, w_gate: torch.Tensor, x: torch.Tensor) -> float:
    """||W_gate X - A B X||_F / ||W_gate X||_F on x: [N, d]."""
    exact = x @ w_gate.T
    return ((exact - predictor.scores(x)).norm() / exact.norm()).item()


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


class Stopwatch:
    """Named laps of wall-clock and process CPU time, each since the previous lap (or since creation)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.rows.append((name, wall - self._wall, cpu - self._cpu))
        self._wall, self._cpu = wall, cpu


def compare_svd_methods(x: torch.Tensor, w_gate: torch.Tensor, d: int, n_neurons: int, rank: int) -> None:
    """Randomized vs exact whitened SVD on a sub-block of the layer: time and calibration error."""
    x_small = x[: 4 * d, :d].contiguous()
    w_small = w_gate[:n_neurons, :d].contiguous()
    gram, _ = input_gram(x_small.split(CHUNK_TOKENS))
    print(f"\nrandomized vs exact SVD  (d={d}, D={n_neurons}, rank={rank}, {x_small.shape[0]} tokens)")
    for method in ("exact", "randomized"):
        start = time.perf_counter()
        predictor = fit_svd_predictor(w_small, rank, gram=gram, method=method)
        elapsed = time.perf_counter() - start
        error = calibration_error(predictor, w_small, x_small)
        print(f"  {method:<10} {elapsed:7.2f} s   relative error on calibration inputs {error:.5f}")


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"layer d={args.d} D={args.D} rank={args.rank} tokens={args.tokens} threads={torch.get_num_threads()}")
    start = time.perf_counter()
    x, w_gate, w_up, w_down_t = synthetic_layer(args.d, args.D, args.tokens, args.seed)
    relu = Activation("relu")
    sparsity = (x[:1024] @ w_gate.T <= 0).float().mean().item()
    print(f"synthetic data: {time.perf_counter() - start:.1f} s (not counted), ReLU activation sparsity {sparsity:.3f}")

    watch = Stopwatch()
    gram, _ = input_gram(x.split(CHUNK_TOKENS))
    watch.lap("input_gram")
    predictor = fit_svd_predictor(w_gate, args.rank, gram=gram)
    watch.lap("fit_svd_predictor (auto)")
    del gram
    scores = predictor.scores(x)
    watch.lap("scores")
    importance = neuron_importance(x, w_gate, w_up, w_down_t, relu)
    watch.lap("neuron_importance")
    biases = calibrate_biases(scores, importance, LEVELS)
    watch.lap(f"calibrate_biases ({len(LEVELS)} levels)")

    print(f"\n{'stage':<32}{'wall s':>10}{'cpu s':>10}")
    for name, wall, cpu in watch.rows:
        print(f"{name:<32}{wall:>10.2f}{cpu:>10.2f}")
    total_wall, total_cpu = (sum(column) for column in list(zip(*watch.rows, strict=True))[1:])
    print(f"{'whole layer':<32}{total_wall:>10.2f}{total_cpu:>10.2f}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"peak RSS after the layer: {peak_rss_gib():.2f} GiB")

    error = calibration_error(predictor, w_gate, x[:4096])
    print(f"\npredictor: regularizer {predictor.regularizer:.3g}, relative error on calibration inputs {error:.4f}")
    print(f"{'level':>6}{'predicted inactive':>20}{'importance kept':>18}")
    total_importance = importance.sum(dtype=torch.float64).item()
    for level in LEVELS:
        kept = sum(
            (importance[s : s + CHUNK_TOKENS] * (scores[s : s + CHUNK_TOKENS] + biases[level] > 0))
            .sum(dtype=torch.float64)
            .item()
            for s in range(0, args.tokens, CHUNK_TOKENS)
        )
        print(
            f"{level:>6.1f}{predicted_inactive_fraction(scores, biases[level]):>20.4f}{kept / total_importance:>18.4f}"
        )
    del scores, importance

    compare_d, compare_neurons = min(args.compare_d, args.d), min(args.compare_D, args.D)
    compare_svd_methods(x, w_gate, compare_d, compare_neurons, min(args.compare_rank, compare_d, compare_neurons))
    print(f"\npeak RSS overall: {peak_rss_gib():.2f} GiB")


if __name__ == "__main__":
    main()
