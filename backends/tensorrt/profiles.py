"""The TensorRT engine's optimization profiles, for one sequence (batch 1) of up to max_seq_len tokens.

One engine is built from the bundle's decode.onnx, which runs a prompt too (edge_sdk/export/graph.py, `_step_ffn`):
on an empty KV cache its FFN is the dense one, otherwise the predictor and SparseFFN. Two profiles cover the two:
- "prefill" (profile 0): seq in [1, max_seq_len] new tokens on an empty cache (past_seq = 0),
- "decode" (profile 1): one token after a cache of past_seq in [1, max_seq_len - 1] (decode follows a prefill).
Every graph input with a symbolic dimension is listed in both; scalars (sparsity_level, dense) are static and need
no profile. A profile only bounds shapes and picks kernels: the engine's weights are shared by both.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk import predictors
from edge_sdk.model.config import ModelConfig

# The graph the engine is built from, and its profiles in the order they are added (index = profile index).
ENGINE_GRAPH = "decode"
PROFILES = ("prefill", "decode")
# The prompt length TensorRT tunes the prefill profile for (clipped to max_seq_len).
PREFILL_OPT_TOKENS = 128


@dataclass(frozen=True)
class ShapeRange:
    """The min / opt / max shapes of one input, as IOptimizationProfile.set_shape takes them."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def _range(low: int, opt: int, high: int) -> tuple[int, int, int]:
    return low, min(max(opt, low), high), high


def profile_shapes(model: ModelConfig, max_seq_len: int, profile: str, predictor: str) -> dict[str, ShapeRange]:
    """The shape range of every dynamic input of the engine's graph in `profile`."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, found {profile!r}")
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len: expected >= 2 (a prompt token and a decoded one), found {max_seq_len}")
    kv_heads, head_dim = model.num_kv_heads, model.head_dim
    if profile == "prefill":
        seq = _range(1, PREFILL_OPT_TOKENS, max_seq_len)
        past = (0, 0, 0)
    else:
        seq = (1, 1, 1)
        past = _range(1, max_seq_len // 2, max_seq_len - 1)
    ranges = {name: ShapeRange(*((1, s) for s in seq)) for name in ("input_ids", "position_ids")}
    for layer in range(model.num_layers):
        for part in ("key", "value"):
            ranges[f"past_key_values.{layer}.{part}"] = ShapeRange(*((1, kv_heads, p, head_dim) for p in past))
    if predictors.KINDS[predictor].fixed_at_prefill:  # the prompt's mask is a decode input (decode_inputs)
        mask = (1, model.intermediate_size)
        for layer in range(model.num_layers):
            ranges[f"core_mask.{layer}"] = ShapeRange(mask, mask, mask)
    return ranges


def kv_buffer_bytes(model: ModelConfig, max_seq_len: int) -> int:
    """Bytes of one KV cache tensor at full capacity, [1, kv_heads, max_seq_len, head_dim] float32."""
    return model.num_kv_heads * max_seq_len * model.head_dim * 4
