"""Decode-FFN benchmark: the native sparse kernel against torch's dense GEMVs at chosen realized sparsities.

One decode step of a gated ReLU FFN is three GEMVs, bound by memory bandwidth. The sparse kernel reads
only the weight rows of the neurons that fire, so at sparsity s it should approach 1 / (1 - s) times the
dense speed. The data are arranged so that the realized sparsity is the requested one: x and the weights
are random normal (fixed seed); an active set of round((1 - s) D) neurons is drawn and every W_gate row
whose g_i = W_gate_i . x has the wrong sign is negated, so relu(g) is nonzero exactly on the active set.
The mask given to the sparse kernel is that active set (a perfect predictor); predictor costs are timed
separately (svd_predictor_ms, signbit_predictor_ms) and not included in sparse_ms.

bench_quantized_ffn times the same sparse step over INT8 or INT4 rows (edge_sdk/quant.py) quantized from the fp16
weights, interleaved with the fp16 kernel, with the quantized kernel's two ways of dotting rows with x (integer dot
products on x quantized per token, the default, and x in fp32 with the codes widened in registers; QUANT.md), and
with a streaming read of a 256 MiB buffer on the same threads: decode reads fewer bytes per token, so it should run
closer to the bandwidth limit at fewer bytes, and the read gives that limit on this machine at this moment.

Variants are timed interleaved (one call of each per repetition, median of the repetitions after warm-up),
so a machine whose load changes during the run affects all of them alike. Before every timed call the
caches are flushed by reading a buffer larger than any last-level cache: in a real decode step the other
layers' weights pass through the caches between two calls of one layer, and at high sparsity the rows a
sparse call reads (27 MB at 95% for llama2-7b fp32) would otherwise stay in a 32 MB L3 and flatter it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from edge_sdk import memory, quant
from edge_sdk.backends.cpu.kernels import (
    QuantizedWeight,
    SparseFFNKernel,
    matvec_quantized,
    max_threads,
    signbit_predictor,
    svd_predictor,
)
from edge_sdk.bundle.layout import WIDER_DOWN_DTYPES
from edge_sdk.model.activation import Activation
from edge_sdk.native import ACTIVATIONS_ENV
from edge_sdk.sparsity.signbit import words_for
from edge_sdk.sparsity.svd import default_rank

SHAPES = {"llama2-7b": (4096, 11008), "mistral-7b": (4096, 14336), "qwen2-7b": (3584, 18944)}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
QUANTIZED_DTYPES = quant.FORMATS  # "int8", "int4": bench_quantized_ffn
# Reading this many bytes between timed calls evicts the weights from every cache level.
_FLUSH_BYTES = 256 << 20
_CPU = torch.device("cpu")
_SHAPE_PATTERN = re.compile(r"(\d+)x(\d+)")


def parse_shape(text: str) -> tuple[int, int]:
    """A preset name (SHAPES) or "dxD" such as "4096x11008" -> (d, D): hidden size, FFN neurons."""
    if text in SHAPES:
        return SHAPES[text]
    match = _SHAPE_PATTERN.fullmatch(text.strip())
    if match is None or min(int(match[1]), int(match[2])) < 1:
        raise ValueError(f"shape: expected one of {', '.join(SHAPES)} or dxD like 4096x11008, found {text!r}")
    return int(match[1]), int(match[2])


class _FFNWeights:
    """The FFN weights in both layouts: neuron-major for the kernel, W_down [d, D] for torch."""

    def __init__(self, d: int, n_neurons: int, dtype: torch.dtype, generator: torch.Generator) -> None:
        self.x = torch.randn(d, generator=generator)  # [d]
        self.w_gate, self.w_up, self.w_down_t = (
            torch.randn(n_neurons, d, generator=generator).to(dtype) for _ in range(3)
        )  # [D, d] each
        self.w_down = self.w_down_t.T.contiguous()  # [d, D], as nn.Linear stores it
        self.x_torch = self.x.to(dtype)  # torch's dense path runs in the weights' dtype

    def make_active(self, active: torch.Tensor) -> None:
        """Negate the W_gate rows whose gate sign disagrees with `active` [D] bool (negation is exact)."""
        positive = (self.w_gate.to(torch.float32) @ self.x) > 0
        self.w_gate[positive != active] *= -1


def _median_ms(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2] * 1e3


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (torch.cuda.synchronize / torch.npu.synchronize); no-op on the CPU."""
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()


def time_interleaved(
    variants: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int,
    device: torch.device = _CPU,
    own_clocks: dict[str, Callable[[], float]] | None = None,
) -> dict[str, float]:
    """Median milliseconds of each variant, caches flushed and the device idle before every call.

    own_clocks: for variants that time themselves, the function giving the seconds their last call took by their own
    clock (SparseFFNKernel.last_call_seconds: inside the library), taken instead of the wall time around the Python
    call. After the flush the interpreter's own code and data come from memory too, and reaching a kernel through its
    Python wrapper and ctypes then costs 50-100 us (benchmarks/README.md), a sixth of a 90%-sparse 7B FFN step."""
    own_clocks = own_clocks or {}
    flush = torch.ones(_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(warmup + repeats):
        for name, run in variants.items():
            flush.sum()
            _synchronize(device)
            start = time.perf_counter()
            run()
            _synchronize(device)
            elapsed = time.perf_counter() - start
            if name in own_clocks:
                elapsed = own_clocks[name]()
            if step >= warmup:
                samples[name].append(elapsed)
    return {name: _median_ms(values) for name, values in samples.items()}


def random_active(n_neurons: int, sparsity: float, generator: torch.Generator) -> tuple[int, torch.Tensor]:
    """round((1 - sparsity) * n_neurons) neurons drawn at random: their count and the [D] bool active set."""
    n_active = round((1.0 - sparsity) * n_neurons)
    active = torch.zeros(n_neurons, dtype=torch.bool)
    active[torch.randperm(n_neurons, generator=generator)[:n_active]] = True
    return n_active, active


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` (0: left as they are) for the block, then restored."""
    saved = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def bench_ffn(
    d: int,
    D: int,
    sparsities: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
    dtype: str = "fp32",
    threads: int = 0,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> list[dict]:
    """Time torch dense vs the native kernel dense and sparse for d x D relu FFN weights, one row per sparsity.

    threads > 0 sets both the kernel's and torch's thread count (torch's is restored afterwards); 0 uses
    their defaults. Row fields: the setup (d, D, dtype, threads), sparsity (requested), realized_sparsity
    (measured by the kernel), dense_torch_ms (F.linear gate and up, relu, F.linear down), dense_kernel_ms
    (every neuron active, mask None), no_predictor_ms (mask None at this sparsity: every gate row read, up
    and down only for active neurons), sparse_ms (mask = the active set), speedup_vs_torch,
    speedup_vs_dense_kernel, sparse_gb_per_s (weight bytes the sparse kernel must read -- the gate, up and
    down rows of the active neurons -- per second), svd_predictor_ms (rank default_rank(D)) and
    signbit_predictor_ms.
    """
    n_neurons = D
    check_arguments(d, n_neurons, sparsities, dtype, repeats, warmup)
    require_memory(d, n_neurons, dtype)

    generator = torch.Generator().manual_seed(seed)
    weights = _FFNWeights(d, n_neurons, DTYPES[dtype], generator)
    row_bytes = d * weights.w_gate.element_size()
    kernel = SparseFFNKernel(d, n_neurons, threads)
    relu = Activation("relu")
    out = torch.empty(d, dtype=torch.float32)

    def torch_dense() -> torch.Tensor:
        x, w = weights.x_torch, weights
        return F.linear(F.relu(F.linear(x, w.w_gate)) * F.linear(x, w.w_up), w.w_down)

    def kernel_call(mask: torch.Tensor | None = None, active_out: torch.Tensor | None = None) -> torch.Tensor:
        w = weights
        return kernel(w.x, w.w_gate, w.w_up, w.w_down_t, relu, mask=mask, out=out, active_out=active_out)

    rank = min(default_rank(n_neurons), d)
    svd_factors = (
        torch.randn(rank, n_neurons, generator=generator),
        torch.randn(rank, d, generator=generator),
    )  # A^T, B
    packed = torch.randint(-(2**31), 2**31, (n_neurons, words_for(d)), dtype=torch.int32, generator=generator)

    with torch_threads(threads):
        weights.make_active(torch.ones(n_neurons, dtype=torch.bool))
        fixed = time_interleaved(
            {
                "dense_kernel_ms": kernel_call,
                "svd_predictor_ms": lambda: svd_predictor(weights.x, *svd_factors, None),
                "signbit_predictor_ms": lambda: signbit_predictor(weights.x, packed, 1.0),
            },
            repeats,
            warmup,
        )
        rows = []
        for sparsity in sparsities:
            n_active, active = random_active(n_neurons, sparsity, generator)
            weights.make_active(active)
            realized = torch.zeros(n_neurons, dtype=torch.bool)
            kernel_call(active, realized)
            timings = time_interleaved(
                {
                    "dense_torch_ms": torch_dense,
                    "no_predictor_ms": kernel_call,
                    "sparse_ms": lambda mask=active: kernel_call(mask),
                },
                repeats,
                warmup,
            )
            rows.append(
                {
                    "d": d,
                    "D": n_neurons,
                    "dtype": dtype,
                    "threads": threads if threads > 0 else max_threads(),
                    "sparsity": sparsity,
                    "realized_sparsity": 1.0 - realized.sum().item() / n_neurons,
                    **timing_columns(timings, fixed, n_active, row_bytes),
                }
            )
        return rows


def check_arguments(d: int, n_neurons: int, sparsities, dtype: str, repeats: int, warmup: int) -> None:
    """The settings every FFN benchmark shares; ValueError naming the setting, expected and found."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, found {dtype!r}")
    if d < 1 or n_neurons < 1:
        raise ValueError(f"d, D: expected sizes >= 1, found d={d}, D={n_neurons}")
    if not sparsities:
        raise ValueError("sparsities: expected one or more levels such as 0.5,0.9, found none")
    for sparsity in sparsities:
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsities: expected values in [0, 1), found {sparsity}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats, warmup: expected >= 1 and >= 0, found {repeats}, {warmup}")


def require_memory(d: int, n_neurons: int, dtype: str) -> None:
    """Refuse, with the figure, a shape whose weights would not fit this machine's available memory: the three
    matrices and torch's W_down in `dtype` (fp16 for the quantized benchmark, plus its float32 working copy while
    quantizing and the codes), the gate matrix in fp32 while arranging the active set, and the 256 MiB flush buffer
    and streaming read."""
    values = d * n_neurons
    if dtype in QUANTIZED_DTYPES:
        needed, parts = values * (4 * 2 + 2 * 4 + 3), "four fp16 matrices, two fp32 working copies, the codes"
    else:
        element = torch.empty(0, dtype=DTYPES[dtype]).element_size()
        needed, parts = values * (4 * element + 4), f"four {dtype} matrices and an fp32 copy"
    memory.require(
        f"bench ffn at d={d}, D={n_neurons}",
        needed + 2 * _FLUSH_BYTES,
        f"{parts}, 512 MiB of flush and read buffers",
        "give a smaller --shape",
    )


def timing_columns(timings: dict, fixed: dict, n_active: int, row_bytes: int) -> dict:
    """The timing columns of one row: times (ms), speedups, and the bandwidth on the bytes the sparse step must
    read (the gate, up and down rows of the n_active neurons, row_bytes each)."""
    return {
        "dense_torch_ms": timings["dense_torch_ms"],
        "dense_kernel_ms": fixed["dense_kernel_ms"],
        "no_predictor_ms": timings["no_predictor_ms"],
        "sparse_ms": timings["sparse_ms"],
        "speedup_vs_torch": timings["dense_torch_ms"] / timings["sparse_ms"],
        "speedup_vs_dense_kernel": fixed["dense_kernel_ms"] / timings["sparse_ms"],
        "sparse_gb_per_s": 3 * n_active * row_bytes / timings["sparse_ms"] / 1e6,
        "svd_predictor_ms": fixed["svd_predictor_ms"],
        "signbit_predictor_ms": fixed["signbit_predictor_ms"],
    }


COLUMNS = (
    "sparsity",
    "realized_sparsity",
    "dense_torch_ms",
    "dense_kernel_ms",
    "no_predictor_ms",
    "sparse_ms",
    "speedup_vs_torch",
    "speedup_vs_dense_kernel",
    "sparse_gb_per_s",
    "svd_predictor_ms",
    "signbit_predictor_ms",
)


def format_table(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """The rows as a fixed-width text table (one header line, one line per row)."""
    widths = [max(len(name), 8) for name in columns]
    lines = ["  ".join(name.rjust(width) for name, width in zip(columns, widths, strict=True))]
    for row in rows:
        cells = [f"{row[name]:.3f}" if isinstance(row[name], float) else str(row[name]) for name in columns]
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)))
    return "\n".join(lines)


def bench_quantized_ffn(
    d: int,
    D: int,
    sparsities: Sequence[float] = (0.5, 0.9),
    dtype: str = "int8",
    group_size: int = 32,
    threads: int = 0,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    asymmetric: bool = False,
    down_dtype: str | None = None,
) -> list[dict]:
    """Time the native sparse FFN over `dtype` ("int8" or "int4"; asymmetric: int4 with group minimums) rows against
    the same step over the fp16 rows they were quantized from, interleaved, one row per sparsity (relu, mask = the
    active set as in bench_ffn). down_dtype "int8" with dtype "int4": the down rows int8 (symmetric), as in a bundle
    exported with --down-dtype int8.

    Row fields: the setup (d, D, dtype, int4_scheme, down_dtype, group_size, threads), sparsity, realized_sparsity
    (measured by the quantized kernel), fp16_sparse_ms, fp32_x_sparse_ms (the quantized kernel with x in fp32,
    ACTIVATIONS_ENV "fp32"), sparse_ms (the quantized kernel's default, integer dot products), each timed by the
    library from the kernel's entry to its return (time_interleaved's own_clocks), sparse_call_ms (the default call
    timed around its Python call, as a decode step in Python pays it), speedup_vs_fp16,
    speedup_vs_fp32_x, sparse_mb_read (codes, scales and minimums of the gate, up and down rows of the active
    neurons), sparse_gb_per_s and fp16_gb_per_s (bytes each step must read per second), read_gb_per_s (a streaming read
    of a 256 MiB buffer on the same threads, timed in the same loop) and read_fraction (sparse_gb_per_s /
    read_gb_per_s).
    """
    n_neurons = D
    check_arguments(d, n_neurons, sparsities, "fp16", repeats, warmup)
    if dtype not in QUANTIZED_DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(QUANTIZED_DTYPES)}, found {dtype!r}")
    if group_size not in quant.GROUP_SIZES or d % group_size != 0:
        raise ValueError(f"group_size: expected one of {quant.GROUP_SIZES} dividing d={d}, found {group_size}")
    require_memory(d, n_neurons, dtype)

    generator = torch.Generator().manual_seed(seed)
    weights = _FFNWeights(d, n_neurons, torch.float16, generator)
    if asymmetric and dtype != "int4":
        raise ValueError(f"asymmetric: only int4 has group minimums, found dtype {dtype!r}")
    down_dtype = down_dtype or dtype
    if down_dtype not in (dtype, *WIDER_DOWN_DTYPES.get(dtype, ())):
        raise ValueError(f"down_dtype: expected {dtype} or int8 with dtype int4, found {down_dtype!r} with {dtype!r}")
    formats = (dtype, dtype, down_dtype)
    quantized = [
        QuantizedWeight.from_matrix(quant.quantize(w.numpy(), fmt, group_size, asymmetric and fmt == "int4"))
        for w, fmt in zip((weights.w_gate, weights.w_up, weights.w_down_t), formats, strict=True)
    ]
    gate_scales, gate_mins = quantized[0].scales, quantized[0].mins
    row_bytes = [sum(part[0].nbytes for part in (w.data, w.scales, w.mins) if part is not None) for w in quantized]
    kernel = SparseFFNKernel(d, n_neurons, threads)
    relu = Activation("relu")
    out = torch.empty(d, dtype=torch.float32)

    def make_active(active: torch.Tensor) -> None:
        """Both weight sets fire exactly on `active`: the fp16 gate rows as in bench_ffn, the quantized ones by
        negating their scales (and minimums), which negates every value of the row exactly."""
        weights.make_active(active)
        flip = (matvec_quantized(weights.x, quantized[0]) > 0) != active
        gate_scales[flip] *= -1
        if gate_mins is not None:
            gate_mins[flip] *= -1

    def fp16_call(mask: torch.Tensor) -> torch.Tensor:
        w = weights
        return kernel(w.x, w.w_gate, w.w_up, w.w_down_t, relu, mask=mask, out=out)

    def quantized_call(mask: torch.Tensor, active_out: torch.Tensor | None = None) -> torch.Tensor:
        return kernel.quantized(weights.x, *quantized, relu, mask=mask, out=out, active_out=active_out)

    def fp32_x_call(mask: torch.Tensor) -> torch.Tensor:
        previous = os.environ.get(ACTIVATIONS_ENV)
        os.environ[ACTIVATIONS_ENV] = "fp32"
        try:
            return quantized_call(mask)
        finally:
            if previous is None:
                del os.environ[ACTIVATIONS_ENV]
            else:
                os.environ[ACTIVATIONS_ENV] = previous

    stream = torch.ones(_FLUSH_BYTES // 4, dtype=torch.float32)  # evicted by each call's flush, so read from memory

    rows = []
    with torch_threads(threads):
        for sparsity in sparsities:
            n_active, active = random_active(n_neurons, sparsity, generator)
            make_active(active)
            realized = torch.zeros(n_neurons, dtype=torch.bool)
            quantized_call(active, realized)
            kernel_variants = ("fp16_sparse_ms", "fp32_x_sparse_ms", "sparse_ms")
            timings = time_interleaved(
                {
                    "fp16_sparse_ms": lambda mask=active: fp16_call(mask),
                    "fp32_x_sparse_ms": lambda mask=active: fp32_x_call(mask),
                    "sparse_ms": lambda mask=active: quantized_call(mask),
                    "sparse_call_ms": lambda mask=active: quantized_call(mask),
                    "read_ms": stream.sum,
                },
                repeats,
                warmup,
                own_clocks=dict.fromkeys(kernel_variants, kernel.last_call_seconds),
            )
            read_bytes = n_active * sum(row_bytes)
            sparse_gb_per_s = read_bytes / timings["sparse_ms"] / 1e6
            read_gb_per_s = stream.nbytes / timings["read_ms"] / 1e6
            rows.append(
                {
                    "d": d,
                    "D": n_neurons,
                    "dtype": dtype,
                    "int4_scheme": ("asymmetric" if asymmetric else "symmetric") if dtype == "int4" else None,
                    "down_dtype": down_dtype,
                    "group_size": group_size,
                    "threads": threads if threads > 0 else max_threads(),
                    "sparsity": sparsity,
                    "realized_sparsity": 1.0 - realized.sum().item() / n_neurons,
                    "fp16_sparse_ms": timings["fp16_sparse_ms"],
                    "fp32_x_sparse_ms": timings["fp32_x_sparse_ms"],
                    "sparse_ms": timings["sparse_ms"],
                    "sparse_call_ms": timings["sparse_call_ms"],
                    "speedup_vs_fp16": timings["fp16_sparse_ms"] / timings["sparse_ms"],
                    "speedup_vs_fp32_x": timings["fp32_x_sparse_ms"] / timings["sparse_ms"],
                    "sparse_mb_read": read_bytes / 1e6,
                    "sparse_gb_per_s": sparse_gb_per_s,
                    "fp16_gb_per_s": 3 * n_active * d * 2 / timings["fp16_sparse_ms"] / 1e6,
                    "read_gb_per_s": read_gb_per_s,
                    "read_fraction": sparse_gb_per_s / read_gb_per_s,
                }
            )
    return rows


QUANTIZED_COLUMNS = (
    "sparsity",
    "realized_sparsity",
    "fp16_sparse_ms",
    "fp32_x_sparse_ms",
    "sparse_ms",
    "sparse_call_ms",
    "speedup_vs_fp16",
    "speedup_vs_fp32_x",
    "sparse_mb_read",
    "sparse_gb_per_s",
    "fp16_gb_per_s",
    "read_gb_per_s",
    "read_fraction",
)
