"""What `edge-sdk info` shows about a checkpoint, as plain data."""

from __future__ import annotations

from typing import Any

from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.tokenizer import TOKENIZER_FILE


def describe_checkpoint(checkpoint: Checkpoint | GgufCheckpoint) -> dict[str, Any]:
    """Summarize an opened (so validated: config, headers, shapes, tokenizer) checkpoint directory or GGUF file."""
    config = checkpoint.config
    activation = config.activation.kind
    if activation == "fatrelu":
        activation += f" (threshold {config.activation.threshold:g})"
    rope = config.rope.rope_type
    if rope != "default":
        rope += f" x{config.rope.factor:g}"
    summary = {
        "path": str(checkpoint.model_dir),
        "architecture": config.architecture,
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "attention_heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "activation": activation,
        "rope": f"theta {config.rope.theta:g}, {rope}",
        "tied_embeddings": config.tie_word_embeddings,
        "parameters": config.parameter_count(),
        "dtype": str(checkpoint.stored_dtype).removeprefix("torch."),
        # what loading the model in its stored dtype takes, before a command that loads it checks memory
        "weight_bytes": checkpoint.weight_bytes,
        "weight_files": len({entry.file for entry in checkpoint.entries.values()}),
        "tokenizer": (checkpoint.model_dir / TOKENIZER_FILE).is_file(),
        "sparse_ready": config.activation.is_relu_family,
    }
    if isinstance(checkpoint, GgufCheckpoint):
        summary["tokenizer"] = bool(checkpoint.tokenizer_files())
        # quantized types are dequantized on export: `dtype` above is what they are read into
        summary["gguf_tensor_types"] = checkpoint.tensor_types()
        # what `export --dtype int4` makes of the file by default (--int4-scheme, --head-dtype, --down-dtype auto)
        summary["int4_scheme"] = "asymmetric" if checkpoint.asymmetric_grid else "symmetric"
        summary["int4_head_dtype"] = checkpoint.int4_head_dtype
        summary["int4_down_dtype"] = checkpoint.int4_down_dtype
    return summary
