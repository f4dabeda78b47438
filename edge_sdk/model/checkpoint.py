"""Hugging Face checkpoint directories: config.json plus model.safetensors or sharded model-*.safetensors.

Every safetensors header is parsed and checked against the file size before any tensor is read, so
a truncated or corrupt file is reported by name instead of failing somewhere inside a read. Tensors
are then read one at a time through safetensors' memory map: nothing holds the whole model twice.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from edge_sdk.errors import CheckpointError
from edge_sdk.model.config import ModelConfig, load_config

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, dtype, shape and byte range inside the data section."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str], int]:
    """Parse and validate a safetensors header: (tensors, metadata, byte offset of the data section)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    file_size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({file_size} bytes, expected at least 8)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > min(MAX_HEADER_BYTES, file_size - 8):
            raise CheckpointError(
                f"{path}: corrupt safetensors header: header length {header_size} does not fit in a "
                f"{file_size}-byte file"
            )
        raw_header = handle.read(header_size)
    try:
        header = json.loads(raw_header)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: corrupt safetensors header: not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_size
    data_size = file_size - data_start
    tensors = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor '{name}'") from None
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{path}: tensor '{name}' has unsupported dtype {dtype!r}")
        if any(not isinstance(n, int) or n < 0 for n in shape) or not 0 <= begin <= end:
            raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor '{name}'")
        expected_bytes = SAFETENSORS_DTYPES[dtype].itemsize
        for n in shape:
            expected_bytes *= n
        if end - begin != expected_bytes:
            raise CheckpointError(
                f"{path}: tensor '{name}' has {end - begin} bytes for shape {list(shape)} {dtype}, "
                f"expected {expected_bytes}"
            )
        if end > data_size:
            raise CheckpointError(
                f"{path}: truncated: tensor '{name}' ends at byte {data_start + end} but the file has {file_size} bytes"
            )
        tensors[name] = TensorEntry(path, dtype, shape, begin, end)
    return tensors, metadata, data_start


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape (Hugging Face names)."""
    d, ffn, heads, kv, hd = (
        config.hidden_size,
        config.intermediate_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, d),
        "model.norm.weight": (d,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (d,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (d,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (heads * hd, d)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv * hd, d)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv * hd, d)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (d, heads * hd)
        if config.qkv_bias:
            shapes[f"{prefix}.self_attn.q_proj.bias"] = (heads * hd,)
            shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv * hd,)
            shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv * hd,)
        if config.o_bias:
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (d,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (ffn, d)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (ffn, d)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (d, ffn)
    return shapes


class Checkpoint:
    """A validated Hugging Face checkpoint directory whose tensors are read lazily, one at a time."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.config = load_config(self.model_dir)
        self.entries = self._index_tensors()
        self.expected_shapes = hf_tensor_shapes(self.config)
        self._check_shapes()

    def _weight_files(self) -> list[Path]:
        index_path = self.model_dir / SHARD_INDEX
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CheckpointError(f"{index_path}: expected a JSON object with a 'weight_map' field") from None
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if Path(shard).is_absolute() or ".." in Path(shard).parts:
                    raise CheckpointError(f"{index_path}: shard path {shard!r} points outside the checkpoint")
            return [self.model_dir / shard for shard in shards]
        single = self.model_dir / SINGLE_FILE
        if single.is_file():
            return [single]
        raise CheckpointError(
            f"{self.model_dir}: no weights found (expected {SINGLE_FILE} or {SHARD_INDEX} with its shards)"
        )

    def _index_tensors(self) -> dict[str, TensorEntry]:
        entries: dict[str, TensorEntry] = {}
        for weight_file in self._weight_files():
            tensors, _, _ = read_safetensors_header(weight_file)
            entries.update(tensors)
        return entries

    def _check_shapes(self) -> None:
        for name, shape in self.expected_shapes.items():
            entry = self.entries.get(name)
            if entry is None:
                raise CheckpointError(f"{self.model_dir}: tensor '{name}' is missing from the weight files")
            if entry.shape != shape:
                raise CheckpointError(
                    f"{entry.file}: tensor '{name}' has shape {list(entry.shape)}, expected {list(shape)} "
                    f"from config.json"
                )

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype of the FFN weights as stored (what `edge-sdk info` reports)."""
        return SAFETENSORS_DTYPES[self.entries["model.layers.0.mlp.gate_proj.weight"].dtype]

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Read one tensor from the memory-mapped file, cast to dtype when given."""
        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.model_dir}: tensor '{name}' is missing from the weight files")
        # A handle per read: a tensor keeps only its own pages mapped, so pages of tensors a caller has
        # dropped leave memory at once (a cached handle would keep every page ever touched mapped).
        with safe_open(str(entry.file), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)

    def layer_tensors(self, layer: int, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name without the layer prefix, tensor) for every tensor of one decoder layer."""
        prefix = f"model.layers.{layer}."
        for name in self.expected_shapes:
            if name.startswith(prefix):
                yield name[len(prefix) :], self.tensor(name, dtype)
