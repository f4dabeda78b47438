"""The CUDA kernel library's host side, which needs no GPU: exported symbols, argument checks, workspace sizes.

Runs wherever the package build compiled libedge_cuda_kernels.so (nvcc present); skips otherwise.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import pytest

from .cuda_harness import (
    CUDA_ERROR_INVALID_VALUE,
    LAUNCHERS,
    gpu_unavailable_reason,
    kernel_library_path,
    load_kernels,
)

LIBRARY = kernel_library_path()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="libedge_cuda_kernels.so was not built (no nvcc at build time)")

# A non-NULL address for arguments the launcher must reject before touching them.
UNUSED = 256
# Arguments of a valid edge_sparse_ffn call (after the stream), with fake addresses.
FFN_ARGUMENTS = {
    "x": UNUSED,
    "x_dtype": 0,
    "tokens": 1,
    "d": 64,
    "D": 128,
    "w_gate": UNUSED,
    "w_up": UNUSED,
    "w_down_t": UNUSED,
    "weight_dtype": 1,
    "mask": None,
    "thresholds": None,
    "activation": 0,
    "act_threshold": 0.0,
    "y": UNUSED,
    "workspace": UNUSED,
    "active_out": None,
}


def test_exports_exactly_the_launchers():
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIBRARY)], check=True, capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1] for line in listing.splitlines() if line.strip()}
    assert exported == set(LAUNCHERS)
    library = load_kernels()
    for name in LAUNCHERS:
        assert ctypes.cast(getattr(library, name), ctypes.c_void_p).value is not None


@pytest.mark.parametrize(
    "field, value",
    [
        ("x", None),
        ("w_down_t", None),
        ("y", None),
        ("workspace", None),
        ("d", 0),
        ("D", -1),
        ("tokens", 0),
        ("tokens", 65536),
        ("x_dtype", 3),
        ("weight_dtype", -1),
        ("activation", 4),
        ("act_threshold", -0.5),
        ("act_threshold", math.nan),
    ],
)
def test_sparse_ffn_rejects_invalid_arguments(field, value):
    arguments = FFN_ARGUMENTS | {field: value}
    assert load_kernels().edge_sparse_ffn(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


# Arguments of a valid edge_sparse_ffn_q call (after the stream): symmetric int4 rows in groups of 32.
FFN_Q_ARGUMENTS = {
    "x": UNUSED,
    "x_dtype": 0,
    "tokens": 1,
    "d": 64,
    "D": 128,
    "w_gate": UNUSED,
    "gate_scales": UNUSED,
    "gate_mins": None,
    "w_up": UNUSED,
    "up_scales": UNUSED,
    "up_mins": None,
    "w_down_t": UNUSED,
    "down_scales": UNUSED,
    "down_mins": None,
    "quant_format": 3,
    "down_format": 3,
    "group_size": 32,
    "mask": None,
    "thresholds": None,
    "activation": 0,
    "act_threshold": 0.0,
    "y": UNUSED,
    "workspace": UNUSED,
    "active_out": None,
}


@pytest.mark.parametrize(
    "field, value",
    [
        ("x", None),
        ("w_up", None),
        ("down_scales", None),
        ("y", None),
        ("workspace", None),
        ("w_gate", UNUSED + 2),  # codes are read in 4-byte words at least
        ("d", 48),  # not a multiple of the group size
        ("d", 0),
        ("D", 0),
        ("tokens", 65536),
        ("quant_format", 1),  # EDGE_F16 is no quantized format
        ("quant_format", 4),
        ("down_format", 1),
        ("down_format", 4),
        ("down_format", -1),
        ("group_size", 16),
        ("group_size", 256),
        ("x_dtype", 3),
        ("activation", -1),
        ("act_threshold", math.nan),
    ],
)
def test_sparse_ffn_q_rejects_invalid_arguments(field, value):
    arguments = FFN_Q_ARGUMENTS | {field: value}
    assert load_kernels().edge_sparse_ffn_q(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize(
    "changes",
    [
        {"gate_mins": UNUSED},  # minimums for some of the three matrices only
        {"down_mins": UNUSED},
        {"gate_mins": UNUSED, "up_mins": UNUSED},
        {"gate_mins": UNUSED, "up_mins": UNUSED, "down_mins": UNUSED, "quant_format": 2},  # int8 has no minimums
    ],
)
def test_sparse_ffn_q_takes_minimums_for_all_three_int4_matrices_or_for_none(changes):
    arguments = FFN_Q_ARGUMENTS | changes
    assert load_kernels().edge_sparse_ffn_q(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


INT8_DOWN = {"quant_format": 3, "down_format": 2}  # int4 gate and up rows, int8 down rows
ASYMMETRIC_GATE_UP = {"gate_mins": UNUSED, "up_mins": UNUSED}


@pytest.mark.parametrize(
    "changes",
    [
        {"quant_format": 2, "down_format": 3},  # int8 gate and up rows with int4 down rows
        {"quant_format": 2, "down_format": 3} | ASYMMETRIC_GATE_UP,
        INT8_DOWN | ASYMMETRIC_GATE_UP | {"down_mins": UNUSED},  # int8 down rows have no minimums
        INT8_DOWN | {"down_mins": UNUSED},
        INT8_DOWN | {"gate_mins": UNUSED},  # gate and up minimums both or neither
        INT8_DOWN | {"up_mins": UNUSED},
        INT8_DOWN | {"w_down_t": UNUSED + 2},  # int8 down codes are read in 4-byte words too
        INT8_DOWN | {"down_scales": None},
        INT8_DOWN | {"d": 48},  # not a multiple of the group size
    ],
)
def test_sparse_ffn_q_refuses_other_format_pairs_and_minimums_of_int8_down_rows(changes):
    arguments = FFN_Q_ARGUMENTS | changes
    assert load_kernels().edge_sparse_ffn_q(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize("changes", [INT8_DOWN, INT8_DOWN | ASYMMETRIC_GATE_UP, {"quant_format": 2, "down_format": 2}])
def test_sparse_ffn_q_takes_int8_down_rows_under_int4_gate_and_up_rows(changes):
    """Past the argument checks: without a device, the launch itself fails, with another error than
    cudaErrorInvalidValue (on a GPU these fake addresses are not launched; test_cuda_kernels.py runs the real ones)."""
    if gpu_unavailable_reason() is None:
        pytest.skip("a CUDA device is present: the fake addresses would be read")
    arguments = FFN_Q_ARGUMENTS | changes
    assert load_kernels().edge_sparse_ffn_q(None, *arguments.values()) != CUDA_ERROR_INVALID_VALUE


# Arguments of a valid edge_matvec_q call (after the stream): int8 rows in groups of 64.
MATVEC_Q_ARGUMENTS = {
    "x": UNUSED,
    "x_dtype": 1,
    "tokens": 3,
    "in": 128,
    "out": 77,
    "w": UNUSED,
    "scales": UNUSED,
    "mins": None,
    "quant_format": 2,
    "group_size": 64,
    "bias": None,
    "y": UNUSED,
    "workspace": UNUSED,
}
# edge_matvec_q_t takes no workspace
MATVEC_Q_T_ARGUMENTS = {field: value for field, value in MATVEC_Q_ARGUMENTS.items() if field != "workspace"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("x", None),
        ("w", None),
        ("w", UNUSED + 1),
        ("scales", None),
        ("y", None),
        ("workspace", None),
        ("tokens", 0),
        ("tokens", 32 * 65535 + 1),  # more token tiles than gridDim.y holds
        ("in", 96),  # not a multiple of 64
        ("out", 0),
        ("x_dtype", -1),
        ("quant_format", 0),
        ("group_size", 48),
        ("mins", UNUSED),  # int8 has no minimums
    ],
)
def test_matvec_q_rejects_invalid_arguments(field, value):
    arguments = MATVEC_Q_ARGUMENTS | {field: value}
    assert load_kernels().edge_matvec_q(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


# edge_matvec_q_t quantizes W [in, out] along its rows: out is the grouped dimension, in may be any size
@pytest.mark.parametrize(
    "field, value",
    [
        ("x", None),
        ("w", UNUSED + 2),
        ("scales", None),
        ("tokens", 0),
        ("in", 0),
        ("out", 77),  # not a multiple of 64
        ("quant_format", 5),
        ("group_size", 0),
        ("mins", UNUSED),  # int8 has no minimums
    ],
)
def test_matvec_q_t_rejects_invalid_arguments(field, value):
    arguments = MATVEC_Q_T_ARGUMENTS | {"in": 77, "out": 128} | {field: value}
    assert load_kernels().edge_matvec_q_t(None, *arguments.values()) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize(
    "arguments",
    [
        (None, 0, 1, 64, 128, 8, UNUSED, UNUSED, None, UNUSED, UNUSED),  # no x
        (UNUSED, 0, 1, 64, 128, 0, UNUSED, UNUSED, None, UNUSED, UNUSED),  # rank 0
        (UNUSED, 5, 1, 64, 128, 8, UNUSED, UNUSED, None, UNUSED, UNUSED),  # unknown x dtype
        (UNUSED, 0, 1, 64, 128, 8, UNUSED, UNUSED, None, UNUSED, None),  # no scratch
    ],
)
def test_svd_predictor_rejects_invalid_arguments(arguments):
    assert load_kernels().edge_svd_predictor(None, *arguments) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize(
    "arguments",
    [
        (UNUSED, 0, 1, 64, 128, None, 1.0, UNUSED),  # no packed bits
        (UNUSED, 0, 1, 393217, 128, UNUSED, 1.0, UNUSED),  # x's bits would not fit shared memory
        (UNUSED, 0, 1, 64, 0, UNUSED, 1.0, UNUSED),  # no rows
    ],
)
def test_signbit_predictor_rejects_invalid_arguments(arguments):
    assert load_kernels().edge_signbit_predictor(None, *arguments) == CUDA_ERROR_INVALID_VALUE


def test_matvec_workspace_holds_each_tokens_planes():
    size = load_kernels().edge_matvec_q_workspace_size
    # edge_cuda_kernels.h: round_up(2.25 * round_up(in, 64), 256) bytes per token, plus 256
    assert size(4096, 3) == 3 * 9216 + 256
    assert size(576, 1) == 1536 + 256  # 2 * 576 + 8 * 18 = 1296 bytes of planes, factors and sums
    assert size(96, 2) == 2 * 512 + 256  # in rounded up to 128: 288 bytes
    assert size(0, 1) == size(4096, 0) == 0


def test_workspace_size_grows_linearly_with_tokens():
    size = load_kernels().edge_sparse_ffn_workspace_size
    d, n_neurons = 4096, 11008
    one, two, three = (size(d, n_neurons, tokens) for tokens in (1, 2, 3))
    assert two - one == three - two > 0
    # edge_cuda_kernels.h: 4 * tokens * (3 D + d * (1 + ceil(D / 64))) bytes (d, D multiples of 64 here) + 512
    per_token = 4 * (3 * n_neurons + d * (1 + math.ceil(n_neurons / 64)))
    assert two - one == per_token
    assert one == per_token + 512
    assert size(0, n_neurons, 1) == size(d, 0, 1) == size(d, n_neurons, 0) == 0
