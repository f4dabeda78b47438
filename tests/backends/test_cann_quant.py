"""int8 / int4 bundles on the CANN backend (backends/cann/quantized.py), on the CPU: the per-chip choice, the CPU
reference of torch_npu's weight-quant operators against their documented semantics, the quantized matrices, and the
engine on the fixture's int8 / int4 bundles both ways (weight-quant matmul with the reference operators, and
dequantize). The op table (tests/ops, columns cann_gather_*) checks each quantized op within its bound, and
tests/runtime/test_golden_ids.py the engine's greedy ids against the C runtime's and ONNX Runtime's. Tests marked npu
compare the reference with the real operators and run the engine on an NPU."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import numpy as np
import pytest
import torch
from edge_sdk.backends import cann
from edge_sdk.backends.cann.engine import load_gather_engine, quantized_lm_head
from edge_sdk.backends.cann.quantized import (
    DEQUANTIZE,
    MAX_MATMUL_DIM,
    QUANT_ENV,
    WEIGHT_QUANT_MATMUL,
    DequantizingMatrix,
    QuantizedLinear,
    TorchNpuWeightQuant,
    WeightQuantMatrix,
    choose_quant_path,
)

from edge_sdk import quant
from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import load_reference_decoder

from .cann_reference import ReferenceWeightQuant

HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None
QUANTIZED = ("svd-int8", "svd-int4")
PROMPT = "def parse_config(path):\n    with open(path) as handle:"
# logits of the fp32 engine against the fp32 reference on the same dequantized weights: summation order only
LOGIT_TOLERANCE = 1e-4


def operators_module(name: str = "Ascend910B3", *, int4pack: bool = True) -> types.SimpleNamespace:
    """A torch_npu stand-in whose weight-quant operators are the reference's, with torch_npu's signatures."""
    reference = ReferenceWeightQuant()

    def matmul(
        x,
        weight,
        antiquant_scale,
        antiquant_offset=None,
        quant_scale=None,
        quant_offset=None,
        bias=None,
        antiquant_group_size=0,
        inner_precise=0,
    ):
        assert antiquant_offset is None and quant_scale is None and quant_offset is None and bias is None
        return reference.matmul(x, weight, antiquant_scale, antiquant_group_size)

    module = types.SimpleNamespace(__version__="2.6.0.post5", reference=reference, npu_weight_quant_batchmatmul=matmul)
    if int4pack:
        module.npu_convert_weight_to_int4pack = lambda weight, inner_k_tiles=0: reference.pack_int4(weight)
    module.npu = types.SimpleNamespace(
        is_available=lambda: True, get_device_name=lambda index: name, device_count=lambda: 1
    )
    module.npu.utils = types.SimpleNamespace(get_cann_version=lambda module="CANN": "8.1.RC1")  # 2.6.0: npu.utils only
    return module


# ---- the choice per chip ----


@pytest.mark.parametrize(
    ("device_name", "path"),
    [
        ("Ascend910B1", WEIGHT_QUANT_MATMUL),
        ("Ascend910B4", WEIGHT_QUANT_MATMUL),
        ("Ascend910_9392", WEIGHT_QUANT_MATMUL),
        ("Ascend310P3", DEQUANTIZE),
        ("Ascend910A", DEQUANTIZE),
        ("Ascend910ProB", DEQUANTIZE),
        ("Ascend310B4", DEQUANTIZE),
    ],
)
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_each_chip_gets_the_product_its_operator_documents(device_name, path, dtype):
    plan = choose_quant_path(device_name, operators_module(device_name), dtype)
    assert plan.path == path
    assert plan.reason.startswith(device_name)
    if device_name.startswith("Ascend310P"):
        assert "per-channel" in plan.reason and "no int4" in plan.reason


def test_a_torch_npu_without_the_operators_dequantizes():
    old = operators_module(int4pack=False)
    assert choose_quant_path("Ascend910B2", old, "int8").path == WEIGHT_QUANT_MATMUL
    plan = choose_quant_path("Ascend910B2", old, "int4")
    assert plan.path == DEQUANTIZE and "lacks npu_convert_weight_to_int4pack" in plan.reason
    del old.npu_weight_quant_batchmatmul
    assert "lacks npu_weight_quant_batchmatmul" in choose_quant_path("Ascend910B2", old, "int8").reason


def test_the_environment_forces_dequantize_and_refuses_other_values():
    plan = choose_quant_path("Ascend910B2", operators_module(), "int4", requested="dequantize")
    assert plan.path == DEQUANTIZE and plan.reason.startswith(f"${QUANT_ENV}=dequantize")
    with pytest.raises(EdgeSdkError, match=r"\$EDGE_SDK_CANN_QUANT: expected one of auto, dequantize, found 'matmul'"):
        choose_quant_path("Ascend910B2", operators_module(), "int4", requested="matmul")


# ---- the reference operators against their documented semantics ----


def test_reference_pack_round_trips_and_checks_its_input():
    reference = ReferenceWeightQuant()
    codes = torch.randint(-8, 8, (5, 48), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = reference.pack_int4(codes)
    assert packed.dtype == torch.int32 and packed.shape == (5, 6)
    assert torch.equal(reference.unpack_int4(packed), codes.to(torch.int64))
    with pytest.raises(ValueError, match="multiple of 8"):
        reference.pack_int4(codes[:, :44].contiguous())
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        reference.pack_int4(codes + 8)
    with pytest.raises(ValueError, match="contiguous"):
        reference.pack_int4(codes.T)


def test_reference_matmul_is_the_documented_formula_and_enforces_its_constraints():
    generator = torch.Generator().manual_seed(1)
    k, n, group = 96, 5, 32
    x = torch.randn(3, k, generator=generator)
    codes = torch.randint(-127, 128, (k, n), generator=generator, dtype=torch.int8)
    scale = torch.rand(k // group, n, generator=generator)
    reference = ReferenceWeightQuant()
    scale_of_each_weight = scale[torch.arange(k) // group]  # (K, N): weight j of a column has the scale of group j / G
    expected = x.double() @ (codes.double() * scale_of_each_weight.double())
    torch.testing.assert_close(reference.matmul(x, codes, scale, group).double(), expected, rtol=1e-6, atol=1e-5)
    per_channel = scale[:1]
    torch.testing.assert_close(
        reference.matmul(x, codes, per_channel, 0), x @ (codes.float() * per_channel), rtol=1e-5, atol=1e-4
    )
    with pytest.raises(ValueError, match=r"antiquant_group_size: expected a multiple of 32 in \[32, K - 1 = 95\]"):
        reference.matmul(x, codes, scale[:1], 96)
    with pytest.raises(ValueError, match="dtype must equal x's"):
        reference.matmul(x, codes, scale.half(), group)
    with pytest.raises(ValueError, match=r"per-group shape must be \(3, 5\)"):
        reference.matmul(x, codes, scale.T, group)
    wide = torch.zeros(1, MAX_MATMUL_DIM + 1, dtype=torch.int8)
    with pytest.raises(ValueError, match="must lie in"):
        reference.matmul(torch.ones(1, 1), wide, torch.ones(1, MAX_MATMUL_DIM + 1), 0)


# ---- the matrices ----


def quantized_weight(fmt: str, rows: int, cols: int, group: int, seed: int = 2) -> quant.QuantizedMatrix:
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).numpy()
    return quant.quantize(weight, fmt, group)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("cols", "group"), [(192, 32), (256, 64), (128, 128)])
def test_both_matrices_multiply_gathered_rows_as_the_dequantized_matrix(fmt, cols, group):
    matrix = quantized_weight(fmt, 40, cols, group)
    dense = torch.from_numpy(quant.dequantize(matrix)).double()
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([39, 0, 17, 17, 5])
    operators = ReferenceWeightQuant()
    cpu = torch.device("cpu")
    for matrix_on_device in (
        DequantizingMatrix(matrix, cpu, torch.float32),
        WeightQuantMatrix(matrix, cpu, torch.float32, operators),
    ):
        for selected in (rows, None):
            expected = x.double() @ (dense if selected is None else dense[selected]).T
            found = matrix_on_device.product(x, selected)
            assert found.dtype == torch.float32
            torch.testing.assert_close(found.double(), expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    assert operators.matmul_calls == 2 and operators.pack_calls == (fmt == "int4")
    # one group per row (cols == group) is the per-channel mode: antiquant_group_size must stay below K
    assert WeightQuantMatrix(matrix, cpu, torch.float32, operators).group_size == (0 if cols == group else group)
    # down rows: dequantized exactly (code * scale is exact in fp32)
    assert torch.equal(DequantizingMatrix(matrix, cpu, torch.float32).rows(rows), dense[rows].float())


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_vocabulary_beyond_the_operators_limit_is_multiplied_in_slices(fmt):
    """Each slice is a whole tensor of its own: torch_npu reads an int32 weight as int4 packed along K only when it is
    the transpose of a whole tensor (the reference reads it the same way), so a row slice of one packed matrix
    would be refused as a K mismatch."""
    matrix = quantized_weight(fmt, MAX_MATMUL_DIM + 700, 64, 32)
    operators = ReferenceWeightQuant()  # refuses N > 65535, as the operator does
    head = WeightQuantMatrix(matrix, torch.device("cpu"), torch.float32, operators)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(4))
    dense = torch.from_numpy(quant.dequantize(matrix)).double()
    expected = x.double() @ dense.T
    found = head.product(x)
    assert operators.matmul_calls == 2 and found.shape == (1, MAX_MATMUL_DIM + 700)
    torch.testing.assert_close(found.double(), expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    # rows gathered from both blocks
    rows = torch.tensor([MAX_MATMUL_DIM + 699, 0, MAX_MATMUL_DIM, 5, MAX_MATMUL_DIM - 1, MAX_MATMUL_DIM + 3])
    expected = x.double() @ dense[rows].T
    found = head.product(x, rows).double()
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
    assert head.shape == (MAX_MATMUL_DIM + 700, 64)
    assert head.codes.dtype == (torch.int8 if fmt == "int8" else torch.int32)


def test_the_reference_reads_an_int32_weight_as_torch_npu_does():
    """op-plugin's npu_weight_quant_batchmatmul: K = 8 * size(0) for the transpose of a whole packed tensor; any other
    int32 view is (K, N / 8), so the transpose of a row slice of the packed words is a K mismatch."""
    reference = ReferenceWeightQuant()
    codes = torch.randint(-8, 8, (16, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(6))
    words = reference.pack_int4(codes)  # (16, 8)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(7))
    scale = torch.ones(1, 16)
    torch.testing.assert_close(reference.matmul(x, words.T, scale, 0), x @ codes.T.float(), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="The k of x and weight should be equal"):
        reference.matmul(x, words[:8].T, scale[:, :8], 0)
    torch.testing.assert_close(
        reference.matmul(x, words[:8].clone().T, scale[:, :8], 0), x @ codes[:8].T.float(), rtol=1e-5, atol=1e-4
    )
    # not transposed: (K, N / 8), int4 packed along N
    along_n = reference.pack_int4(codes.T.contiguous())  # (64, 2): K = 64, N = 16
    torch.testing.assert_close(reference.matmul(x, along_n, scale, 0), x @ codes.T.float(), rtol=1e-5, atol=1e-4)


# ---- the engine on the fixture's int8 / int4 bundles ----


def engine_for(bundle, path: str, **options):
    operators = ReferenceWeightQuant() if path == WEIGHT_QUANT_MATMUL else None
    engine = load_gather_engine(bundle, EngineOptions.of(bundle, **options), device="cpu", weight_quant=operators)
    return engine, operators


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("path", [WEIGHT_QUANT_MATMUL, DEQUANTIZE])
def test_engine_reads_the_quantized_matrices_on_the_chosen_path(bundle_matrix, name, path):
    bundle = bundle_matrix[name]
    engine, operators = engine_for(bundle, path)
    assert engine.quant_path == path
    product_matrix = WeightQuantMatrix if path == WEIGHT_QUANT_MATMUL else DequantizingMatrix
    for ffn in engine.model.ffns:
        assert ffn.w_gate.device.type == "meta"  # no float copy of the FFN anywhere
        assert isinstance(ffn.quantized.gate, product_matrix) and isinstance(ffn.quantized.up, product_matrix)
        assert isinstance(ffn.quantized.down, DequantizingMatrix)
    decoder = engine.model.decoder
    projections = [getattr(layer.self_attn, name) for layer in decoder.layers for name in ("q_proj", "o_proj")]
    if path == WEIGHT_QUANT_MATMUL:
        assert all(isinstance(module, QuantizedLinear) for module in [*projections, decoder.lm_head])
    else:  # dequantized once at load: the reference decoder's Linear modules on the dequantized weights
        assert all(isinstance(module, torch.nn.Linear) for module in [*projections, decoder.lm_head])
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT)
    reference = load_reference_decoder(bundle)
    expected = reference.prefill(torch.tensor([ids]))[0, -1].numpy()
    found = engine.prefill(ids)
    assert float(np.abs(found - expected).max()) <= LOGIT_TOLERANCE * float(np.abs(expected).max())
    for _ in range(4):
        token = int(expected.argmax())
        assert int(found.argmax()) == token
        expected = reference.decode(torch.tensor([[token]]))[0, -1].numpy()
        found = engine.decode(token)
    if operators is not None:  # int4: every matrix of the weight-quant path packed once at load, none per token
        packed = bundle.config.num_layers * 6 + isinstance(decoder.lm_head, QuantizedLinear)  # gate, up, q, k, v, o
        assert operators.matmul_calls > 0 and operators.pack_calls == (packed if name == "svd-int4" else 0)


@pytest.mark.parametrize(
    ("stored", "head"),
    [
        ({"lm_head.weight.scales", "embed_tokens.weight.scales"}, "lm_head.weight"),  # untied, both quantized
        ({"lm_head.weight.scales"}, "lm_head.weight"),  # untied, fp16 embedding
        ({"embed_tokens.weight.scales"}, "embed_tokens.weight"),  # tied to a quantized embedding
        (set(), None),  # tied to an fp16 embedding: the head stays a torch Linear
    ],
)
def test_the_lm_head_reads_the_quantized_matrix_the_bundle_holds(stored, head):
    assert quantized_lm_head(types.SimpleNamespace(has_tensor=lambda name: name in stored)) == head


@pytest.mark.parametrize("device_name", ["Ascend910B3", "Ascend310P3"])
def test_backend_load_picks_the_path_from_the_chip(bundle_matrix, monkeypatch, device_name):
    """CannBackend.load with a torch_npu whose operators are the reference: the chip decides, the 310P says why, and
    TorchNpuWeightQuant calls the operators with torch_npu's signatures."""
    module = operators_module(device_name)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    backend = cann.CannBackend(device="cpu")  # the backend's own load, on the CPU instead of an NPU
    monkeypatch.setattr(backend, "probe", lambda: (True, "pretend NPU"))
    bundle = bundle_matrix["svd-int4"]
    if device_name.startswith("Ascend310P"):
        with pytest.warns(UserWarning, match=r"Ascend310P3: the Atlas inference series has no group-wise quantized"):
            engine = backend.load(bundle, EngineOptions.of(bundle))
        assert engine.quant_path == DEQUANTIZE
    else:
        engine = backend.load(bundle, EngineOptions.of(bundle))
        assert engine.quant_path == WEIGHT_QUANT_MATMUL
        assert isinstance(engine.model.ffns[0].quantized.gate.ops, TorchNpuWeightQuant)
    assert engine.model.decoder.dtype == torch.float16
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT)
    logits = engine.prefill(ids)
    reference = load_reference_decoder(bundle).prefill(torch.tensor([ids]))[0, -1].numpy()
    assert np.isfinite(logits).all() and logits.argmax() == reference.argmax()
    assert (module.reference.matmul_calls > 0) == (device_name == "Ascend910B3")


def test_quantized_bundles_get_no_cast_notice():
    assert cann.npu_weight_notice("int8") is None and cann.npu_weight_notice("int4") is None


# ---- on a real Ascend NPU ----


def npu_or_skip():
    if not HAS_TORCH_NPU:
        pytest.skip("needs an Ascend NPU with torch_npu (torch_npu is not installed)")
    available, reason = cann.BACKEND.probe()
    if not available:
        pytest.skip(reason)
    return importlib.import_module("torch_npu")


@pytest.mark.npu
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_npu_operators_agree_with_the_reference(fmt, group):
    """The reference's reading of the documentation against the real operators (fp16, as the engine calls them)."""
    torch_npu = npu_or_skip()
    plan = choose_quant_path(torch_npu.npu.get_device_name(0), torch_npu, fmt)
    if plan.path != WEIGHT_QUANT_MATMUL:
        pytest.skip(plan.reason)
    matrix = quantized_weight(fmt, 300, 512, group)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(5)).half()
    rows = torch.tensor([299, 3, 150, 7])
    on_npu = WeightQuantMatrix(matrix, torch.device("npu"), torch.float16, TorchNpuWeightQuant(torch_npu))
    found = on_npu.product(x.npu(), rows.npu()).cpu().float()
    expected = x.double() @ torch.from_numpy(quant.dequantize(matrix)).double()[rows].T
    scale = float(expected.abs().max())
    torch.testing.assert_close(found.double(), expected, rtol=0, atol=2e-3 * scale)


@pytest.mark.npu
@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("requested", ["auto", "dequantize"])
def test_npu_engine_on_quantized_bundles_follows_the_reference(bundle_matrix, monkeypatch, name, requested):
    npu_or_skip()
    monkeypatch.setenv(QUANT_ENV, requested)
    bundle = bundle_matrix[name]
    engine = cann.BACKEND.load(bundle, EngineOptions.of(bundle))
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT)
    model = load_reference_decoder(bundle)
    tokens, expected = [], []
    logits, reference = engine.prefill(ids), model.prefill(torch.tensor([ids]))[0, -1]
    for _ in range(8):
        tokens.append(int(np.argmax(logits)))
        expected.append(int(reference.argmax()))
        logits = engine.decode(expected[-1])
        reference = model.decode(torch.tensor([[expected[-1]]]))[0, -1]
    # fp16 on the NPU against the fp32 reference: the start of a greedy run must agree
    assert tokens == expected


@pytest.mark.parametrize("name", ["svd-int4-head-int8", "tied-svd-int4-head-int8"])
def test_an_int8_head_in_an_int4_bundle_goes_through_the_int8_weight_quant_matmul(bundle_matrix, name):
    """export --head-dtype int8: the head (a tied model's embedding) is an int8 WeightQuantMatrix (codes as stored,
    never packed as int4) while every other dense matrix is packed int4, and the engine follows the reference."""
    bundle = bundle_matrix[name]
    engine, operators = engine_for(bundle, WEIGHT_QUANT_MATMUL, dense=True)
    decoder = engine.model.decoder
    head = decoder.lm_head.weight_q
    assert isinstance(decoder.lm_head, QuantizedLinear) and isinstance(head, WeightQuantMatrix)
    assert head.codes.dtype == torch.int8 and head.shape == (bundle.config.vocab_size, bundle.config.hidden_size)
    assert operators.pack_calls == bundle.config.num_layers * 6  # gate, up, q, k, v, o; the head is not packed
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT)
    reference = load_reference_decoder(bundle)
    expected = reference.prefill(torch.tensor([ids]))[0, -1].numpy()
    found = engine.prefill(ids)
    assert float(np.abs(found - expected).max()) <= LOGIT_TOLERANCE * float(np.abs(expected).max())
