"""config.json parsing and the FFN activations transformers has no reference for (fatrelu, drelu)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from edge_sdk.errors import CheckpointError
from edge_sdk.model.activation import Activation
from edge_sdk.model.config import parse_config
from edge_sdk.model.loader import load_decoder

from .hf_models import SMALL_CONFIG

BASE = SMALL_CONFIG


def parse(**overrides):
    return parse_config({**BASE, **overrides}, Path("config.json"))


def test_fatrelu_threshold_comes_from_hidden_act_param():
    config = parse(hidden_act="fatrelu", hidden_act_param=0.01)
    assert config.activation == Activation("fatrelu", 0.01)


def test_fatrelu_without_threshold_is_an_error():
    with pytest.raises(CheckpointError, match="hidden_act_param"):
        parse(hidden_act="fatrelu")


def test_architectures_field_identifies_the_family():
    config = parse(model_type=None, architectures=["Qwen2ForCausalLM"])
    assert config.model_type == "qwen2" and config.qkv_bias and not config.o_bias


def test_llama_attention_bias_covers_output_projection():
    config = parse(attention_bias=True)
    assert config.qkv_bias and config.o_bias


def test_derived_fields():
    config = parse(eos_token_id=[2, 7], torch_dtype="bfloat16")
    assert config.head_dim == 8 and config.kv_groups == 2
    assert config.eos_token_ids == (2, 7) and config.torch_dtype == "bfloat16"
    # 1 layer: attention 32*32*2 + 32*16*2, FFN 3*32*80, norms 2*32; embeddings 2*50*32; final norm 32
    assert config.parameter_count() == 2048 + 1024 + 7680 + 64 + 3200 + 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_act": "gelu"}, "'hidden_act' must be one of relu, fatrelu, drelu, silu, swish, found \"gelu\""),
        ({"model_type": "gpt2"}, "'model_type' must be one of llama, mistral, qwen2"),
        ({"num_key_value_heads": 3}, "'num_key_value_heads' must be a divisor of num_attention_heads (4), found 3"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
            "'rope_scaling.rope_type' must be one of default, linear, llama3, dynamic, found \"yarn\"",
        ),
        ({"mlp_bias": True}, "'mlp_bias' must be false"),
        ({"hidden_size": "64"}, "'hidden_size' must be an integer in [1, 1048576], found \"64\""),
    ],
)
def test_unsupported_configs_name_the_field(overrides, message):
    with pytest.raises(CheckpointError, match=re.escape(message)):
        parse(**overrides)


def test_config_round_trips_through_dict():
    config = parse(hidden_act="fatrelu", hidden_act_param=0.5, rope_scaling={"type": "linear", "factor": 2.0})
    assert type(config).from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("kind", "threshold"),
    [("relu", 0.0), ("fatrelu", 0.05), ("drelu", 0.0), ("silu", 0.0)],
)
def test_ffn_follows_the_activation_formula(kind, threshold, tmp_path):
    from safetensors.torch import save_file

    from edge_sdk.model.checkpoint import hf_tensor_shapes

    hidden_act = {"hidden_act": kind} | ({"hidden_act_param": threshold} if kind == "fatrelu" else {})
    config = parse(**hidden_act)
    generator = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=generator) * 0.2 for n, s in hf_tensor_shapes(config).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(__import__("json").dumps(BASE | hidden_act))
    mlp = load_decoder(tmp_path).layers[0].mlp
    x = torch.randn(5, 32, generator=generator)
    g = x @ tensors["model.layers.0.mlp.gate_proj.weight"].T
    u = x @ tensors["model.layers.0.mlp.up_proj.weight"].T
    gate = {"relu": g.clamp(min=0), "drelu": g.clamp(min=0), "silu": g * torch.sigmoid(g)}.get(
        kind, torch.where(g > threshold, g, 0.0)
    )
    up = u.clamp(min=0) if kind == "drelu" else u
    expected = (gate * up) @ tensors["model.layers.0.mlp.down_proj.weight"].T
    torch.testing.assert_close(mlp(x), expected, atol=1e-5, rtol=1e-5)
    if kind == "fatrelu":
        # values in (0, threshold] are cut, unlike plain relu
        assert ((g > 0) & (g <= threshold)).any()
