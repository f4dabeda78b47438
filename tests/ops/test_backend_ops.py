"""Every op case on every implementation, as ggml's test-backend-ops: one table, one test id per (case, implementation).

Cases (cases.py): SparseFFN on float32 / float16 / bfloat16 weights and QuantizedSparseFFN on int8 / int4 ones,
SvdPredictor, SignBitPredictor, QuantizedMatMul (both layouts) and the CPU kernels' MatVec, at shapes with partial
vectors, every activation, masks all / none / random / absent, with and without CHESS thresholds. Implementations
(implementations.py): the torch reference, ONNX Runtime running the op's reference function, the C kernels
(quantized rows dotted with x quantized, the default, or with x in fp32), the CANN gather path on the CPU, CUDA, the
quantized CUDA kernels emulated on the host (nvcc, no GPU), and TensorRT with the plugins (CUDA and TensorRT skip
with the reason where they cannot run). Each is compared with the torch reference
(edge_sdk.sparsity) on the x it computes with, within the bound its op declares (edge_sdk.export.ops.ERROR_BOUNDS);
the torch reference itself is compared with the op's definition written out here in float64. A case's data tell a
correct implementation from one that ignores the mask, the thresholds, the activation kind, the bias or the last
partial vector (cases.py draws them so, and the MatVec check shows it). An id reads
`SparseFFN[float16,relu,d=67,D=130,mask=random,no-thresholds]-c_kernels`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from edge_sdk import quant
from edge_sdk.sparsity.ffn import sparse_ffn

from .cases import (
    CASES,
    DISCRIMINATION,
    VECTOR_WIDTH,
    MatVecCase,
    QuantizedMatMulCase,
    SignBitPredictorCase,
    SparseFFNCase,
    SvdPredictorCase,
)
from .implementations import IMPLEMENTATIONS


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The table's tensors are small: torch's thread pool costs more than it gives, on a loaded machine far more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pairs():
    for case in CASES:
        for implementation in IMPLEMENTATIONS:
            if implementation.supports(case):
                marks = {"cuda": [pytest.mark.gpu], "tensorrt": [pytest.mark.tensorrt]}.get(implementation.name, [])
                yield pytest.param(case, implementation, id=f"{case.id}-{implementation.name}", marks=marks)


@pytest.mark.parametrize(("case", "implementation"), list(_pairs()))
def test_op(case, implementation) -> None:
    reason = implementation.unavailable()
    if reason is not None:
        pytest.skip(reason)
    result = implementation.run(case)
    is_reference = implementation.name == "torch_reference"
    # the x the implementation computes with, where it is not the case's own (the C kernels' quantized x)
    own_x = getattr(implementation, "reference_input", lambda case: None)(case)
    if isinstance(case, SparseFFNCase):
        _check_sparse_ffn(case, *result, is_reference, own_x)
    elif isinstance(case, SvdPredictorCase):
        _check_svd_predictor(case, result, is_reference)
    elif isinstance(case, SignBitPredictorCase):
        _check_signbit_predictor(case, result, is_reference)
    elif isinstance(case, QuantizedMatMulCase):
        _check_quantized_matmul(case, result, own_x)
    else:
        _check_matvec(case, result, own_x)


def _relative_error(found: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max |found - expected|, max |expected|), in float64."""
    return float((found.double() - expected.double()).abs().max()), float(expected.double().abs().max())


def _assert_within(found: torch.Tensor, expected: torch.Tensor, bound: float) -> None:
    error, scale = _relative_error(found, expected)
    assert error <= bound * scale, f"max |y - y_ref| = {error:.3g} > {bound:g} * max |y_ref| = {bound * scale:.3g}"


def _assert_beyond(wrong: torch.Tensor, expected: torch.Tensor, bound: float, what: str) -> None:
    error, scale = _relative_error(wrong, expected)
    assert error > DISCRIMINATION * bound * scale, f"an implementation that {what} would pass this case"


# ------------------------------------------------------------------------------------------------- SparseFFN


def _ffn_definition(case: SparseFFNCase) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseFFN as its schema defines it, in float64 numpy: (y [T, d], active [T, D])."""
    data = case.data()
    x = data.x.double().numpy()
    w_gate, w_up, w_down_t = (w.double().numpy() for w in data.weights)
    g, u = x @ w_gate.T, x @ w_up.T  # [T, D]
    # silu, or g > cut ? g : 0 with cut 0 for relu and drelu
    a = g / (1 + np.exp(-g)) if case.activation == "silu" else np.where(g > case.act.threshold, g, 0.0)
    if case.activation == "drelu":
        u = np.maximum(u, 0.0)
    active = data.reference_mask.numpy() & (a != 0)
    if data.thresholds is not None:
        active &= np.abs(a) > data.thresholds.double().numpy()
    y = np.where(active, a * u, 0.0) @ w_down_t
    return torch.from_numpy(y), torch.from_numpy(active)


def _check_sparse_ffn(
    case: SparseFFNCase, y: torch.Tensor, active: torch.Tensor | None, is_reference: bool, own_x: torch.Tensor | None
) -> None:
    data = case.data()
    assert y.dtype == torch.float32 and y.shape == (case.tokens, case.d)
    if is_reference:
        expected, expected_active = _ffn_definition(case)
    else:
        expected, expected_active = (data.expected, data.active) if own_x is None else case.reference_on(own_x)
    _assert_within(y, expected, case.bound)  # an empty mask's bound is 0: exact zeros
    if active is not None:
        assert torch.equal(active, expected_active), "the active neurons differ from the reference's"
    if case.asymmetric and data.active.any():  # the data tell the minimums' use in each matrix from wrong ones
        for k, matrix in enumerate(data.quantized):
            for what, wrong in _wrong_asymmetric_weights(matrix).items():
                weights = list(data.weights)
                weights[k] = wrong
                result = sparse_ffn(data.x, *weights, data.reference_mask, case.act, thresholds=data.thresholds)
                _assert_beyond(result.output, data.expected, case.bound, f"{what} (matrix {k})")


def _wrong_asymmetric_weights(matrix: quant.QuantizedMatrix) -> dict[str, torch.Tensor]:
    """What an implementation that ignores asymmetric int4's minimums, or adds them to code * scale without the
    codes' +8, would dequantize (float32)."""
    symmetric = quant.dequantize(dataclasses.replace(matrix, mins=None))
    mins = np.repeat(matrix.mins.astype(np.float32), matrix.group_size, axis=1)
    return {
        "ignores the group minimums": torch.from_numpy(
            quant.dequantize(dataclasses.replace(matrix, mins=np.zeros_like(matrix.mins)))
        ),
        "drops the codes' +8": torch.from_numpy(symmetric + mins),
    }


# ------------------------------------------------------------------------------------------------ predictors


def _as_bool_mask(mask: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A predictor's [T, D] mask as bool; int32 masks (the schema's) must hold exactly 1 / 0."""
    assert tuple(mask.shape) == shape
    if mask.dtype == torch.int32:
        assert set(mask.unique().tolist()) <= {0, 1}, "an int32 predictor mask must be exactly 1 / 0"
        return mask.bool()
    assert mask.dtype == torch.bool
    return mask


def _check_svd_predictor(case: SvdPredictorCase, mask: torch.Tensor, is_reference: bool) -> None:
    data = case.data()
    mask = _as_bool_mask(mask, (case.tokens, case.n_neurons))
    expected = data.expected
    if is_reference:  # (x b^T) a^T + bias > 0 in float64
        scores = data.x.double() @ data.b.double().T @ data.a.double().T
        if data.bias is not None:
            scores += data.bias.double()
            without_bias = data.scores - data.bias > 0
            assert (without_bias != expected).any(), "the bias decides nothing: ignoring it goes untested"
        expected = scores > 0
        assert 0 < int(expected.sum()) < expected.numel(), "one decision only"
    decided = case.decided()
    assert int(decided.sum()) >= decided.numel() - case.tokens, "too many scores at 0: change the seed"
    assert torch.equal(mask[decided], expected[decided])


def _signbit_definition(case: SignBitPredictorCase) -> torch.Tensor:
    """The sign-bit rule of the schema in numpy: N_neg counted bit by bit, compared with alpha * N_pos in float64."""
    data = case.data()
    packed = data.packed.numpy().view(np.uint32)  # [D, W]
    bits = (packed[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1  # [D, W, 32]
    w_negative = bits.reshape(case.n_neurons, -1)[:, : case.d].astype(bool)  # [D, d]
    x_negative = data.x.float().numpy() < 0  # [T, d]; -0.0 is not negative
    n_negative = (w_negative[None] != x_negative[:, None]).sum(-1)  # [T, D]
    return torch.from_numpy(~(case.alpha * (case.d - n_negative).astype(np.float64) < n_negative))


def _check_signbit_predictor(case: SignBitPredictorCase, mask: torch.Tensor, is_reference: bool) -> None:
    mask = _as_bool_mask(mask, (case.tokens, case.n_neurons))
    expected = _signbit_definition(case) if is_reference else case.data().expected
    if is_reference:
        assert 0 < int(expected.sum()) < expected.numel(), "one decision only"
    assert torch.equal(mask, expected)  # exact: the bound is 0
    assert case.bound == 0.0


# -------------------------------------------------------------------------------------------- QuantizedMatMul


def _check_quantized_matmul(case: QuantizedMatMulCase, y: torch.Tensor, own_x: torch.Tensor | None) -> None:
    data = case.data()
    assert y.dtype == torch.float32 and y.shape == (case.tokens, case.n_out)
    _assert_within(y, data.expected if own_x is None else case.reference_on(own_x), case.bound)
    # the data tell the right groups from wrong ones: each row's last group dropped, or read with the next group's scale
    matrix = data.quantized
    last_dropped = matrix.scales.copy()
    last_dropped[:, -1] = 0
    for what, scales in (
        ("drops each row's last group", last_dropped),
        ("reads each group with the next group's scale", np.roll(matrix.scales, -1, axis=1)),
    ):
        weight = torch.from_numpy(quant.dequantize(dataclasses.replace(matrix, scales=scales))).double()
        _assert_beyond(data.x.double() @ (weight.T if case.transposed else weight), data.expected, case.bound, what)
    if case.asymmetric:
        for what, weight in _wrong_asymmetric_weights(matrix).items():
            weight = weight.double()
            _assert_beyond(data.x.double() @ (weight.T if case.transposed else weight), data.expected, case.bound, what)


# ---------------------------------------------------------------------------------------------------- MatVec


def _check_matvec(case: MatVecCase, y: torch.Tensor, own_x: torch.Tensor | None) -> None:
    data = case.data()
    assert y.dtype == torch.float32 and y.shape == (case.n_out,)
    _assert_within(y, data.expected if own_x is None else case.reference_on(own_x), case.bound)
    if data.bias is not None:
        _assert_beyond(data.expected - data.bias.double(), data.expected, case.bound, "ignores the bias")
    if case.n_in % VECTOR_WIDTH and case.n_in > VECTOR_WIDTH:
        head = data.x.double().clone()
        head[case.n_in - case.n_in % VECTOR_WIDTH :] = 0
        wrong = data.weight.double() @ head + (0.0 if data.bias is None else data.bias.double())
        _assert_beyond(wrong, data.expected, case.bound, "drops the last partial vector of x")
