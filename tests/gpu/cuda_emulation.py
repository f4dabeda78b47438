"""The host emulation of the quantized CUDA kernels (cuda_emulation.cu), built with nvcc and called through ctypes.

No GPU is needed: the emulation runs every block, warp, lane and thread of edge_sparse_ffn_q and edge_matvec_q on the
host through the kernels' own __host__ __device__ functions (plugins/kernels/quant_rows.cuh,
sparse_ffn_pipeline.cuh), so its results check the kernels' indexing and summation orders against the reference.
Asymmetric int4 matrices (QuantizedMatrix.mins) pass their minimums as the launchers take them; the down rows' format
is w_down_t's own (int8 down rows under int4 gate and up rows: edge_sparse_ffn_q's down_format).
nvcc compiles it once per process into a temporary directory (a few seconds).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from edge_sdk import quant

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("cuda_emulation.cu")
INCLUDES = (ROOT / "plugins" / "kernels", ROOT / "kernels" / "cpu")
QUANT_FORMATS = {"int8": 2, "int4": 3}  # enum edge_quant_format
ACTIVATIONS = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}  # enum edge_activation

_ptr, _int = ctypes.c_void_p, ctypes.c_int


def unavailable_reason() -> str | None:
    """Why the emulation cannot be built here (no nvcc), or None."""
    return None if shutil.which("nvcc") else "nvcc (the CUDA toolkit) is not on PATH: the kernel emulation is not built"


@functools.cache
def load() -> ctypes.CDLL:
    """The emulation library, compiled on first use (CalledProcessError with nvcc's output if that fails)."""
    directory = Path(tempfile.mkdtemp(prefix="edge-sdk-cuda-emulation-"))
    atexit.register(shutil.rmtree, directory, True)
    library = directory / "libedge_cuda_emulation.so"
    command = [
        "nvcc",
        "-O2",
        "-std=c++17",
        "-shared",
        "-Xcompiler=-fPIC,-Wall,-Wextra,-Werror,-ffp-contract=off",
        *(f"-I{include}" for include in INCLUDES),
        str(SOURCE),
        "-o",
        str(library),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    emulation = ctypes.CDLL(str(library))
    emulation.edge_emulate_sparse_ffn_q.argtypes = [
        _ptr,
        _int,
        _int,
        _int,
        *[_ptr] * 9,  # codes, scales and mins of w_gate, w_up, w_down_t
        _int,  # quant_format
        _int,  # down_format
        _int,  # group_size
        _ptr,
        _ptr,
        _int,
        ctypes.c_float,
        _ptr,
        _ptr,
    ]
    # x, tokens, in, out, w, scales, mins, quant_format, group_size, bias, y
    emulation.edge_emulate_matvec_q.argtypes = [_ptr, _int, _int, _int, _ptr, _ptr, _ptr, _int, _int, _ptr, _ptr]
    emulation.edge_emulate_matvec_q_t.argtypes = [_ptr, _int, _int, _int, _ptr, _ptr, _ptr, _int, _int, _ptr, _ptr]
    for function in (
        emulation.edge_emulate_sparse_ffn_q,
        emulation.edge_emulate_matvec_q,
        emulation.edge_emulate_matvec_q_t,
    ):
        function.restype = _int
    return emulation


def _address(array: np.ndarray | None) -> int | None:
    return None if array is None else array.ctypes.data


def _arrays(w: quant.QuantizedMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A matrix's codes, scales and minimums (None when symmetric), C-contiguous for the emulation."""
    mins = None if w.mins is None else np.ascontiguousarray(w.mins)
    return np.ascontiguousarray(w.data), np.ascontiguousarray(w.scales), mins


def sparse_ffn_q(
    x: np.ndarray,  # [T, d] float32
    # [D, d] each; w_down_t int8 under int4 w_gate and w_up, or all three of one format
    weights: tuple[quant.QuantizedMatrix, quant.QuantizedMatrix, quant.QuantizedMatrix],
    mask: np.ndarray | None,  # [T, D] int32, nonzero = predicted active
    thresholds: np.ndarray | None,  # [D] float32
    activation: str,
    act_threshold: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(y [T, d] float32, active [T, D] bool) as edge_sparse_ffn_q computes them (asymmetric int4 weights with their
    minimums; down_format w_down_t's format)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    tokens, d = x.shape
    n_neurons = weights[0].shape[0]
    matrices = [array for w in weights for array in _arrays(w)]
    mask = None if mask is None else np.ascontiguousarray(mask, dtype=np.int32)
    thresholds = None if thresholds is None else np.ascontiguousarray(thresholds, dtype=np.float32)
    y = np.empty((tokens, d), np.float32)
    active = np.empty((tokens, n_neurons), np.uint8)
    status = load().edge_emulate_sparse_ffn_q(
        _address(x),
        tokens,
        d,
        n_neurons,
        *map(_address, matrices),
        QUANT_FORMATS[weights[0].format],
        QUANT_FORMATS[weights[2].format],
        weights[0].group_size,
        _address(mask),
        _address(thresholds),
        ACTIVATIONS[activation],
        act_threshold,
        _address(y),
        _address(active),
    )
    if status != 0:
        raise ValueError(f"edge_emulate_sparse_ffn_q refused the arguments (d={d}, D={n_neurons})")
    return y, active.astype(bool)


def matvec_q(x: np.ndarray, w: quant.QuantizedMatrix, bias: np.ndarray | None, transposed: bool = True) -> np.ndarray:
    """y [T, out] float32 as edge_matvec_q computes it: x [T, in] W^T (+ bias) for W [out, in] (transposed), or as
    edge_matvec_q_t: x W (+ bias) for W [in, out] (transposed False); asymmetric int4 W with its minimums."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    tokens, n_in = x.shape
    n_out = w.shape[0] if transposed else w.shape[1]
    codes, scales, mins = _arrays(w)
    bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    y = np.empty((tokens, n_out), np.float32)
    emulate = load().edge_emulate_matvec_q if transposed else load().edge_emulate_matvec_q_t
    status = emulate(
        _address(x),
        tokens,
        n_in,
        n_out,
        _address(codes),
        _address(scales),
        _address(mins),
        QUANT_FORMATS[w.format],
        w.group_size,
        _address(bias),
        _address(y),
    )
    if status != 0:
        raise ValueError(f"the emulated launcher refused the arguments (in={n_in}, out={n_out})")
    return y
