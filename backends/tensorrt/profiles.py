"""TensorRT optimization profiles of the bundle's two graphs, for one sequence (batch 1) of up to max_seq_len tokens.

prefill.onnx starts a sequence: seq in [1, max_seq_len] new tokens on an empty KV cache (past_seq = 0).
decode.onnx appends one token to a cache of past_seq in [0, max_seq_len - 1]. Every graph input with a
symbolic dimension is listed; scalars (sparsity_level, dense) are static and need no profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.model.config import ModelConfig

PHASES = ("prefill", "decode")
# The prompt length TensorRT tunes the prefill engine for (clipped to max_seq_len).
PREFILL_OPT_TOKENS = 128


@dataclass(frozen=True)
class ShapeRange:
    """The min / opt / max shapes of one input, as IOptimizationProfile.set_shape takes them."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def _range(low: int, opt: int, high: int) -> tuple[int, int, int]:
    return low, min(max(opt, low), high), high


def profile_shapes(model: ModelConfig, max_seq_len: int, phase: str, predictor: str) -> dict[str, ShapeRange]:
    """The shape range of every dynamic input of `phase`'s graph."""
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {', '.join(PHASES)}, found {phase!r}")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len: expected >= 1, found {max_seq_len}")
    kv_heads, head_dim = model.num_kv_heads, model.head_dim
    if phase == "prefill":
        seq = _range(1, PREFILL_OPT_TOKENS, max_seq_len)
        past = (0, 0, 0)
    else:
        seq = (1, 1, 1)
        past = _range(0, max_seq_len // 2, max_seq_len - 1)
    ranges = {name: ShapeRange(*((1, s) for s in seq)) for name in ("input_ids", "position_ids")}
    for layer in range(model.num_layers):
        for part in ("key", "value"):
            ranges[f"past_key_values.{layer}.{part}"] = ShapeRange(*((1, kv_heads, p, head_dim) for p in past))
    if phase == "decode" and predictor == "core":
        mask = (1, model.intermediate_size)
        for layer in range(model.num_layers):
            ranges[f"core_mask.{layer}"] = ShapeRange(mask, mask, mask)
    return ranges
