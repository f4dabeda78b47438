"""Asymmetric int4 rows (group minimums, llama.cpp's Q4_1 grid: value = (code + 8) * scale + min) for the tests of the
quantized kernels, the C ones (backends/test_cpu_quant_kernels.py) and the CUDA ones on the GPU and emulated
(gpu/test_cuda_kernels.py, gpu/test_cuda_emulation.py): rows whose minimums matter, the wrong readings of them a kernel
must not match, and the float64 reference with the bound both kernel libraries declare.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant
from edge_sdk.model.activation import Activation

# The CPU kernels' asymmetric bound (kernels/cpu/QUANT.md "Asymmetric bound"), which edge_cuda_kernels.h declares for
# asymmetric rows beside OPS.md's: relative to the rows' products before they cancel (sum_j |w_j x_j|), as the
# minimums make a row's values large against its dot product.
ASYMMETRIC_RTOL = 1e-5
SILU_SLOPE = 1.1
ACTIVATIONS = {
    "relu": Activation("relu"),
    "fatrelu": Activation("fatrelu", 0.05),
    "drelu": Activation("drelu"),
    "silu": Activation("silu"),
}
# gate values at least this far from the activity boundaries (g = 0, g = fatrelu's cut): the same active set
DECISION_MARGIN = 1e-4


def asymmetric_weights(rows: int, cols: int, group_size: int, seed: int, offset: float = 3.0) -> np.ndarray:
    """[rows, cols] float32 Gaussian rows whose groups are shifted by +-offset..2 offset (each group its own shift and
    sign), scaled by cols^-0.5: the minimums dominate the values and differ from group to group, so a kernel that
    ignores them, drops the codes' +8 or takes another group's minimum is far off."""
    rng = np.random.default_rng(seed)
    groups = (rows, cols // group_size)
    shifts = rng.uniform(offset, 2 * offset, groups) * rng.choice([-1, 1], groups)
    weight = rng.standard_normal((rows, cols)) + np.repeat(shifts, group_size, axis=1)
    return (weight * cols**-0.5).astype(np.float32)


def asymmetric_matrix(rows: int, cols: int, group_size: int, seed: int, offset: float = 3.0) -> quant.QuantizedMatrix:
    weights = asymmetric_weights(rows, cols, group_size, seed, offset)
    return quant.quantize(weights, "int4", group_size, asymmetric=True)


def wrong_dequantizations(matrix: quant.QuantizedMatrix) -> dict[str, np.ndarray]:
    """float64 [rows, cols]: what kernels that read asymmetric rows wrongly would compute with. value = code * scale +
    mid, mid = 8 * scale + min: a gate, up or matvec row without its mid times x's block sums, or a down row without its
    mid correction, is the symmetric reading; a mid without the 8 * scale drops the codes' +8."""
    codes = quant.unpack_int4(matrix.data).astype(np.float64)
    scales = np.repeat(matrix.scales.astype(np.float64), matrix.group_size, axis=1)
    mins = matrix.mins.astype(np.float64)
    steps = (codes + 8) * scales

    def with_mins(group_mins: np.ndarray) -> np.ndarray:
        return steps + np.repeat(group_mins, matrix.group_size, axis=1)

    return {
        "reads the symmetric rows (no mid)": codes * scales,
        "ignores the minimums": steps,
        "drops the codes' +8 (mid = min)": codes * scales + np.repeat(mins, matrix.group_size, axis=1),
        "takes the next group's minimum": with_mins(np.roll(mins, -1, axis=1)),
        "takes the previous group's minimum": with_mins(np.roll(mins, 1, axis=1)),
    }


def assert_asymmetric_bounds(found: np.ndarray, expected: np.ndarray, products: np.ndarray, bound: float) -> None:
    """found within OPS.md's bound (bound * max |expected|) and within the asymmetric one (ASYMMETRIC_RTOL * the largest
    sum_j |w_j x_j| of an output's row: products, shaped as expected)."""
    error = float(np.abs(found.astype(np.float64) - expected).max())
    assert error <= bound * float(np.abs(expected).max()), f"{error:.3g} > {bound} * max |y_ref|"
    assert error <= ASYMMETRIC_RTOL * float(products.max()), f"{error:.3g} > {ASYMMETRIC_RTOL} * {products.max():.3g}"


def with_zero_mids(matrix: quant.QuantizedMatrix) -> quant.QuantizedMatrix:
    """A symmetric int4 matrix as asymmetric rows of minimums -8 scale (exact in fp16): every mid 8 * scale + min is 0
    and every value (code + 8) * scale + min is the symmetric code * scale."""
    mins = matrix.scales * np.float16(-8)
    assert np.array_equal(mins.astype(np.float32), -8 * matrix.scales.astype(np.float32))
    return dataclasses.replace(matrix, mins=mins)


def ffn_reference(x: np.ndarray, rows, mask: np.ndarray, activation: Activation):
    """The sequential SparseFFN in float64 on x [T, d] and float64 rows: (y [T, d], active [T, D], the CPU kernels'
    asymmetric bound per output [T, d]: ASYMMETRIC_RTOL sum_i (|h_i| + |a_i| S_up_i + 1.1 |u_i| S_gate_i) |w_down_i|,
    S a row's sum of |w x|)."""
    w_gate, w_up, w_down = rows
    g, u = x @ w_gate.T, x @ w_up.T
    a = g / (1 + np.exp(-g)) if activation.kind == "silu" else np.where(g > activation.threshold, g, 0.0)
    if activation.kind == "drelu":
        u = np.maximum(u, 0.0)
    active = mask & (a != 0)
    h = np.where(active, a * u, 0.0)
    slope = SILU_SLOPE if activation.kind == "silu" else 1.0
    s_gate, s_up = np.abs(x) @ np.abs(w_gate).T, np.abs(x) @ np.abs(w_up).T
    delta_h = np.where(mask, np.abs(a) * s_up + slope * np.abs(u) * s_gate, 0.0)
    return h @ w_down, active, ASYMMETRIC_RTOL * ((delta_h + np.abs(h)) @ np.abs(w_down))


def asymmetric_ffn_case(d: int, n_neurons: int, group_size: int, activation: Activation, seed: int):
    """x [2, d], the three asymmetric matrices and a random half mask [2, D], from the first seed at or after `seed`
    whose gates (all of them: the mask or none) sit DECISION_MARGIN from the activity boundary on the dequantized rows
    and x_hat."""
    for attempt in range(seed, seed + 100):
        rng = np.random.default_rng(attempt)
        matrices = tuple(asymmetric_matrix(n_neurons, d, group_size, seed=attempt * 3 + k) for k in range(3))
        x = rng.standard_normal((2, d)).astype(np.float32)
        mask = rng.random((2, n_neurons)) < 0.5
        g = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64) @ quant.dequantize(matrices[0]).T
        if np.abs(g - activation.threshold).min() > DECISION_MARGIN:
            return x, matrices, mask
    raise AssertionError(f"no seed gives clear decisions for d={d}, D={n_neurons}")
