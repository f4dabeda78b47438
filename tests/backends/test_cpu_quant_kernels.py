"""Quantized rows (edge_sdk/quant.py, kernels/cpu/QUANT.md): the format's round trip, and the CPU kernels
edge_cpu_sparse_ffn_q / edge_cpu_matvec_q beyond the op table (tests/ops: their values on every op case, with x
quantized to two int8 planes for integer dot products, the default, and with x in fp32,
EDGE_SDK_QUANT_ACTIVATIONS=fp32): thread counts, rows ending in a partial unit, non-finite activations, the
activations' bound, scales and nibbles in the wrong place, bad arguments."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
import torch

from edge_sdk import quant
from edge_sdk.export.ops import error_bound
from edge_sdk.native import NativeLibraryError, load_cpu_kernels
from edge_sdk.sparsity.ffn import sparse_ffn

try:
    load_cpu_kernels()
except (NativeLibraryError, OSError) as error:  # the package build must have compiled it; say why if not
    pytest.skip(f"CPU kernel library not loadable: {error}", allow_module_level=True)

from edge_sdk.backends.cpu import kernels
from edge_sdk.backends.cpu.kernels import QuantizedWeight, SparseFFNKernel, quantized_activations

from edge_sdk.native import ACTIVATIONS_ENV

from ..asymmetric_rows import ACTIVATIONS, ASYMMETRIC_RTOL, SILU_SLOPE, asymmetric_matrix, wrong_dequantizations

# Kernel bound, declared in ops.ERROR_BOUNDS (the same for int8 and int4, SparseFFN and MatVec): max |y - y_ref| <=
# KERNEL_RTOL * max |y_ref|, y_ref on the dequantized weights and on the x the kernel computes with
# (quantized_activations(x) for the integer dot products): the same real numbers in another fp32 order.
KERNEL_RTOL = error_bound("QuantizedSparseFFN", "int8")
# Activation bound (QUANT.md): each value of x enters the integer dot products within ACTIVATION_STEP times its
# block's scale (max |x| / 127 over its 32 values; 1/512 but where the low code clamps), plus float32 rounding of the
# value itself. A dot product's bound follows: sum over j of |w_j| * ACTIVATION_STEP * scale of x_j's block.
ACTIVATION_STEP = 1 / 256
# Round trip, per value, in units of its group's scale s: int8 rounds to the nearest code, |w - w_hat| <= s / 2;
# int4 too except for values beyond +7.5 s (only the positive side of a group whose extreme is negative, or the
# other way round), clamped to code 7: |w - w_hat| <= s. The extra 1e-6 is float64 rounding of w / s.
INT8_ROUND_TRIP = 0.5 + 1e-6
INT4_ROUND_TRIP = {"rounded": 0.5 + 1e-6, "clamped": 1.0 + 1e-6}
# Scales are rounded to fp16 away from zero: at most one fp16 step above the ideal max / code, relative 2^-10 for
# normal halves, absolute 2^-24 for subnormal ones.
SCALE_ROUNDING = 2.0**-10
SUBNORMAL_STEP = 2.0**-24

FORMATS = quant.FORMATS
GROUP_SIZES = quant.GROUP_SIZES


@pytest.fixture(params=["integer", "fp32"])
def kernel_x(request, monkeypatch):
    """Runs a kernel test with each way of dotting quantized rows with x; returns the x the kernels compute with."""
    if request.param == "fp32":
        monkeypatch.setenv(ACTIVATIONS_ENV, "fp32")
        return lambda x: x
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    return quantized_activations


def random_weights(shape, seed, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale


def quantized_ffn(d, n_neurons, format, group_size, seed):
    """x [d] and the gate, up, down_t [D, d] weights quantized, plus their dequantized fp32 torch tensors."""
    x = torch.from_numpy(random_weights(d, seed))
    matrices = [
        quant.quantize(random_weights((n_neurons, d), seed + k + 1, d**-0.5), format, group_size) for k in range(3)
    ]
    return (
        x,
        [QuantizedWeight.from_matrix(m) for m in matrices],
        [torch.from_numpy(quant.dequantize(m)) for m in matrices],
    )


# ---- the format -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("format", FORMATS)
def test_round_trip_error_is_within_the_format_bound(format, group_size):
    weight = random_weights((40, 512), seed=group_size, scale=0.02)
    weight[3, :group_size] = 0.0  # an all-zero group: scale 0, exact zeros back
    weight[5, 7] = 3.0  # an outlier: its group's scale grows, the others' do not
    weight[6, :group_size] *= 1e-4  # a group whose scale is an fp16 subnormal
    matrix = quant.quantize(weight, format, group_size)
    restored = quant.dequantize(matrix)
    assert restored.dtype == np.float32 and restored.shape == weight.shape
    scales = np.repeat(np.abs(matrix.scales.astype(np.float64)), group_size, axis=1)
    error = np.abs(restored.astype(np.float64) - weight)
    groups = np.abs(weight.astype(np.float64)).reshape(40, -1, group_size).max(axis=2)
    extreme_code = 127 if format == "int8" else 8
    ideal = groups / extreme_code
    found = np.abs(matrix.scales.astype(np.float64))
    assert np.all(found >= ideal) and np.all(found <= ideal + np.maximum(ideal * SCALE_ROUNDING, SUBNORMAL_STEP))
    assert np.all(restored[3, :group_size] == 0.0) and np.all(matrix.scales[3, 0] == 0)
    if format == "int8":
        assert np.all(error <= INT8_ROUND_TRIP * scales)
        assert np.abs(matrix.data).max() == 127 and matrix.data.min() >= -127
    else:
        with np.errstate(divide="ignore", invalid="ignore"):  # the all-zero group: 0 / 0, not clamped
            codes_ideal = weight / np.repeat(matrix.scales.astype(np.float64), group_size, axis=1)
        clamped = codes_ideal > 7.5
        assert np.all(error[~clamped] <= INT4_ROUND_TRIP["rounded"] * scales[~clamped])
        assert np.all(error[clamped] <= INT4_ROUND_TRIP["clamped"] * scales[clamped])
        codes = quant.unpack_int4(matrix.data)
        assert codes.min() == -8 and codes.max() <= 7  # the extreme of each group takes code -8
    # the outlier takes the extreme code (off by the scale's fp16 rounding only); the next group keeps a fine scale
    assert error[5, 7] <= 3.0 * SCALE_ROUNDING
    assert abs(float(matrix.scales[5, 1])) < 0.1 / extreme_code
    relative = np.sqrt((error[7:] ** 2).mean() / (weight[7:] ** 2).mean())
    assert relative < (0.008 if format == "int8" else 0.12)


def signed_nibble(nibble: int) -> int:
    """The code a stored nibble holds: its 4-bit two's complement (QUANT.md)."""
    return nibble - 16 if nibble >= 8 else nibble


def test_int4_nibble_order_is_value_k_low_and_k_plus_16_high():
    codes = np.arange(64, dtype=np.int64).reshape(1, 64) % 16 - 8
    codes[0, 16:32] = -codes[0, 16:32] - 1  # high halves differ from the low ones
    codes = codes.astype(np.int8)
    packed = quant.pack_int4(codes)
    assert packed.shape == (1, 32) and packed.dtype == np.uint8
    for block in range(2):
        for k in range(16):
            low, high = int(codes[0, 32 * block + k]) & 0xF, int(codes[0, 32 * block + 16 + k]) & 0xF
            assert packed[0, 16 * block + k] == low | (high << 4)
    # two's complement nibbles: 0 -> 0x0, 7 -> 0x7, -1 -> 0xF, -8 -> 0x8 (not code + 8)
    edges = np.zeros((1, 32), dtype=np.int8)
    edges[0, [0, 1, 2, 3]] = [0, 7, -1, -8]
    edges[0, 16] = -1
    assert quant.pack_int4(edges)[0, :4].tolist() == [0xF0, 0x07, 0x0F, 0x08]
    assert np.array_equal(quant.unpack_int4(packed), codes)
    every_byte = np.arange(256, dtype=np.uint8).reshape(8, 32)
    unpacked = quant.unpack_int4(every_byte)
    for byte in range(256):
        row, k = divmod(byte, 32)
        block, within = divmod(k, 16)
        low, high = unpacked[row, 32 * block + within], unpacked[row, 32 * block + 16 + within]
        assert (low, high) == (signed_nibble(byte & 0xF), signed_nibble(byte >> 4))
    assert np.array_equal(quant.pack_int4(unpacked), every_byte)


def test_quantize_hand_computed_int8_and_int4():
    weight = np.zeros((1, 32), dtype=np.float32)
    weight[0, :4] = [1.27, -0.635, 0.004, -1.0]
    int8 = quant.quantize(weight, "int8", 32)
    assert float(int8.scales[0, 0]) == pytest.approx(0.01, rel=1e-3) and float(int8.scales[0, 0]) >= 0.01
    assert int8.data[0, :4].tolist() == [127, -63, 0, -100]
    weight[0, :4] = [-2.0, 1.0, 2.0, 0.1]
    int4 = quant.quantize(weight, "int4", 32)
    assert float(int4.scales[0, 0]) == 0.25  # -(-2.0) / 8, exact in fp16
    assert quant.unpack_int4(int4.data)[0, :4].tolist() == [-8, 4, 7, 0]  # 2.0 / 0.25 = 8 clamps to 7


@pytest.mark.parametrize(
    ("weight", "format", "group_size", "message"),
    [
        (np.zeros((2, 48)), "int8", 32, "multiple of group_size"),
        (np.zeros((2, 64)), "int3", 32, "format"),
        (np.zeros((2, 64)), "int8", 16, "group_size"),
        (np.full((2, 64), np.nan), "int4", 32, "finite"),
        (np.full((2, 64), 1e7), "int8", 32, "fp16"),
        (np.zeros(64), "int8", 32, "2-D"),
    ],
)
def test_quantize_rejects_bad_input(weight, format, group_size, message):
    with pytest.raises(ValueError, match=message):
        quant.quantize(weight, format, group_size)


# ---- the kernels ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("format", FORMATS)
def test_sparse_ffn_is_bit_identical_across_thread_counts(format, kernel_x):
    d, n_neurons = 1024, 700  # several gate chunks per thread (32 to 53 candidates), several down column blocks
    x, weights, dequantized = quantized_ffn(d, n_neurons, format, 32, seed=5)
    mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(6)) < 0.6
    relu = ACTIVATIONS["relu"]
    runs = [SparseFFNKernel(d, n_neurons, threads).quantized(x, *weights, relu, mask=mask) for threads in (1, 2, 4, 2)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    reference = sparse_ffn(kernel_x(x), *dequantized, mask, relu).output
    assert (runs[0] - reference).abs().max() <= KERNEL_RTOL * reference.abs().max()


@pytest.mark.parametrize("format", FORMATS)
def test_matvec_is_bit_identical_across_threads_and_rows(format, kernel_x):
    matrix = quant.quantize(random_weights((301, 512), seed=9), format, 128)
    weight = QuantizedWeight.from_matrix(matrix)
    x = torch.from_numpy(random_weights(512, seed=10))
    runs = [kernels.matvec_quantized(x, weight, threads=threads) for threads in (1, 2, 4, 0)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    for row in (0, 150, 300):  # a row's value is its own dot product, whichever other rows are computed
        alone = QuantizedWeight(format, 128, weight.data[row : row + 1], weight.scales[row : row + 1])
        assert torch.equal(kernels.matvec_quantized(x, alone), runs[0][row : row + 1])


@pytest.mark.parametrize("storage", ["int8", "int4", "fp16", "fp32"])
def test_matvecs_equal_each_matvec_alone_for_any_split(storage, kernel_x):
    """A token's q, k and v in one call (edge_cpu_matvecs): each output is, bit for bit, the matvec of its matrix
    alone, whichever thread's run of rows crosses a matrix's end (37, 5 and 19 rows over 1 to 4 threads), with a
    bias on some matrices."""
    d, row_counts = 576, (37, 5, 19)
    x = torch.from_numpy(random_weights(d, seed=21))
    matrices = [random_weights((rows, d), seed=22 + i, scale=d**-0.5) for i, rows in enumerate(row_counts)]
    biases = [
        torch.from_numpy(random_weights(rows, seed=30 + i)) if i != 1 else None for i, rows in enumerate(row_counts)
    ]
    if storage in FORMATS:
        weights = [QuantizedWeight.from_matrix(quant.quantize(m, storage, 64)) for m in matrices]
        expected = [kernels.matvec_quantized(x, w, b) for w, b in zip(weights, biases, strict=True)]
    else:
        dtype = torch.float16 if storage == "fp16" else torch.float32
        weights = [torch.from_numpy(m).to(dtype) for m in matrices]
        expected = [kernels.matvec(x, w, b) for w, b in zip(weights, biases, strict=True)]
    assert expected[0].abs().max() > 0.1  # real dot products, not zeros
    for threads in (1, 2, 3, 4):
        found = kernels.matvecs(x, weights, biases, threads=threads)
        assert [f.shape for f in found] == [e.shape for e in expected]
        assert all(torch.equal(f, e) for f, e in zip(found, expected, strict=True)), f"threads={threads}"


def test_matvecs_refuse_matrices_of_different_storage():
    """One call takes one storage type and group size: the binding says so, and the C kernel returns
    EDGE_CPU_INVALID_ARGUMENT without writing any output."""
    x = torch.from_numpy(random_weights(64, seed=40))
    weights = [
        QuantizedWeight.from_matrix(quant.quantize(random_weights((4, 64), seed=41), "int8", g)) for g in (32, 64)
    ]
    with pytest.raises(ValueError, match="one storage type and group size"):
        kernels.matvecs(x, weights)
    with pytest.raises(ValueError, match="one storage type and group size"):
        kernels.matvecs(x, [weights[0], torch.zeros(4, 64)])
    outputs = [torch.full((4,), 7.0), torch.full((4,), 7.0)]
    matrices = (kernels._Matrix * 2)(
        *[
            kernels._Matrix(w.data.data_ptr(), w.scales.data_ptr(), None, 2, w.group_size, 4, None, y.data_ptr())
            for w, y in zip(weights, outputs, strict=True)
        ]
    )
    assert kernels._library().edge_cpu_matvecs(x.data_ptr(), 64, matrices, 2, 1) == 1
    assert all(torch.equal(y, torch.full((4,), 7.0)) for y in outputs)
    assert kernels._library().edge_cpu_matvecs(x.data_ptr(), 64, matrices, 1, 1) == 0  # the first alone is valid
    assert torch.equal(outputs[0], kernels.matvec_quantized(x, weights[0]))


def test_kernels_read_int4_bytes_as_signed_nibbles(kernel_x):
    """Rows of every byte value, built here from the format's definition rather than by quant.pack_int4: the matvec
    and the sparse FFN (gate, up and down rows) compute with code = the nibble's two's complement."""
    d, n_neurons, group_size = 128, 32, 32
    rng = np.random.default_rng(21)
    matrices, dequantized = [], []
    for k in range(3):
        data = rng.permutation(np.arange(n_neurons * d // 2) % 256).astype(np.uint8).reshape(n_neurons, d // 2)
        codes = np.empty((n_neurons, d), dtype=np.float32)
        for column in range(d):
            block, within = divmod(column, 32)
            byte = data[:, 16 * block + within % 16].astype(np.int64)
            codes[:, column] = [signed_nibble(int(b)) for b in (byte & 0xF if within < 16 else byte >> 4)]
        scales = (rng.uniform(0.5, 1.0, (n_neurons, d // group_size)) * d**-0.5).astype(np.float16)
        scales[k] *= -1  # a negative scale: the sign is the scale's, not the code's
        matrices.append(QuantizedWeight("int4", group_size, torch.from_numpy(data), torch.from_numpy(scales)))
        weight = codes * np.repeat(scales.astype(np.float32), group_size, axis=1)
        dequantized.append(torch.from_numpy(weight))
    x = torch.from_numpy(random_weights(d, seed=22))
    expected = dequantized[0].double() @ kernel_x(x).double()
    found = kernels.matvec_quantized(x, matrices[0]).double()
    assert (found - expected).abs().max() <= KERNEL_RTOL * expected.abs().max()
    mask = torch.ones(n_neurons, dtype=torch.bool)
    relu = ACTIVATIONS["relu"]
    output = SparseFFNKernel(d, n_neurons).quantized(x, *matrices, relu, mask=mask)
    reference = sparse_ffn(kernel_x(x), *dequantized, mask, relu).output
    assert (output - reference).abs().max() <= KERNEL_RTOL * reference.abs().max()


def test_a_scale_or_code_in_the_wrong_place_is_caught():
    """Swapping two groups' scales or a row's nibble halves changes the output far beyond the bound."""
    x, weights, _ = quantized_ffn(256, 64, "int4", 32, seed=12)
    reference = kernels.matvec_quantized(x, weights[0])
    swapped_scales = weights[0].scales.clone()
    swapped_scales[:, [0, 1]] = swapped_scales[:, [1, 0]]
    swapped = QuantizedWeight("int4", 32, weights[0].data, swapped_scales)
    assert (kernels.matvec_quantized(x, swapped) - reference).abs().max() > 100 * KERNEL_RTOL * reference.abs().max()
    nibbles_swapped = (weights[0].data >> 4) | (weights[0].data << 4)
    flipped = QuantizedWeight("int4", 32, nibbles_swapped, weights[0].scales)
    assert (kernels.matvec_quantized(x, flipped) - reference).abs().max() > 100 * KERNEL_RTOL * reference.abs().max()


def test_bindings_reject_bad_quantized_weights():
    x, weights, _ = quantized_ffn(128, 16, "int8", 32, seed=13)
    kernel = SparseFFNKernel(128, 16)
    relu = ACTIVATIONS["relu"]
    int4 = QuantizedWeight("int4", 32, torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(16, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="w_up: expected format int8"):
        kernel.quantized(x, weights[0], int4, weights[2], relu)
    with pytest.raises(ValueError, match=r"w_gate\.data"):
        kernel.quantized(x, QuantizedWeight("int8", 32, int4.data, int4.scales), *weights[1:], relu)
    with pytest.raises(ValueError, match="scales"):
        kernels.matvec_quantized(x, QuantizedWeight("int8", 64, weights[0].data, weights[0].scales))
    with pytest.raises(ValueError, match="QuantizedWeight"):
        kernels.matvec_quantized(x, weights[0].data)


def test_c_kernels_return_an_error_status_for_invalid_arguments():
    library = load_cpu_kernels()
    library.edge_cpu_matvec_q.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    x = torch.zeros(64)
    codes = torch.zeros(4, 64, dtype=torch.int8)
    scales = torch.zeros(4, 2, dtype=torch.float16)
    y = torch.full((4,), 7.0)
    valid = (x.data_ptr(), 64, 4, codes.data_ptr(), scales.data_ptr(), None, 2, 32, None, y.data_ptr(), 1)
    assert library.edge_cpu_matvec_q(*valid) == 0 and torch.equal(y, torch.zeros(4))
    y.fill_(7.0)
    # no scales, fp16, bad groups, minimums for int8 rows
    for position, bad in [(4, None), (6, 1), (6, 4), (7, 48), (7, 0), (1, 48), (5, scales.data_ptr())]:
        arguments = list(valid)
        arguments[position] = bad
        assert library.edge_cpu_matvec_q(*arguments) == 1
    assert torch.equal(y, torch.full((4,), 7.0))  # nothing written on failure


# ---- the integer dot products' activations ------------------------------------------------------------------


def block_scales(x):
    """[n] the scale of each value's block of 32 (max |x| / 127), float64."""
    blocks = x.double().reshape(-1, kernels.ACTIVATION_BLOCK).abs().amax(dim=1) / 127
    return blocks.repeat_interleave(kernels.ACTIVATION_BLOCK)


def test_quantized_activations_hand_computed_and_used_exactly_by_the_kernels(monkeypatch):
    """A block whose scale is 1: x = high + low / 256 with the clamped ties, and a row of codes 1 at scale 1 sums
    exactly those values (both planes, the low one's weight 1/256)."""
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    x = torch.zeros(64)
    x[:5] = torch.tensor([127.0, 1.3, -0.5, 2.5, 0.25])
    expected = [127.0, 1 + 77 / 256, -127 / 256, 2 + 127 / 256, 0.25]  # -0.5, 2.5: ties, low code clamped to 127
    assert quantized_activations(x)[:5].tolist() == expected
    assert torch.equal(quantized_activations(x)[5:], torch.zeros(59))
    codes = torch.zeros(1, 64, dtype=torch.int8)
    codes[0, :5] = 1
    scales = torch.ones(1, 2, dtype=torch.float16)
    for format in FORMATS:
        data = codes if format == "int8" else torch.from_numpy(quant.pack_int4(codes.numpy()))
        weight = QuantizedWeight(format, 32, data, scales)
        assert kernels.matvec_quantized(x, weight).item() == sum(expected)
    monkeypatch.setenv(ACTIVATIONS_ENV, "fp32")
    assert kernels.matvec_quantized(x, weight).item() == pytest.approx(130.55, abs=1e-5)


def test_the_kernels_quantize_x_to_the_mirrors_bits(monkeypatch):
    """Through W = I (int8 codes 1 on the diagonal, scales 1) the integer matvec returns the x it computes with:
    quantized_activations(x) to the bit, over blocks of magnitudes 1e-3 to 1e3 (its division 127 / max|x| is one
    IEEE division, as the kernels'; torch's `127.0 / tensor` rounds twice and missed them in about one block in
    four)."""
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    generator = torch.Generator().manual_seed(3)
    n = 2048
    x = torch.randn(n, generator=generator) * (
        10.0 ** (6 * torch.rand(n // 32, generator=generator) - 3)
    ).repeat_interleave(32)
    x[:32] = 0.0
    identity = QuantizedWeight("int8", 32, torch.eye(n, dtype=torch.int8), torch.ones(n, n // 32, dtype=torch.float16))
    assert torch.equal(
        kernels.matvec_quantized(x, identity).view(torch.int32), quantized_activations(x).view(torch.int32)
    )


def test_quantized_activations_are_within_the_declared_bound():
    x = torch.from_numpy(random_weights(1024, seed=20))
    x[32:64] = 0.0  # an all-zero block stays zero
    x[64:96] *= 1e-30  # tiny values keep their relative precision: the scale is per block
    x[100] = 1e4  # an outlier coarsens its own block only
    found = quantized_activations(x)
    error = (found.double() - x.double()).abs()
    assert torch.all(error <= ACTIVATION_STEP * block_scales(x) + 2.0**-24 * x.double().abs())
    assert torch.equal(found[32:64], torch.zeros(32))
    assert error[:32].max() > 0  # quantized: a wrong path that passes x through is not mistaken for this one
    assert (error[:32] / block_scales(x)[:32]).max() < 1 / 256 + 1e-6


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("format", FORMATS)
def test_integer_matvec_against_unquantized_x_is_within_the_activation_bound(format, group_size, monkeypatch):
    """The default (integer) matvec against the dequantized rows times x itself: off by the activations' bound, and
    off at all (the kernel does quantize x)."""
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    matrix = quant.quantize(random_weights((200, 1024), seed=21), format, group_size)
    x = torch.from_numpy(random_weights(1024, seed=22))
    dequantized = torch.from_numpy(quant.dequantize(matrix)).double()
    exact = dequantized @ x.double()
    found = kernels.matvec_quantized(x, QuantizedWeight.from_matrix(matrix)).double()
    bound = dequantized.abs() @ (ACTIVATION_STEP * block_scales(x)) + KERNEL_RTOL * exact.abs().max()
    assert torch.all((found - exact).abs() <= bound)
    assert (found - exact).abs().max() > 1e-3 * KERNEL_RTOL * exact.abs().max()


@pytest.mark.parametrize("format", FORMATS)
def test_rows_ending_in_a_partial_unit(format, kernel_x):
    """The integer path sums units of 16 lanes, 2 blocks of 32 values (INT8) or 4 (INT4): rows of 1, 2 or 3 blocks
    beyond whole units end in a partial unit, at group size 32 and at 64 (whose groups then straddle the unit's
    blocks). 4128 and more inputs also take the matvec's heap buffer for x's planes (more than 4096)."""
    for n_in, group_size in [(32, 32), (64, 32), (96, 32), (2080, 32), (2144, 32), (4128, 32), (4192, 32), (192, 64),
                             (4288, 64)]:  # fmt: skip
        matrix = quant.quantize(random_weights((33, n_in), seed=n_in), format, group_size)
        x = torch.from_numpy(random_weights(n_in, seed=23))
        expected = torch.from_numpy(quant.dequantize(matrix)).double() @ kernel_x(x).double()
        found = kernels.matvec_quantized(x, QuantizedWeight.from_matrix(matrix))
        assert (found.double() - expected).abs().max() <= KERNEL_RTOL * expected.abs().max()


@pytest.mark.parametrize("format", FORMATS)
def test_a_non_finite_activation_makes_every_dot_product_nan(format, kernel_x):
    """A NaN or an infinity in x: no row's product is finite, as in fp32 arithmetic (the integer path gives the
    value's block a NaN scale, so its products are NaN), rather than a finite number that hides it."""
    matrix = QuantizedWeight.from_matrix(quant.quantize(random_weights((9, 320), seed=30), format, 32))
    for value in (float("nan"), float("inf"), float("-inf")):
        x = torch.from_numpy(random_weights(320, seed=31))
        x[300] = value  # in the last, partial, INT4 unit
        found = kernels.matvec_quantized(x, matrix)
        assert not torch.isfinite(found).any()
        if kernel_x is quantized_activations:
            assert torch.isnan(found).all()


# ---- asymmetric int4 (Q4_1's grid: value = (code + 8) * scale + min) -------------------------------------------

# Declared in edge_cpu_kernels.h: a dot product over asymmetric rows is within ASYMMETRIC_RTOL times the largest
# sum_j |w_hat_j x_j| of its matrix (the rows' products before they cancel) of the float64 dot of the dequantized row
# with the x the kernel computes with. The FFN's bound adds the gate and up rows' errors carried through h: the
# reference's |delta h_i| <= ASYMMETRIC_RTOL (|a_i| S_up_i + |u_i| S_gate_i) (S the row's sum of |w x|, the activation's
# slope at most 1.1), times |w_down_i|, plus ASYMMETRIC_RTOL sum_i |h_i w_down_i|, per column. The rows, their wrong
# readings and the bound's constants are tests/asymmetric_rows.py's, shared with the CUDA kernels' tests.


def rows_of(weight, first, last):
    """Rows [first, last) of a QuantizedWeight, minimums included."""
    mins = None if weight.mins is None else weight.mins[first:last]
    return QuantizedWeight(weight.format, weight.group_size, weight.data[first:last], weight.scales[first:last], mins)


def assert_asymmetric_dot_bound(found, dequantized, x):
    """found [rows] against dequantized [rows, n] float64 rows and the x [n] the kernel computes with."""
    exact = dequantized.double() @ x.double()
    scale = float((dequantized.double().abs() @ x.double().abs()).max())
    error = float((found.double() - exact).abs().max())
    assert error <= ASYMMETRIC_RTOL * scale, f"max |y - y_ref| = {error:.3g} > {ASYMMETRIC_RTOL} * {scale:.3g}"
    return exact, scale


@pytest.mark.parametrize(("n_in", "group_size"), [(576, 32), (576, 64), (4096, 32), (4096, 128), (4192, 32), (416, 32)])
def test_asymmetric_matvec_is_within_its_bound(n_in, group_size, kernel_x):
    """SmolLM2's width (576: a partial last unit and step), LLaMA-2-7B's (4096), a heap-buffered x (4192 > 4096)."""
    matrix = asymmetric_matrix(77, n_in, group_size, seed=n_in + group_size)
    weight = QuantizedWeight.from_matrix(matrix)
    assert weight.asymmetric and weight.mins.dtype == torch.float16
    x = torch.from_numpy(random_weights(n_in, seed=50))
    dequantized = torch.from_numpy(quant.dequantize(matrix))
    found = kernels.matvec_quantized(x, weight)
    exact, scale = assert_asymmetric_dot_bound(found, dequantized, kernel_x(x))
    for what, wrong in wrong_dequantizations(matrix).items():  # such kernels would miss the bound by far
        miss = float((torch.from_numpy(wrong).double() @ kernel_x(x).double() - exact).abs().max())
        assert miss > 1000 * ASYMMETRIC_RTOL * scale, f"a kernel that {what} would pass"
    # with a bias, and the same bits for any thread count and with every row alone (a 4-row group or a single row)
    bias = torch.from_numpy(random_weights(77, seed=51))
    runs = [kernels.matvec_quantized(x, weight, bias, threads=threads) for threads in (1, 2, 3)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    assert torch.equal(runs[0], kernels.matvec_quantized(x, weight) + bias)
    for first, last in ((0, 1), (3, 4), (4, 5), (76, 77), (1, 6), (2, 11)):  # alone, or in other 4-row groups
        assert torch.equal(kernels.matvec_quantized(x, rows_of(weight, first, last)), found[first:last])


def test_asymmetric_rows_equal_their_symmetric_part_plus_the_minimums(kernel_x):
    """Minimums all zero: (code + 8) * scale, i.e. the symmetric kernel's codes + 8; the kernel's two forms agree
    within the bound, and an asymmetric row of constant minimums m adds m * sum(x) exactly as the reference."""
    matrix = asymmetric_matrix(40, 256, 32, seed=60)
    x = torch.from_numpy(random_weights(256, seed=61))
    zero_mins = dataclasses.replace(matrix, mins=np.zeros_like(matrix.mins))
    found = kernels.matvec_quantized(x, QuantizedWeight.from_matrix(zero_mins))
    assert_asymmetric_dot_bound(found, torch.from_numpy(quant.dequantize(zero_mins)), kernel_x(x))
    constant = dataclasses.replace(matrix, mins=np.full_like(matrix.mins, 0.5))
    found = kernels.matvec_quantized(x, QuantizedWeight.from_matrix(constant))
    assert_asymmetric_dot_bound(found, torch.from_numpy(quant.dequantize(constant)), kernel_x(x))


def test_asymmetric_and_symmetric_matrices_share_a_matvecs_call(kernel_x):
    """edge_cpu_matvecs: each matrix its own minimums (or none), each output the bits of its matvec alone."""
    d, row_counts = 576, (37, 5, 19)
    x = torch.from_numpy(random_weights(d, seed=70))
    weights = [
        QuantizedWeight.from_matrix(asymmetric_matrix(row_counts[0], d, 64, seed=71)),
        QuantizedWeight.from_matrix(quant.quantize(random_weights((row_counts[1], d), seed=72), "int4", 64)),
        QuantizedWeight.from_matrix(asymmetric_matrix(row_counts[2], d, 64, seed=73)),
    ]
    biases = [None, torch.from_numpy(random_weights(5, seed=74)), None]
    expected = [kernels.matvec_quantized(x, w, b) for w, b in zip(weights, biases, strict=True)]
    for threads in (1, 2, 3):
        found = kernels.matvecs(x, weights, biases, threads=threads)
        assert all(torch.equal(f, e) for f, e in zip(found, expected, strict=True)), f"threads={threads}"


def asymmetric_ffn(d, n_neurons, group_size, seed):
    matrices = [asymmetric_matrix(n_neurons, d, group_size, seed=seed + k) for k in range(3)]
    x = torch.from_numpy(random_weights(d, seed=seed + 10))
    return x, matrices, [torch.from_numpy(quant.dequantize(m)) for m in matrices]


def asymmetric_ffn_bound(x, dequantized, mask, activation):
    """Per column: the declared FFN bound (ASYMMETRIC_RTOL above), from the float64 reference's g, u and h."""
    w_gate, w_up, w_down = (w.double() for w in dequantized)
    x = x.double()
    g, u = w_gate @ x, w_up @ x
    a = activation.gate(g)
    if activation.kind == "drelu":
        u = u.clamp(min=0)
    h = torch.where(mask & (a != 0), a * u, torch.zeros_like(a))
    s_gate, s_up = w_gate.abs() @ x.abs(), w_up.abs() @ x.abs()
    slope = SILU_SLOPE if activation.kind == "silu" else 1.0
    delta_h = ASYMMETRIC_RTOL * (a.abs() * s_up + slope * u.abs() * s_gate)
    delta_h = torch.where(mask, delta_h, torch.zeros_like(delta_h))
    return delta_h @ w_down.abs() + ASYMMETRIC_RTOL * (h.abs() @ w_down.abs())


def masked_and_dense_runs(x, weights, dequantized, act, kernel_x):
    """The quantized FFN kernel (2 threads) and the reference on the dequantized rows, with a random half of the
    neurons masked and with no mask: yields (the reference's mask, the kernel's y, the reference) once both activate
    the same neurons, at least 5 of them (so that down rows are summed)."""
    n_neurons, d = dequantized[0].shape
    random_mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(7)) < 0.5
    kernel = SparseFFNKernel(d, n_neurons, threads=2)
    for mask in (random_mask, None):
        reference_mask = torch.ones(n_neurons, dtype=torch.bool) if mask is None else mask
        active = torch.zeros(n_neurons, dtype=torch.bool)
        found = kernel.quantized(x, *weights, act, mask=mask, active_out=active)
        reference = sparse_ffn(kernel_x(x), *dequantized, reference_mask, act)
        assert torch.equal(active, reference.active)
        assert reference.active.sum() >= 5
        yield reference_mask, found, reference


# SmolLM2's width (576, no multiple of 128) and LLaMA-2-7B's, each with the group sizes that divide it
ASYMMETRIC_FFN_SHAPES = [(576, 300, 32), (576, 300, 64), *((4096, 96, group_size) for group_size in GROUP_SIZES)]


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize(("d", "n_neurons", "group_size"), ASYMMETRIC_FFN_SHAPES)
def test_asymmetric_sparse_ffn_is_within_its_bound(d, n_neurons, activation, group_size, kernel_x):
    """Masked (a random half) and dense (no mask), every activation, group sizes 32 / 64 / 128 at SmolLM2's width and
    LLaMA-2-7B's: the reference on the dequantized rows, the same active neurons, and far from what kernels that
    ignore the minimums or their +8 would give (in any of gate, up or down)."""
    x, matrices, dequantized = asymmetric_ffn(d, n_neurons, group_size, seed=d + group_size)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    act = ACTIVATIONS[activation]
    for reference_mask, found, reference in masked_and_dense_runs(x, weights, dequantized, act, kernel_x):
        bound = asymmetric_ffn_bound(kernel_x(x), dequantized, reference_mask, act)
        error = (found.double() - reference.output.double()).abs()
        assert torch.all(error <= bound), f"worst error / bound {float((error / bound).max()):.3g}"
        for k, matrix in enumerate(matrices):
            for what, wrong in wrong_dequantizations(matrix).items():
                wrongs = list(dequantized)
                wrongs[k] = torch.from_numpy(wrong)
                miss = (sparse_ffn(kernel_x(x), *wrongs, reference_mask, act).output.double() - reference.output).abs()
                assert torch.any(miss > 10 * bound), f"a kernel that {what} in matrix {k} would pass"


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_asymmetric_sparse_ffn_is_bit_identical_across_thread_counts(group_size, kernel_x):
    """Gate chunks and down column blocks split differently for 1, 2 and 3 threads (groups of 64 and 128 straddle
    the 32-column units of the down blocks: each block's correction is its own)."""
    d, n_neurons = 1024, 700
    x, matrices, _ = asymmetric_ffn(d, n_neurons, group_size, seed=80)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(81)) < 0.6
    for activation in (ACTIVATIONS["relu"], ACTIVATIONS["silu"]):
        for m in (mask, None):
            runs = [SparseFFNKernel(d, n_neurons, t).quantized(x, *weights, activation, mask=m) for t in (1, 2, 3, 2)]
            assert all(torch.equal(runs[0], run) for run in runs[1:])


def test_asymmetric_sparse_ffn_rows_do_not_depend_on_the_neurons_beside_them(kernel_x):
    """A neuron's gate and up values (and so which neurons fire) are those of its rows alone: the FFN over one neuron
    equals the FFN over all of them with a mask of that neuron, bit for bit."""
    d, n_neurons = 576, 9
    x, matrices, _ = asymmetric_ffn(d, n_neurons, 32, seed=90)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    silu = ACTIVATIONS["silu"]
    for neuron in range(n_neurons):
        mask = torch.zeros(n_neurons, dtype=torch.bool)
        mask[neuron] = True
        full = SparseFFNKernel(d, n_neurons).quantized(x, *weights, silu, mask=mask)
        one = [rows_of(w, neuron, neuron + 1) for w in weights]
        assert torch.equal(SparseFFNKernel(d, 1).quantized(x, *one, silu), full)


def test_bindings_reject_bad_minimums():
    x, matrices, _ = asymmetric_ffn(128, 16, 32, seed=100)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    symmetric = QuantizedWeight.from_matrix(quant.quantize(random_weights((16, 128), seed=101), "int4", 32))
    kernel = SparseFFNKernel(128, 16)
    relu = ACTIVATIONS["relu"]
    for k in range(3):
        mixed = list(weights)
        mixed[k] = symmetric
        with pytest.raises(ValueError, match=r"\.mins: expected .*symmetric"):
            kernel.quantized(x, *mixed, relu)
    int8 = QuantizedWeight.from_matrix(quant.quantize(random_weights((16, 128), seed=102), "int8", 32))
    with pytest.raises(ValueError, match=r"weight\.mins: expected None \(only int4"):
        kernels.matvec_quantized(x, QuantizedWeight("int8", 32, int8.data, int8.scales, weights[0].mins))
    for mins, message in [
        (weights[0].mins.float(), "dtype torch.float16"),
        (weights[0].mins[:, :2].contiguous(), r"shape \[16, 4\]"),
        (weights[0].mins[:8], r"shape \[16, 4\]"),
    ]:
        with pytest.raises(ValueError, match=rf"weights\[0\]\.mins: expected {message}"):
            kernels.matvecs(x, [QuantizedWeight("int4", 32, weights[0].data, weights[0].scales, mins)])


def test_c_kernels_refuse_bad_minimums():
    """Minimums on only some of gate / up / down, or on int8 rows (FFN, matvec, a matvecs matrix, fp rows): status
    EDGE_CPU_INVALID_ARGUMENT and nothing written."""
    library = kernels._library()
    d, n_neurons = 64, 4
    x, matrices, _ = asymmetric_ffn(d, n_neurons, 32, seed=110)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    y = torch.full((d,), 7.0)
    workspace = torch.empty(library.edge_cpu_sparse_ffn_workspace_size(d, n_neurons, 1), dtype=torch.uint8)

    def ffn(mins, quant_format=3):
        arguments = [x.data_ptr(), d, n_neurons]
        for weight, weight_mins in zip(weights, mins, strict=True):
            arguments += [weight.data.data_ptr(), weight.scales.data_ptr(), weight_mins]
        arguments += [quant_format, quant_format, 32, None, None, 0, 0.0, y.data_ptr(), workspace.data_ptr(), 1, None]
        return library.edge_cpu_sparse_ffn_q(*arguments)

    all_mins = [w.mins.data_ptr() for w in weights]
    for k in range(3):
        some = [None, None, None]
        some[k] = all_mins[k]
        assert ffn(some) == 1
        others = list(all_mins)
        others[k] = None
        assert ffn(others) == 1
    assert ffn(all_mins, quant_format=2) == 1  # int8 has no minimums (the codes' bytes serve as int8 here)
    assert torch.equal(y, torch.full((d,), 7.0))
    assert ffn(all_mins) == 0 and ffn([None] * 3) == 0
    out = torch.full((n_neurons,), 7.0)
    fp_rows = torch.zeros(n_neurons, d)
    matrix = kernels._Matrix(fp_rows.data_ptr(), None, all_mins[0], 0, 0, n_neurons, None, out.data_ptr())
    assert library.edge_cpu_matvecs(x.data_ptr(), d, (kernels._Matrix * 1)(matrix), 1, 1) == 1
    assert torch.equal(out, torch.full((n_neurons,), 7.0))


# ---- int8 down rows under int4 gate and up (a bundle's down_dtype int8) ------------------------------------------
# The down projection is the matrix whose int4 rounding costs the most (SmolLM2: +7.06% perplexity with int4 down
# rows, +0.68% with int8): an int4 bundle may keep it int8, symmetric, beside symmetric or asymmetric int4 gate and up.


def int8_down_ffn(d, n_neurons, group_size, asymmetric, seed):
    """x [d], int4 gate and up (asymmetric: with minimums) and int8 down [D, d] as QuantizedMatrix, and the three
    dequantized as fp32 torch tensors."""
    if asymmetric:
        gate_up = [asymmetric_matrix(n_neurons, d, group_size, seed=seed + k) for k in range(2)]
    else:
        gate_up = [
            quant.quantize(random_weights((n_neurons, d), seed + k, d**-0.5), "int4", group_size) for k in range(2)
        ]
    down = quant.quantize(random_weights((n_neurons, d), seed + 2, d**-0.5), "int8", group_size)
    matrices = [*gate_up, down]
    x = torch.from_numpy(random_weights(d, seed=seed + 10))
    return x, matrices, [torch.from_numpy(quant.dequantize(m)) for m in matrices]


@pytest.mark.parametrize("activation", ["relu", "silu"])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize(("d", "n_neurons", "group_size"), [(576, 300, 32), (1024, 200, 128)])
def test_int8_down_rows_under_int4_gate_and_up_are_within_the_bound(
    d, n_neurons, group_size, asymmetric, activation, kernel_x
):
    """Masked (a random half) and dense (no mask): the float64 reference on the dequantized rows (int4 gate and up,
    int8 down), the same active neurons; far from the reference with the down rows rounded to int4 instead (the test
    tells the two down formats apart). Asymmetric gate and up: the declared per-column bound; symmetric: OPS.md's."""
    x, matrices, dequantized = int8_down_ffn(d, n_neurons, group_size, asymmetric, seed=d + group_size)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    assert [w.format for w in weights] == ["int4", "int4", "int8"] and weights[2].mins is None
    act = ACTIVATIONS[activation]
    int4_down = quant.dequantize(quant.quantize(dequantized[2].numpy(), "int4", group_size))
    for reference_mask, found, reference in masked_and_dense_runs(x, weights, dequantized, act, kernel_x):
        error = (found.double() - reference.output.double()).abs()
        if asymmetric:
            bound = asymmetric_ffn_bound(kernel_x(x), dequantized, reference_mask, act)
        else:
            bound = torch.full_like(error, KERNEL_RTOL * float(reference.output.abs().max()))
        assert torch.all(error <= bound), f"worst error / bound {float((error / bound).max()):.3g}"
        as_int4 = sparse_ffn(kernel_x(x), *dequantized[:2], torch.from_numpy(int4_down), reference_mask, act).output
        assert torch.any((as_int4.double() - reference.output.double()).abs() > 10 * bound)


@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("group_size", [32, 128])
def test_int8_down_rows_are_bit_identical_across_thread_counts(group_size, asymmetric, kernel_x):
    """Gate chunks and down column blocks split differently for 1, 2 and 3 threads, masked and dense."""
    d, n_neurons = 1024, 700
    x, matrices, _ = int8_down_ffn(d, n_neurons, group_size, asymmetric, seed=120)
    weights = [QuantizedWeight.from_matrix(m) for m in matrices]
    mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(121)) < 0.6
    for activation in (ACTIVATIONS["relu"], ACTIVATIONS["silu"]):
        for m in (mask, None):
            runs = [SparseFFNKernel(d, n_neurons, t).quantized(x, *weights, activation, mask=m) for t in (1, 3, 2)]
            assert all(torch.equal(runs[0], run) for run in runs[1:])


def test_int8_down_rows_add_what_int4_rows_of_the_same_values_add(kernel_x):
    """Symmetric int4 down rows and int8 rows holding the same codes (every int4 code is an int8 one) and scales have
    the same values, and each down row adds (h * scale) * code per value in both formats: the same bits. So a wider
    down projection changes only what its values are, not how the kernel sums them."""
    d, n_neurons = 576, 300
    x, matrices, _ = int8_down_ffn(d, n_neurons, 32, asymmetric=False, seed=130)
    int4_down = quant.quantize(random_weights((n_neurons, d), seed=131, scale=d**-0.5), "int4", 32)
    same_values = quant.QuantizedMatrix("int8", 32, quant.unpack_int4(int4_down.data), int4_down.scales)
    assert np.array_equal(quant.dequantize(same_values), quant.dequantize(int4_down))
    gate, up = (QuantizedWeight.from_matrix(m) for m in matrices[:2])
    mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(132)) < 0.5
    for activation in (ACTIVATIONS["relu"], ACTIVATIONS["silu"]):
        as_int4 = SparseFFNKernel(d, n_neurons).quantized(
            x, gate, up, QuantizedWeight.from_matrix(int4_down), activation, mask=mask
        )
        as_int8 = SparseFFNKernel(d, n_neurons).quantized(
            x, gate, up, QuantizedWeight.from_matrix(same_values), activation, mask=mask
        )
        assert torch.equal(as_int4, as_int8)


def test_bindings_take_int8_down_rows_only_under_int4_gate_and_up():
    x, matrices, _ = int8_down_ffn(128, 16, 32, asymmetric=True, seed=140)
    gate, up, down = (QuantizedWeight.from_matrix(m) for m in matrices)
    kernel = SparseFFNKernel(128, 16)
    relu = ACTIVATIONS["relu"]
    kernel.quantized(x, gate, up, down, relu)  # asymmetric int4 gate and up, symmetric int8 down
    other_groups = QuantizedWeight.from_matrix(quant.quantize(random_weights((16, 128), seed=141), "int8", 64))
    with pytest.raises(ValueError, match=r"w_down_t: expected format int4 \(or int8\) and group_size 32"):
        kernel.quantized(x, gate, up, other_groups, relu)
    int8_rows = [
        QuantizedWeight.from_matrix(quant.quantize(random_weights((16, 128), 142 + k), "int8", 32)) for k in range(2)
    ]
    int4_down = QuantizedWeight.from_matrix(quant.quantize(random_weights((16, 128), seed=144), "int4", 32))
    with pytest.raises(ValueError, match="w_down_t: expected format int8 and group_size 32"):
        kernel.quantized(x, *int8_rows, int4_down, relu)  # no narrower down rows under int8 gate and up
    with pytest.raises(ValueError, match="w_up: expected format int4 and group_size 32"):
        kernel.quantized(x, gate, down, down, relu)  # only the down projection may be int8


def test_c_kernels_refuse_other_format_pairs_and_minimums_on_int8_down_rows():
    """edge_cpu_sparse_ffn_q's down_format: quant_format, or EDGE_Q8 under EDGE_Q4 (down_mins NULL; gate_mins and
    up_mins both or neither). Every other pair or minimums pattern is EDGE_CPU_INVALID_ARGUMENT, nothing written."""
    library = kernels._library()
    d, n_neurons = 64, 4
    x, matrices, _ = int8_down_ffn(d, n_neurons, 32, asymmetric=True, seed=150)
    gate, up, down = (QuantizedWeight.from_matrix(m) for m in matrices)
    down_mins = torch.zeros(n_neurons, d // 32, dtype=torch.float16)
    y = torch.full((d,), 7.0)
    workspace = torch.empty(library.edge_cpu_sparse_ffn_workspace_size(d, n_neurons, 1), dtype=torch.uint8)

    def ffn(quant_format, down_format, mins=(gate.mins, up.mins, None), codes=(gate, up, down)):
        arguments = [x.data_ptr(), d, n_neurons]
        for weight, weight_mins in zip(codes, mins, strict=True):
            arguments += [
                weight.data.data_ptr(),
                weight.scales.data_ptr(),
                None if weight_mins is None else weight_mins.data_ptr(),
            ]
        arguments += [quant_format, down_format, 32, None, None, 0, 0.0, y.data_ptr(), workspace.data_ptr(), 1, None]
        return library.edge_cpu_sparse_ffn_q(*arguments)

    refused = {
        "int4 down under int8 gate and up": ffn(2, 3, (None, None, None)),
        "an fp32 down format": ffn(3, 0),
        "an fp16 down format": ffn(3, 1),
        "an unknown down format": ffn(3, 4),
        "a negative down format": ffn(3, -1),
        "minimums on int8 down rows": ffn(3, 2, (gate.mins, up.mins, down_mins)),
        "minimums on int8 down rows alone": ffn(3, 2, (None, None, down_mins)),
        "gate minimums without up's": ffn(3, 2, (gate.mins, None, None)),
        "up minimums without gate's": ffn(3, 2, (None, up.mins, None)),
        "minimums on int8 gate and up": ffn(2, 2, (gate.mins, up.mins, None)),
    }
    assert [name for name, status in refused.items() if status != 1] == []
    assert torch.equal(y, torch.full((d,), 7.0))
    assert ffn(3, 2) == 0  # asymmetric int4 gate and up, symmetric int8 down
    assert ffn(3, 2, (None, None, None)) == 0  # symmetric int4 gate and up
    # down_format == quant_format: today's rules (int4 down rows with minimums exactly when gate and up have them)
    int4_down = QuantizedWeight.from_matrix(asymmetric_matrix(n_neurons, d, 32, seed=151))
    assert ffn(3, 3, (gate.mins, up.mins, int4_down.mins), (gate, up, int4_down)) == 0
    assert ffn(3, 3, (gate.mins, up.mins, None), (gate, up, int4_down)) == 1
    assert ffn(3, 3, (None, None, int4_down.mins), (gate, up, int4_down)) == 1
