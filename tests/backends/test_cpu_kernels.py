"""Native CPU kernels (kernels/cpu) beyond the op table (tests/ops, their values on every op case): dense and
sparse paths bit for bit, thread counts, fp16 subnormals, a hand-computed case, alpha rounding and bad arguments."""

import ctypes
import re
import time

import pytest
import torch

from edge_sdk.export.ops import error_bound
from edge_sdk.model.activation import Activation
from edge_sdk.native import NativeLibraryError, load_cpu_kernels
from edge_sdk.sparsity.ffn import dense_ffn, sparse_ffn
from edge_sdk.sparsity.signbit import pack_sign_bits, signbit_mask

try:
    load_cpu_kernels()
except (NativeLibraryError, OSError) as error:  # the package build must have compiled it; say why if not
    pytest.skip(f"CPU kernel library not loadable: {error}", allow_module_level=True)

from edge_sdk.backends.cpu import kernels
from edge_sdk.backends.cpu.kernels import SparseFFNKernel, signbit_predictor, svd_predictor

# SparseFFN's declared bound (ops.ERROR_BOUNDS): max |y - y_ref| <= FFN_RTOL * max |y_ref|. fp16 weights are compared
# with a reference on the same fp16 values upcast, so the bound is the same.
FFN_RTOL = error_bound("SparseFFN", "float32")
# Test data keep every masked neuron this far from its activity boundary (g = 0, g = t, |a| = threshold),
# so the kernel's rounding cannot flip it and `active` must match exactly.
DECISION_MARGIN = 1e-4
ACTIVATIONS = {
    "relu": Activation("relu"),
    "fatrelu": Activation("fatrelu", 0.05),
    "drelu": Activation("drelu"),
    "silu": Activation("silu"),
}
DTYPES = [torch.float32, torch.float16]


def random_ffn(d, n_neurons, dtype=torch.float32, seed=0):
    """x [d] fp32 and w_gate, w_up, w_down_t [D, d] of dtype, scaled so that y is O(1)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=generator)
    weights = [(torch.randn(n_neurons, d, generator=generator) / d**0.5).to(dtype) for _ in range(3)]
    return x, *weights


def chess_thresholds(x, w_gate, activation, seed=0):
    """Per-neuron thresholds around the median |act(g)|, so that roughly half of the neurons pass."""
    gate_act = activation.gate(w_gate.float() @ x).abs()
    generator = torch.Generator().manual_seed(seed)
    return gate_act.median() * 2 * torch.rand(w_gate.shape[0], generator=generator)


def assert_clear_decisions(x, w_gate, activation, mask, thresholds):
    """The test data themselves must not sit on an activity boundary (else `active` may legitimately differ)."""
    g = w_gate.float() @ x
    margins = [(g - activation.threshold).abs() if activation.kind == "fatrelu" else g.abs()]
    if thresholds is not None:
        margins.append((activation.gate(g).abs() - thresholds).abs())
    for margin in margins:
        assert margin[mask].min() > DECISION_MARGIN, "test data too close to a decision boundary: change the seed"


def assert_matches_reference(x, weights, activation, mask, thresholds=None, threads=0):
    n_neurons, d = weights[0].shape
    kernel = SparseFFNKernel(d, n_neurons, threads)
    active = torch.zeros(n_neurons, dtype=torch.bool)
    y = kernel(x, *weights, activation, mask=mask, thresholds=thresholds, active_out=active)
    full = torch.ones(n_neurons, dtype=torch.bool)
    reference = sparse_ffn(x, *weights, full if mask is None else mask, activation, thresholds=thresholds)
    assert_clear_decisions(x, weights[0], activation, full if mask is None else mask, thresholds)
    assert torch.equal(active, reference.active)
    scale = reference.output.abs().max()
    assert (y - reference.output).abs().max() <= FFN_RTOL * scale
    return y, reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS.values(), ids=ACTIVATIONS)
def test_full_mask_equals_dense_reference(activation, dtype):
    x, *weights = random_ffn(97, 300, dtype, seed=5)
    y_none, _ = assert_matches_reference(x, weights, activation, None)
    kernel = SparseFFNKernel(97, 300)
    y_ones = kernel(x, *weights, activation, mask=torch.ones(300, dtype=torch.bool))
    assert torch.equal(y_none, y_ones)  # an all-ones mask is the dense path, bit for bit
    dense = dense_ffn(x, *weights, activation)
    assert (y_none - dense).abs().max() <= FFN_RTOL * dense.abs().max()
    # the dense kernel reads every row, zeros included: the same sums, since the skipped terms are exact zeros
    y_dense = kernel.dense(x, *weights, activation)
    assert torch.equal(y_dense, y_none)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("d", "n_neurons"), [(192, 768), (97, 300), (600, 77)])
def test_any_mask_covering_the_active_neurons_equals_dense_bit_for_bit(d, n_neurons, dtype):
    """A neuron's gate and up values must not depend on which other rows the kernel reads with it (the AVX-512
    build dots short fp16 rows sixteen at a time): with every truly active neuron predicted, plus random false
    positives or not, the sparse output is the dense one exactly."""
    x, *weights = random_ffn(d, n_neurons, dtype, seed=d + n_neurons)
    relu = ACTIVATIONS["relu"]
    kernel = SparseFFNKernel(d, n_neurons)
    truly_active = torch.zeros(n_neurons, dtype=torch.bool)
    kernel(x, *weights, relu, active_out=truly_active)  # the kernel's own gates decide, not torch's rounding
    assert 0 < truly_active.sum() < n_neurons
    false_positives = torch.rand(n_neurons, generator=torch.Generator().manual_seed(1)) < 0.3
    dense = kernel.dense(x, *weights, relu)
    for mask in (truly_active, truly_active | false_positives):
        assert torch.equal(kernel(x, *weights, relu, mask=mask), dense)


def test_dense_kernel_reads_the_rows_the_sparse_kernel_skips():
    """A NaN in the up and down rows of an inactive neuron: the sparse kernel never reads them, the dense one
    multiplies them (0 * NaN), as a dense FFN does."""
    x, *weights = random_ffn(45, 77, torch.float32, seed=3)
    inactive = int(torch.nonzero(weights[0] @ x <= 0)[0])
    weights[1][inactive, 0] = float("nan")
    weights[2][inactive, 0] = float("nan")
    kernel = SparseFFNKernel(45, 77)
    assert torch.isfinite(kernel(x, *weights, ACTIVATIONS["relu"])).all()
    assert torch.isnan(kernel.dense(x, *weights, ACTIVATIONS["relu"])).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS.values(), ids=ACTIVATIONS)
def test_empty_mask_gives_exact_zero(activation, dtype):
    x, *weights = random_ffn(45, 77, dtype)
    active = torch.ones(77, dtype=torch.bool)
    out = torch.full((45,), float("nan"))
    y = SparseFFNKernel(45, 77)(
        x, *weights, activation, mask=torch.zeros(77, dtype=torch.bool), out=out, active_out=active
    )
    assert y is out
    assert torch.equal(y, torch.zeros(45))
    assert not active.any()


def test_fp16_subnormal_weights_are_converted_exactly():
    # Every down weight is an fp16 subnormal (< 2^-14): flushing or misconverting them changes y entirely.
    x, w_gate, w_up, w_down_t = random_ffn(130, 300, torch.float16, seed=9)
    w_down_t = (w_down_t.float() * 1e-5).half()
    assert (w_down_t.float().abs() < 2**-14).all() and (w_down_t != 0).sum() > 1000
    assert_matches_reference(x, (w_gate, w_up, w_down_t), ACTIVATIONS["relu"], None)


def test_hand_computed_relu_with_false_positive_and_false_negative():
    # g = W_gate x = [3, -1, 1, 2], u = W_up x = [1, 2, 2, -2]; neuron 1 is a false positive, neuron 2 not predicted.
    x = torch.tensor([1.0, 2.0, -1.0])
    w_gate = torch.tensor([[1.0, 1, 0], [0, 0, 1], [2, 0, 1], [0, 1, 0]])
    w_up = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 2]])
    w_down_t = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    active = torch.zeros(4, dtype=torch.bool)
    y = SparseFFNKernel(3, 4)(
        x, w_gate, w_up, w_down_t, Activation("relu"), mask=torch.tensor([True, True, False, True]), active_out=active
    )
    assert torch.equal(y, torch.tensor([-1.0, -4.0, -4.0]))  # h = [3, 0, -, -4]: 3 * WdT_0 - 4 * WdT_3
    assert active.tolist() == [True, False, False, True]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_identical_across_calls_and_thread_counts(dtype):
    # Large enough for many gate chunks and several column blocks per call.
    d, n_neurons = 1100, 700
    x, *weights = random_ffn(d, n_neurons, dtype, seed=3)
    mask = torch.rand(n_neurons, generator=torch.Generator().manual_seed(4)) < 0.5
    for activation, thresholds in (
        (ACTIVATIONS["relu"], None),
        (ACTIVATIONS["drelu"], None),
        (ACTIVATIONS["silu"], chess_thresholds(x, weights[0], ACTIVATIONS["silu"])),
    ):
        first = SparseFFNKernel(d, n_neurons, threads=1)(x, *weights, activation, mask=mask, thresholds=thresholds)
        for threads in (2, 3):
            kernel = SparseFFNKernel(d, n_neurons, threads=threads)
            for _ in range(10):
                assert torch.equal(kernel(x, *weights, activation, mask=mask, thresholds=thresholds), first)


def test_signbit_alpha_is_rounded_to_float32():
    generator = torch.Generator().manual_seed(0)
    d, n_neurons = 97, 3000
    w_gate, x = torch.randn(n_neurons, d, generator=generator), torch.randn(d, generator=generator)
    packed = pack_sign_bits(w_gate)
    alpha = 1.1
    alpha32 = torch.tensor(alpha, dtype=torch.float32).item()
    assert torch.equal(signbit_predictor(x, packed, alpha), signbit_mask(packed, x, alpha32))


# ---- invalid arguments ----------------------------------------------------------------------------------


def test_ffn_binding_rejects_bad_tensors():
    x, w_gate, w_up, w_down_t = random_ffn(45, 77)
    kernel = SparseFFNKernel(45, 77)
    relu = ACTIVATIONS["relu"]
    cases = {
        "x: expected dtype torch.float32": dict(x=x.double()),
        "x: expected shape [45]": dict(x=x[:44]),
        "w_gate: expected a contiguous": dict(w_gate=torch.randn(45, 77).T),
        "w_up: expected dtype torch.float32": dict(w_up=w_up.half()),
        "w_down_t: expected shape [77, 45]": dict(w_down_t=w_down_t[:76]),
        "w_gate: expected dtype torch.float32 or torch.float16": dict(w_gate=w_gate.to(torch.bfloat16)),
        "mask: expected dtype torch.bool": dict(mask=torch.ones(77, dtype=torch.uint8)),
        "thresholds: expected shape [77]": dict(thresholds=torch.zeros(76)),
        "out: expected a CPU tensor": dict(out=torch.empty(45, device="meta")),
        "active_out: expected dtype torch.bool": dict(active_out=torch.zeros(77)),
        "activation: expected an Activation": dict(activation="relu"),
    }
    for message, override in cases.items():
        arguments = dict(x=x, w_gate=w_gate, w_up=w_up, w_down_t=w_down_t, activation=relu) | override
        with pytest.raises(ValueError, match=re.escape(message)):
            kernel(**arguments)
    with pytest.raises(ValueError, match="d, D: expected sizes >= 1"):
        SparseFFNKernel(0, 77)


def test_predictor_bindings_reject_bad_tensors():
    x = torch.randn(45)
    with pytest.raises(ValueError, match=r"b: expected shape \[4, 45\]"):
        svd_predictor(x, torch.randn(4, 77), torch.randn(4, 44), None)
    with pytest.raises(ValueError, match=r"bias: expected dtype torch.float32"):
        svd_predictor(x, torch.randn(4, 77), torch.randn(4, 45), torch.zeros(77, dtype=torch.float64))
    with pytest.raises(ValueError, match="x: expected a non-empty 1-D tensor"):
        svd_predictor(x[None], torch.randn(4, 77), torch.randn(4, 45), None)
    with pytest.raises(ValueError, match=r"packed: expected shape \[77, 2\]"):
        signbit_predictor(x, torch.zeros(77, 3, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match=r"packed: expected dtype torch.int32"):
        signbit_predictor(x, torch.zeros(77, 2, dtype=torch.int64), 1.0)


def test_c_kernels_return_an_error_status_for_invalid_arguments():
    library = kernels._library()
    d, n_neurons = 45, 77
    x, w_gate, w_up, w_down_t = random_ffn(d, n_neurons)
    y = torch.full((d,), 7.0)
    workspace = torch.empty(library.edge_cpu_sparse_ffn_workspace_size(d, n_neurons, 0), dtype=torch.uint8)
    good = [
        x.data_ptr(),
        d,
        n_neurons,
        w_gate.data_ptr(),
        w_up.data_ptr(),
        w_down_t.data_ptr(),
        0,
        None,
        None,
        0,
        0.0,
        y.data_ptr(),
        workspace.data_ptr(),
        0,
        None,
    ]
    assert library.edge_cpu_sparse_ffn(*good) == 0
    y_good = y.clone()
    y.fill_(7.0)
    # argument position -> invalid value
    for position, value in {0: None, 1: 0, 2: -1, 3: None, 5: None, 6: 2, 9: 4, 11: None, 12: None}.items():
        arguments = list(good)
        arguments[position] = value
        assert library.edge_cpu_sparse_ffn(*arguments) != 0, f"argument {position} = {value}"
    fatrelu_negative = list(good)
    fatrelu_negative[9:11] = [1, -0.5]
    assert library.edge_cpu_sparse_ffn(*fatrelu_negative) != 0
    assert torch.equal(y, torch.full((d,), 7.0))  # nothing written on failure
    assert library.edge_cpu_sparse_ffn(*good) == 0 and torch.equal(y, y_good)
    assert library.edge_cpu_sparse_ffn_workspace_size(0, n_neurons, 0) == 0
    dense = [*good[:7], 0, 0.0, *good[11:14]]
    assert library.edge_cpu_dense_ffn(*dense) == 0 and torch.equal(y, y_good)
    for position, value in {0: None, 1: 0, 2: -1, 4: None, 6: 2, 7: 4, 9: None, 10: None}.items():
        arguments = list(dense)
        arguments[position] = value
        assert library.edge_cpu_dense_ffn(*arguments) != 0, f"argument {position} = {value}"

    mask = torch.zeros(n_neurons, dtype=torch.uint8)
    a_t, b, scratch = torch.randn(4, n_neurons), torch.randn(4, d), torch.empty(4)
    svd = [x.data_ptr(), d, n_neurons, 4, a_t.data_ptr(), b.data_ptr(), None, mask.data_ptr(), scratch.data_ptr()]
    assert library.edge_cpu_svd_predictor(*svd) == 0
    for position, value in {0: None, 1: 0, 3: 0, 4: None, 7: None, 8: None}.items():
        arguments = list(svd)
        arguments[position] = value
        assert library.edge_cpu_svd_predictor(*arguments) != 0, f"argument {position} = {value}"

    packed = pack_sign_bits(w_gate)
    signbit = [x.data_ptr(), d, n_neurons, packed.data_ptr(), ctypes.c_float(1.0), mask.data_ptr()]
    assert library.edge_cpu_signbit_predictor(*signbit) == 0
    for position, value in {0: None, 1: -3, 2: 0, 3: None, 5: None}.items():
        arguments = list(signbit)
        arguments[position] = value
        assert library.edge_cpu_signbit_predictor(*arguments) != 0, f"argument {position} = {value}"


def test_the_workspace_records_the_duration_of_each_successful_call():
    """edge_cpu_sparse_ffn_call_ns: the kernel's own time of the last call on the workspace, within the wall time
    around that call; a failed call leaves it; bad arguments give -1."""
    library = kernels._library()
    d, n_neurons = 1024, 4096
    x, *weights = random_ffn(d, n_neurons)  # 48 MB of fp32 rows: milliseconds of work, dense
    kernel = SparseFFNKernel(d, n_neurons, 1)
    relu = ACTIVATIONS["relu"]

    def timed(run) -> tuple[float, float]:
        start = time.perf_counter()  # CLOCK_MONOTONIC, the library's clock
        run()
        return kernel.last_call_seconds(), time.perf_counter() - start

    dense, dense_wall = timed(lambda: kernel.dense(x, *weights, relu))
    assert 0 < dense <= dense_wall
    # an empty mask reads no row: microseconds, so the dense call's record (milliseconds) must have been replaced
    # (its wall time is not compared with the dense call's: the Python around it, preempted on a busy machine, has
    # taken longer than the dense kernel)
    empty, empty_wall = timed(lambda: kernel(x, *weights, relu, mask=torch.zeros(n_neurons, dtype=torch.bool)))
    assert 0 < empty <= empty_wall and empty < dense
    workspace = kernel._workspace.data_ptr()
    recorded = library.edge_cpu_sparse_ffn_call_ns(workspace, d, n_neurons)
    assert recorded == round(empty * 1e9)
    y = torch.empty(d)
    failing = [x.data_ptr(), d, n_neurons, *(w.data_ptr() for w in weights), 0, None, None, 9, 0.0, y.data_ptr()]
    assert library.edge_cpu_sparse_ffn(*failing, workspace, 1, None) != 0  # activation 9: invalid
    assert library.edge_cpu_sparse_ffn_call_ns(workspace, d, n_neurons) == recorded
    for arguments in ((None, d, n_neurons), (workspace, 0, n_neurons), (workspace, d, -1)):
        assert library.edge_cpu_sparse_ffn_call_ns(*arguments) == -1


def kernel_scores(x: torch.Tensor, a_t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The float32 scores svd_predictor computes, bit for bit, read from its masks alone: mask_i = s_i + bias_i > 0
    (an exact comparison of a float sum with 0) holds exactly for bias_i > -s_i, so a bisection over the float32
    values of bias finds -s_i as the largest bias whose mask is 0."""
    n_neurons = a_t.shape[1]

    def ordered(values: torch.Tensor) -> torch.Tensor:  # float32 -> int64 increasing with the value
        bits = values.view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    def value_of(keys: torch.Tensor) -> torch.Tensor:
        bits = torch.where(keys < 0, (-keys) | (1 << 31), keys)
        return bits.to(torch.int64).to(torch.int32).view(torch.float32)

    low = ordered(torch.full((n_neurons,), -1e30))  # mask 0 at this bias (for scores below 1e30)
    high = ordered(torch.full((n_neurons,), 1e30))  # mask 1
    while bool((high - low > 1).any()):
        middle = (low + high) // 2
        active = svd_predictor(x, a_t, b, value_of(middle))
        low, high = torch.where(active, low, middle), torch.where(active, middle, high)
    return -value_of(low)


@pytest.fixture
def openmp_threads():
    """Sets OpenMP's team size for the kernels (the libgomp they are linked with), restored afterwards."""
    try:
        openmp = ctypes.CDLL("libgomp.so.1")
    except OSError:
        pytest.skip("the kernels are not linked with libgomp here")
    previous = kernels.max_threads()
    yield openmp.omp_set_num_threads
    openmp.omp_set_num_threads(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_svd_scores_do_not_depend_on_the_thread_count(openmp_threads, dtype):
    """Every score is one thread's sum of its rank terms in order, however the neurons are split into blocks: 16405
    neurons are two blocks of scores on one thread (at most 16384 each), and 2 or 3 blocks on 2 or 3 threads, the
    last ending off a vector of 16; a rank of 19 leaves 3 rows after the 8-row groups."""
    generator = torch.Generator().manual_seed(19)
    d, n_neurons, rank = 40, 16405, 19
    x = torch.randn(d, generator=generator)
    a_t = (torch.randn(rank, n_neurons, generator=generator) * 3).to(dtype)
    b = (torch.randn(rank, d, generator=generator) / 7).to(dtype)
    scores = {}
    for threads in (1, 2, 3):
        openmp_threads(threads)
        assert kernels.max_threads() == threads
        scores[threads] = kernel_scores(x, a_t, b)
    assert torch.equal(scores[1], scores[2]) and torch.equal(scores[1], scores[3])
    assert torch.allclose(scores[1], (x @ b.float().T) @ a_t.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("d", "n_neurons", "rank"), [(192, 768, 16), (45, 1100, 7), (300, 2100, 40)])
def test_fp16_factor_kernel_computes_the_fp32_kernels_scores_on_widened_factors(d, n_neurons, rank):
    """edge_cpu_svd_predictor_f16 = edge_cpu_svd_predictor on the widened factors, every score bit for bit (block
    tails, vector tails and ranks that are no multiple of anything included), so F16 bundles score as calibrated."""
    generator = torch.Generator().manual_seed(d)
    x = torch.randn(d, generator=generator)
    a_t = (torch.randn(rank, n_neurons, generator=generator) * 3).half()
    b = (torch.randn(rank, d, generator=generator) / 7).half()
    scores = kernel_scores(x, a_t.float(), b.float())
    assert torch.equal(kernel_scores(x, a_t, b), scores)
    assert torch.allclose(scores, (x @ b.float().T) @ a_t.float(), rtol=1e-4, atol=1e-4)  # the scores, not noise
    bias = torch.randn(n_neurons, generator=generator)
    assert torch.equal(svd_predictor(x, a_t, b, bias), svd_predictor(x, a_t.float(), b.float(), bias))
