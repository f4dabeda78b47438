"""Reference decoder for Llama / Mistral / Qwen2-family checkpoints (gpt-fast style).

Module and parameter names follow the Hugging Face checkpoint names, so loading only moves tensors.
The KV cache is allocated once by `setup_cache` and written by index; `prefill` and `decode` are
separate small functions. `forward` runs a whole sequence without a cache (training, calibration).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.activation import Activation
from edge_sdk.model.config import ModelConfig, RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., d]; normalized in fp32 like the Hugging Face reference, then scaled in x's dtype
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair rotation frequencies [head_dim / 2], with linear or llama3 scaling applied."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_tables(rope: RopeConfig, head_dim: int, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_seq_len, head_dim] in fp32 (rotate-half layout)."""
    positions = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(positions, rope_inverse_frequencies(rope, head_dim))
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, S, hd]; cos, sin: [S, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class KVCache(nn.Module):
    def __init__(self, batch: int, max_seq_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (batch, kv_heads, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: [B, Hkv, S, hd] written at positions start..start+S-1; returns the filled prefix
        end = start + k.shape[2]
        batch = k.shape[0]
        self.k[:batch, :, start:end] = k
        self.v[:batch, :, start:end] = v
        return self.k[:batch, :, :end], self.v[:batch, :, :end]


def attention_mask(
    query_start: int, query_len: int, key_len: int, sliding_window: int | None, device
) -> torch.Tensor | None:
    """Boolean [S, L] mask (True = attend): causal, and within the sliding window when one is set."""
    if query_len == 1 and (sliding_window is None or key_len <= sliding_window):
        return None
    query_pos = torch.arange(query_start, query_start + query_len, device=device)[:, None]
    key_pos = torch.arange(key_len, device=device)[None, :]
    mask = key_pos <= query_pos
    if sliding_window is not None:
        mask &= key_pos > query_pos - sliding_window
    return mask


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.sliding_window = config.sliding_window
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=config.o_bias)
        self.kv_cache: KVCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
        # x: [B, S, d]; cos, sin: [S, hd] for positions start..start+S-1
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(start, k, v)
        mask = attention_mask(start, seq_len, k.shape[2], self.sliding_window, x.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, ffn = config.hidden_size, config.intermediate_size
        self.activation: Activation = config.activation
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d] -> [B, S, d]
        return self.down_proj(self.activation.gate(self.gate_proj(x)) * self.activation.up(self.up_proj(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, start)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.max_seq_len = 0
        self.position = 0
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def _rope(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + length
        if self.rope_cos is None or end > self.rope_cos.shape[0]:
            table_len = max(end, self.max_seq_len, 1)
            cos, sin = rope_tables(self.config.rope, self.config.head_dim, table_len)
            self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)
        return self.rope_cos[start:end], self.rope_sin[start:end]

    def setup_cache(self, max_seq_len: int, batch: int = 1) -> None:
        """Allocate the KV cache for up to max_seq_len positions and reset to position 0."""
        self.max_seq_len = max_seq_len
        for layer in self.layers:
            layer.self_attn.kv_cache = KVCache(
                batch, max_seq_len, self.config.num_kv_heads, self.config.head_dim, self.dtype, self.device
            )
        self.rope_cos = None
        self._rope(0, max_seq_len)
        self.position = 0

    def reset(self) -> None:
        """Forget the cached sequence; the next call must be prefill."""
        self.position = 0

    def _run(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        # ids: [B, S] -> logits [B, S, V] in fp32
        cos, sin = self._rope(start, ids.shape[1])
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h, cos, sin, start)
        return self.lm_head(self.norm(h)).float()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Whole-sequence causal forward without the KV cache: ids [B, S] -> logits [B, S, V]."""
        caches = [layer.self_attn.kv_cache for layer in self.layers]
        for layer in self.layers:
            layer.self_attn.kv_cache = None
        try:
            return self._run(ids, 0)
        finally:
            for layer, cache in zip(self.layers, caches, strict=True):
                layer.self_attn.kv_cache = cache

    def _check_room(self, new_tokens: int) -> None:
        if self.layers[0].self_attn.kv_cache is None:
            raise EdgeSdkError("the KV cache is not set up: call setup_cache(max_seq_len) first")
        if self.position + new_tokens > self.max_seq_len:
            raise EdgeSdkError(
                f"sequence length {self.position + new_tokens} exceeds the KV cache's max_seq_len {self.max_seq_len}"
            )

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Start a new sequence: ids [B, S] -> logits [B, S, V]; fills the cache at positions 0..S-1."""
        self.position = 0
        self._check_room(ids.shape[1])
        logits = self._run(ids, 0)
        self.position = ids.shape[1]
        return logits

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """One step: ids [B, 1] at the current position -> logits [B, 1, V]."""
        self._check_room(ids.shape[1])
        logits = self._run(ids, self.position)
        self.position += ids.shape[1]
        return logits
