"""Time one decode-step SparseFFN (edge_sparse_ffn / edge_sparse_ffn_q, plugins/kernels) against a dense cuBLAS FFN.

LLaMA-2-7B shapes by default (d=4096, D=11008, fp16 weights). For each sparsity s the mask keeps a random
(1 - s) of the neurons, and every kept neuron fires (x and W_gate are positive), so the kernel reads exactly
those rows of W_gate, W_up and W_down^T. The dense baseline is three cuBLAS GEMVs (cublasHgemm with n = 1 for fp16
weights, cublasSgemv for fp32): gate, up and down, without the elementwise activation; int8 / int4 weights (group-wise,
edge_sdk/quant.py, --group-size; --asymmetric: int4 with group minimums, llama.cpp's Q4_1 grid) are compared with that
fp16 baseline, the dense FFN a user would otherwise run. Several copies of the weights ("layers") are cycled so that no
run finds its rows in L2. Times are CUDA-event device times per FFN after warm-up, with the calls captured in a CUDA
graph (launch overhead excluded), and also with plain launches from Python. Bandwidth counts the weight rows (codes,
scales and minimums for int8 / int4) and the mask read, against a measured device-to-device copy rate. For int8 / int4
also the dense projection edge_matvec_q (QuantizedMatMul) on a d x d matrix for one token (GEMV, bandwidth) and for a
prompt of 128 (tiled GEMM, GFLOP/s), against cuBLAS fp16.

Needs an NVIDIA GPU, the kernel library built (`pip install -e .` with nvcc) and libcublas from the CUDA toolkit:

    .venv/bin/python benchmarks/cuda_ffn.py
    .venv/bin/python benchmarks/cuda_ffn.py --dtype int4 --group-size 32 --json results.json
    .venv/bin/python benchmarks/cuda_ffn.py --dtype int4 --asymmetric
    .venv/bin/python benchmarks/cuda_ffn.py --dtype fp32 --layers 4
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import torch

from edge_sdk import quant
from edge_sdk.bench.record import with_machine_info

HARNESS = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "cuda_harness.py"
SPARSITIES = (0.0, 0.5, 0.8, 0.9, 0.95)
DTYPES = {"fp16": torch.float16, "fp32": torch.float32, "int8": torch.float16, "int4": torch.float16}
PROMPT_TOKENS = 128
CUBLAS_LIBRARIES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_HALF_ONE, _HALF_ZERO = 0x3C00, 0x0000


def load_harness():
    """tests/gpu/cuda_harness.py: the ctypes bindings the GPU tests use."""
    spec = importlib.util.spec_from_file_location("cuda_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the harness is executed
    spec.loader.exec_module(module)
    return module


class Cublas:
    """The three GEMVs of a dense FFN through cuBLAS on the harness's stream."""

    def __init__(self, stream: int):
        self.library = None
        for name in CUBLAS_LIBRARIES:
            try:
                self.library = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.library is None:
            raise OSError(f"libcublas not found (tried {', '.join(CUBLAS_LIBRARIES)})")
        handle = ctypes.c_void_p()
        self._check(self.library.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self._check(self.library.cublasSetStream_v2(handle, ctypes.c_void_p(stream)), "cublasSetStream")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def matvec(self, dtype: torch.dtype, transpose: bool, rows: int, cols: int, matrix: int, vector: int, out: int):
        """out = op(M) vector for the column-major [rows, cols] matrix M at `matrix` (lda = rows)."""
        op = _CUBLAS_OP_T if transpose else _CUBLAS_OP_N
        out_len, in_len = (cols, rows) if transpose else (rows, cols)
        p = ctypes.c_void_p
        if dtype == torch.float32:
            one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
            operands = (p(matrix), rows, p(vector), 1, ctypes.byref(zero), p(out), 1)
            status = self.library.cublasSgemv_v2(self.handle, op, rows, cols, ctypes.byref(one), *operands)
        else:
            one, zero = ctypes.c_uint16(_HALF_ONE), ctypes.c_uint16(_HALF_ZERO)
            shape = (op, _CUBLAS_OP_N, out_len, 1, in_len)
            operands = (p(matrix), rows, p(vector), in_len, ctypes.byref(zero), p(out), out_len)
            status = self.library.cublasHgemm(self.handle, *shape, ctypes.byref(one), *operands)
        self._check(status, "cuBLAS GEMV")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=4096, help="hidden size")
    parser.add_argument("--D", type=int, default=11008, help="intermediate size (neurons)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="weight storage type")
    parser.add_argument(
        "--group-size", type=int, choices=quant.GROUP_SIZES, default=quant.DEFAULT_GROUP_SIZE, help="int8 / int4 group"
    )
    parser.add_argument(
        "--asymmetric", action="store_true", help="int4 only: group minimums beside the scales (llama.cpp's Q4_1 grid)"
    )
    parser.add_argument(
        "--down-dtype",
        choices=["int8"],
        help="int4 only: the down rows in int8 (an int4 bundle exported with --down-dtype int8; edge_sparse_ffn_q's "
        "down_format)",
    )
    parser.add_argument("--layers", type=int, default=8, help="weight copies cycled so that L2 never holds them")
    parser.add_argument("--repeats", type=int, default=20, help="timed FFN calls per measurement (per layer cycle)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args()


def copy_bandwidth(device, nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written), the practical ceiling of a streaming kernel."""
    source, target = device.allocate(nbytes), device.allocate(nbytes)
    device.copy_on_device(target, source, nbytes)  # warm-up
    milliseconds = min(device.elapsed_ms(lambda: device.copy_on_device(target, source, nbytes)) for _ in range(5))
    return 2 * nbytes / milliseconds / 1e6


def timed(device, enqueue, repeats: int) -> tuple[float, float]:
    """(graph, launches): microseconds per call of enqueue() when captured in a CUDA graph and when launched."""

    def calls():
        for _ in range(repeats):
            enqueue()

    calls()  # warm-up
    graph = device.capture(calls)
    try:
        device.launch_graph(graph)
        in_graph = min(device.elapsed_ms(lambda: device.launch_graph(graph)) for _ in range(5)) * 1e3 / repeats
    finally:
        device.destroy_graph(graph)
    launched = min(device.elapsed_ms(calls) for _ in range(5)) * 1e3 / repeats
    return in_graph, launched


def time_matvec(harness, device, kernels, cublas, args, generator) -> list[dict]:
    """edge_matvec_q on a d x d matrix (an attention projection) for 1 and PROMPT_TOKENS tokens, against cuBLAS fp16
    (GEMV / GEMM): microseconds, the weight bandwidth of one token and the arithmetic rate of a prompt."""
    d = args.d
    weight = torch.rand(d, d, generator=generator) / d
    matrices = [
        quant.quantize(weight.numpy(), args.dtype, args.group_size, args.asymmetric) for _ in range(args.layers)
    ]
    uploaded = [harness.upload_quantized(device, m) for m in matrices]
    half = [device.upload(weight.half()) for _ in range(args.layers)]
    cycle = itertools.count()
    rows = []
    print(f"QuantizedMatMul {d}x{d} ({row_format(args)}, groups of {args.group_size}) against cuBLAS fp16:")
    for tokens in (1, PROMPT_TOKENS):
        x = device.upload(torch.rand(tokens, d, generator=generator))
        x_half = device.upload(torch.rand(tokens, d, generator=generator).half())
        y = device.empty((tokens, d), torch.float32)
        y_half = device.empty((tokens, d), torch.float16)
        workspace = device.allocate(kernels.matvec_workspace_size(d, tokens))  # before the graph capture

        def quantized(x=x, y=y, workspace=workspace):
            kernels.matvec_q(x, uploaded[next(cycle) % args.layers], None, y, workspace=workspace)

        def dense(tokens=tokens, x_half=x_half, y_half=y_half):  # y^T = W x^T: column-major [d, d] W^T, n = tokens
            weights = half[next(cycle) % args.layers]
            shape = (_CUBLAS_OP_T, _CUBLAS_OP_N, d, tokens, d)
            one, zero = ctypes.c_uint16(_HALF_ONE), ctypes.c_uint16(_HALF_ZERO)
            p = ctypes.c_void_p
            operands = (p(weights.pointer), d, p(x_half.pointer), d, ctypes.byref(zero), p(y_half.pointer), d)
            status = cublas.library.cublasHgemm(cublas.handle, *shape, ctypes.byref(one), *operands)
            cublas._check(status, "cublasHgemm")

        quantized_us = timed(device, quantized, args.repeats)[0]
        dense_us = timed(device, dense, args.repeats)[0] if cublas is not None else None
        row = {"tokens": tokens, "quantized_us": quantized_us, "cublas_fp16_us": dense_us}
        row["weight_gb_per_s"] = matrices[0].nbytes / quantized_us / 1e3
        row["gflop_per_s"] = 2 * tokens * d * d / quantized_us / 1e3
        versus = f", cuBLAS fp16 {dense_us:.1f} us" if dense_us is not None else ""
        print(
            f"  {tokens:>4} tokens: {quantized_us:.1f} us ({row['weight_gb_per_s']:.0f} GB/s of weights, "
            f"{row['gflop_per_s']:.0f} GFLOP/s){versus}"
        )
        rows.append(row)
    return rows


def row_format(args: argparse.Namespace) -> str:
    """The quantized rows' format in words (a projection's, and the FFN's gate and up rows): int8, int4 or int4
    asymmetric."""
    return f"{args.dtype} asymmetric" if args.asymmetric else args.dtype


def quantized_format(args: argparse.Namespace) -> str:
    """The FFN's quantized weights in words: the row format, with int8 down rows where --down-dtype says so."""
    return f"{row_format(args)} with {args.down_dtype} down rows" if args.down_dtype else row_format(args)


def device_name() -> str:
    """The name of CUDA device 0, from the driver API (torch may be a CPU build)."""
    driver = ctypes.CDLL("libcuda.so.1")
    device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return "CUDA device 0"
    driver.cuDeviceGetName(name, len(name), device)
    return name.value.decode()


def main() -> int:
    args = parse_args()
    harness = load_harness()
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(f"benchmarks/cuda_ffn.py needs an NVIDIA GPU and the CUDA kernel library: {reason}", file=sys.stderr)
        return 2
    # dtype: of the dense baseline (and of the sparse kernel's weights unless quantized)
    dtype, d, n_neurons = DTYPES[args.dtype], args.d, args.D
    quantized = args.dtype in quant.FORMATS
    if quantized and d % args.group_size:
        print(f"--d {d}: expected a multiple of --group-size {args.group_size}", file=sys.stderr)
        return 2
    if args.asymmetric and args.dtype != "int4":
        print(f"--asymmetric: only int4 has group minimums, found --dtype {args.dtype}", file=sys.stderr)
        return 2
    if args.down_dtype and args.dtype != "int4":
        print(f"--down-dtype: only int4 keeps its down rows wider, found --dtype {args.dtype}", file=sys.stderr)
        return 2
    device = harness.Device()
    kernels = harness.Kernels(device)
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(1, d, generator=generator) + 0.1  # positive, so every masked neuron fires
        host_weights = [(torch.rand(n_neurons, d, generator=generator) / d).to(dtype) for _ in range(3)]
        layers = [tuple(device.upload(w) for w in host_weights) for _ in range(args.layers)]
        if quantized:
            formats = [args.dtype, args.dtype, args.down_dtype or args.dtype]
            asymmetric = [args.asymmetric, args.asymmetric, args.asymmetric and args.down_dtype is None]
            matrices = [
                quant.quantize(w.float().numpy(), fmt, args.group_size, minimums)
                for w, fmt, minimums in zip(host_weights, formats, asymmetric, strict=True)
            ]
            quantized_layers = [
                tuple(harness.upload_quantized(device, m) for m in matrices) for _ in range(args.layers)
            ]
            # codes and scales (and minimums) of one neuron's gate, up and down rows
            neuron_bytes = sum(m.nbytes for m in matrices) / n_neurons
        else:
            neuron_bytes = 3 * d * torch.empty((), dtype=dtype).element_size()
        x_device, x_half = device.upload(x), device.upload(x.to(dtype))
        y = device.empty((1, d), torch.float32)
        workspace = device.allocate(kernels.workspace_size(d, n_neurons, 1))
        dense_gate, dense_hidden = device.empty((n_neurons,), dtype), device.empty((d,), dtype)
        element = torch.empty((), dtype=dtype).element_size()
        peak = copy_bandwidth(device)
        try:
            cublas = Cublas(device.stream)
        except OSError as error:
            cublas = None
            print(f"(no cuBLAS baseline: {error})", file=sys.stderr)

        cycle = itertools.count()

        def dense_ffn():
            w_gate, w_up, w_down_t = layers[next(cycle) % args.layers]
            # row-major [D, d] is column-major [d, D]: gate/up = M^T x, down = M h
            cublas.matvec(dtype, True, d, n_neurons, w_gate.pointer, x_half.pointer, dense_gate.pointer)
            cublas.matvec(dtype, True, d, n_neurons, w_up.pointer, x_half.pointer, dense_gate.pointer)
            cublas.matvec(dtype, False, d, n_neurons, w_down_t.pointer, dense_gate.pointer, dense_hidden.pointer)

        dense_us = timed(device, dense_ffn, args.repeats)[0] if cublas is not None else None
        weights = f"{args.dtype} weights"
        if quantized:
            weights = f"{quantized_format(args)} weights (groups of {args.group_size})"
        setup = f"d={d}, D={n_neurons}, {weights}, {args.layers} weight copies"
        print(f"{device_name()}: {setup}; device-to-device copy {peak:.0f} GB/s")
        if dense_us is not None:
            baseline = f"cuBLAS dense FFN ({'fp16' if quantized else args.dtype})"
            print(f"{baseline}: {dense_us:.1f} us ({3 * n_neurons * d * element / dense_us / 1e3:.0f} GB/s)")
        print(f"{'sparsity':>8} {'graph us':>9} {'launch us':>10} {'GB/s':>7} {'% copy':>7} {'vs dense':>9}")
        results = []
        for sparsity in SPARSITIES:
            mask = torch.zeros(1, n_neurons, dtype=torch.int32)  # OPS.md: int32 masks
            kept = torch.randperm(n_neurons, generator=generator)[: round((1 - sparsity) * n_neurons)]
            mask[0, kept] = 1
            mask_device = device.upload(mask)

            def sparse_ffn(mask_device=mask_device):
                if quantized:
                    weights = quantized_layers[next(cycle) % args.layers]
                    kernels.sparse_ffn_q(x_device, weights, mask_device, None, "relu", 0.0, y, workspace)
                else:
                    weights = layers[next(cycle) % args.layers]
                    kernels.sparse_ffn(x_device, weights, mask_device, None, "relu", 0.0, y, workspace)

            graph_us, launch_us = timed(device, sparse_ffn, args.repeats)
            weight_bytes = len(kept) * neuron_bytes + 4 * n_neurons
            bandwidth = weight_bytes / graph_us / 1e3
            speedup = dense_us / graph_us if dense_us is not None else float("nan")
            row = f"{sparsity:>8.2f} {graph_us:>9.1f} {launch_us:>10.1f} {bandwidth:>7.0f}"
            print(f"{row} {100 * bandwidth / peak:>6.0f}% {speedup:>8.2f}x")
            results.append({"sparsity": sparsity, "graph_us": graph_us, "launch_us": launch_us, "gb_per_s": bandwidth})
        record = {"gpu": device_name(), "d": d, "D": n_neurons, "dtype": args.dtype, "copy_gb_per_s": peak}
        record["dense_us"] = dense_us
        if quantized:
            record["group_size"] = args.group_size
            record["asymmetric"] = args.asymmetric
            record["down_dtype"] = args.down_dtype or args.dtype
            if harness.has_matvec_workspace(kernels.cuda):
                record["matvec"] = time_matvec(harness, device, kernels, cublas, args, generator)
            else:
                print("QuantizedMatMul not measured: this kernel library's edge_matvec_q predates its workspace")
        if args.json is not None:
            args.json.write_text(json.dumps(with_machine_info(record | {"sparse": results}), indent=2) + "\n")
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
