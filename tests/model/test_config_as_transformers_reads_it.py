"""config.json keys whose reading transformers (the reference) defines by default or by precedence: a missing
sliding_window, a Mistral config with layer_types (read by transformers as Ministral's), the RoPE keys' precedence,
the families that ignore attention_bias / mlp_bias, and a tied head stored apart. Each case computes transformers'
logits, or is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge_sdk.errors import CheckpointError
from edge_sdk.model.config import RopeConfig, parse_config
from edge_sdk.model.loader import load_decoder

from .hf_models import SMALL_CONFIG, VOCAB, save_hf_model

BASE = SMALL_CONFIG | {"num_hidden_layers": 2}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def parsed(**fields):
    return parse_config(BASE | fields, Path("config.json"))


def test_an_absent_sliding_window_is_transformers_default_and_null_is_none():
    assert parsed(model_type="mistral").sliding_window == 4096
    assert parsed(model_type="mistral", sliding_window=None).sliding_window is None
    qwen = {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 0}
    assert parsed(**qwen).sliding_window == 4096
    assert parsed(**qwen, sliding_window=None).sliding_window is None
    assert parsed(model_type="qwen2").sliding_window is None  # no use_sliding_window
    assert parsed().sliding_window is None  # Llama


def test_a_mistral_config_with_layer_types_slides_as_they_say():
    mistral = {"model_type": "mistral", "sliding_window": 8}
    assert parsed(**mistral, layer_types=["full_attention"] * 2).sliding_window is None
    assert parsed(**mistral, layer_types=["sliding_attention"] * 2).sliding_window == 8
    assert parsed(**mistral, layer_types=None).sliding_window == 8
    with pytest.raises(CheckpointError, match="'layer_types' must be such that every layer or none attends"):
        parsed(**mistral, layer_types=["sliding_attention", "full_attention"])


def test_rope_keys_take_transformers_precedence():
    # rope_parameters' rope_theta over the top level's; the top level's when rope_parameters has none
    assert parsed(rope_theta=100.0, rope_parameters={"rope_type": "default", "rope_theta": 5e4}).rope.theta == 5e4
    assert parsed(rope_theta=100.0, rope_parameters={"rope_type": "default"}).rope.theta == 100.0
    # a non-empty rope_scaling replaces rope_parameters, rope_theta included
    both = parsed(rope_scaling={"rope_type": "linear", "factor": 4}, rope_parameters={"rope_theta": 5e4}).rope
    assert (both.rope_type, both.factor, both.theta) == ("linear", 4.0, 10000.0)
    assert parsed(rope_scaling={"type": "linear", "factor": 2, "rope_theta": 300}).rope.theta == 300.0
    # an empty one does not
    assert parsed(rope_scaling={}, rope_parameters={"rope_type": "linear", "factor": 4}).rope.rope_type == "linear"
    # dynamic NTK scaling changes nothing up to max_position_embeddings, which bounds every sequence edge-sdk runs
    assert parsed(rope_scaling={"type": "dynamic", "factor": 2.0}, rope_theta=5e5).rope == RopeConfig(theta=5e5)
    # llama3's original_max_position_embeddings: the top level's first, else max_position_embeddings
    assert parsed(rope_scaling=LLAMA3, max_position_embeddings=4096).rope.original_max_position_embeddings == 4096
    top = parsed(rope_scaling=LLAMA3 | {"original_max_position_embeddings": 16}, original_max_position_embeddings=64)
    assert top.rope.original_max_position_embeddings == 64


def test_bias_keys_are_read_for_llama_only():
    for family in ("mistral", "qwen2"):
        config = parsed(model_type=family, attention_bias=True, mlp_bias=True)
        assert config.o_bias is False and config.qkv_bias is (family == "qwen2")
    with pytest.raises(CheckpointError, match="'mlp_bias' must be false"):
        parsed(mlp_bias=True)
    assert parsed(attention_bias=True).o_bias is True
    with pytest.raises(CheckpointError, match="'attention_bias' must be true or false"):
        parsed(model_type="mistral", attention_bias="yes")


def transformers_logits(directory, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(ids).logits[0]


@pytest.mark.parametrize(
    ("family", "settings", "edit"),
    [
        ("mistral", {"sliding_window": 4}, {"layer_types": ["full_attention"] * 2}),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 5e4}}, {"rope_theta": 100.0}),
        ("llama", {}, {"rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 300.0}}),
        ("mistral", {}, {"attention_bias": True, "mlp_bias": True}),
        # dynamic NTK scaling up to max_position_embeddings, the test's 20 positions: the default RoPE
        ("llama", {}, {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, "max_position_embeddings": 20}),
    ],
)
def test_edited_configs_match_transformers(tmp_path, family, settings, edit):
    from transformers import LlamaConfig, MistralConfig

    kind = {"llama": LlamaConfig, "mistral": MistralConfig}[family]
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    save_hf_model(kind(**common, num_key_value_heads=2, **settings), tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | edit))
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    expected = transformers_logits(tmp_path, ids)
    with torch.no_grad():
        found = load_decoder(tmp_path)(ids)[0]
    assert (found - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_a_tied_config_whose_weights_hold_another_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4)
    save_hf_model(Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=False), tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"tie_word_embeddings": True}))
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' differs from 'model\.embed_tokens\.weight'"):
        load_decoder(tmp_path)
    # the same head as the embedding (as torch .bin conversions store it) is a tied model
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert load_decoder(tmp_path).config.tie_word_embeddings
