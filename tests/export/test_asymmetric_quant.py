"""Asymmetric int4 in edge_sdk/quant.py (llama.cpp's Q4_1 grid): the rule, its round trip, and Q4_1 files carried
over to the bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from edge_sdk import quant


def test_quantize_hand_computed_asymmetric_int4():
    weight = np.zeros((1, 32), dtype=np.float32)
    weight[0, :4] = [-1.0, 0.5, 2.0, -0.9]
    weight[0, 4:] = 0.25
    matrix = quant.quantize(weight, "int4", 32, asymmetric=True)
    assert matrix.asymmetric and float(matrix.mins[0, 0]) == -1.0
    assert matrix.scales[0, 0] == np.float16(0.2)  # (2.0 - -1.0) / 15, rounded to fp16
    steps = quant.unpack_int4(matrix.data)[0] + 8
    # -1.0 is the minimum (step 0), 2.0 the maximum (15); 0.5 is 1.5 / 0.19995 = 7.502 steps up, 0.25 is 6.25
    assert steps[:5].tolist() == [0, 8, 15, 1, 6]
    restored = quant.dequantize(matrix)[0]
    scale = np.float32(np.float16(0.2))
    assert restored[1] == np.float32(8) * scale + np.float32(-1.0)  # (code + 8) * scale + min, one rounding
    assert restored[0] == -1.0


@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_asymmetric_round_trip_is_within_half_a_step(group_size):
    rng = np.random.default_rng(group_size)
    weight = (rng.standard_normal((24, 512)) * 0.02 + 0.01).astype(np.float32)
    weight[2, :group_size] = 0.3  # a constant group: scale 0, every value its minimum
    weight[4, :group_size] = np.abs(weight[4, :group_size]) + 5.0  # a group far from zero, one-sided
    weight[6, :group_size] *= 1e-4  # a scale in fp16's subnormal range
    matrix = quant.quantize(weight, "int4", group_size, asymmetric=True)
    assert matrix.mins.dtype == matrix.scales.dtype == np.float16
    assert matrix.mins.shape == matrix.scales.shape == (24, 512 // group_size)
    assert matrix.nbytes == matrix.data.nbytes + 2 * matrix.scales.nbytes
    restored = quant.dequantize(matrix)
    assert matrix.scales[2, 0] == 0 and np.all(restored[2, :group_size] == np.float32(np.float16(0.3)))
    groups = weight.astype(np.float64).reshape(24, -1, group_size)
    scales = matrix.scales.astype(np.float64)[..., None]
    mins = matrix.mins.astype(np.float64)[..., None]
    error = np.abs(restored.astype(np.float64).reshape(groups.shape) - groups)
    # half a step, plus what fp16 rounding of the minimum and the scale moves the ends by (at most 15 scale roundings)
    bound = 0.5 * scales + np.abs(groups.min(axis=2, keepdims=True) - mins) + 15 * scales * 2.0**-11 + 1e-7
    assert np.all(error <= bound)
    steps = quant.unpack_int4(matrix.data) + 8
    assert steps.min() == 0 and steps.max() == 15
    # the far group is represented as finely as a group around zero: a symmetric scale would be 20x coarser
    symmetric = quant.quantize(weight, "int4", group_size)
    assert error[4].max() < 0.1 * np.abs(quant.dequantize(symmetric)[4, :group_size] - weight[4, :group_size]).max()
    relative = np.sqrt((error[7:] ** 2).mean() / (groups[7:] ** 2).mean())
    assert relative < 0.12


def test_q4_1_blocks_come_back_to_the_bit():
    """Every block gguf-py's Q4_1 writes (minimum and scale in fp16, steps 0..15 with 0 and 15 used) is quantized
    back to its own minimum, scale and steps: the dequantized values are equal."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((64, 256)).astype(np.float32) * np.logspace(-3, 1, 64, dtype=np.float32)[:, None]
    weight[:8] += 3.0  # skewed rows
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q4_1)
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)
    matrix = quant.quantize(values, "int4", 32, asymmetric=True)
    assert np.array_equal(quant.dequantize(matrix), values)
    # the same minimums and scales as the file's blocks (fp16 d, then fp16 m, then 16 bytes of steps)
    stored = blocks.reshape(64, 8, 20)
    assert np.array_equal(matrix.scales.view(np.uint8).reshape(64, 8, 2), stored[..., 0:2])
    assert np.array_equal(matrix.mins.view(np.uint8).reshape(64, 8, 2), stored[..., 2:4])


@pytest.mark.parametrize(
    ("weight", "format", "message"),
    [
        (np.zeros((2, 64)), "int8", "only int4 has group minimums"),
        (np.full((2, 64), 1e6), "int4", "minimum or scale exceeds fp16"),
    ],
)
def test_asymmetric_refusals(weight, format, message):
    with pytest.raises(ValueError, match=message):
        quant.quantize(weight, format, 32, asymmetric=True)
