"""Tiny random Hugging Face checkpoints for parity tests (transformers is a test-only dependency)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 97
# config.json of a small Llama, for tests of how a config is read (a checkpoint of it is 20 KB)
SMALL_CONFIG = {
    "model_type": "llama",
    "vocab_size": 50,
    "hidden_size": 32,
    "intermediate_size": 80,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "relu",
}


def family_configs():
    """The configurations the loader must match transformers on, as (name, config)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, rms_norm_eps=1e-5)
    qwen2_window = dict(
        num_attention_heads=4, num_key_value_heads=2, hidden_act="relu", use_sliding_window=True, sliding_window=5
    )
    return {
        "llama-relu": LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4, hidden_act="relu"),
        "mistral-gqa": MistralConfig(
            **common, num_attention_heads=8, num_key_value_heads=2, hidden_act="relu", sliding_window=4096
        ),
        # a window shorter than the test's 25 positions (mistral-gqa's 4096 never binds)
        "mistral-window": MistralConfig(
            **common, num_attention_heads=4, num_key_value_heads=1, hidden_act="silu", sliding_window=5
        ),
        "qwen2-bias-tied": Qwen2Config(
            **common, num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", tie_word_embeddings=True
        ),
        # a window shorter than the test's 25 positions, in every layer (max_window_layers 0): transformers' Qwen2
        # slides only from that layer on; with its default, 28, this model attends over the whole context
        "qwen2-window": Qwen2Config(**common, **qwen2_window, max_window_layers=0),
        "qwen2-window-unused": Qwen2Config(**common, **qwen2_window),
        "llama-rope-llama3": LlamaConfig(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_act="relu",
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "llama-rope-linear": LlamaConfig(
            **common,
            num_attention_heads=4,
            num_key_value_heads=1,
            hidden_act="silu",
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        ),
    }


def save_hf_model(config, directory: Path, seed: int = 0, max_shard_size: str | None = None):
    """Build a random model for config, give biases nonzero values, save it; returns the model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model
