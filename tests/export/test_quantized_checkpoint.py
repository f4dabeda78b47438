"""The model a quantized bundle holds (export/quantized_checkpoint.py): AWQ scales folded in, matrices dequantized.

The folding must leave the fp model's function unchanged, the scale search must lower the quantized layers' output
error on calibration activations, and the default level of an int8 / int4 export must be validated on the
quantized weights, not the checkpoint's.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from edge_sdk import quant
from edge_sdk.cli import main
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.export.quantized_checkpoint import (
    AWQ_ALPHAS,
    LayerScales,
    QuantizedCheckpoint,
    search_awq_scales,
    search_scale,
)
from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.model.loader import load_decoder
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder
from edge_sdk.sparsity.collect import calibration_chunks, read_calibration_texts
from edge_sdk.sparsity.pipeline import fitting_chunks
from edge_sdk.sparsity.settings import CalibrationSettings
from edge_sdk.sparsity.validation import VALIDATION_PROMPT_TOKENS


class _ScaledView:
    """The checkpoint with the AWQ scales folded in but not quantized: the fp model the fold must leave unchanged."""

    def __init__(self, model: QuantizedCheckpoint):
        self.model = model

    def __getattr__(self, name: str):
        return getattr(self.model.checkpoint, name)

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = self.model.scaled_tensor(name)
        return tensor if dtype is None else tensor.to(dtype)


def _random_scales(config, generator: torch.Generator) -> dict[int, LayerScales]:
    """Log-uniform scales in [1/4, 4]; o_proj's equal within each kv group, as the fold requires."""

    def scales(*shape: int) -> torch.Tensor:
        return torch.exp((torch.rand(*shape, generator=generator) * 2 - 1) * math.log(4))

    group = config.num_heads // config.num_kv_heads
    result = {}
    for layer in range(config.num_layers):
        per_kv = scales(config.num_kv_heads, 1, config.head_dim)
        result[layer] = LayerScales(
            attention_input=scales(config.hidden_size),
            attention_output=per_kv.expand(-1, group, -1).flatten(),
            ffn_input=scales(config.hidden_size),
            ffn_hidden=scales(config.intermediate_size),
        )
    return result


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir):
    return open_checkpoint(tiny_model_dir)


@pytest.fixture(scope="module")
def prompt_ids(checkpoint, tiny_model_dir) -> torch.Tensor:
    texts = read_calibration_texts([tiny_model_dir / "held_out.txt"])
    return calibration_chunks(checkpoint.tokenizer(), texts, 256, 128, vocab_size=checkpoint.config.vocab_size)


def test_folded_scales_leave_the_fp_model_unchanged(checkpoint, prompt_ids):
    scales = _random_scales(checkpoint.config, torch.Generator().manual_seed(0))
    folded = _ScaledView(QuantizedCheckpoint(checkpoint, "int4", 32, scales))
    with torch.inference_mode():
        reference = load_decoder(checkpoint)(prompt_ids)
        transformed = load_decoder(folded)(prompt_ids)
    # the fold really moved weight between the norms and the projections
    norm = "model.layers.1.post_attention_layernorm.weight"
    assert (folded.tensor(norm) / checkpoint.tensor(norm, torch.float32)).std() > 0.3
    for name in ("model.layers.1.self_attn.v_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        assert not torch.allclose(folded.tensor(name), checkpoint.tensor(name, torch.float32), rtol=0.1)
    assert (transformed - reference).abs().max() <= 1e-4 * reference.abs().max()


def test_quantized_checkpoint_holds_the_bundles_values(checkpoint):
    model = QuantizedCheckpoint(checkpoint, "int4", 32)
    gate = "model.layers.0.mlp.gate_proj.weight"
    expected = quant.dequantize(quant.quantize(checkpoint.tensor(gate, torch.float32).numpy(), "int4", 32))
    assert torch.equal(model.tensor(gate), torch.from_numpy(expected))
    # down is quantized neuron-major: its groups run along the HF matrix's columns
    down = "model.layers.0.mlp.down_proj.weight"
    neuron_major = checkpoint.tensor(down, torch.float32).T.contiguous().numpy()
    expected_down = torch.from_numpy(quant.dequantize(quant.quantize(neuron_major, "int4", 32))).T
    assert torch.equal(model.tensor(down), expected_down)
    embedding = "model.embed_tokens.weight"
    assert torch.equal(model.tensor(embedding), checkpoint.tensor(embedding, torch.float16).float())
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(model.tensor(norm), checkpoint.tensor(norm, torch.float32))


def test_a_tied_embedding_is_held_quantized(tiny_model_dir, tmp_path):
    """A tied embedding is the LM head: the bundle stores it quantized, so calibration and the default level see its
    dequantized values (for the lookup and the head alike), not the fp16 matrix an untied embedding keeps."""
    from ..conftest import tied_checkpoint

    tied = open_checkpoint(tied_checkpoint(tiny_model_dir, tmp_path / "tied"))
    embedding = "model.embed_tokens.weight"
    source = tied.tensor(embedding, torch.float32)
    held = QuantizedCheckpoint(tied, "int4", 32).tensor(embedding)
    assert torch.equal(held, torch.from_numpy(quant.dequantize(quant.quantize(source.numpy(), "int4", 32))))
    assert not torch.equal(held, tied.tensor(embedding, torch.float16).float())


def test_awq_scales_lower_the_quantized_output_error(checkpoint, tiny_model_dir):
    texts = read_calibration_texts([tiny_model_dir / "calibration.txt"])
    chunks = calibration_chunks(checkpoint.tokenizer(), texts, 512, 256, vocab_size=checkpoint.config.vocab_size)
    scales, report = search_awq_scales(checkpoint, chunks, "int4", 32)
    assert set(scales) == set(range(checkpoint.config.num_layers))
    # alpha 0 (RTN) is a candidate: no group loses; the attention input gains in every layer
    for layer in report:
        assert all(
            layer[group]["error_vs_rtn"] <= 1.0 for group in ("attention_input", "attention_output", "ffn_input")
        )
        assert layer["attention_input"]["error_vs_rtn"] < 0.98
        # down_proj is stored neuron-major (groups along d), so a per-neuron scale multiplies whole rows of it and
        # of up_proj, which group-wise rounding follows: measured on the grid the bundle holds, it gains ~nothing
        assert 0.99 <= layer["ffn_hidden"]["error_vs_rtn"] <= 1.0
    # the search's own objective, recomputed: the chosen scale beats s = 1 on the layer's activations
    # inputs with a few salient channels (20x the others, one in 37) are AWQ's case: the error drops several-fold
    weight = checkpoint.tensor("model.layers.1.mlp.down_proj.weight", torch.float32)  # [d, D]
    x = torch.randn(256, weight.shape[1], generator=torch.Generator().manual_seed(0)).abs()
    x[:, ::37] *= 20
    scale, alpha, errors = search_scale(x, [weight], "int4", 32)
    assert alpha in AWQ_ALPHAS and alpha > 0
    assert errors[alpha] < 0.4 * errors[0.0]
    assert scale.shape == (weight.shape[1],) and (scale > 0).all()


def _dense_validation_perplexity(decoder, held: torch.Tensor) -> float:
    """Teacher-forced perplexity of the tokens validation scores: after each chunk's prompt and first decoded one."""
    with torch.inference_mode():
        logits = decoder(held).double()  # [C, L, V]
    scored = logits[:, VALIDATION_PROMPT_TOKENS:-1].flatten(0, 1)
    targets = held[:, VALIDATION_PROMPT_TOKENS + 1 :].flatten()
    return math.exp(F.cross_entropy(scored, targets).item())


def test_default_level_is_validated_on_the_quantized_weights(tmp_path, tiny_model_dir, checkpoint):
    calibration = CalibrationSettings(rank=16, max_tokens=512, levels=(0.5, 0.8), validation_tokens=512)
    files = [tiny_model_dir / "calibration.txt"]
    reported = {}
    for dtype in ("fp16", "int4"):
        settings = ExportSettings(dtype=dtype, max_seq_len=512, calibration=calibration)
        bundle = export_bundle(tiny_model_dir, tmp_path / dtype, settings, files)
        choice = json.loads((bundle.path / "report.json").read_text())["default_level_choice"]
        reported[dtype] = (bundle, choice["dense_perplexity"])
    _, held = fitting_chunks(checkpoint, calibration, files)
    int4_bundle, int4_dense = reported["int4"]
    decoder = load_reference_decoder(int4_bundle)
    configure(decoder, int4_bundle.sparsity.resolve(None, True))
    independent = _dense_validation_perplexity(decoder.decoder, held)
    assert int4_dense == pytest.approx(independent, rel=1e-4)
    assert abs(int4_dense / reported["fp16"][1] - 1) > 1e-3


def test_cli_exports_with_the_measured_default_group_size(tmp_path, tiny_model_dir):
    out = tmp_path / "int4"
    result = CliRunner().invoke(
        main, ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", "--dtype", "int4"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["group_size"] == quant.DEFAULT_GROUP_SIZE == 32
    # one fp16 scale per 32 values of a row: the fixture's q_proj is [192, 192]
    assert manifest["tensors"]["layers.0.self_attn.q_proj.weight.scales"]["shape"] == [192, 6]


def test_awq_searches_down_on_the_stored_grid_for_any_ffn_width():
    """down_proj [d, D] is quantized as the bundle stores it, transposed (groups along d): the search must quantize
    that grid, so that D need not be a multiple of the group size (D = 100 here died with a ValueError)."""
    from edge_sdk.export.quantized_checkpoint import _output_error, fake_quantize

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 100, generator=generator)  # [d, D]
    x = torch.randn(32, 100, generator=generator).abs()
    scale = torch.rand(100, generator=generator) + 0.5
    stored = fake_quantize((weight * scale).T.contiguous(), "int4", 32).T
    expected = float(((x / scale) @ stored.T - x @ weight.T).double().square().sum())
    assert _output_error(x, [weight], scale, "int4", 32, neuron_major=True) == expected
    _, alpha, errors = search_scale(x, [weight], "int4", 32, neuron_major=True)
    assert alpha in AWQ_ALPHAS and errors[alpha] <= errors[0.0]
