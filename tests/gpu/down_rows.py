"""int8 down rows under int4 gate and up rows (edge_sparse_ffn_q's down_format EDGE_Q8 with quant_format EDGE_Q4, the
QuantizedSparseFFN of an int4 bundle exported with --down-dtype int8) for the CUDA kernels' tests, emulated
(test_cuda_emulation.py) and on the GPU (test_cuda_kernels.py): the test FFNs, wrong readings of the int8 down rows a
kernel must not match, and int8 copies of int4 matrices.
"""

from __future__ import annotations

import numpy as np
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant

from ..asymmetric_rows import DECISION_MARGIN, asymmetric_weights


def mixed_ffn_case(tokens: int, d: int, n_neurons: int, group_size: int, asymmetric: bool, seed: int):
    """x [T, d], int4 w_gate and w_up (asymmetric: with minimums), int8 w_down_t and a random half mask [T, D], from the
    first seed at or after `seed` whose gates all sit DECISION_MARGIN from g = 0 on the dequantized rows and x_hat.
    Every matrix's groups are shifted (asymmetric_weights), so a down row read with another group's scale is far
    off."""
    for attempt in range(seed, seed + 100):
        rng = np.random.default_rng(attempt)
        gate_up = [asymmetric_weights(n_neurons, d, group_size, seed=attempt * 3 + k) for k in range(2)]
        gate, up = (quant.quantize(w, "int4", group_size, asymmetric=asymmetric) for w in gate_up)
        down = quant.quantize(asymmetric_weights(n_neurons, d, group_size, seed=attempt * 3 + 2), "int8", group_size)
        x = rng.standard_normal((tokens, d)).astype(np.float32)
        mask = rng.random((tokens, n_neurons)) < 0.5
        g = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64) @ quant.dequantize(gate).T
        if np.abs(g).min() > DECISION_MARGIN:
            return x, (gate, up, down), mask
    raise AssertionError(f"no seed gives clear decisions for d={d}, D={n_neurons}")


def wrong_int8_down_readings(matrix: quant.QuantizedMatrix) -> dict[str, np.ndarray]:
    """float64 [D, d]: what a kernel that reads int8 down rows wrongly computes with."""
    rows, cols = matrix.data.shape
    scales = np.repeat(matrix.scales.astype(np.float64), matrix.group_size, axis=1)
    codes = matrix.data.astype(np.float64)
    # the int4 kernel's reading of the bytes: rows of cols / 2 bytes, two signed nibbles per byte (Q4_0 order)
    as_int4 = quant.unpack_int4(matrix.data.view(np.uint8).reshape(-1)[: rows * cols // 2].reshape(rows, cols // 2))
    return {
        "reads the down rows as int4": as_int4.astype(np.float64) * scales,
        "reads the codes unsigned": (codes % 256) * scales,
        "takes the next group's scale": codes
        * np.repeat(np.roll(matrix.scales, -1, axis=1), matrix.group_size, axis=1),
    }


def int8_copy(matrix: quant.QuantizedMatrix) -> quant.QuantizedMatrix:
    """A symmetric int4 matrix's codes and scales as an int8 matrix: the same values, one code per byte."""
    return quant.QuantizedMatrix(
        "int8", matrix.group_size, quant.unpack_int4(matrix.data).astype(np.int8), matrix.scales
    )
