"""Logits of edge_sdk's decoder against Hugging Face transformers: prefill + 16 cached decode steps."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.loader import load_decoder

from .hf_models import VOCAB, family_configs, save_hf_model

PREFILL_TOKENS = 9
DECODE_STEPS = 16
TOLERANCE = 1e-4


def cache_name(model) -> str:
    """The name of the KV cache, as forward's keyword and its output's field: transformers 5 calls it `cache` (its
    old name, `past_key_values`, is removed in 5.40), 4.x only `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def hf_cached_logits(model, prompt: torch.Tensor, continuation: torch.Tensor) -> list[torch.Tensor]:
    """Prefill logits, then one logits row per cached decode step, from transformers."""
    name = cache_name(model)
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        logits, past = [out.logits[0]], getattr(out, name)
        for token in continuation:
            out = model(token.view(1, 1), use_cache=True, **{name: past})
            logits.append(out.logits[0])
            past = getattr(out, name)
    return logits


def ours_cached_logits(decoder, prompt: torch.Tensor, continuation: torch.Tensor) -> list[torch.Tensor]:
    logits = [decoder.prefill(prompt)[0]]
    logits += [decoder.decode(token.view(1, 1))[0] for token in continuation]
    return logits


@pytest.mark.parametrize("family", list(family_configs()))
def test_prefill_and_decode_match_transformers(family, tmp_path):
    config = family_configs()[family]
    model = save_hf_model(config, tmp_path)
    decoder = load_decoder(tmp_path, max_seq_len=64)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, PREFILL_TOKENS), generator=generator)
    continuation = torch.randint(0, VOCAB, (DECODE_STEPS,), generator=generator)

    expected = hf_cached_logits(model, prompt, continuation)
    found = ours_cached_logits(decoder, prompt, continuation)

    assert len(found) == 1 + DECODE_STEPS
    for step, (ours, theirs) in enumerate(zip(found, expected, strict=True)):
        assert ours.shape == theirs.shape
        diff = (ours - theirs).abs().max().item()
        assert diff <= TOLERANCE, f"{family}: step {step} max abs diff {diff}"
    # the models are random but not degenerate: logits differ across positions
    assert (found[1] - found[2]).abs().max() > 1e-3


def test_cacheless_forward_matches_cached_decode(tmp_path):
    save_hf_model(family_configs()["mistral-gqa"], tmp_path)
    decoder = load_decoder(tmp_path, max_seq_len=32)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    full = decoder(ids)[0]
    stepped = ours_cached_logits(decoder, ids[:, :4], ids[0, 4:])
    torch.testing.assert_close(stepped[0], full[:4], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(stepped[1:]), full[4:], atol=1e-5, rtol=0)


def test_sharded_checkpoint_matches_single_file(tmp_path):
    config = family_configs()["llama-relu"]
    save_hf_model(config, tmp_path / "single")
    save_hf_model(config, tmp_path / "sharded", max_shard_size="60KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    ids = torch.arange(12).view(1, 12)
    single, sharded = load_decoder(tmp_path / "single"), load_decoder(tmp_path / "sharded")
    assert torch.equal(single(ids), sharded(ids))
    assert len({entry.file for entry in Checkpoint(tmp_path / "sharded").entries.values()}) > 2


def test_legacy_rope_config_fields_are_read(tmp_path):
    """Checkpoints written before transformers 5 carry rope_theta + rope_scaling instead of rope_parameters."""
    save_hf_model(family_configs()["llama-rope-llama3"], tmp_path)
    config_path = tmp_path / "config.json"
    modern = json.loads(config_path.read_text())
    modern_config = Checkpoint(tmp_path).config
    legacy = {k: v for k, v in modern.items() if k != "rope_parameters"}
    legacy["rope_theta"] = modern["rope_parameters"]["rope_theta"]
    legacy["rope_scaling"] = {k: v for k, v in modern["rope_parameters"].items() if k != "rope_theta"}
    config_path.write_text(json.dumps(legacy))
    legacy_config = Checkpoint(tmp_path).config
    assert legacy_config.rope == modern_config.rope
    assert legacy_config.rope.rope_type == "llama3" and legacy_config.rope.theta == 500000.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_decoders_track_fp32(dtype, tmp_path):
    save_hf_model(family_configs()["qwen2-bias-tied"], tmp_path)
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    reference = load_decoder(tmp_path, max_seq_len=16).prefill(ids)
    half = load_decoder(tmp_path, dtype=dtype, max_seq_len=16)
    assert half.embed_tokens.weight.dtype == dtype
    logits = half.prefill(ids)
    assert logits.dtype == torch.float32
    relative = ((logits - reference).norm() / reference.norm()).item()
    assert 0 < relative < 3e-2
