"""CUDA kernels (plugins/kernels) against the torch reference: sparsity/ffn.py, svd.py, signbit.py, and the quantized
kernels against the same reference on the dequantized rows (edge_sdk/quant.py), the quantized SparseFFN's on the x it
computes with (quantized_activations: its gate and up rows are integer dot products, as the CPU kernels').

Run on any NVIDIA GPU with the kernel library built (`pip install -e .` with nvcc present); they skip with the
reason otherwise. Tolerances are those of edge_sdk/export/ops/schemas.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations
from safetensors import safe_open

from edge_sdk import quant
from edge_sdk.export.ops import error_bound
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.signbit import pack_sign_bits, signbit_mask

from .. import asymmetric_rows
from . import cuda_emulation, down_rows
from .cuda_harness import Device, Kernels, gpu_unavailable_reason, upload_quantized

UNAVAILABLE = gpu_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))]

# SparseFFN's declared bound (ops.ERROR_BOUNDS): max |y - y_ref| <= FFN_RTOL * max |y_ref|.
FFN_RTOL = error_bound("SparseFFN", "float32")
# Test data keep every masked neuron this far from its activity boundary (g = 0, g = t, |a| = threshold), so
# rounding cannot flip it and `active` must match exactly.
DECISION_MARGIN = 1e-4
# SvdPredictor: scores whose reference value is within this of zero may round either way.
SVD_SCORE_TOLERANCE = 1e-5

# (d, D): element-wise paths (d not a multiple of 8), 16-byte paths, several compaction passes (D > 4096)
# and many down-projection chunks.
SIZES = [(45, 77), (97, 300), (130, 77), (256, 1000), (64, 5000), (4096, 1100)]
ACTIVATIONS = {
    "relu": Activation("relu"),
    "fatrelu": Activation("fatrelu", 0.05),
    "drelu": Activation("drelu"),
    "silu": Activation("silu"),
}
WEIGHT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def device():
    gpu = Device()
    yield gpu
    gpu.close()


def margins(x, w_gate, activation, mask, thresholds=None):
    """Smallest distance of a masked neuron's gate from an activity boundary (g = 0, g = t, |a| = threshold)."""
    g = x.float() @ w_gate.float().T  # [T, D]
    distances = [(g - activation.threshold).abs() if activation.kind == "fatrelu" else g.abs()]
    if thresholds is not None:
        distances.append((activation.gate(g).abs() - thresholds).abs())
    return min((distance[mask].min().item() for distance in distances if mask.any()), default=float("inf"))


def ffn_case(tokens, d, n_neurons, dtype, activation, mask_fraction=0.4, seed=0):
    """x [T, d] fp32, w_gate, w_up, w_down_t [D, d] of dtype (y is O(1)) and a mask [T, D] of about mask_fraction,
    from the first seed at or after `seed` whose masked neurons all sit DECISION_MARGIN away from a boundary."""
    for attempt in range(seed, seed + 100):
        generator = torch.Generator().manual_seed(attempt)
        x = torch.randn(tokens, d, generator=generator)
        weights = tuple((torch.randn(n_neurons, d, generator=generator) / d**0.5).to(dtype) for _ in range(3))
        mask = torch.rand(tokens, n_neurons, generator=generator) < mask_fraction
        if margins(x, weights[0], activation, mask) > DECISION_MARGIN:
            return x, weights, mask
    raise AssertionError(f"no seed in {seed}..{seed + 99} gives clear decisions for d={d}, D={n_neurons}")


def run_ffn(device, x, weights, mask, activation, thresholds=None, weight_tensors=None):
    """The kernel's (y [T, d], active [T, D] bool). weight_tensors: device copies to use instead of uploading."""
    kernels = Kernels(device)
    tokens, d = x.shape
    n_neurons = weights[0].shape[0]
    device_weights = weight_tensors or tuple(device.upload(w) for w in weights)
    y = device.empty((tokens, d), torch.float32)
    active = device.empty((tokens, n_neurons), torch.uint8)
    workspace = device.allocate(kernels.workspace_size(d, n_neurons, tokens))
    kernels.sparse_ffn(
        device.upload(x),
        device_weights,
        None if mask is None else device.upload(mask.to(torch.int32)),  # OPS.md: int32 masks
        None if thresholds is None else device.upload(thresholds),
        activation.kind,
        activation.threshold,
        y,
        workspace,
        active,
    )
    return device.download(y), device.download(active).bool()


def assert_matches_reference(device, x, weights, mask, activation, thresholds=None, weight_tensors=None):
    n_neurons = weights[0].shape[0]
    full = torch.ones(x.shape[0], n_neurons, dtype=torch.bool)
    reference_mask = full if mask is None else mask
    assert margins(x, weights[0], activation, reference_mask, thresholds) > DECISION_MARGIN, "unclear test data"
    y, active = run_ffn(device, x, weights, mask, activation, thresholds, weight_tensors)
    reference = sparse_ffn(x.float(), *weights, reference_mask, activation, thresholds=thresholds)
    assert torch.equal(active, reference.active)
    scale = reference.output.abs().max()
    assert (y - reference.output).abs().max() <= FFN_RTOL * max(scale, 1e-30)
    return y, reference


@pytest.mark.parametrize("d, n_neurons", SIZES)
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES, ids=str)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_sparse_ffn_matches_reference(device, d, n_neurons, dtype, name):
    x, weights, mask = ffn_case(2, d, n_neurons, dtype, ACTIVATIONS[name])
    _, reference = assert_matches_reference(device, x, weights, mask, ACTIVATIONS[name])
    assert reference.active.any() and not reference.active.all()  # the case exercises both outcomes


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_inputs_are_converted(device, x_dtype):
    x, weights, mask = ffn_case(3, 256, 600, torch.float16, ACTIVATIONS["relu"], 0.5)
    x = x.to(x_dtype)
    assert margins(x, weights[0], ACTIVATIONS["relu"], mask) > DECISION_MARGIN
    assert_matches_reference(device, x, weights, mask, ACTIVATIONS["relu"])


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES, ids=str)
def test_chess_thresholds_with_silu(device, dtype):
    silu = ACTIVATIONS["silu"]
    everything = torch.ones(1, 500, dtype=torch.bool)
    for seed in range(100):
        x, weights, _ = ffn_case(1, 130, 500, dtype, silu, seed=seed)
        gate = silu.gate(x @ weights[0].float().T)[0].abs()
        thresholds = gate.median() * 2 * torch.rand(500, generator=torch.Generator().manual_seed(seed))
        if margins(x, weights[0], silu, everything, thresholds) > DECISION_MARGIN:
            break
    _, reference = assert_matches_reference(device, x, weights, None, silu, thresholds)
    assert 0 < reference.active.sum() < 500


def test_empty_mask_gives_zero_output(device):
    x, weights, _ = ffn_case(2, 256, 300, torch.float16, ACTIVATIONS["relu"])
    y, active = run_ffn(device, x, weights, torch.zeros(2, 300, dtype=torch.bool), ACTIVATIONS["relu"])
    assert not active.any()
    assert torch.equal(y, torch.zeros_like(y))


def test_full_mask_equals_dense_bit_for_bit(device):
    x, weights, _ = ffn_case(1, 512, 1000, torch.bfloat16, ACTIVATIONS["relu"], mask_fraction=1.0)
    dense, _ = assert_matches_reference(device, x, weights, None, ACTIVATIONS["relu"])
    full, _ = run_ffn(device, x, weights, torch.ones(1, 1000, dtype=torch.bool), ACTIVATIONS["relu"])
    assert torch.equal(dense.view(torch.int32), full.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_repeated_runs_are_bit_identical(device, dtype):
    x, weights, mask = ffn_case(2, 4096, 2000, dtype, ACTIVATIONS["relu"], 0.5)
    device_weights = tuple(device.upload(w) for w in weights)
    runs = [run_ffn(device, x, weights, mask, ACTIVATIONS["relu"], weight_tensors=device_weights) for _ in range(5)]
    for y, active in runs[1:]:
        assert torch.equal(y.view(torch.int32), runs[0][0].view(torch.int32))
        assert torch.equal(active, runs[0][1])


def test_misaligned_weights_take_the_elementwise_path(device):
    """Weights 2 bytes past a 16-byte boundary (d a multiple of 8) give the reference result too."""
    x, weights, mask = ffn_case(1, 256, 300, torch.float16, ACTIVATIONS["drelu"], 0.5)
    shifted = tuple(device.upload(w, byte_offset=2) for w in weights)
    assert_matches_reference(device, x, weights, mask, ACTIVATIONS["drelu"], weight_tensors=shifted)


def test_graph_capture_replays_the_same_result(device):
    """The launcher only enqueues (no host synchronisation), so it can be captured in a CUDA graph."""
    kernels = Kernels(device)
    x, weights, mask = ffn_case(1, 1024, 3000, torch.float16, ACTIVATIONS["relu"], 0.3)
    direct, _ = run_ffn(device, x, weights, mask, ACTIVATIONS["relu"])
    inputs = device.upload(x), tuple(device.upload(w) for w in weights), device.upload(mask.to(torch.int32))
    y = device.empty((1, 1024), torch.float32)
    workspace = device.allocate(kernels.workspace_size(1024, 3000, 1))
    graph = device.capture(lambda: kernels.sparse_ffn(*inputs, None, "relu", 0.0, y, workspace))
    try:
        for _ in range(3):
            device.fill_bytes(y, 0xFF)  # NaNs, so a replay that writes nothing is caught
            device.launch_graph(graph)
            assert torch.equal(device.download(y).view(torch.int32), direct.view(torch.int32))
    finally:
        device.destroy_graph(graph)


def test_fixture_layer_with_signbit_mask(device, tiny_model_dir):
    """The trained tiny model's layer 1 FFN (fp16, d=192, D=768), masked by the sign-bit predictor kernel."""
    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as checkpoint:
        prefix = "model.layers.1.mlp"
        w_gate = checkpoint.get_tensor(f"{prefix}.gate_proj.weight")
        w_up = checkpoint.get_tensor(f"{prefix}.up_proj.weight")
        w_down_t = checkpoint.get_tensor(f"{prefix}.down_proj.weight").T.contiguous()
    packed = pack_sign_bits(w_gate)
    for seed in range(100):
        x = torch.randn(2, 192, generator=torch.Generator().manual_seed(seed))
        expected_mask = signbit_mask(packed, x, 1.0)
        if margins(x, w_gate, ACTIVATIONS["relu"], expected_mask) > DECISION_MARGIN:
            break
    mask = device.empty((2, 768), torch.int32)
    Kernels(device).signbit_predictor(device.upload(x), device.upload(packed), 1.0, mask)
    predicted = device.download(mask)
    assert torch.equal(predicted, expected_mask.to(torch.int32))  # exactly 1 / 0
    predicted = predicted.bool()
    _, reference = assert_matches_reference(device, x, (w_gate, w_up, w_down_t), predicted, ACTIVATIONS["relu"])
    assert reference.active.sum() < predicted.sum()  # the predictor's false positives were dropped


@pytest.mark.parametrize("d, n_neurons, rank", [(45, 77, 5), (256, 1000, 32), (4096, 2000, 96)])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("factor_dtype", [torch.float32, torch.float16], ids=str)
def test_svd_predictor_matches_reference(device, d, n_neurons, rank, x_dtype, with_bias, factor_dtype):
    """fp16 factors (bundle format 5) are widened and scored in fp32: the reference on the widened factors."""
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(3, d, generator=generator).to(x_dtype)
    a = (torch.randn(n_neurons, rank, generator=generator) / rank**0.5).to(factor_dtype)
    b = (torch.randn(rank, d, generator=generator) / d**0.5).to(factor_dtype)
    bias = 0.3 * torch.randn(n_neurons, generator=generator) if with_bias else None
    mask = device.empty((3, n_neurons), torch.int32)
    scratch = device.empty((3, rank), torch.float32)
    upload = device.upload
    Kernels(device).svd_predictor(
        upload(x), upload(a), upload(b), None if bias is None else upload(bias), mask, scratch
    )
    scores = (x.float() @ b.float().T) @ a.float().T + (0.0 if bias is None else bias)
    clear = scores.abs() > SVD_SCORE_TOLERANCE
    assert torch.equal(device.download(mask)[clear], (scores > 0)[clear].to(torch.int32))  # exactly 1 / 0


@pytest.mark.parametrize("d", [45, 100, 128, 4096])
@pytest.mark.parametrize("alpha", [0.8, 1.0, 1.3])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_signbit_predictor_is_exact(device, d, alpha, x_dtype):
    generator = torch.Generator().manual_seed(10)
    # rows biased from mostly negative to mostly positive, so N_neg spreads across the decision for any d
    w_gate = torch.randn(700, d, generator=generator) + torch.linspace(-1.0, 1.0, 700)[:, None]
    x = torch.randn(2, d, generator=generator) + 0.5
    x[:, ::7] = 0.0
    x[:, 3::11] = -0.0  # sign bit set, but not negative: must count as non-negative
    x = x.to(x_dtype)
    packed = pack_sign_bits(w_gate)
    mask = device.empty((2, 700), torch.int32)
    Kernels(device).signbit_predictor(device.upload(x), device.upload(packed), alpha, mask)
    expected = signbit_mask(packed, x.float(), alpha)
    assert expected.any() and not expected.all()
    assert torch.equal(device.download(mask), expected.to(torch.int32))  # exactly 1 / 0


# ------------------------------------------------------------------------------------------ quantized rows

QUANT_RTOL = {fmt: error_bound("QuantizedSparseFFN", fmt) for fmt in quant.FORMATS}
MATMUL_RTOL = {fmt: error_bound("QuantizedMatMul", fmt) for fmt in quant.FORMATS}


def quantized_ffn_case(tokens, d, n_neurons, fmt, group_size, activation, mask_fraction=0.5, seed=0):
    """x [T, d] fp32, the three matrices quantized (QuantizedMatrix) and as the dequantized fp32 rows they hold, and a
    mask [T, D], from the first seed whose masked neurons sit DECISION_MARGIN from a boundary on the dequantized
    rows and quantized_activations(x)."""
    for attempt in range(seed, seed + 100):
        generator = torch.Generator().manual_seed(attempt)
        x = torch.randn(tokens, d, generator=generator)
        fp32 = [torch.randn(n_neurons, d, generator=generator) / d**0.5 for _ in range(3)]
        matrices = tuple(quant.quantize(w.numpy(), fmt, group_size) for w in fp32)
        rows = tuple(torch.from_numpy(quant.dequantize(m)) for m in matrices)
        mask = torch.rand(tokens, n_neurons, generator=generator) < mask_fraction
        if margins(quantized_activations(x), rows[0], activation, mask) > DECISION_MARGIN:
            return x, matrices, rows, mask
    raise AssertionError(f"no seed gives clear decisions for d={d}, D={n_neurons}")


def run_ffn_q(device, x, matrices, mask, activation, thresholds=None, byte_offset=0, weights=None):
    """The kernel's (y [T, d], active [T, D] bool); weights: device copies to use instead of uploading."""
    kernels = Kernels(device)
    tokens, d = x.shape
    n_neurons = matrices[0].shape[0]
    weights = weights or tuple(upload_quantized(device, m, byte_offset) for m in matrices)
    y = device.empty((tokens, d), torch.float32)
    active = device.empty((tokens, n_neurons), torch.uint8)
    workspace = device.allocate(kernels.workspace_size(d, n_neurons, tokens))
    kernels.sparse_ffn_q(
        device.upload(x),
        weights,
        None if mask is None else device.upload(mask.to(torch.int32)),
        None if thresholds is None else device.upload(thresholds),
        activation.kind,
        activation.threshold,
        y,
        workspace,
        active,
    )
    return device.download(y), device.download(active).bool()


def assert_quantized_matches_reference(device, x, matrices, rows, mask, activation, **options):
    y, active = run_ffn_q(device, x, matrices, mask, activation, **options)
    full = torch.ones(x.shape[0], matrices[0].shape[0], dtype=torch.bool)
    thresholds = options.get("thresholds")
    x_used = quantized_activations(x.float())
    reference = sparse_ffn(x_used, *rows, full if mask is None else mask, activation, thresholds=thresholds)
    assert torch.equal(active, reference.active)
    scale = reference.output.abs().max()
    assert (y - reference.output).abs().max() <= QUANT_RTOL[matrices[0].format] * max(scale, 1e-30)
    return y, reference


@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_quantized_sparse_ffn_matches_reference(device, fmt, group_size, name):
    # d: several tiles of the down kernel (512 int8 / 1024 int4 columns) plus a partial one; D: several chunks
    x, matrices, rows, mask = quantized_ffn_case(3, 1152, 700, fmt, group_size, ACTIVATIONS[name])
    _, reference = assert_quantized_matches_reference(device, x, matrices, rows, mask, ACTIVATIONS[name])
    assert reference.active.any() and not reference.active.all()


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantized_sparse_ffn_reads_codes_at_any_4_byte_alignment(device, fmt):
    """Codes 4 bytes past a 16-byte boundary take the word-load path, with the same result."""
    x, matrices, rows, mask = quantized_ffn_case(2, 4096, 300, fmt, 32, ACTIVATIONS["drelu"])
    aligned, _ = assert_quantized_matches_reference(device, x, matrices, rows, mask, ACTIVATIONS["drelu"])
    drelu = ACTIVATIONS["drelu"]
    shifted, _ = assert_quantized_matches_reference(device, x, matrices, rows, mask, drelu, byte_offset=4)
    assert torch.equal(aligned.view(torch.int32), shifted.view(torch.int32))


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_quantized_sparse_ffn_converts_half_precision_x(device, x_dtype):
    x, matrices, rows, mask = quantized_ffn_case(2, 256, 300, "int4", 64, ACTIVATIONS["relu"])
    x = x.to(x_dtype)
    assert margins(quantized_activations(x.float()), rows[0], ACTIVATIONS["relu"], mask) > DECISION_MARGIN
    assert_quantized_matches_reference(device, x, matrices, rows, mask, ACTIVATIONS["relu"])


def test_quantized_sparse_ffn_with_chess_thresholds_and_no_mask(device):
    silu = ACTIVATIONS["silu"]
    everything = torch.ones(1, 500, dtype=torch.bool)
    for seed in range(100):
        x, matrices, rows, _ = quantized_ffn_case(1, 256, 500, "int8", 128, silu, seed=seed)
        x_used = quantized_activations(x)
        gate = silu.gate(x_used @ rows[0].T)[0].abs()
        thresholds = gate.median() * 2 * torch.rand(500, generator=torch.Generator().manual_seed(seed))
        if margins(x_used, rows[0], silu, everything, thresholds) > DECISION_MARGIN:
            break
    _, reference = assert_quantized_matches_reference(device, x, matrices, rows, None, silu, thresholds=thresholds)
    assert 0 < reference.active.sum() < 500


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantized_sparse_ffn_is_bit_identical_run_to_run_and_equals_its_emulation(device, fmt):
    """Repeated runs give the same bits; the host emulation of the kernels (cuda_emulation.cu) computes the same
    sums in the same order, so it must agree within the op's bound (bits may differ only through expf and fused
    multiply-adds the device compiler forms)."""
    x, matrices, _, mask = quantized_ffn_case(2, 4096, 2000, fmt, 32, ACTIVATIONS["relu"])
    weights = tuple(upload_quantized(device, m) for m in matrices)
    runs = [run_ffn_q(device, x, matrices, mask, ACTIVATIONS["relu"], weights=weights) for _ in range(5)]
    for y, active in runs[1:]:
        assert torch.equal(y.view(torch.int32), runs[0][0].view(torch.int32))
        assert torch.equal(active, runs[0][1])
    if cuda_emulation.unavailable_reason() is None:
        emulated, emulated_active = cuda_emulation.sparse_ffn_q(x.numpy(), matrices, mask.numpy(), None, "relu", 0.0)
        assert np.array_equal(emulated_active, runs[0][1].numpy())
        scale = float(np.abs(emulated).max())
        assert float((runs[0][0] - torch.from_numpy(emulated)).abs().max()) <= QUANT_RTOL[fmt] * scale


def test_quantized_sparse_ffn_graph_capture_replays_the_same_result(device):
    kernels = Kernels(device)
    x, matrices, _, mask = quantized_ffn_case(1, 1024, 3000, "int4", 32, ACTIVATIONS["relu"], 0.3)
    direct, _ = run_ffn_q(device, x, matrices, mask, ACTIVATIONS["relu"])
    weights = tuple(upload_quantized(device, m) for m in matrices)
    inputs = device.upload(x), weights, device.upload(mask.to(torch.int32))
    y = device.empty((1, 1024), torch.float32)
    workspace = device.allocate(kernels.workspace_size(1024, 3000, 1))
    graph = device.capture(lambda: kernels.sparse_ffn_q(*inputs, None, "relu", 0.0, y, workspace))
    try:
        for _ in range(3):
            device.fill_bytes(y, 0xFF)
            device.launch_graph(graph)
            assert torch.equal(device.download(y).view(torch.int32), direct.view(torch.int32))
    finally:
        device.destroy_graph(graph)


def run_matvec_q(device, x, matrix, bias, byte_offset=0, transposed=True):
    y = device.empty((x.shape[0], matrix.shape[0] if transposed else matrix.shape[1]), torch.float32)
    bias_device = None if bias is None else device.upload(bias)
    weights = upload_quantized(device, matrix, byte_offset)
    Kernels(device).matvec_q(device.upload(x), weights, bias_device, y, transposed=transposed)
    return device.download(y)


# edge_matvec_q computes with x quantized to the integer dot products' planes: the reference runs on
# quantized_activations(x). tokens: one (lane_row_dot_planes), 3 (one warp per row for several tokens), 37 and 100
# (tiled GEMM staging x_hat, partial tiles)
@pytest.mark.parametrize("tokens", [1, 3, 37, 100])
@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_quantized_matvec_matches_reference(device, tokens, fmt, group_size):
    generator = torch.Generator().manual_seed(tokens + group_size)
    n_in, n_out = 1024, 130  # 130 rows: a partial tile of 64 rows and a partial block of 8 warps
    x = torch.randn(tokens, n_in, generator=generator)
    matrix = quant.quantize(torch.randn(n_out, n_in, generator=generator).numpy(), fmt, group_size)
    bias = torch.randn(n_out, generator=generator)
    weights = torch.from_numpy(quant.dequantize(matrix)).double()
    expected = quantized_activations(x).double() @ weights.T + bias.double()
    y = run_matvec_q(device, x, matrix, bias)
    assert (y.double() - expected).abs().max() <= MATMUL_RTOL[fmt] * expected.abs().max()
    unbiased = run_matvec_q(device, x, matrix, None, byte_offset=4)
    assert (unbiased.double() + bias.double() - expected).abs().max() <= MATMUL_RTOL[fmt] * expected.abs().max()


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_quantized_matvec_computes_with_the_cpu_kernels_quantized_x_to_the_bit(device, tokens):
    """Through W = I (int8 codes 1 on the diagonal, scales 1) edge_matvec_q returns the x it computes with: the CPU
    kernels' planes (quantized_activations), to the bit, on the one-token, few-token and GEMM paths."""
    generator = torch.Generator().manual_seed(tokens)
    magnitudes = 10.0 ** (6 * torch.rand(tokens, 8, generator=generator) - 3)
    x = torch.randn(tokens, 256, generator=generator) * magnitudes.repeat_interleave(32, dim=1)
    x[0, :32] = 0.0
    identity = quant.QuantizedMatrix("int8", 32, np.eye(256, dtype=np.int8), np.ones((256, 8), np.float16))
    y = run_matvec_q(device, x, identity, None)
    assert torch.equal(y.view(torch.int32), quantized_activations(x).view(torch.int32))


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_a_non_finite_activation_makes_every_product_of_its_token_nan(device, tokens):
    """As the CPU kernels: a NaN or an infinity gives its x block a NaN factor, so every output of its token is NaN
    and the other tokens' stay finite."""
    generator = torch.Generator().manual_seed(7)
    matrix = quant.quantize(torch.randn(9, 320, generator=generator).numpy(), "int4", 32)
    for value in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(tokens, 320, generator=generator)
        x[0, 300] = value
        y = run_matvec_q(device, x, matrix, None)
        assert torch.isnan(y[0]).all() and torch.isfinite(y[1:]).all()


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 40])
def test_quantized_matvec_converts_half_precision_x(device, x_dtype, tokens):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, 256, generator=generator).to(x_dtype)
    matrix = quant.quantize(torch.randn(70, 256, generator=generator).numpy(), "int4", 32)
    expected = quantized_activations(x.float()).double() @ torch.from_numpy(quant.dequantize(matrix)).double().T
    y = run_matvec_q(device, x, matrix, None)
    assert (y.double() - expected).abs().max() <= MATMUL_RTOL["int4"] * expected.abs().max()


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_quantized_matvec_equals_its_emulation_and_repeats_bit_for_bit(device, tokens):
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(tokens, 512, generator=generator)
    matrix = quant.quantize(torch.randn(200, 512, generator=generator).numpy(), "int8", 64)
    first, second = run_matvec_q(device, x, matrix, None), run_matvec_q(device, x, matrix, None)
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))
    if cuda_emulation.unavailable_reason() is None:
        emulated = torch.from_numpy(cuda_emulation.matvec_q(x.numpy(), matrix, None))
        assert (first - emulated).abs().max() <= MATMUL_RTOL["int8"] * emulated.abs().max()


# One token (decode's GEMV, lane_row_dot_planes and the warp butterfly) against its emulation, to the bit: 40 rows, a
# partial last block of 8 warps; 22016 values, a long x.
@pytest.mark.parametrize("kind", ["int8", "int4", "int4-asymmetric"])
@pytest.mark.parametrize(("n_in", "n_out"), [(512, 40), (22016, 9)])
def test_one_token_matvec_equals_its_emulation_to_the_bit(device, kind, n_in, n_out):
    if cuda_emulation.unavailable_reason() is not None:
        pytest.skip(cuda_emulation.unavailable_reason())
    rng = np.random.default_rng(n_in + n_out)
    if kind == "int4-asymmetric":
        matrix = asymmetric_rows.asymmetric_matrix(n_out, n_in, 64, seed=n_in)
    else:
        matrix = quant.quantize(rng.standard_normal((n_out, n_in)), kind, 64)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y = run_matvec_q(device, torch.from_numpy(x), matrix, torch.from_numpy(bias)).numpy()
    emulated = cuda_emulation.matvec_q(x, matrix, bias)
    assert np.array_equal(y.view(np.int32), emulated.view(np.int32)), np.abs(y - emulated).max()


# The integer GEMM (more than quant::kGemvTokens tokens) against its emulation, to the bit: the emulation hands the
# lanes' fragments to the matrix units in the PTX ISA's layout (quant_rows.cuh, "integer GEMM") and sums each output
# as the kernel does, so any difference is a fragment, a stage or a step the kernel reads otherwise. n_in: 416 = three
# stages of 128 columns and one step, 320 = two stages and two steps, 384 = three whole stages; 70 rows and 37 tokens:
# partial row and token tiles.
@pytest.mark.parametrize("kind", ["int8", "int4", "int4-asymmetric"])
@pytest.mark.parametrize(("n_in", "group_size"), [(416, 32), (320, 64), (384, 128)])
def test_integer_gemm_equals_its_emulation_to_the_bit(device, kind, n_in, group_size):
    if cuda_emulation.unavailable_reason() is not None:
        pytest.skip(cuda_emulation.unavailable_reason())
    rng = np.random.default_rng(n_in + group_size)
    if kind == "int4-asymmetric":
        matrix = asymmetric_rows.asymmetric_matrix(70, n_in, group_size, seed=n_in)
    else:
        matrix = quant.quantize(rng.standard_normal((70, n_in)), kind, group_size)
    x = rng.standard_normal((37, n_in)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    y = run_matvec_q(device, torch.from_numpy(x), matrix, torch.from_numpy(bias)).numpy()
    emulated = cuda_emulation.matvec_q(x, matrix, bias)
    assert np.array_equal(y.view(np.int32), emulated.view(np.int32)), np.abs(y - emulated).max()


# edge_matvec_q_t over W [in, out] (the neuron-major down projection of a prompt's dense FFN): in (the rows) not a
# multiple of the 32-row step, out a partial 64-column tile
@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_transposed_quantized_matvec_matches_reference(device, tokens, fmt, group_size):
    generator = torch.Generator().manual_seed(tokens * group_size)
    n_in, n_out = 700, 640
    x = torch.randn(tokens, n_in, generator=generator)
    matrix = quant.quantize(torch.randn(n_in, n_out, generator=generator).numpy(), fmt, group_size)
    bias = torch.randn(n_out, generator=generator)
    expected = x.double() @ torch.from_numpy(quant.dequantize(matrix)).double() + bias.double()
    y = run_matvec_q(device, x, matrix, bias, transposed=False)
    assert (y.double() - expected).abs().max() <= MATMUL_RTOL[fmt] * expected.abs().max()
    again = run_matvec_q(device, x, matrix, bias, byte_offset=4, transposed=False)
    assert torch.equal(y.view(torch.int32), again.view(torch.int32))


# ------------------------------------------------------------------ asymmetric int4 rows (group minimums)
# Rows whose minimums dominate their values and differ group to group (asymmetric_rows.py; test_cuda_emulation.py shows
# that every wrong reading of them misses these references by far): the reference on the dequantized rows, within
# OPS.md's bound and the asymmetric one edge_cuda_kernels.h declares (relative to the products).


@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_asymmetric_quantized_sparse_ffn_matches_reference(device, group_size, name):
    """d 1152: a whole tile of the down kernel and a partial one; D 301: chunks of 64 rows and a partial one. Masked and
    dense, the same active neurons as the float64 reference, repeated runs bit-identical, and the emulation within the
    bound."""
    act = asymmetric_rows.ACTIVATIONS[name]
    x, matrices, random_mask = asymmetric_rows.asymmetric_ffn_case(1152, 301, group_size, act, seed=group_size)
    rows = [quant.dequantize(m).astype(np.float64) for m in matrices]
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    weights = tuple(upload_quantized(device, m) for m in matrices)
    for mask in (torch.from_numpy(random_mask), None):
        runs = [run_ffn_q(device, torch.from_numpy(x), matrices, mask, act, weights=weights) for _ in range(2)]
        assert torch.equal(runs[0][0].view(torch.int32), runs[1][0].view(torch.int32))
        y, active = runs[0][0].numpy(), runs[0][1].numpy()
        reference_mask = np.ones((2, 301), bool) if mask is None else random_mask
        expected, expected_active, products_bound = asymmetric_rows.ffn_reference(x_used, rows, reference_mask, act)
        assert np.array_equal(active, expected_active) and expected_active.sum() >= 10
        error = np.abs(y.astype(np.float64) - expected)
        assert error.max() <= QUANT_RTOL["int4"] * np.abs(expected).max()
        assert (error <= products_bound).all()
        if cuda_emulation.unavailable_reason() is None:
            emulated, emulated_active = cuda_emulation.sparse_ffn_q(
                x, matrices, None if mask is None else random_mask, None, name, act.threshold
            )
            assert np.array_equal(emulated_active, active)
            assert np.abs(emulated - y).max() <= QUANT_RTOL["int4"] * np.abs(emulated).max()


def test_asymmetric_quantized_sparse_ffn_reads_codes_at_any_4_byte_alignment(device):
    act = asymmetric_rows.ACTIVATIONS["drelu"]
    x, matrices, mask = asymmetric_rows.asymmetric_ffn_case(4096, 300, 32, act, seed=5)
    x, mask = torch.from_numpy(x), torch.from_numpy(mask)
    aligned, _ = run_ffn_q(device, x, matrices, mask, act)
    shifted, _ = run_ffn_q(device, x, matrices, mask, act, byte_offset=4)
    assert torch.equal(aligned.view(torch.int32), shifted.view(torch.int32))


# tokens: 1 (one warp per row), 3 (several tokens per piece), 37 and 100 (the tiled GEMM, partial tiles)
@pytest.mark.parametrize("tokens", [1, 3, 37, 100])
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_asymmetric_quantized_matvec_matches_reference(device, tokens, group_size):
    rng = np.random.default_rng(tokens + group_size)
    matrix = asymmetric_rows.asymmetric_matrix(130, 1024, group_size, seed=tokens * group_size)
    x = rng.standard_normal((tokens, 1024)).astype(np.float32)
    bias = rng.standard_normal(130).astype(np.float32)
    weights = quant.dequantize(matrix).astype(np.float64)
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    expected = x_used @ weights.T + bias
    products = np.abs(x_used) @ np.abs(weights).T
    y = run_matvec_q(device, torch.from_numpy(x), matrix, torch.from_numpy(bias)).numpy()
    asymmetric_rows.assert_asymmetric_bounds(y, expected, products, MATMUL_RTOL["int4"])
    unbiased = run_matvec_q(device, torch.from_numpy(x), matrix, None, byte_offset=4).numpy()
    asymmetric_rows.assert_asymmetric_bounds(unbiased + bias, expected, products, MATMUL_RTOL["int4"])
    if cuda_emulation.unavailable_reason() is None:
        emulated = cuda_emulation.matvec_q(x, matrix, bias)
        assert np.abs(emulated - y).max() <= MATMUL_RTOL["int4"] * np.abs(emulated).max()


@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("group_size", quant.GROUP_SIZES)
def test_asymmetric_transposed_quantized_matvec_matches_reference(device, tokens, group_size):
    rng = np.random.default_rng(tokens * group_size)
    matrix = asymmetric_rows.asymmetric_matrix(700, 640, group_size, seed=tokens + group_size)
    x = rng.standard_normal((tokens, 700)).astype(np.float32)
    weights = quant.dequantize(matrix).astype(np.float64)
    expected = x.astype(np.float64) @ weights
    products = np.abs(x.astype(np.float64)) @ np.abs(weights)
    y = run_matvec_q(device, torch.from_numpy(x), matrix, None, transposed=False)
    asymmetric_rows.assert_asymmetric_bounds(y.numpy(), expected, products, MATMUL_RTOL["int4"])
    again = run_matvec_q(device, torch.from_numpy(x), matrix, None, byte_offset=4, transposed=False)
    assert torch.equal(y.view(torch.int32), again.view(torch.int32))


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_asymmetric_rows_of_mid_zero_give_the_symmetric_kernels_results(device, tokens):
    """Minimums of -8 scale make every mid 0 (asymmetric_rows.with_zero_mids): each launcher's asymmetric kernels give
    its symmetric kernels' values exactly, the minimums' terms added on top of unchanged symmetric sums."""
    rng = np.random.default_rng(tokens)
    symmetric = tuple(quant.quantize(rng.standard_normal((300, 1152)) / 34, "int4", 64) for _ in range(3))
    asymmetric = tuple(map(asymmetric_rows.with_zero_mids, symmetric))
    x = torch.from_numpy(rng.standard_normal((tokens, 1152)).astype(np.float32))
    assert torch.equal(run_matvec_q(device, x, asymmetric[0], None), run_matvec_q(device, x, symmetric[0], None))
    x_t = torch.from_numpy(rng.standard_normal((tokens, 300)).astype(np.float32))
    transposed = (run_matvec_q(device, x_t, m, None, transposed=False) for m in (asymmetric[0], symmetric[0]))
    assert torch.equal(*transposed)
    mask = torch.from_numpy(rng.random((tokens, 300)) < 0.5)
    (y, active), (y_symmetric, active_symmetric) = (
        run_ffn_q(device, x, weights, mask, ACTIVATIONS["relu"]) for weights in (asymmetric, symmetric)
    )
    assert active.any() and torch.equal(active, active_symmetric)
    assert torch.equal(y, y_symmetric)


# ---------------------------------------------- int8 down rows under int4 gate and up rows (down_format EDGE_Q8)
# An int4 bundle exported with --down-dtype int8 (down_rows.py; test_cuda_emulation.py shows that a reading of the down
# rows as int4, unsigned or with another group's scale misses these references by far).


@pytest.mark.parametrize("asymmetric", [False, True], ids=["int4", "int4_asymmetric"])
@pytest.mark.parametrize("name", ["relu", "silu"])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("tokens", [1, 3])
def test_int8_down_rows_under_int4_gate_and_up_match_reference(device, tokens, group_size, name, asymmetric):
    """d 1152: whole 512-column tiles of the int8 down kernel and a partial one; D 301: chunks of 64 rows and a partial
    one. Masked and dense: the same active neurons as the float64 reference on the dequantized rows, within OPS.md's
    bound and the products' one, repeated runs and codes 4 bytes past a 16-byte boundary bit-identical, and the
    emulation within the bound."""
    act = asymmetric_rows.ACTIVATIONS[name]
    x, matrices, random_mask = down_rows.mixed_ffn_case(tokens, 1152, 301, group_size, asymmetric, seed=tokens)
    rows = [quant.dequantize(m).astype(np.float64) for m in matrices]
    x_used = quantized_activations(torch.from_numpy(x)).numpy().astype(np.float64)
    weights = tuple(upload_quantized(device, m) for m in matrices)
    shifted = tuple(upload_quantized(device, m, byte_offset=4) for m in matrices)
    bound = QUANT_RTOL["int4"]
    for mask in (torch.from_numpy(random_mask), None):
        runs = [run_ffn_q(device, torch.from_numpy(x), matrices, mask, act, weights=w) for w in (weights, weights)]
        runs.append(run_ffn_q(device, torch.from_numpy(x), matrices, mask, act, weights=shifted))
        for y_run, _ in runs[1:]:
            assert torch.equal(runs[0][0].view(torch.int32), y_run.view(torch.int32))
        y, active = runs[0][0].numpy(), runs[0][1].numpy()
        reference_mask = np.ones((tokens, 301), bool) if mask is None else random_mask
        expected, expected_active, products_bound = asymmetric_rows.ffn_reference(x_used, rows, reference_mask, act)
        assert np.array_equal(active, expected_active) and expected_active.sum() >= 10 * tokens
        error = np.abs(y.astype(np.float64) - expected)
        assert error.max() <= bound * np.abs(expected).max()
        assert (error <= products_bound).all()
        if cuda_emulation.unavailable_reason() is None:
            emulated, emulated_active = cuda_emulation.sparse_ffn_q(
                x, matrices, None if mask is None else random_mask, None, name, act.threshold
            )
            assert np.array_equal(emulated_active, active)
            assert np.abs(emulated - y).max() <= bound * np.abs(emulated).max()


@pytest.mark.parametrize("tokens", [1, 3])
def test_int8_down_rows_of_int4_codes_give_the_all_int4_results_to_the_bit(device, tokens):
    """int8 down rows holding an int4 matrix's codes and scales: the int8 down kernel adds, per column, the int4 one's
    fmaf(h_i * scale, code) in the same order, so y is the all-int4 launch's to the bit (asymmetric gate and up: the
    all-asymmetric launch's with down mids of zero)."""
    rng = np.random.default_rng(tokens)
    symmetric = tuple(quant.quantize(rng.standard_normal((300, 1152)) / 34, "int4", 64) for _ in range(3))
    asymmetric = tuple(asymmetric_rows.asymmetric_matrix(300, 1152, 64, seed=tokens + k) for k in range(2))
    down = down_rows.int8_copy(symmetric[2])
    x = torch.from_numpy(rng.standard_normal((tokens, 1152)).astype(np.float32))
    mask = torch.from_numpy(rng.random((tokens, 300)) < 0.5)
    relu = ACTIVATIONS["relu"]
    for gate_up, all_int4 in (
        (symmetric[:2], symmetric),
        (asymmetric, (*asymmetric, asymmetric_rows.with_zero_mids(symmetric[2]))),
    ):
        y, active = run_ffn_q(device, x, (*gate_up, down), mask, relu)
        y_int4, active_int4 = run_ffn_q(device, x, all_int4, mask, relu)
        assert active.any() and torch.equal(active, active_int4)
        assert torch.equal(y.view(torch.int32), y_int4.view(torch.int32))
