"""SVDP Algorithm 1: whitened truncated SVD predictor, gram accumulation, regularisation, validation."""

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.sparsity.svd import SvdPredictor, default_rank, fit_svd_predictor, input_gram


def anisotropic_inputs(tokens, d, seed=0):
    """x: [tokens, d] whose covariance has a spectrum decaying over four orders of magnitude, in a random basis."""
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64)).Q
    scales = torch.logspace(0, -2, d, dtype=torch.float64)
    return ((torch.randn(tokens, d, generator=generator, dtype=torch.float64) * scales) @ basis).to(torch.float32)


def gate_weights(n_neurons, d, seed=1):
    return torch.randn(n_neurons, d, generator=torch.Generator().manual_seed(seed)) / d**0.5


def calibration_error(predictor: SvdPredictor, w_gate, x):
    """||W_gate X - A B X||_F / ||W_gate X||_F on inputs x: [N, d], in float64."""
    exact = x.double() @ w_gate.double().T
    approx = x.double() @ (predictor.a.double() @ predictor.b.double()).T
    return ((exact - approx).norm() / exact.norm()).item()


def optimal_whitened_error(w_gate, x, rank):
    """The Eckart-Young bound the whitened SVD must attain: the tail singular values of W_gate X^T."""
    sigma = torch.linalg.svdvals(w_gate.double() @ x.double().T)
    return (sigma[rank:].square().sum() / sigma.square().sum()).sqrt().item()


def test_input_gram_accumulates_chunks_in_float64():
    x = anisotropic_inputs(300, 12)
    gram, n_tokens = input_gram(x.split(64))
    assert n_tokens == 300 and gram.dtype == torch.float64 and gram.shape == (12, 12)
    assert torch.allclose(gram, x.double().T @ x.double(), rtol=1e-5, atol=1e-6)
    with pytest.raises(CalibrationError, match="hidden size 12"):
        input_gram([x[:5], x[:5, :11]])
    with pytest.raises(CalibrationError, match="at least one"):
        input_gram([])


@pytest.mark.parametrize("method", ["exact", "randomized"])
@pytest.mark.parametrize("whiten", [True, False])
def test_full_rank_reproduces_w_gate(method, whiten):
    x, w_gate = anisotropic_inputs(200, 24), gate_weights(40, 24)
    gram, _ = input_gram([x])
    predictor = fit_svd_predictor(w_gate, 24, gram=gram if whiten else None, whiten=whiten, method=method)
    assert predictor.a.shape == (40, 24) and predictor.b.shape == (24, 24)
    assert predictor.a.dtype == predictor.b.dtype == torch.float32
    assert predictor.whitened is whiten and predictor.regularizer == 0.0
    # A and B are stored in fp32, so the reconstruction is exact up to fp32 rounding of the factors.
    reconstruction = predictor.a.double() @ predictor.b.double()
    assert ((reconstruction - w_gate.double()).norm() / w_gate.norm()).item() < 1e-6
    assert calibration_error(predictor, w_gate, x) < 1e-6


def test_whitened_attains_optimum_and_beats_naive_on_anisotropic_inputs():
    x, w_gate = anisotropic_inputs(400, 32), gate_weights(48, 32)
    gram, _ = input_gram([x])
    whitened = fit_svd_predictor(w_gate, 6, gram=gram, method="exact")
    naive = fit_svd_predictor(w_gate, 6, whiten=False)
    whitened_error, naive_error = calibration_error(whitened, w_gate, x), calibration_error(naive, w_gate, x)
    assert whitened_error == pytest.approx(optimal_whitened_error(w_gate, x, 6), rel=1e-4)
    assert whitened_error < 0.8 * naive_error
    scores = whitened.scores(x)
    assert scores.shape == (400, 48) and scores.dtype == torch.float32
    assert torch.allclose(scores, (x @ whitened.b.T) @ whitened.a.T)
    assert whitened.scores(x[0]).shape == (48,)


def test_randomized_matches_exact_on_structured_matrix():
    generator = torch.Generator().manual_seed(2)
    low_rank = torch.randn(600, 40, generator=generator) @ torch.randn(40, 300, generator=generator)
    w_gate = (low_rank + 0.5 * torch.randn(600, 300, generator=generator)) / 300**0.5
    x = anisotropic_inputs(800, 300, seed=3)
    gram, _ = input_gram([x])
    for rank in (16, 32):
        exact = fit_svd_predictor(w_gate, rank, gram=gram, method="exact")
        randomized = fit_svd_predictor(w_gate, rank, gram=gram, method="randomized")
        exact_error, randomized_error = calibration_error(exact, w_gate, x), calibration_error(randomized, w_gate, x)
        assert exact_error == pytest.approx(optimal_whitened_error(w_gate, x, rank), rel=1e-4)
        assert exact_error <= randomized_error <= 1.03 * exact_error


def test_fewer_tokens_than_hidden_size_is_regularized():
    x, w_gate = anisotropic_inputs(10, 32), gate_weights(48, 32)
    gram, n_tokens = input_gram([x])
    assert n_tokens < 32
    predictor = fit_svd_predictor(w_gate, 8, gram=gram)
    assert predictor.regularizer > 0
    assert predictor.regularizer <= 1e-6 * gram.diagonal().mean().item()
    assert torch.isfinite(predictor.a).all() and torch.isfinite(predictor.b).all()
    # Whitening still targets the calibration inputs: better there than the naive SVD.
    naive = fit_svd_predictor(w_gate, 8, whiten=False)
    assert calibration_error(predictor, w_gate, x) < calibration_error(naive, w_gate, x)


def test_dead_input_dimension_is_regularized():
    x = anisotropic_inputs(300, 16)
    x[:, 5] = 0.0  # a hidden dimension that never fires makes the gram singular
    gram, _ = input_gram([x])
    predictor = fit_svd_predictor(gate_weights(20, 16), 4, gram=gram)
    assert predictor.regularizer > 0
    assert torch.isfinite(predictor.b).all() and predictor.b.abs().max() < 1e4


@pytest.mark.parametrize("rank", [0, 25, -3, 2.0])
def test_rank_out_of_range_is_rejected(rank):
    w_gate = gate_weights(40, 24)
    with pytest.raises(CalibrationError, match=r"rank.*min\(d, D\) = 24"):
        fit_svd_predictor(w_gate, rank, whiten=False)


def test_bad_gram_and_method_are_rejected():
    w_gate = gate_weights(40, 24)
    with pytest.raises(CalibrationError, match=r"gram: expected shape \[24, 24\]"):
        fit_svd_predictor(w_gate, 4, gram=torch.eye(23, dtype=torch.float64))
    with pytest.raises(CalibrationError, match="gram"):
        fit_svd_predictor(w_gate, 4)
    with pytest.raises(CalibrationError, match="method"):
        fit_svd_predictor(w_gate, 4, whiten=False, method="lanczos")


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_deterministic(method):
    x, w_gate = anisotropic_inputs(200, 64), gate_weights(96, 64)
    gram, _ = input_gram([x])
    first = fit_svd_predictor(w_gate, 8, gram=gram, method=method)
    second = fit_svd_predictor(w_gate, 8, gram=gram, method=method)
    assert torch.equal(first.a, second.a) and torch.equal(first.b, second.b)


def test_auto_picks_randomized_only_for_large_matrices_at_low_rank():
    large = gate_weights(2100, 2048)  # D * d = 4.3e6 > 4e6
    auto = fit_svd_predictor(large, 8, whiten=False)
    assert torch.equal(auto.a, fit_svd_predictor(large, 8, whiten=False, method="randomized").a)
    small = gate_weights(96, 64)
    assert torch.equal(
        fit_svd_predictor(small, 8, whiten=False).a, fit_svd_predictor(small, 8, whiten=False, method="exact").a
    )


def test_default_rank():
    assert default_rank(11008) == 224  # LLaMA-2-7B
    assert default_rank(14336) == 288  # Mistral-7B
    assert default_rank(400) == 8
    assert default_rank(100) == 2
    assert default_rank(1) == 1
    with pytest.raises(CalibrationError):
        default_rank(0)
