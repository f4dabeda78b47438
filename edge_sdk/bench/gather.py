"""Decode-FFN benchmark of the gather-plus-matmul executor (backends/cann, SVDP Algorithm 4) on a torch device.

The counterpart of bench/ffn.py for the torch path the CANN backend runs: the same data (random normal
weights whose W_gate rows are sign-flipped so that relu(g) is nonzero exactly on a random active set of
round((1 - s) D) neurons), the same interleaved timing with the caches flushed before every call, and the
same row keys where they apply. The executor is GatherSparseFFN in `mode`:

- dense_torch_ms: torch's dense FFN (F.linear gate and up, relu, F.linear down) in the compute dtype.
- dense_kernel_ms: the executor with every neuron active (the weights re-signed so that all fire) and
  dense decoding, i.e. a dense gate, then up/down over every row (gathered in dynamic mode).
- no_predictor_ms: no predictor at this sparsity: the dense gate, then up/down on the active rows only
  (compacted by nonzero in dynamic mode; in static mode the top-capacity |gate| rows, masked).
- sparse_ms: a perfect predictor's mask (the active set) through candidate selection (nonzero, or top-k to
  capacity = the active count in static mode), the gathered gate, false-positive elimination and the
  gathered up/down. The predictors are timed separately (svd_predictor_ms, signbit_predictor_ms).

Unlike the native kernel, the executor copies the selected rows before multiplying them, so it moves
about twice the bytes it needs; sparse_gb_per_s counts only the needed ones (gate, up and down rows of
the active neurons), like bench/ffn.py. Accelerators are synchronised around every timed call.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from edge_sdk.backends.cann import MODES
from edge_sdk.backends.cann.gather_ffn import GatherSparseFFN
from edge_sdk.bench import ffn as ffn_bench
from edge_sdk.bench.ffn import DTYPES
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.signbit import DeviceSignBit, words_for
from edge_sdk.sparsity.sparse_model import LayerPredictor
from edge_sdk.sparsity.svd import default_rank

DEVICES = ("cpu", "cuda", "npu")


def _device(name: str) -> torch.device:
    """The torch device to time on; "npu" imports torch_npu, which registers the device and torch.npu."""
    if name == "npu":
        try:
            importlib.import_module("torch_npu")
        except Exception as error:  # ImportError, or OSError / RuntimeError when CANN is missing or mismatched
            raise ValueError(f"device npu: torch_npu does not import ({type(error).__name__}: {error})") from None
    device = torch.device(name)
    if device.type != "cpu" and not getattr(torch, device.type).is_available():
        raise ValueError(f"device {name}: torch.{device.type}.is_available() is False")
    return device


def _check_arguments(d, n_neurons, sparsities, dtype, device, mode, repeats, warmup) -> None:
    ffn_bench.check_arguments(d, n_neurons, sparsities, dtype, repeats, warmup)
    if device not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, found {device!r}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, found {mode!r}")
    ffn_bench.require_memory(d, n_neurons, dtype)


def bench_gather_ffn(
    d: int,
    D: int,
    sparsities: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
    dtype: str = "fp16",
    device: str = "cpu",
    mode: str = "dynamic",
    repeats: int = 20,
    warmup: int = 3,
    threads: int = 0,
    seed: int = 0,
) -> list[dict]:
    """Time torch dense vs the gather executor dense, without predictor and sparse for d x D relu FFN weights
    on `device` in `dtype`, one row per sparsity (fields: see the module docstring and bench/ffn.bench_ffn).

    An unusable device is a ValueError saying why. threads > 0 sets torch's CPU thread count (restored
    afterwards). Rows also carry device, mode and capacity (the
    static top-k size: the active count; D in dynamic mode, where nothing is padded)."""
    n_neurons = D
    _check_arguments(d, n_neurons, sparsities, dtype, device, mode, repeats, warmup)
    target = _device(device)
    compute_dtype = DTYPES[dtype]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=generator)  # [d]
    # [D, d] each, rounded to the compute dtype first so that the sign fix-up below sees the stored values
    w_gate, w_up, w_down_t = (torch.randn(n_neurons, d, generator=generator).to(compute_dtype) for _ in range(3))
    relu = Activation("relu")
    rank = min(default_rank(n_neurons), d)
    svd_a = torch.randn(n_neurons, rank, generator=generator).to(target, compute_dtype)  # [D, r]
    svd_b = torch.randn(rank, d, generator=generator).to(target, compute_dtype)  # [r, d]
    packed = torch.randint(-(2**31), 2**31, (n_neurons, words_for(d)), dtype=torch.int32, generator=generator)
    signbit = DeviceSignBit(packed, 1.0, d, target)
    x_device = x.to(target, compute_dtype)
    w_up_device, w_down_t_device = w_up.to(target), w_down_t.to(target)  # [D, d] each
    w_down = w_down_t.T.contiguous().to(target)  # [d, D], as nn.Linear stores it

    def executor(active: torch.Tensor, capacity: int | None) -> GatherSparseFFN:
        """W_gate re-signed so that exactly `active` [D] fires, on the device, in a no-predictor executor."""
        positive = (w_gate.to(torch.float32) @ x) > 0
        signed = torch.where((positive != active).unsqueeze(1), -w_gate, w_gate)
        return GatherSparseFFN(
            signed.to(target),
            w_up_device,
            w_down_t_device,
            relu,
            LayerPredictor("none"),
            device=target,
            dtype=compute_dtype,
            mode=mode,
            capacity=capacity,
        )

    with ffn_bench.torch_threads(threads):
        with torch.inference_mode():
            dense = executor(torch.ones(n_neurons, dtype=torch.bool), None)
            dense.dense = True
            fixed = ffn_bench.time_interleaved(
                {
                    "dense_kernel_ms": lambda: dense.step(x_device),
                    "svd_predictor_ms": lambda: ((x_device @ svd_b.T) @ svd_a.T).float() > 0,
                    "signbit_predictor_ms": lambda: signbit.scores(x_device) > 0,
                },
                repeats,
                warmup,
                target,
            )
            rows = []
            for sparsity in sparsities:
                n_active, active = ffn_bench.random_active(n_neurons, sparsity, generator)
                ffn = executor(active, n_active if mode == "static" else None)
                perfect_scores = active.to(target, torch.float32)  # [D]: 1 on the active set

                def sparse(ffn=ffn, scores=perfect_scores):
                    return ffn.step_from_candidates(x_device, *ffn.candidates(scores))

                def torch_dense(w_gate_device=ffn.w_gate):
                    return F.linear(F.relu(F.linear(x_device, w_gate_device)) * F.linear(x_device, w_up_device), w_down)

                realized = sparse().active(n_neurons).sum().item()
                timings = ffn_bench.time_interleaved(
                    {
                        "dense_torch_ms": torch_dense,
                        "no_predictor_ms": lambda ffn=ffn: ffn.step(x_device),
                        "sparse_ms": sparse,
                    },
                    repeats,
                    warmup,
                    target,
                )
                row_bytes = d * ffn.w_gate.element_size()
                rows.append(
                    {
                        "d": d,
                        "D": n_neurons,
                        "dtype": dtype,
                        "device": device,
                        "mode": mode,
                        "threads": torch.get_num_threads(),
                        "sparsity": sparsity,
                        "realized_sparsity": 1.0 - realized / n_neurons,
                        "capacity": n_active if mode == "static" else n_neurons,
                        **ffn_bench.timing_columns(timings, fixed, n_active, row_bytes),
                    }
                )
                del ffn
        return rows


# the native kernel benchmark's columns, with the static gather's capacity after the sparsity
COLUMNS = (*ffn_bench.COLUMNS[:2], "capacity", *ffn_bench.COLUMNS[2:])


def format_table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table (one header line, one line per row)."""
    return ffn_bench.format_table(rows, COLUMNS)
