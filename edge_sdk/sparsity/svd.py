"""Whitened truncated-SVD sparsity predictor (SVDP Algorithm 1).

The predictor approximates the gate projection by a rank-r product, W_gate ~= A B, so that the cheap
scores (x B^T) A^T rank the neurons the way W_gate x would. Whitening makes the truncation optimal on the
calibration inputs rather than on the weights alone: with G = X X^T = S S^T (S lower-triangular Cholesky
factor, X = [d, N] calibration inputs), the truncated SVD of W_gate S minimises ||W_gate X - A B X||_F
over rank-r A B. Then A = U_r Sigma_r and B = V_r^T S^{-1}.

All factorisation math runs in float64; the predictor is float32, as the runtimes compute with it. A bundle whose
weights are not fp32 stores the factors in fp16 (with_half_factors): calibration rounds them before it fits the biases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from edge_sdk.errors import CalibrationError

METHODS = ("auto", "exact", "randomized")
# "auto" uses the randomized range finder above this many weight elements (LLaMA-7B's gate is 4.5e7)...
_RANDOMIZED_MIN_ELEMENTS = 4_000_000
# ...and when the rank is below this fraction of min(D, d).
_RANDOMIZED_MAX_RANK_FRACTION = 0.25
# Randomized range finder: extra sampled directions and subspace (power) iterations. With these the
# captured energy matches the exact SVD to well under 1% on LLM-like spectra.
_MIN_OVERSAMPLE = 16
_POWER_ITERATIONS = 2
# Cholesky regularizer ladder: lambda = eps * mean(diag(G)) with eps = 1e-10, 1e-9, ..., 1.
_FIRST_EPS = 1e-10
_LAST_EPS = 1.0
# A pivot of the Cholesky factor below sqrt(this * mean(diag(G))) counts as numerically singular: LAPACK
# can "succeed" on a rank-deficient gram with pivots made of rounding noise, and S^{-1} would then blow up
# B along directions the calibration data never visited.
_MIN_RELATIVE_PIVOT = 1e-12


@dataclass
class SvdPredictor:
    """A rank-r predictor of W_gate x: scores = (x B^T) A^T. The calibrated bias is kept separately."""

    a: torch.Tensor  # [D, r] float32 = U_r Sigma_r
    b: torch.Tensor  # [r, d] float32 = V_r^T S^-1 (V_r^T when not whitened)
    whitened: bool
    regularizer: float  # lambda added to diag(G) before the Cholesky factorisation (0.0 when none was needed)

    @property
    def rank(self) -> int:
        return self.a.shape[1]

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, d] or [d] -> (x B^T) A^T: [T, D] or [D] float32, the predictor's outputs without bias."""
        return (x.to(torch.float32) @ self.b.T) @ self.a.T


def default_rank(intermediate_size: int) -> int:
    """Predictor rank for an FFN with D = intermediate_size neurons: about 2% of D (SVDP E.3).

    ceil(0.02 * D), rounded up to a multiple of 8 once it reaches 8 (aligned GEMM tiles), at least 1:
    11008 -> 224, 14336 -> 288, 18944 -> 384, 100 -> 2. Never exceeds D. Callers must still clamp it to the
    hidden size d when d < rank (fit_svd_predictor rejects rank > min(d, D)).
    """
    if intermediate_size < 1:
        raise CalibrationError(f"intermediate_size: expected >= 1, found {intermediate_size}")
    rank = math.ceil(0.02 * intermediate_size)
    if rank >= 8:
        rank = 8 * math.ceil(rank / 8)
    return min(rank, intermediate_size)


def input_gram(x_chunks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """G = sum over chunks of x^T x, the calibration inputs' Gram matrix (X X^T with X = [d, N]).

    x_chunks: chunks of [n_i, d] (any float dtype) so calibration inputs never need to sit in memory at once.
    Each chunk's product is an fp32 matmul, accumulated in float64. Returns (G [d, d] float64, N tokens).
    """
    gram: torch.Tensor | None = None
    n_tokens = 0
    for index, chunk in enumerate(x_chunks):
        if chunk.dim() != 2:
            raise CalibrationError(f"x_chunks[{index}]: expected shape [n, d], found {list(chunk.shape)}")
        if gram is None:
            gram = torch.zeros(chunk.shape[1], chunk.shape[1], dtype=torch.float64)
        elif chunk.shape[1] != gram.shape[0]:
            raise CalibrationError(
                f"x_chunks[{index}]: expected hidden size {gram.shape[0]} (as the first chunk), found {chunk.shape[1]}"
            )
        xf = chunk.to(torch.float32)
        gram += (xf.T @ xf).to(torch.float64)
        n_tokens += chunk.shape[0]
    if gram is None or n_tokens == 0:
        raise CalibrationError("x_chunks: expected at least one calibration token, found none")
    return gram, n_tokens


def _whitening_factor(gram: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Lower-triangular S with S S^T = G + lambda I, for the smallest lambda on the ladder 0, 1e-10 m, ... m.

    m = mean(diag(G)). A factor is accepted when LAPACK succeeds and no pivot is numerically zero.
    """
    mean_diag = gram.diagonal().mean().item()
    if not math.isfinite(mean_diag) or mean_diag <= 0:
        raise CalibrationError(f"gram: expected positive finite diagonal entries, found mean {mean_diag}")
    n_steps = round(math.log10(_LAST_EPS / _FIRST_EPS))
    ladder = [0.0] + [_FIRST_EPS * 10**k * mean_diag for k in range(n_steps + 1)]
    identity = torch.eye(gram.shape[0], dtype=torch.float64)
    for regularizer in ladder:
        factor, info = torch.linalg.cholesky_ex(gram + regularizer * identity)
        if info.item() == 0 and factor.diagonal().square().min().item() >= _MIN_RELATIVE_PIVOT * mean_diag:
            return factor, regularizer
    raise CalibrationError(f"gram: not positive definite even with regularizer {ladder[-1]:.3g} (is it symmetric?)")


def _randomized_svd(
    w: torch.Tensor,  # [D, d] float64
    s: torch.Tensor | None,  # [d, d] float64 lower-triangular, or None for M = w
    rank: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-`rank` SVD of M = w s by a seeded randomized range finder (Halko et al. 2011, Alg. 4.4).

    M is only used through products with thin matrices, so M = w s is never formed: each product costs
    D d q + d^2 q instead of the D d^2 of forming it. Returns (U [D, r], sigma [r], Vh [r, d]).
    """

    def times(v: torch.Tensor) -> torch.Tensor:  # M v: [d, q] -> [D, q]
        return w @ (v if s is None else s @ v)

    def transpose_times(u: torch.Tensor) -> torch.Tensor:  # M^T u: [D, q] -> [d, q]
        wt_u = w.T @ u
        return wt_u if s is None else s.T @ wt_u

    n_neurons, d = w.shape
    width = min(rank + max(_MIN_OVERSAMPLE, rank // 2), n_neurons, d)
    generator = torch.Generator().manual_seed(seed)
    omega = torch.randn(d, width, dtype=torch.float64, generator=generator)
    basis = torch.linalg.qr(times(omega)).Q  # [D, q]
    for _ in range(_POWER_ITERATIONS):
        basis = torch.linalg.qr(times(torch.linalg.qr(transpose_times(basis)).Q)).Q
    projected = transpose_times(basis).T  # [q, d] = basis^T M
    u_small, sigma, vh = torch.linalg.svd(projected, full_matrices=False)
    return (basis @ u_small)[:, :rank], sigma[:rank], vh[:rank]


def fit_svd_predictor(
    w_gate: torch.Tensor,  # [D, d]
    rank: int,
    *,
    gram: torch.Tensor | None = None,  # [d, d] = X X^T of the calibration inputs (input_gram)
    whiten: bool = True,
    method: str = "auto",
    seed: int = 0,
) -> SvdPredictor:
    """Build the rank-r predictor A B ~= W_gate (SVDP Algorithm 1).

    whiten=True needs the calibration gram and minimises the error on the calibration inputs; whiten=False
    is the naive truncated SVD of W_gate (the paper's ablation). method: "exact" full SVD, "randomized"
    seeded range finder (deterministic for a given seed), "auto" = randomized for large matrices
    (D*d > 4e6) at rank < min(D, d)/4, exact otherwise.
    """
    if w_gate.dim() != 2:
        raise CalibrationError(f"w_gate: expected shape [D, d], found {list(w_gate.shape)}")
    n_neurons, d = w_gate.shape
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(d, n_neurons):
        raise CalibrationError(f"rank: expected an integer in [1, min(d, D) = {min(d, n_neurons)}], found {rank!r}")
    if method not in METHODS:
        raise CalibrationError(f"method: expected one of {', '.join(METHODS)}, found {method!r}")
    if method == "auto":
        large = n_neurons * d > _RANDOMIZED_MIN_ELEMENTS
        method = "randomized" if large and rank < _RANDOMIZED_MAX_RANK_FRACTION * min(n_neurons, d) else "exact"

    w = w_gate.to(torch.float64)
    if not torch.isfinite(w).all():
        raise CalibrationError("w_gate: contains NaN or infinite values")
    factor, regularizer = None, 0.0
    if whiten:
        if gram is None:
            raise CalibrationError("gram: whiten=True needs the calibration inputs' gram matrix (input_gram)")
        if list(gram.shape) != [d, d]:
            raise CalibrationError(
                f"gram: expected shape [{d}, {d}] for w_gate {list(w_gate.shape)}, found {list(gram.shape)}"
            )
        g = gram.to(torch.float64)
        if not torch.isfinite(g).all():
            raise CalibrationError("gram: contains NaN or infinite values")
        factor, regularizer = _whitening_factor((g + g.T) / 2)

    if method == "randomized":
        u, sigma, vh = _randomized_svd(w, factor, rank, seed)
    else:
        u, sigma, vh = torch.linalg.svd(w if factor is None else w @ factor, full_matrices=False)
        u, sigma, vh = u[:, :rank], sigma[:rank], vh[:rank]

    a = u * sigma  # [D, r]
    # B = V_r^T S^{-1}, i.e. the solution of B S = V_r^T: a triangular solve, never an explicit inverse.
    b = vh if factor is None else torch.linalg.solve_triangular(factor, vh, upper=False, left=False)  # [r, d]
    return SvdPredictor(
        a=a.to(torch.float32).contiguous(),
        b=b.to(torch.float32).contiguous(),
        whitened=whiten,
        regularizer=regularizer,
    )


def with_half_factors(predictor: SvdPredictor) -> SvdPredictor:
    """The predictor as a bundle with F16 factors stores it (bundle/format.py predictor_factor_dtype): a and b hold
    fp16 values, in float32, so scores computed from them are the runtimes' scores.

    Each rank component's a[:, r] is multiplied and b[r, :] divided by the power of two that brings their largest
    magnitudes closest together: A B is unchanged (exactly, in float32), while whitening alone leaves A scaled by the
    calibration inputs' norm (sqrt of the token count) and B by its inverse, out of fp16's range or into its
    subnormals. CalibrationError when a factor still exceeds fp16's range."""
    a, b = predictor.a.to(torch.float64), predictor.b.to(torch.float64)
    a_max, b_max = a.abs().amax(dim=0), b.abs().amax(dim=1)  # [r] each
    both = (a_max > 0) & (b_max > 0)
    ratio = torch.where(both, b_max / torch.where(both, a_max, 1.0), 1.0)
    scale = torch.exp2(torch.round(torch.log2(ratio) / 2))  # [r] powers of two
    a_half = (a * scale).to(torch.float16)
    b_half = (b / scale[:, None]).to(torch.float16)
    if not (torch.isfinite(a_half).all() and torch.isfinite(b_half).all()):
        raise CalibrationError(
            f"the rank-{predictor.rank} svd factors exceed fp16's range even balanced (largest |a| * |b| "
            f"{float((a_max * b_max).max()):.3g}): export with --dtype fp32, which stores them in fp32"
        )
    return SvdPredictor(
        a=a_half.to(torch.float32).contiguous(),
        b=b_half.to(torch.float32).contiguous(),
        whitened=predictor.whitened,
        regularizer=predictor.regularizer,
    )
