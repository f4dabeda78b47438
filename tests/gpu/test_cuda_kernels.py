"""CUDA kernels (plugins/kernels) against the torch reference: sparsity/ffn.py, svd.py, signbit.py.

Run on any NVIDIA GPU with the kernel library built (`pip install -e .` with nvcc present); they skip with the
reason otherwise. Tolerances are those of edge_sdk/export/ops/schemas.py.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from edge_sdk.export.ops import error_bound
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.signbit import pack_sign_bits, signbit_mask

from .cuda_harness import Device, Kernels, gpu_unavailable_reason

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
def test_svd_predictor_matches_reference(device, d, n_neurons, rank, x_dtype, with_bias):
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(3, d, generator=generator).to(x_dtype)
    a = torch.randn(n_neurons, rank, generator=generator) / rank**0.5
    b = torch.randn(rank, d, generator=generator) / d**0.5
    bias = 0.3 * torch.randn(n_neurons, generator=generator) if with_bias else None
    mask = device.empty((3, n_neurons), torch.int32)
    scratch = device.empty((3, rank), torch.float32)
    upload = device.upload
    Kernels(device).svd_predictor(
        upload(x), upload(a), upload(b), None if bias is None else upload(bias), mask, scratch
    )
    scores = (x.float() @ b.T) @ a.T + (0.0 if bias is None else bias)
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
