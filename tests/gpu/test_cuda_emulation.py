"""The quantized CUDA kernels' indexing, checked on the host: their emulation (cuda_emulation.cu, every block, warp,
lane and thread through the kernels' own __host__ __device__ functions) against the reference on the dequantized rows
and on the x they compute with (edge_matvec_q: quantized_activations(x); edge_matvec_q_t: x itself).

Needs nvcc, not a GPU. The quantized SparseFFN's cases are rows of the op table (tests/ops, implementation
`cuda_emulation`); here: the dense edge_matvec_q on both of its paths (one warp per row up to 4 tokens, the tiled
GEMM beyond) with partial tiles, and that the reading of the codes is the format's and no other. Asymmetric int4 rows
(group minimums) on all three launchers: within the bounds edge_cuda_kernels.h declares for them, on rows where every
wrong reading of the minimums (asymmetric_rows.py) misses the reference by far, and with mids of zero the symmetric
kernels' values exactly. int8 down rows under int4 gate and up rows (edge_sparse_ffn_q's down_format, OPS.md's
down_weight_format "int8"), symmetric and asymmetric: within the bounds, far from wrong readings of the down rows, and,
where the int8 codes are an int4 matrix's, the all-int4 launch's values to the bit.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant
from edge_sdk.export.ops import error_bound

from ..asymmetric_rows import (
    ACTIVATIONS,
    assert_asymmetric_bounds,
    asymmetric_ffn_case,
    asymmetric_matrix,
    ffn_reference,
    with_zero_mids,
    wrong_dequantizations,
)
from . import cuda_emulation
from .down_rows import int8_copy, mixed_ffn_case, wrong_int8_down_readings

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


# ---- asymmetric int4 (group minimums, llama.cpp's Q4_1 grid: value = (code + 8) * scale + min; asymmetric_rows.py) ---


# tokens: 1 (lane_row_dot_planes), 2 and 4 (lane_row_dot_tokens_planes), 5 and 37 (the tiled GEMM staging the
# dequantized rows); 416 = 13 blocks of 32 (a partial round of lane loads), 384 = three groups of 128
@pytest.mark.parametrize("tokens", [1, 2, 4, 5, 37])
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_asymmetric_matvec_emulation_matches_the_reference(tokens, group_size):
    """edge_matvec_q over asymmetric int4 rows: the reference on the dequantized rows and quantized_activations(x),
    within both bounds, and far from every wrong reading of the minimums."""
    rng = np.random.default_rng(tokens * 10 + group_size)
    n_in = 416 if group_size == 32 else 384
    matrix = asymmetric_matrix(77, n_in, group_size, seed=tokens + group_size)
    x = rng.standard_normal((tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(77).astype(np.float32)
    weights = quant.dequantize(matrix).astype(np.float64)
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    expected = x_used @ weights.T + bias
    bound = error_bound("QuantizedMatMul", "int4")
    products = np.abs(x_used) @ np.abs(weights).T
    assert_asymmetric_bounds(cuda_emulation.matvec_q(x, matrix, bias), expected, products, bound)
    for what, wrong in wrong_dequantizations(matrix).items():
        assert relative_error(x_used @ wrong.T + bias, expected) > DISCRIMINATION * bound, f"a kernel that {what}"


# edge_matvec_q_t over W [in, out] quantized along its rows, x in fp32: in not a multiple of the 32-row step (300)
@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("group_size, n_out", [(32, 96), (64, 384), (128, 384)])
@pytest.mark.parametrize("n_in", [300, 64])
def test_asymmetric_transposed_matvec_emulation_matches_the_reference(tokens, group_size, n_out, n_in):
    rng = np.random.default_rng(tokens + n_out + n_in)
    matrix = asymmetric_matrix(n_in, n_out, group_size, seed=group_size + n_in)
    x = rng.standard_normal((tokens, n_in)).astype(np.float32)
    weights = quant.dequantize(matrix).astype(np.float64)
    expected = x.astype(np.float64) @ weights
    bound = error_bound("QuantizedMatMul", "int4")
    products = np.abs(x.astype(np.float64)) @ np.abs(weights)
    assert_asymmetric_bounds(cuda_emulation.matvec_q(x, matrix, None, transposed=False), expected, products, bound)
    for what, wrong in wrong_dequantizations(matrix).items():
        assert relative_error(x.astype(np.float64) @ wrong, expected) > DISCRIMINATION * bound, f"a kernel that {what}"


# d: one whole tile of the down kernel (1024 int4 columns) and a partial one, or SmolLM2's width (576: a partial round
# of lane loads); D: several chunks of 64 rows and a partial one
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize(
    "d, n_neurons, group_size", [(1152, 301, 32), (1152, 301, 64), (1152, 301, 128), (576, 150, 64)]
)
def test_asymmetric_sparse_ffn_emulation_matches_the_reference(activation, d, n_neurons, group_size):
    """Masked and dense (no mask): the reference on the dequantized rows and quantized_activations(x), the same active
    neurons, within both bounds, and far from what a wrong reading of the minimums in any of gate, up or down gives."""
    act = ACTIVATIONS[activation]
    x, matrices, random_mask = asymmetric_ffn_case(d, n_neurons, group_size, act, seed=d + group_size)
    rows = [quant.dequantize(m).astype(np.float64) for m in matrices]
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    bound = error_bound("QuantizedSparseFFN", "int4")
    for mask in (random_mask, None):
        reference_mask = np.ones_like(random_mask) if mask is None else mask
        y, active = cuda_emulation.sparse_ffn_q(x, matrices, mask, None, activation, act.threshold)
        expected, expected_active, products_bound = ffn_reference(x_used, rows, reference_mask, act)
        assert np.array_equal(active, expected_active)
        assert expected_active.sum() >= 10  # down rows are summed
        assert relative_error(y, expected) <= bound
        error = np.abs(y.astype(np.float64) - expected)
        assert (error <= products_bound).all(), f"worst error / bound {(error / products_bound).max():.3g}"
        for k, matrix in enumerate(matrices):
            for what, wrong in wrong_dequantizations(matrix).items():
                wrongs = list(rows)
                wrongs[k] = wrong
                miss = relative_error(ffn_reference(x_used, wrongs, reference_mask, act)[0], expected)
                assert miss > DISCRIMINATION * bound, f"a kernel that {what} in matrix {k}"


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_asymmetric_rows_of_mid_zero_give_the_symmetric_kernels_results(tokens, group_size):
    """Minimums of -8 scale (exact in fp16) make every mid 0 and every value code * scale: each path (the FFN,
    edge_matvec_q's one-token and few-token GEMVs and its GEMM, edge_matvec_q_t) gives the symmetric kernels' values
    exactly, so the minimums' terms come on top of the symmetric sums without reordering them."""
    rng = np.random.default_rng(tokens + group_size)
    d = 416 if group_size == 32 else 384

    symmetric = tuple(quant.quantize(rng.standard_normal((130, d)) / d**0.5, "int4", group_size) for _ in range(3))
    asymmetric = tuple(map(with_zero_mids, symmetric))
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    assert np.array_equal(
        cuda_emulation.matvec_q(x, asymmetric[0], None), cuda_emulation.matvec_q(x, symmetric[0], None)
    )
    x_t = rng.standard_normal((tokens, 130)).astype(np.float32)
    transposed = (cuda_emulation.matvec_q(x_t, m, None, transposed=False) for m in (asymmetric[0], symmetric[0]))
    assert np.array_equal(*transposed)
    mask = rng.random((tokens, 130)) < 0.5
    (y, active), (y_symmetric, active_symmetric) = (
        cuda_emulation.sparse_ffn_q(x, weights, mask, None, "relu", 0.0) for weights in (asymmetric, symmetric)
    )
    assert active.any() and np.array_equal(active, active_symmetric)
    assert np.array_equal(y, y_symmetric)


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_a_non_finite_activation_makes_every_asymmetric_product_of_its_token_nan(tokens):
    """x's block sums carry a non-finite block's NaN factor into the minimums' terms too."""
    rng = np.random.default_rng(8)
    matrix = asymmetric_matrix(9, 320, 32, seed=8)
    for value in (np.nan, np.inf, -np.inf):
        x = rng.standard_normal((tokens, 320)).astype(np.float32)
        x[0, 300] = value
        y = cuda_emulation.matvec_q(x, matrix, None)
        assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()


def test_emulation_refuses_minimums_where_the_launchers_do():
    """Minimums only with int4, and for all three matrices of the FFN or for none (cudaErrorInvalidValue)."""
    rng = np.random.default_rng(1)
    asymmetric = asymmetric_matrix(8, 64, 32, seed=1)
    int8 = quant.quantize(rng.standard_normal((8, 64)), "int8", 32)
    with pytest.raises(ValueError, match="refused"):
        cuda_emulation.matvec_q(np.zeros((1, 64), np.float32), dataclasses.replace(int8, mins=asymmetric.mins), None)
    symmetric = dataclasses.replace(asymmetric, mins=None)
    for weights in ((asymmetric, symmetric, symmetric), (asymmetric, asymmetric, symmetric)):
        with pytest.raises(ValueError, match="refused"):
            cuda_emulation.sparse_ffn_q(np.zeros((1, 64), np.float32), weights, None, None, "relu", 0.0)


# ---- int8 down rows under int4 gate and up rows (edge_sparse_ffn_q: down_format EDGE_Q8, quant_format EDGE_Q4) ---


# tokens 1 and 3; d 1152: two whole 512-column tiles of the int8 down kernel and a partial one (and a whole 1024-column
# int4 tile and a partial one for the gate and up rows' format); D 301: chunks of 64 rows and a partial one
@pytest.mark.parametrize("asymmetric", [False, True], ids=["int4", "int4_asymmetric"])
@pytest.mark.parametrize("activation", ["relu", "silu"])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("tokens", [1, 3])
def test_int8_down_rows_under_int4_gate_and_up_match_the_reference(tokens, group_size, activation, asymmetric):
    """Masked and dense: the reference on the dequantized rows (int4 gate and up, int8 down) and
    quantized_activations(x), the same active neurons, within OPS.md's bound and the products' one edge_cuda_kernels.h
    declares, and far from a reading of the down rows as int4, unsigned or with another group's scale, or (asymmetric)
    of the gate and up rows without their minimums."""
    act = ACTIVATIONS[activation]
    x, matrices, random_mask = mixed_ffn_case(tokens, 1152, 301, group_size, asymmetric, seed=tokens + group_size)
    rows = [quant.dequantize(m).astype(np.float64) for m in matrices]
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    bound = error_bound("QuantizedSparseFFN", "int4_asymmetric" if asymmetric else "int4")
    for mask in (random_mask, None):
        reference_mask = np.ones_like(random_mask) if mask is None else mask
        y, active = cuda_emulation.sparse_ffn_q(x, matrices, mask, None, activation, act.threshold)
        expected, expected_active, products_bound = ffn_reference(x_used, rows, reference_mask, act)
        assert np.array_equal(active, expected_active)
        assert expected_active.sum() >= 10 * tokens  # down rows are summed
        assert relative_error(y, expected) <= bound
        error = np.abs(y.astype(np.float64) - expected)
        assert (error <= products_bound).all(), f"worst error / bound {(error / products_bound).max():.3g}"
        wrongs = {
            f"{what} in w_down_t": (rows[0], rows[1], wrong)
            for what, wrong in wrong_int8_down_readings(matrices[2]).items()
        }
        for k in range(2 if asymmetric else 0):
            for what, wrong in wrong_dequantizations(matrices[k]).items():
                wrongs[f"{what} in matrix {k}"] = tuple(wrong if j == k else rows[j] for j in range(3))
        for what, wrong_rows in wrongs.items():
            miss = relative_error(ffn_reference(x_used, wrong_rows, reference_mask, act)[0], expected)
            assert miss > DISCRIMINATION * bound, f"a kernel that {what}"


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_int8_down_rows_of_int4_codes_give_the_all_int4_results_to_the_bit(tokens, group_size, activation):
    """int8 down rows holding an int4 matrix's codes with its scales: per column the int8 down kernel adds the same
    fmaf(h_i * scale, code) in the same row order as the int4 one, and the gate and up rows are the int4 kernels', so y
    is the all-int4 launch's to the bit; with asymmetric gate and up rows, the all-asymmetric launch's whose down rows
    have mids of zero (with_zero_mids: their correction adds exactly 0)."""
    rng = np.random.default_rng(tokens * 7 + group_size)
    d = 1152
    symmetric = tuple(quant.quantize(rng.standard_normal((301, d)) / d**0.5, "int4", group_size) for _ in range(3))
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    mask = rng.random((tokens, 301)) < 0.5
    down = int8_copy(symmetric[2])
    assert np.array_equal(quant.dequantize(down), quant.dequantize(symmetric[2]))
    asymmetric = tuple(asymmetric_matrix(301, d, group_size, seed=tokens + k) for k in range(2))
    for gate_up, all_int4 in (
        (symmetric[:2], symmetric),
        (asymmetric, (*asymmetric, with_zero_mids(symmetric[2]))),
    ):
        y, active = cuda_emulation.sparse_ffn_q(x, (*gate_up, down), mask, None, activation, 0.0)
        y_int4, active_int4 = cuda_emulation.sparse_ffn_q(x, all_int4, mask, None, activation, 0.0)
        assert active.sum() >= 10 * tokens and np.array_equal(active, active_int4)
        assert np.array_equal(y.view(np.int32), y_int4.view(np.int32))


def test_emulation_refuses_the_format_pairs_the_launcher_refuses():
    """Down rows in the gate and up rows' format, or int8 under int4 (symmetric, or asymmetric without down minimums);
    an int8 gate with int4 down rows, minimums for int8 down rows, or gate minimums without up ones: refused."""
    rng = np.random.default_rng(2)
    int4 = quant.quantize(rng.standard_normal((8, 64)), "int4", 32)
    int8 = quant.quantize(rng.standard_normal((8, 64)), "int8", 32)
    asymmetric = asymmetric_matrix(8, 64, 32, seed=2)
    x = np.zeros((1, 64), np.float32)
    for weights in ((int4, int4, int8), (asymmetric, asymmetric, int8)):
        cuda_emulation.sparse_ffn_q(x, weights, None, None, "relu", 0.0)  # accepted
    int8_with_mins = dataclasses.replace(int8, mins=asymmetric.mins)
    for weights in (
        (int8, int8, int4),
        (asymmetric, asymmetric, int8_with_mins),
        (asymmetric, int4, int8),
        (int4, asymmetric, int8),
    ):
        with pytest.raises(ValueError, match="refused"):
            cuda_emulation.sparse_ffn_q(x, weights, None, None, "relu", 0.0)
