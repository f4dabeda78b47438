"""Build a Decoder from a checkpoint directory or a GGUF file, materializing one tensor at a time.

The decoder is created on the meta device (no memory), then each parameter is replaced by the
tensor read from the memory-mapped safetensors file, so peak memory is the model once plus the
largest single tensor being cast.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from edge_sdk.errors import CheckpointError
from edge_sdk.model.checkpoint import Checkpoint, open_checkpoint
from edge_sdk.model.decoder import Decoder, TransformerBlock
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise CheckpointError(f"dtype {name!r} is not supported; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _assign(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    setattr(module, leaf, nn.Parameter(tensor, requires_grad=False))


def load_decoder(
    source: str | Path | Checkpoint | GgufCheckpoint,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_seq_len: int | None = None,
) -> Decoder:
    """Load a checkpoint into the reference decoder, in eval mode, with a KV cache when max_seq_len is given."""
    checkpoint = open_checkpoint(source) if isinstance(source, (str, Path)) else source
    with torch.device("meta"):
        decoder = Decoder(checkpoint.config)
    for name in checkpoint.expected_shapes:
        # Hugging Face names are "model.<our name>" except lm_head.weight
        _assign(decoder, name.removeprefix("model."), checkpoint.tensor(name, dtype).to(device))
    if checkpoint.config.tie_word_embeddings:
        decoder.lm_head.weight = decoder.embed_tokens.weight
    for name, parameter in decoder.named_parameters():
        if parameter.is_meta:
            raise CheckpointError(f"{checkpoint.model_dir}: no tensor was loaded for parameter '{name}'")
    decoder.eval()
    if max_seq_len is not None:
        decoder.setup_cache(max_seq_len)
    return decoder


def load_layer(
    checkpoint: Checkpoint | GgufCheckpoint, layer: int, dtype: torch.dtype = torch.float32
) -> TransformerBlock:
    """One decoder layer with its weights, for code that streams through a model layer by layer."""
    with torch.device("meta"):
        block = TransformerBlock(checkpoint.config)
    for name, tensor in checkpoint.layer_tensors(layer, dtype):
        _assign(block, name, tensor)
    return block.eval()
