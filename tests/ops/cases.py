"""The op cases of the backend-ops table: each custom op at a few shapes, types, activations and masks, with its data.

A case is a frozen description (its `id` names the op and every choice) plus `data()`, the seeded inputs and the
torch reference's expected result (edge_sdk.sparsity), computed once per case and shared by every implementation.
Adding a case to the table means adding one entry to CASES.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant
from edge_sdk.export.ops import error_bound
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.signbit import pack_sign_bits, signbit_mask
from edge_sdk.sparsity.svd import SvdPredictor

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
QUANT_FORMATS = quant.FORMATS
ACTIVATIONS = {
    "relu": Activation("relu"),
    "fatrelu": Activation("fatrelu", 0.25),
    "drelu": Activation("drelu"),
    "silu": Activation("silu"),
}
# mask kinds: all predicted, none predicted, a random half, or no mask input at all (every neuron a candidate;
# the kernels' mask=NULL)
MASKS = ("all", "none", "random", "absent")
# Test data keep every neuron a decision is taken on this far from its boundary (g = 0, g = t, |a| = threshold), so
# rounding in another summation order cannot flip it and the active sets must be equal.
DECISION_MARGIN = 1e-4
# The widest vector of any implementation (16 fp32 lanes, AVX-512): a d that is not a multiple of it leaves a tail.
VECTOR_WIDTH = 16
# A wrong implementation must miss the reference by this many times the op's bound, so that no case passes it. (A
# bound raised past about 1e-3, e.g. for kernels that quantize x, needs data of larger effects: the data search
# below then says so.)
DISCRIMINATION = 10


def _seeded_retry(make, seed: int, accept, what: str):
    """make(generator) for the first seed at or after `seed` whose result accept() takes (data off the boundaries)."""
    for attempt in range(seed, seed + 100):
        made = make(torch.Generator().manual_seed(attempt))
        if accept(made):
            return made
    raise AssertionError(
        f"{what}: no seed in {seed}..{seed + 99} gives data off the decision boundaries (and, for SparseFFN, that "
        f"a wrong implementation misses by {DISCRIMINATION} bounds)"
    )


# ------------------------------------------------------------------------------------------------- SparseFFN


@dataclass(frozen=True)
class FFNData:
    x: torch.Tensor  # [T, d] float32
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # w_gate, w_up, w_down_t [D, d] of the case's type
    quantized: tuple[quant.QuantizedMatrix, ...] | None  # int8 / int4: the matrices `weights` dequantize
    mask: torch.Tensor | None  # [T, D] bool, None for mask=absent
    thresholds: torch.Tensor | None  # [D] float32
    expected: torch.Tensor  # [T, d] float32, sparse_ffn's output
    active: torch.Tensor  # [T, D] bool, sparse_ffn's active neurons

    @property
    def reference_mask(self) -> torch.Tensor:
        """[T, D] bool: the mask, all ones when absent."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.x.shape[0], self.weights[0].shape[0], dtype=torch.bool)


@dataclass(frozen=True)
class SparseFFNCase:
    """SparseFFN on float weights (float32, float16, bfloat16), or QuantizedSparseFFN on quantized ones (int8, int4
    with group_size; asymmetric: int4 with group minimums, edge_sdk.quant's Q4_1 grid)."""

    weights: str
    activation: str
    d: int
    n_neurons: int
    mask: str
    thresholds: bool
    group_size: int = 0
    tokens: int = 2
    asymmetric: bool = False

    @property
    def op(self) -> str:
        return "QuantizedSparseFFN" if self.quantized else "SparseFFN"

    @property
    def id(self) -> str:
        weights = f"{self.weights},g={self.group_size}" if self.quantized else self.weights
        weights += ",asymmetric" if self.asymmetric else ""
        thresholds = "thresholds" if self.thresholds else "no-thresholds"
        return f"{self.op}[{weights},{self.activation},d={self.d},D={self.n_neurons},mask={self.mask},{thresholds}]"

    @property
    def quantized(self) -> bool:
        return self.weights in QUANT_FORMATS

    @property
    def bound(self) -> float:
        return error_bound(self.op, self.weights)

    @property
    def act(self) -> Activation:
        return ACTIVATIONS[self.activation]

    def data(self) -> FFNData:
        return _ffn_data(self)

    def reference_on(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's (y, active) on another x [T, d] (the one an implementation computes with)."""
        data = self.data()
        result = sparse_ffn(x, *data.weights, data.reference_mask, self.act, thresholds=data.thresholds)
        return result.output, result.active


@functools.cache
def _ffn_weights(weights: str, group_size: int, d: int, n_neurons: int, asymmetric: bool = False):
    """(w_gate, w_up, w_down_t) [D, d] of the type and, for int8 / int4, their QuantizedMatrix: y is O(1).

    Shared by every case of these weights (the cases differ in x, mask, thresholds and activation).
    """
    generator = torch.Generator().manual_seed(d * 7919 + n_neurons)
    fp32 = [torch.randn(n_neurons, d, generator=generator) / d**0.5 for _ in range(3)]
    if weights not in QUANT_FORMATS:
        return tuple(w.to(TORCH_DTYPES[weights]) for w in fp32), None
    matrices = tuple(quant.quantize(w.numpy(), weights, group_size, asymmetric=asymmetric) for w in fp32)
    return tuple(torch.from_numpy(quant.dequantize(m)) for m in matrices), matrices


def _clear_of_boundaries(case: SparseFFNCase, x, w_gate, mask, thresholds) -> bool:
    """Every neuron in mask is DECISION_MARGIN away from each activity boundary (computed in float64)."""
    g = x.double() @ w_gate.double().T  # [T, D]
    distances = [(g - case.act.threshold).abs() if case.activation == "fatrelu" else g.abs()]
    if thresholds is not None:
        distances.append((case.act.gate(g).abs() - thresholds.double()).abs())
    return all(bool((distance[mask] > DECISION_MARGIN).all()) for distance in distances)


_OTHER_ACTIVATION = {"relu": "fatrelu", "fatrelu": "relu", "drelu": "relu", "silu": "relu"}


def _discriminates(case: SparseFFNCase, x, weights, mask, thresholds) -> bool:
    """Whether an implementation that ignores the mask, the thresholds, the activation kind (fatrelu's cut, drelu's
    up relu, silu) or the last partial vector of x misses this data's reference output by DISCRIMINATION bounds, and
    (random masks, relu family) the mask holds false positives for the sequential pipeline to drop."""

    def output(x=x, mask=mask, activation=case.act, thresholds=thresholds):
        return sparse_ffn(x, *weights, mask, activation, thresholds=thresholds)

    right = output()
    limit = DISCRIMINATION * case.bound * float(right.output.abs().max())
    wrong = []
    if case.mask in ("random", "none"):
        wrong.append(output(mask=torch.ones_like(mask)))
    if case.mask != "none":
        if thresholds is not None:
            wrong.append(output(thresholds=None))
        else:  # thresholds above fatrelu's cut can hide it
            wrong.append(output(activation=ACTIVATIONS[_OTHER_ACTIVATION[case.activation]]))
        if case.d % VECTOR_WIDTH:
            head = x.clone()
            head[:, case.d - case.d % VECTOR_WIDTH :] = 0
            wrong.append(output(x=head))
    if case.mask == "random" and case.act.is_relu_family and not (mask & ~right.active).any():
        return False
    return all(float((result.output - right.output).abs().max()) > limit for result in wrong)


@functools.cache
def _ffn_data(case: SparseFFNCase) -> FFNData:
    def make(generator):
        x = torch.randn(case.tokens, case.d, generator=generator)
        weights, matrices = _ffn_weights(case.weights, case.group_size, case.d, case.n_neurons, case.asymmetric)
        shape = (case.tokens, case.n_neurons)
        mask = {
            "all": torch.ones(shape, dtype=torch.bool),
            "none": torch.zeros(shape, dtype=torch.bool),
            "random": torch.rand(shape, generator=generator) < 0.5,
            "absent": None,
        }[case.mask]
        thresholds = None
        if case.thresholds:  # around the median |a|, so that about half of the activated neurons pass
            gate_act = case.act.gate(x @ weights[0].float().T).abs()
            thresholds = gate_act[gate_act > 0].median() * 2 * torch.rand(case.n_neurons, generator=generator)
            thresholds[::17] = float("inf")  # switches the neuron off
        return x, weights, matrices, mask, thresholds

    def accept(made) -> bool:
        x, weights, _, mask, thresholds = made
        decided = torch.ones(case.tokens, case.n_neurons, dtype=torch.bool) if mask is None else mask
        # quantized weights: the C kernels' integer dot products compute with quantized_activations(x)
        inputs = (x, quantized_activations(x)) if case.quantized else (x,)
        clear = all(_clear_of_boundaries(case, each, weights[0], decided, thresholds) for each in inputs)
        return clear and _discriminates(case, x, weights, decided, thresholds)

    x, weights, matrices, mask, thresholds = _seeded_retry(make, zlib.crc32(case.id.encode()) % 1000, accept, case.id)
    reference_mask = torch.ones(case.tokens, case.n_neurons, dtype=torch.bool) if mask is None else mask
    result = sparse_ffn(x, *weights, reference_mask, case.act, thresholds=thresholds)
    return FFNData(x, weights, matrices, mask, thresholds, result.output, result.active)


def _sparse_ffn_cases() -> list[SparseFFNCase]:
    # (d, D): below one vector, tails of 13, 1, 3 and 2 values past whole vectors, a LLaMA-2-7B row (d = 4096)
    random_shapes = [(8, 16), (45, 77), (67, 130), (97, 300), (130, 77), (4096, 64)]
    cases = []
    for weights in TORCH_DTYPES:
        for activation in ACTIVATIONS:
            for thresholds in (False, True):
                cases += [SparseFFNCase(weights, activation, d, n, "random", thresholds) for d, n in random_shapes]
                cases += [SparseFFNCase(weights, activation, 67, 130, mask, thresholds) for mask in MASKS]
    # quantized: d three groups of 128, and for groups of 32 a half unit of 64 values more (the integer dot products'
    # last unit); D = 301 a partial chunk of neurons
    for weights in QUANT_FORMATS:
        for group_size in quant.GROUP_SIZES:
            d = 416 if group_size == 32 else 384
            for activation in ACTIVATIONS:
                for mask in MASKS:
                    cases.append(SparseFFNCase(weights, activation, d, 301, mask, False, group_size))
                    if group_size == 64:
                        cases.append(SparseFFNCase(weights, activation, d, 301, mask, True, group_size))
        cases.append(SparseFFNCase(weights, "relu", 128, 7, "random", False, 32))
    # asymmetric int4 (group minimums): every group size and activation on a random mask and without one, thresholds
    # at 64, and SmolLM2's width (576, a partial last unit) at 32 and 64
    for group_size in quant.GROUP_SIZES:
        d = 416 if group_size == 32 else 384
        for activation in ACTIVATIONS:
            for mask in ("random", "absent"):
                cases.append(SparseFFNCase("int4", activation, d, 301, mask, False, group_size, asymmetric=True))
        if group_size == 64:
            cases.append(SparseFFNCase("int4", "relu", d, 301, "random", True, group_size, asymmetric=True))
        if group_size != 128:
            cases.append(SparseFFNCase("int4", "silu", 576, 150, "random", False, group_size, asymmetric=True))
    return list(dict.fromkeys(cases))


# ---------------------------------------------------------------------------------------------- SvdPredictor


@dataclass(frozen=True)
class SvdData:
    x: torch.Tensor  # [T, d] of the case's type
    a: torch.Tensor  # [D, r] float32
    b: torch.Tensor  # [r, d] float32
    bias: torch.Tensor | None  # [D] float32
    scores: torch.Tensor  # [T, D] float32, SvdPredictor.scores + bias
    expected: torch.Tensor  # [T, D] bool, scores > 0


@dataclass(frozen=True)
class SvdPredictorCase:
    x_dtype: str
    d: int
    n_neurons: int
    rank: int
    bias: bool
    tokens: int = 3
    op = "SvdPredictor"

    @property
    def id(self) -> str:
        bias = "bias" if self.bias else "no-bias"
        return f"{self.op}[{self.x_dtype},d={self.d},D={self.n_neurons},r={self.rank},{bias}]"

    @property
    def bound(self) -> float:
        return error_bound(self.op, self.x_dtype)

    def data(self) -> SvdData:
        return _svd_data(self)

    def decided(self) -> torch.Tensor:
        """[T, D] bool: the decisions every implementation must take as the reference does."""
        scores = self.data().scores
        return scores.abs() > self.bound * scores.abs().max()


@functools.cache
def _svd_data(case: SvdPredictorCase) -> SvdData:
    generator = torch.Generator().manual_seed(case.d + case.rank)
    predictor = SvdPredictor(
        a=torch.randn(case.n_neurons, case.rank, generator=generator) / case.rank**0.5,
        b=torch.randn(case.rank, case.d, generator=generator) / case.d**0.5,
        whitened=False,
        regularizer=0.0,
    )
    bias = 0.5 * torch.randn(case.n_neurons, generator=generator) if case.bias else None
    x = torch.randn(case.tokens, case.d, generator=generator).to(TORCH_DTYPES[case.x_dtype])
    scores = predictor.scores(x) + (0.0 if bias is None else bias)
    return SvdData(x, predictor.a, predictor.b, bias, scores, scores > 0)


def _svd_cases() -> list[SvdPredictorCase]:
    shapes = [(8, 16, 2), (45, 77, 5), (97, 300, 16), (130, 300, 33), (4096, 64, 96)]
    return [
        SvdPredictorCase(x_dtype, d, n, rank, bias)
        for x_dtype in TORCH_DTYPES
        for d, n, rank in shapes
        for bias in (True, False)
    ]


# ------------------------------------------------------------------------------------------ SignBitPredictor


@dataclass(frozen=True)
class SignBitData:
    x: torch.Tensor  # [T, d] of the case's type, with zeros and -0.0
    packed: torch.Tensor  # [D, ceil(d / 32)] int32
    expected: torch.Tensor  # [T, D] bool, signbit_mask


@dataclass(frozen=True)
class SignBitPredictorCase:
    x_dtype: str
    d: int
    n_neurons: int
    alpha: float  # a float32 value: the node stores float32, the kernels take it
    tokens: int = 2
    op = "SignBitPredictor"

    @property
    def id(self) -> str:
        return f"{self.op}[{self.x_dtype},d={self.d},D={self.n_neurons},alpha={self.alpha:.7g}]"

    @property
    def bound(self) -> float:
        return error_bound(self.op, self.x_dtype)

    def data(self) -> SignBitData:
        x, packed = _signbit_inputs(self.x_dtype, self.d, self.n_neurons, self.tokens)
        return SignBitData(x, packed, signbit_mask(packed, x.float(), self.alpha))


@functools.cache
def _signbit_inputs(x_dtype: str, d: int, n_neurons: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, d] with zeros and -0.0, and the packed sign bits [D, W] of a W_gate with negative int32 words."""
    generator = torch.Generator().manual_seed(d)
    x = torch.randn(tokens, d, generator=generator)
    x[:, ::7] = 0.0
    x[:, 3::11] = -0.0  # sign bit set, but not negative: counts as non-negative
    w_gate = torch.randn(n_neurons, d, generator=generator)
    # rows from mostly negative to mostly positive products, so that both decisions occur at every alpha
    w_gate += torch.linspace(-1.5, 1.5, n_neurons)[:, None] * x[0].sign()
    w_gate[::3, 31::32] = -1.0  # bit 31 set: negative int32 words
    w_gate[1::5, ::9] = -0.0  # packs as non-negative
    return x.to(TORCH_DTYPES[x_dtype]), pack_sign_bits(w_gate)


def _signbit_cases() -> list[SignBitPredictorCase]:
    alphas = [float(np.float32(alpha)) for alpha in (0.5, 0.9, 1.0, 1.03, 1.25, 2.0)]
    shapes = [(8, 16), (45, 77), (64, 300), (97, 300), (130, 77), (70_000, 9)]
    cases = [SignBitPredictorCase("float32", d, n, alpha) for d, n in shapes for alpha in alphas]
    cases += [SignBitPredictorCase(x_dtype, 97, 300, alpha) for x_dtype in ("float16", "bfloat16") for alpha in alphas]
    return cases


# -------------------------------------------------------------------------------------------- QuantizedMatMul


@dataclass(frozen=True)
class QuantizedMatMulData:
    x: torch.Tensor  # [T, K] float32
    quantized: quant.QuantizedMatrix  # W: [N, K] when transposed, else [K, N]
    weight: torch.Tensor  # W dequantized, float32
    expected: torch.Tensor  # [T, N] float64


@dataclass(frozen=True)
class QuantizedMatMulCase:
    """y = x W^T (transposed, W [N, K]: projections, the LM head) or y = x W (W [K, N]: a prompt's neuron-major down
    projection) for a group-wise quantized W, groups along W's rows."""

    weights: str  # int8 | int4
    group_size: int
    tokens: int
    n_in: int  # K
    n_out: int  # N
    transposed: bool = True
    asymmetric: bool = False  # int4 with group minimums (edge_sdk.quant's Q4_1 grid)
    op = "QuantizedMatMul"

    @property
    def id(self) -> str:
        layout = "W[N,K]" if self.transposed else "W[K,N]"
        shape = f"T={self.tokens},K={self.n_in},N={self.n_out}"
        weights = f"{self.weights},asymmetric" if self.asymmetric else self.weights
        return f"{self.op}[{weights},g={self.group_size},{layout},{shape}]"

    @property
    def bound(self) -> float:
        return error_bound(self.op, self.weights)

    def data(self) -> QuantizedMatMulData:
        return _quantized_matmul_data(self)

    def reference_on(self, x: torch.Tensor) -> torch.Tensor:
        """The float64 y on another x [T, K] (the one an implementation computes with)."""
        weight = self.data().weight.double()
        return x.double() @ (weight.T if self.transposed else weight)


@functools.cache
def _quantized_matmul_data(case: QuantizedMatMulCase) -> QuantizedMatMulData:
    generator = torch.Generator().manual_seed(case.n_in * 31 + case.n_out + case.tokens)
    x = torch.randn(case.tokens, case.n_in, generator=generator)
    shape = (case.n_out, case.n_in) if case.transposed else (case.n_in, case.n_out)
    weights = torch.randn(*shape, generator=generator).numpy()
    matrix = quant.quantize(weights, case.weights, case.group_size, asymmetric=case.asymmetric)
    weight = torch.from_numpy(quant.dequantize(matrix))
    expected = x.double() @ (weight.double().T if case.transposed else weight.double())
    return QuantizedMatMulData(x, matrix, weight, expected)


def _quantized_matmul_cases() -> list[QuantizedMatMulCase]:
    cases = []
    for weights in QUANT_FORMATS:
        for group_size in quant.GROUP_SIZES:
            width = 416 if group_size == 32 else 384  # the grouped dimension: 13 groups of 32, or 3 of 128
            for tokens in (1, 3, 37):  # one warp per row for up to 4 tokens, the tiled GEMM beyond (CUDA)
                cases += [QuantizedMatMulCase(weights, group_size, tokens, width, n_out) for n_out in (77, 130)]
                cases.append(QuantizedMatMulCase(weights, group_size, tokens, 300, width, transposed=False))
    for group_size in quant.GROUP_SIZES:  # asymmetric int4
        width = 416 if group_size == 32 else 384
        for tokens in (1, 3):
            cases.append(QuantizedMatMulCase("int4", group_size, tokens, width, 77, asymmetric=True))
        cases.append(QuantizedMatMulCase("int4", group_size, 3, 300, width, transposed=False, asymmetric=True))
    cases.append(QuantizedMatMulCase("int4", 64, 1, 576, 130, asymmetric=True))
    return cases


# ---------------------------------------------------------------------------------------------------- MatVec


@dataclass(frozen=True)
class MatVecData:
    x: torch.Tensor  # [in] float32
    weight: torch.Tensor  # [out, in] float32 / float16, or the dequantized float32 matrix
    quantized: quant.QuantizedMatrix | None
    bias: torch.Tensor | None  # [out] float32
    expected: torch.Tensor  # [out] float64


@dataclass(frozen=True)
class MatVecCase:
    """The CPU kernels' dense projection y = W x (+ bias); no ONNX op, its bound is declared in ops.ERROR_BOUNDS."""

    weights: str
    n_in: int
    n_out: int
    bias: bool
    group_size: int = 0
    op = "MatVec"

    @property
    def id(self) -> str:
        weights = f"{self.weights},g={self.group_size}" if self.group_size else self.weights
        return f"{self.op}[{weights},in={self.n_in},out={self.n_out},{'bias' if self.bias else 'no-bias'}]"

    @property
    def bound(self) -> float:
        return error_bound(self.op, self.weights)

    def data(self) -> MatVecData:
        return _matvec_data(self)

    def reference_on(self, x: torch.Tensor) -> torch.Tensor:
        """The float64 y on another x [in] (the one an implementation computes with)."""
        data = self.data()
        return data.weight.double() @ x.double() + (0.0 if data.bias is None else data.bias.double())


@functools.cache
def _matvec_data(case: MatVecCase) -> MatVecData:
    generator = torch.Generator().manual_seed(case.n_in + case.n_out)
    x = torch.randn(case.n_in, generator=generator)
    weight = torch.randn(case.n_out, case.n_in, generator=generator)
    bias = torch.randn(case.n_out, generator=generator) if case.bias else None
    matrix = None
    if case.group_size:
        matrix = quant.quantize(weight.numpy(), case.weights, case.group_size)
        weight = torch.from_numpy(quant.dequantize(matrix))
    else:
        weight = weight.to(TORCH_DTYPES[case.weights])
    expected = weight.double() @ x.double() + (0.0 if bias is None else bias.double())
    return MatVecData(x, weight, matrix, bias, expected)


def _matvec_cases() -> list[MatVecCase]:
    fp_shapes = [(1, 1), (45, 7), (97, 300), (192, 2048), (512, 33), (513, 17)]
    cases = [
        MatVecCase(weights, n_in, n_out, bias)
        for weights in ("float32", "float16")
        for n_in, n_out in fp_shapes
        for bias in (True, False)
    ]
    cases += [
        MatVecCase(weights, n_in, n_out, bias, group_size)
        for weights in QUANT_FORMATS
        for group_size in quant.GROUP_SIZES
        for n_in, n_out in [(128, 1), (384, 77), (1024, 300)]
        for bias in (True, False)
    ]
    return cases


CASES = [*_sparse_ffn_cases(), *_svd_cases(), *_signbit_cases(), *_quantized_matmul_cases(), *_matvec_cases()]
