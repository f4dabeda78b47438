"""The CANN backend's torch path (backends/cann) on the CPU: GatherSparseFFN against sparsity/ffn.py and
SparseFeedForward, the gather engine on fixture bundles against the torch reference and the CPU backend,
the probe's messages and the fp16 cast. Tests that need an Ascend NPU are marked npu."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
import torch
from edge_sdk.backends import cann
from edge_sdk.backends.cann.engine import load_gather_engine
from edge_sdk.backends.cann.gather_ffn import GatherSparseFFN

from edge_sdk.bench.gather import COLUMNS, bench_gather_ffn, format_table
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.export.ops import error_bound
from edge_sdk.model.activation import Activation
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend, select_backend
from edge_sdk.sparsity.bundle_model import load_reference_decoder
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.settings import CalibrationSettings
from edge_sdk.sparsity.signbit import DeviceSignBit, pack_sign_bits, signbit_mask, signbit_max_negatives
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseFeedForward

D_MODEL, N_NEURONS, RANK = 72, 256, 8  # d not a multiple of 32: the sign-bit words carry padding
PROMPT = "class Namespace(object):\n    def __init__(self"
STEPS = 24
ACTIVATIONS = {
    "relu": Activation("relu"),
    "fatrelu": Activation("fatrelu", 0.3),
    "drelu": Activation("drelu"),
    "silu": Activation("silu"),
}
HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Within SparseFFN's declared bound relative to the reference's largest entry (the gathered GEMVs sum in another
    order)."""
    assert expected.abs().max() > 0.05, "the reference output is ~0: the comparison would prove nothing"
    bound = error_bound("SparseFFN", "float32")
    torch.testing.assert_close(actual, expected, rtol=bound, atol=bound * expected.abs().max().item())


def random_layer(seed: int = 0):
    """(tokens [8, d], w_gate, w_up, w_down_t [D, d] each), scaled so that g and u are O(1)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(8, D_MODEL, generator=generator)
    weights = [torch.randn(N_NEURONS, D_MODEL, generator=generator) / D_MODEL**0.5 for _ in range(3)]
    return tokens, *weights


def svd_predictor(seed: int = 1, bias_shift: float = 0.0, capacity: int | None = None) -> LayerPredictor:
    """A random svd predictor (scores are continuous: no ties) with one level and the given capacity."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "svd.a": torch.randn(N_NEURONS, RANK, generator=generator),
        "svd.b": torch.randn(RANK, D_MODEL, generator=generator) / D_MODEL**0.5,
        "svd.biases": torch.randn(1, N_NEURONS, generator=generator) + bias_shift,
    }
    if capacity is not None:
        tensors["svd.capacity"] = torch.tensor([capacity], dtype=torch.int32)
    return LayerPredictor("svd", tensors)


def svd_scores(predictor: LayerPredictor, x: torch.Tensor) -> torch.Tensor:
    """DESIGN 3.2's svd rule written out: x B^T A^T + b, [D] for x [d]."""
    tensors = predictor.tensors
    return x @ tensors["svd.b"].T @ tensors["svd.a"].T + tensors["svd.biases"][0]


def make_ffn(weights, activation, predictor, mode, capacity=None) -> GatherSparseFFN:
    ffn = GatherSparseFFN(*weights, activation, predictor, mode=mode, capacity=capacity)
    ffn.phase = "decode"
    return ffn


# ---- GatherSparseFFN against sparsity/ffn.sparse_ffn ----


def test_static_mode_keeps_the_top_capacity_scores():
    tokens, *weights = random_layer()
    relu = ACTIVATIONS["relu"]
    predictor = svd_predictor()
    for x in tokens:
        scores = svd_scores(predictor, x)
        predicted = int((scores > 0).sum())
        capacity = predicted // 2
        ffn = make_ffn(weights, relu, predictor, "static", capacity=capacity)
        step = ffn.step(x)
        top = torch.argsort(scores, descending=True)[:capacity]  # scores are continuous: no ties
        assert sorted(step.rows.tolist()) == sorted(top.tolist())
        kept_mask = torch.zeros(N_NEURONS, dtype=torch.bool)
        kept_mask[top] = True
        reference = sparse_ffn(x, *weights, kept_mask, relu)  # the predictor's mask cut to its top scores
        assert_close(step.output, reference.output)
        assert torch.equal(step.active(N_NEURONS), reference.active)
        full = sparse_ffn(x, *weights, scores > 0, relu)
        assert (full.active & ~reference.active).any(), "the cut dropped no active neuron: the test proves nothing"
        exact = make_ffn(weights, relu, predictor, "static", capacity=predicted).step(x)  # a capacity that just fits
        assert_close(exact.output, full.output)
        assert torch.equal(exact.active(N_NEURONS), full.active)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_empty_masks_give_zeros(mode):
    tokens, *weights = random_layer()
    relu = ACTIVATIONS["relu"]
    nothing_predicted = make_ffn(weights, relu, svd_predictor(bias_shift=-1e6, capacity=16), mode)
    step = nothing_predicted.step(tokens[0])
    assert torch.equal(step.output, torch.zeros(D_MODEL)) and not step.active(N_NEURONS).any()
    # x = 0: every predicted neuron has g = 0, a false positive, so nothing reaches up/down
    everything_predicted = make_ffn(weights, relu, svd_predictor(bias_shift=1e6, capacity=N_NEURONS), mode)
    step = everything_predicted.step(torch.zeros(D_MODEL))
    assert torch.equal(step.output, torch.zeros(D_MODEL)) and not step.active(N_NEURONS).any()


def _predictor(kind: str, w_gate: torch.Tensor) -> LayerPredictor:
    """A predictor of each kind on random data, static capacity D (so static mode must be exact)."""
    capacity = torch.tensor([N_NEURONS], dtype=torch.int32)
    if kind == "svd":
        return svd_predictor(capacity=N_NEURONS)
    if kind == "signbit":
        packed = pack_sign_bits(w_gate)
        return LayerPredictor(
            "signbit", {"signbit.packed": packed, "signbit.alpha": torch.tensor([1.1]), "signbit.capacity": capacity}
        )
    if kind == "threshold":
        thresholds = torch.full((1, N_NEURONS), 0.2)
        return LayerPredictor("threshold", {"threshold.thresholds": thresholds, "threshold.capacity": capacity})
    if kind == "core":
        return LayerPredictor("core", {"core.capacity": torch.tensor([52], dtype=torch.int32)}, core_beta=0.2)
    return LayerPredictor("none")


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["svd", "signbit", "core", "threshold", "none"])
def test_each_predictor_kind_matches_sparse_feed_forward(kind, mode):
    tokens, *weights = random_layer(seed=3)
    relu = ACTIVATIONS["relu"]
    predictor = _predictor(kind, weights[0])
    reference = SparseFeedForward(*weights, relu, predictor)
    gather = GatherSparseFFN(*weights, relu, predictor, mode=mode)
    prompt = tokens[None, :5]  # [1, 5, d]
    torch.testing.assert_close(gather(prompt), reference(prompt))  # dense prefill (core picks its neurons)
    if kind == "core":
        assert torch.equal(gather.prefill_mask, reference.prefill_mask) and 0 < int(reference.prefill_mask.sum()) <= 52
    gather.phase = reference.phase = "decode"
    for x in tokens[5:]:
        x = x.clone()
        x[:3] = torch.tensor([0.0, -0.0, 1e-30])  # sign conventions: 0 and -0.0 count as non-negative
        expected = reference(x[None, None])
        assert_close(gather(x[None, None])[0, 0], expected[0, 0])
        assert torch.equal(gather.last_active, reference.last_active)
        assert reference.last_active.sum() < N_NEURONS


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.1, 1.7, 2.0])
def test_device_signbit_equals_signbit_mask(alpha):
    generator = torch.Generator().manual_seed(4)
    w_gate = torch.randn(N_NEURONS, D_MODEL, generator=generator)
    x = torch.randn(16, D_MODEL, generator=generator)
    x[:, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    packed = pack_sign_bits(w_gate)
    signbit = DeviceSignBit(packed, alpha, D_MODEL, torch.device("cpu"))
    expected = signbit_mask(packed, x, alpha)  # [16, D]
    for row, token in enumerate(x):
        assert torch.equal(signbit.negatives(token), ((w_gate < 0) != (token < 0)).sum(1, dtype=torch.int32))
        assert torch.equal(signbit.scores(token) > 0, expected[row])
    assert 0 < int(expected.sum()) < expected.numel()


def test_signbit_max_negatives_is_the_rules_boundary():
    for d, alpha in ((72, 1.0), (72, 1.1), (4096, 0.9), (5, 2.0), (3, 0.5)):
        boundary = signbit_max_negatives(d, alpha)
        for negatives in range(d + 1):
            predicted_active = not (alpha * (d - negatives) < negatives)
            assert predicted_active == (negatives <= boundary), (d, alpha, negatives)


def test_unknown_mode_and_missing_capacity_are_errors():
    _, *weights = random_layer()
    with pytest.raises(ValueError, match="mode: expected one of dynamic, static, found 'graph'"):
        GatherSparseFFN(*weights, ACTIVATIONS["relu"], svd_predictor(), mode="graph")
    with pytest.raises(Exception, match=r"static mode needs the predictor tensor 'svd\.capacity'"):
        GatherSparseFFN(*weights, ACTIVATIONS["relu"], svd_predictor(), mode="static")


# ---- the gather engine on fixture bundles ----


@pytest.fixture(scope="module")
def bundles(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("cann-bundles")
    # the default level is given: chosen on validation, this small calibration would make the default dense
    calibration = CalibrationSettings(rank=16, max_tokens=1024, levels=(0.5, 0.8), sparsity=0.5)
    made = {}
    for kind, dtype in (("svd", "fp32"), ("signbit", "fp32"), ("core", "fp16"), ("threshold", "fp32")):
        settings = ExportSettings(dtype=dtype, max_seq_len=128, calibration=replace(calibration, predictor=kind))
        made[kind] = export_bundle(tiny_model_dir, root / kind, settings, [tiny_model_dir / "calibration.txt"])
    return made


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir):
    return Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)


def greedy(prefill, decode, ids):
    tokens = [int(np.asarray(prefill(ids)).argmax())]
    for _ in range(STEPS - 1):
        tokens.append(int(np.asarray(decode(tokens[-1])).argmax()))
    return tokens


@pytest.fixture(scope="module")
def reference_tokens(bundles, prompt_ids):
    """Greedy tokens of the torch reference per bundle, and of the CPU backend when its kernels are built."""
    tokens = {}
    cpu = get_backend("cpu")
    for kind, bundle in bundles.items():
        model = load_reference_decoder(bundle)
        reference = greedy(
            lambda p, m=model: m.prefill(torch.tensor([p]))[0, -1],
            lambda t, m=model: m.decode(torch.tensor([[t]]))[0, -1],
            prompt_ids,
        )
        native = None
        if cpu.probe()[0]:
            engine = cpu.load(bundle, EngineOptions.of(bundle))
            native = greedy(engine.prefill, engine.decode, prompt_ids)
        tokens[kind] = (reference, native)
    return tokens


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["svd", "signbit", "core", "threshold"])
def test_engine_greedy_tokens_equal_reference_and_cpu_backend(bundles, prompt_ids, reference_tokens, kind, mode):
    engine = load_gather_engine(
        bundles[kind], EngineOptions.of(bundles[kind]), device="cpu", dtype=torch.float32, mode=mode
    )
    if mode == "static":  # the calibrated capacities, which must really cut
        capacities = [ffn.static_capacity() for ffn in engine.model.ffns]
        assert all(0 < capacity < bundles[kind].config.intermediate_size for capacity in capacities), capacities
    tokens = greedy(engine.prefill, engine.decode, prompt_ids)
    reference, native = reference_tokens[kind]
    assert tokens == reference
    if native is None:
        pytest.skip(f"CPU backend unavailable ({get_backend('cpu').probe()[1]}); compared with the reference only")
    assert tokens == native


def test_engine_levels_dense_and_reset(bundles, prompt_ids):
    bundle = bundles["svd"]
    sparse = load_gather_engine(bundle, EngineOptions.of(bundle, sparsity=0.8))
    dense = load_gather_engine(bundle, EngineOptions.of(bundle, dense=True))
    assert [ffn.level_index for ffn in sparse.model.ffns] == [1] * bundle.config.num_layers
    first = sparse.prefill(prompt_ids), sparse.decode(prompt_ids[-1])
    sparse.reset()
    again = sparse.prefill(prompt_ids), sparse.decode(prompt_ids[-1])
    assert np.array_equal(first[1], again[1]) and first[1].shape == (bundle.config.vocab_size,)
    dense.prefill(prompt_ids)
    dense_logits = dense.decode(prompt_ids[-1])
    reference = load_reference_decoder(bundle)
    reference.configure(dense=True)
    reference.prefill(torch.tensor([prompt_ids]))
    expected = reference.decode(torch.tensor([[prompt_ids[-1]]]))[0, -1].numpy()
    np.testing.assert_allclose(dense_logits, expected, rtol=1e-4, atol=1e-4)
    assert not np.array_equal(dense_logits, first[1])


# ---- the CANN backend: probe, selection, fp16 cast ----


def test_probe_without_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ModuleNotFoundError
    available, reason = cann.CannBackend().probe()
    assert not available and "torch_npu is not installed" in reason
    with pytest.raises(BackendUnavailable, match=r"'cann' \(--backend\) is not available here: torch_npu is not inst"):
        select_backend("cann")


def test_probe_reports_a_failed_import(monkeypatch):
    real_import = importlib.import_module

    def failing_import(name, *args, **kwargs):
        if name == "torch_npu":
            raise OSError("libascendcl.so: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", failing_import)
    available, reason = cann.CannBackend().probe()
    assert not available
    assert reason.startswith("torch_npu import failed (CANN libraries missing?): OSError: libascendcl.so: cannot")
    with pytest.raises(BackendUnavailable, match=r"torch_npu import failed .*: OSError: libascendcl\.so: cannot open"):
        select_backend("cann")


def fake_torch_npu(available: bool, monkeypatch) -> types.ModuleType:
    """torch_npu 2.4.0 as it is: no get_cann_version (torch_npu.npu.utils has it since 2.5.1, torch_npu.utils since
    2.7.1) and no torch_npu.version.cann; importing it sets torch.version.cann (utils/collect_env.py)."""
    module = types.ModuleType("torch_npu")
    module.__version__ = "2.4.0.post2"
    module.npu = types.SimpleNamespace(
        is_available=lambda: available, get_device_name=lambda index: "Ascend310P3", device_count=lambda: 2
    )
    module.utils = types.SimpleNamespace()
    monkeypatch.setattr(torch.version, "cann", "8.0.0", raising=False)
    return module


@pytest.mark.parametrize(
    ("utils", "npu_utils", "found"),
    [
        (None, None, "8.0.0"),  # torch_npu < 2.5.1: torch.version.cann
        (None, "", "8.0.0"),  # 2.5.1 / 2.6.0 on a CANN older than 8.1.RC1: get_cann_version() answers ""
        ("8.1.RC1", "8.1.RC1", "8.1.RC1"),  # 2.7.1 and later
    ],
)
def test_the_cann_version_is_read_where_each_torch_npu_keeps_it(monkeypatch, utils, npu_utils, found):
    module = fake_torch_npu(True, monkeypatch)
    if utils is not None:
        module.utils.get_cann_version = lambda module="CANN": utils
    if npu_utils is not None:
        module.npu.utils = types.SimpleNamespace(get_cann_version=lambda module="CANN": npu_utils)
    assert cann._cann_version(module) == found
    monkeypatch.delattr(torch.version, "cann")
    assert cann._cann_version(types.ModuleType("torch_npu")) == "unknown"


def test_probe_distinguishes_no_npu_from_an_available_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(available=False, monkeypatch=monkeypatch))
    available, reason = cann.CannBackend().probe()
    assert not available and reason.startswith("no NPU visible (torch_npu 2.4.0.post2")
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(available=True, monkeypatch=monkeypatch))
    monkeypatch.setenv(cann.MODE_ENV, "static")
    available, reason = cann.CannBackend().probe()
    assert available and reason.startswith("Ascend310P3 (2 visible), CANN 8.0.0, torch_npu 2.4.0.post2, torch ")
    assert reason.endswith("decode FFN static gather-plus-matmul")


def test_npu_weight_notice_names_every_cast_but_fp16():
    assert cann.npu_weight_notice("fp16") is None
    assert cann.npu_weight_notice("fp32") == "casting fp32 bundle to fp16 for the Ascend cube unit"
    assert cann.npu_weight_notice("bf16") == "casting bf16 bundle to fp16 for the Ascend cube unit"


def test_cann_load_casts_an_fp32_bundle_with_a_notice(bundles, prompt_ids, monkeypatch):
    backend = cann.CannBackend(device="cpu")  # the backend's own load, on the CPU instead of an NPU
    monkeypatch.setattr(backend, "probe", lambda: (True, "pretend NPU"))
    monkeypatch.setenv(cann.MODE_ENV, "static")
    with pytest.warns(UserWarning, match="casting fp32 bundle to fp16 for the Ascend cube unit"):
        engine = backend.load(bundles["svd"], EngineOptions.of(bundles["svd"]))
    assert all(ffn.mode == "static" and ffn.w_gate.dtype == torch.float16 for ffn in engine.model.ffns)
    assert engine.model.decoder.dtype == torch.float16
    logits = engine.prefill(prompt_ids)
    reference = load_reference_decoder(bundles["svd"]).prefill(torch.tensor([prompt_ids]))[0, -1].numpy()
    assert np.isfinite(logits).all() and logits.argmax() == reference.argmax()
    monkeypatch.setenv(cann.MODE_ENV, "graph")
    with pytest.raises(Exception, match=r"\$EDGE_SDK_CANN_MODE: expected one of dynamic, static, found 'graph'"):
        backend.load(bundles["svd"], EngineOptions.of(bundles["svd"]))


# ---- on a real Ascend NPU ----


@pytest.mark.npu
@pytest.mark.skipif(not HAS_TORCH_NPU, reason="needs an Ascend NPU with torch_npu (torch_npu is not installed)")
@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["relu", "drelu"])
def test_npu_fp16_gather_ffn_is_close_to_the_reference(kind, mode):
    importlib.import_module("torch_npu")
    tokens, *weights = random_layer()
    activation = ACTIVATIONS[kind]
    predictor = svd_predictor(capacity=N_NEURONS)
    ffn = GatherSparseFFN(*weights, activation, predictor, device="npu", dtype=torch.float16, mode=mode)
    for x in tokens:
        reference = sparse_ffn(x, *(w.half() for w in weights), svd_scores(predictor, x) > 0, activation)
        output = ffn.step(x).output.cpu()
        torch.testing.assert_close(output, reference.output, rtol=2e-2, atol=2e-2 * reference.output.abs().max().item())


@pytest.mark.npu
@pytest.mark.skipif(not HAS_TORCH_NPU, reason="needs an Ascend NPU with torch_npu (torch_npu is not installed)")
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_npu_engine_follows_the_reference(bundles, prompt_ids, reference_tokens, mode, monkeypatch):
    monkeypatch.setenv(cann.MODE_ENV, mode)
    available, reason = cann.BACKEND.probe()
    if not available:
        pytest.skip(reason)
    engine = cann.BACKEND.load(bundles["core"], EngineOptions.of(bundles["core"]))  # an fp16 bundle: no cast
    tokens = greedy(engine.prefill, engine.decode, prompt_ids)
    reference, _ = reference_tokens["core"]
    # fp16 attention and matmuls may drift from the fp32 reference late in a greedy run; the start must agree
    assert tokens[:8] == reference[:8]


# ---- the benchmark ----


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_bench_gather_ffn_realizes_the_requested_sparsity(mode):
    rows = bench_gather_ffn(64, 400, (0.5, 0.9), dtype="fp32", device="cpu", mode=mode, repeats=1, warmup=0)
    assert [row["sparsity"] for row in rows] == [0.5, 0.9]
    assert [row["realized_sparsity"] for row in rows] == [0.5, 0.9]
    assert [row["capacity"] for row in rows] == ([200, 40] if mode == "static" else [400, 400])
    assert all(row[column] > 0 for row in rows for column in COLUMNS)
    assert len(format_table(rows).splitlines()) == 3


# ---- fp16 compute: predictor scores in fp32, the FFN input clamped to the fp16 range ----


def test_fp16_svd_scores_stay_fp32_where_fp16_would_overflow():
    """A whitened factor with a large row: x B^T is 240000 and 239999, beyond fp16 (inf - inf = NaN there, which
    would mark both neurons inactive); in fp32 the scores are exactly +1 and -1."""
    d, n_neurons = 8, 2
    x = torch.ones(d)
    b = torch.full((2, d), 30000.0)
    b[1, -1] = 29999.0
    tensors = {
        "svd.a": torch.tensor([[1.0, -1.0], [-1.0, 1.0]]),
        "svd.b": b,
        "svd.biases": torch.zeros(1, n_neurons),
    }
    assert torch.isnan((x.half() @ b.half().T) @ tensors["svd.a"].half().T).all()  # what fp16 scores would give
    weights = [torch.full((n_neurons, d), 0.01) for _ in range(3)]
    ffn = GatherSparseFFN(*weights, Activation("relu"), LayerPredictor("svd", tensors), dtype=torch.float16)
    ffn.phase = "decode"
    assert torch.equal(ffn.scores(x), torch.tensor([1.0, -1.0]))
    step = ffn.step(x)
    assert step.rows.tolist() == [0]  # the fp32 mask: neuron 0 active, neuron 1 not
    torch.testing.assert_close(step.output, torch.full((d,), 0.08 * 0.08 * 0.01), rtol=1e-2, atol=0)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_fp16_input_beyond_the_fp16_range_is_clamped_not_inf(mode):
    tokens, *weights = random_layer(seed=3)
    weights = [w / 1000 for w in weights]  # keep products with a 65504 entry inside fp16
    x = tokens[0].clone()
    x[5] = 1e6  # a massive activation: inf in fp16
    predictor = svd_predictor(capacity=N_NEURONS)
    ffn = GatherSparseFFN(*weights, ACTIVATIONS["relu"], predictor, dtype=torch.float16, mode=mode)
    ffn.phase = "decode"
    output = ffn.step(x).output
    assert torch.isfinite(output).all()
    clamped = x.clamp(-65504.0, 65504.0)
    mask = svd_scores(predictor, x) > 0  # the predictor sees the unclamped input, in fp32
    reference = sparse_ffn(clamped.half().float(), *(w.half().float() for w in weights), mask, ACTIVATIONS["relu"])
    assert not torch.isfinite(weights[0].half() @ x.half()).all()  # what an unclamped cast gives the gate
    scale = reference.output.abs().max().item()
    assert scale > 0.05
    torch.testing.assert_close(output, reference.output, rtol=2e-2, atol=2e-2 * scale)
