"""The quantized CUDA kernels' indexing, checked on the host: their emulation (cuda_emulation.cu, every block, warp,
lane and thread through the kernels' own __host__ __device__ functions) against the reference on the dequantized rows
and on the x they compute with (edge_matvec_q: quantized_activations(x); edge_matvec_q_t: x itself).

Needs nvcc, not a GPU. The quantized SparseFFN's cases are rows of the op table (tests/ops, implementation
`cuda_emulation`); here: the dense edge_matvec_q on both of its paths (one warp per row up to 4 tokens, the tiled
GEMM beyond) with partial tiles, and that the reading of the codes is the format's and no other.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant
from edge_sdk.export.ops import error_bound

from . import cuda_emulation

UNAVAILABLE = cuda_emulation.unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))

# A wrong reading must miss the reference by this many bounds (as the op table's DISCRIMINATION).
DISCRIMINATION = 10


def relative_error(found: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(found.astype(np.float64) - expected).max() / np.abs(expected).max())


# tokens: 1 (lane_row_dot), 2 and 4 (one warp per row, each piece dotted with every token), 5, 37 and 70 (the tiled
# GEMM: one partial token tile, two tiles and a partial one); n_out 77 and 130: partial 64-row tiles and 8-row blocks
@pytest.mark.parametrize("tokens", [1, 2, 4, 5, 37, 70])
@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
@pytest.mark.parametrize("n_out", [77, 130])
def test_matvec_emulation_matches_the_reference(tokens, fmt, group_size, n_out):
    rng = np.random.default_rng(tokens * 1000 + group_size + n_out)
    n_in = 384 if group_size != 32 else 416  # three groups of 128; 13 groups of 32 (a partial round of lane loads)
    matrix = quant.quantize(rng.standard_normal((n_out, n_in)), fmt, group_size)
    x = rng.standard_normal((tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    weights = quant.dequantize(matrix).astype(np.float64)
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)  # the planes' values
    expected = x_used @ weights.T + bias
    bound = error_bound("QuantizedMatMul", fmt)
    assert relative_error(cuda_emulation.matvec_q(x, matrix, bias), expected) <= bound
    unbiased = cuda_emulation.matvec_q(x, matrix, None)
    assert relative_error(unbiased + bias, expected) <= bound
    assert relative_error(expected - bias, expected) > DISCRIMINATION * bound  # the bias is not lost


# edge_matvec_q_t, W [in, out] (the neuron-major down projection): in not a multiple of the 32-row step (300), outputs
# a partial 64-column tile (96 = 3 groups of 32, 1.5 tiles) or several (384)
@pytest.mark.parametrize("tokens", [1, 5, 37])
@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("group_size, n_out", [(32, 96), (64, 384), (128, 384)])
@pytest.mark.parametrize("n_in", [300, 64])
def test_transposed_matvec_emulation_matches_the_reference(tokens, fmt, group_size, n_out, n_in):
    rng = np.random.default_rng(tokens * 100 + n_out + n_in)
    matrix = quant.quantize(rng.standard_normal((n_in, n_out)), fmt, group_size)
    x = rng.standard_normal((tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    expected = x.astype(np.float64) @ quant.dequantize(matrix).astype(np.float64) + bias
    bound = error_bound("QuantizedMatMul", fmt)
    assert relative_error(cuda_emulation.matvec_q(x, matrix, bias, transposed=False), expected) <= bound
    assert relative_error(cuda_emulation.matvec_q(x, matrix, None, transposed=False) + bias, expected) <= bound


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_matvec_emulation_reads_int4_nibbles_signed_in_q4_0_order(tokens):
    """Reading the int4 bytes any other way (interleaved pairs, offset-8 nibbles) misses the reference by far."""
    rng = np.random.default_rng(tokens)
    matrix = quant.quantize(rng.standard_normal((96, 256)), "int4", 32)
    x = rng.standard_normal((tokens, 256)).astype(np.float32)
    y = cuda_emulation.matvec_q(x, matrix, None)
    x = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)  # the values edge_matvec_q uses
    bound = error_bound("QuantizedMatMul", "int4")
    codes = quant.unpack_int4(matrix.data).astype(np.float64)
    scales = np.repeat(matrix.scales.astype(np.float64), 32, axis=1)
    assert relative_error(y, x @ (codes * scales).T) <= bound
    bytes_ = matrix.data.astype(np.int64)
    low, high = bytes_ & 0xF, bytes_ >> 4
    interleaved = np.stack([low, high], axis=-1).reshape(codes.shape)  # value 2k low nibble, 2k + 1 high
    offset_eight = np.where(codes >= 0, codes - 8, codes + 8)  # the nibbles read as code + 8
    for wrong in (np.where(interleaved > 7, interleaved - 16, interleaved), offset_eight):
        assert relative_error(y, x @ (wrong * scales).T) > DISCRIMINATION * bound


def identity_int8(n: int) -> quant.QuantizedMatrix:
    """W = I as int8 codes 1 on the diagonal with scales 1: W x returns, exactly, the x a kernel computes with."""
    return quant.QuantizedMatrix("int8", 32, np.eye(n, dtype=np.int8), np.ones((n, n // 32), np.float16))


# tokens: 1 (one warp per row), 3 (several tokens per piece), 37 (the tiled GEMM staging x_hat)
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_matvec_computes_with_the_cpu_kernels_quantized_x_to_the_bit(tokens):
    """x's planes are those of the CPU kernels (quantized_activations, the bit for bit reference of both), on every
    path: blocks of very different magnitudes, an all-zero block, negative zeros."""
    rng = np.random.default_rng(tokens)
    x = (rng.standard_normal((tokens, 256)) * 10.0 ** rng.uniform(-3, 3, size=(tokens, 8)).repeat(32, axis=1)).astype(
        np.float32
    )
    x[0, :32] = 0.0
    x[-1, 32:40] = -0.0
    y = cuda_emulation.matvec_q(x, identity_int8(256), None)
    expected = quantized_activations(torch.from_numpy(x)).numpy()
    assert np.array_equal(y.view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_a_non_finite_activation_makes_every_product_of_its_token_nan(fmt, tokens):
    """A NaN or an infinity in x gives its block a NaN factor, as in the CPU kernels: every output of that token is
    NaN (not a finite number that hides it), and the other tokens' are untouched."""
    rng = np.random.default_rng(7)
    matrix = quant.quantize(rng.standard_normal((9, 320)), fmt, 32)
    for value in (np.nan, np.inf, -np.inf):
        x = rng.standard_normal((tokens, 320)).astype(np.float32)
        x[0, 300] = value
        y = cuda_emulation.matvec_q(x, matrix, None)
        assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()


def test_emulation_refuses_what_the_launchers_refuse():
    rng = np.random.default_rng(0)
    matrix = dataclasses.replace(quant.quantize(rng.standard_normal((8, 96)), "int8", 32), group_size=64)
    with pytest.raises(ValueError, match="refused"):
        cuda_emulation.matvec_q(np.zeros((1, 96), np.float32), matrix, None)  # 96 is no multiple of 64
