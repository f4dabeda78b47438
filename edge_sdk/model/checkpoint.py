"""Hugging Face checkpoint directories: config.json plus model.safetensors or sharded model-*.safetensors.

Every safetensors header is parsed and validated (formats/safetensors.py) before any tensor is read, so a
truncated or corrupt file is reported by name instead of failing somewhere inside a read. Tensors are then read
one at a time through safetensors' memory map: nothing holds the whole model twice.

Checkpoints are often Hugging Face cache snapshots whose files are symbolic links into ../../blobs, so, unlike
bundle readers, these readers follow links. A sharded checkpoint's model.safetensors.index.json is held to:
- strict JSON (formats/strict_json.py), at most MAX_INDEX_BYTES, an object whose 'weight_map' is a non-empty
  object of tensor name -> shard file name;
- every shard name a relative path inside the model directory as written ('/'-separated names, none empty, '.'
  or '..', no backslash): checked before links are followed, since a cache's links point outside by design;
- the index and the shards agree exactly: every tensor is in one shard only, the one the index names, and every
  tensor the index names is in its shard.
The tensors the model uses must be F32, F16 or BF16 with the shapes config.json implies.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from edge_sdk.errors import CheckpointError
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import read_bounded
from edge_sdk.formats.safetensors import TensorEntry, read_header
from edge_sdk.model.config import hf_tensor_shapes, load_config
from edge_sdk.model.tokenizer import Tokenizer, read_tokenizer_files

if TYPE_CHECKING:
    from edge_sdk.model.gguf_checkpoint import GgufCheckpoint

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# An index lists one line per tensor: a 400B-parameter model's is under 1 MiB.
MAX_INDEX_BYTES = 16 << 20
# torch dtypes of the safetensors dtype names (formats/safetensors.py DTYPE_SIZES) torch has
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
# The dtypes the decoder computes from; integer or packed (quantized) weights would be cast into garbage.
MODEL_DTYPES = ("F32", "F16", "BF16")


def _shard_path(model_dir: Path, index_path: Path, shard: str) -> Path:
    if "\\" in shard or "\0" in shard or any(part in ("", ".", "..") for part in shard.split("/")):
        raise CheckpointError(
            f"{index_path}: shard {shard[:200]!r} must be a relative path inside the model directory "
            f"('/'-separated names, none empty, '.' or '..', no backslash)"
        )
    return model_dir / shard


def _read_weight_map(index_path: Path) -> dict[str, str]:
    data = read_bounded(index_path, MAX_INDEX_BYTES, follow_symlinks=True, error=CheckpointError)
    index = strict_json.parse_object(data, str(index_path), error=CheckpointError)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        found = strict_json.json_type(weight_map) if "weight_map" in index else "nothing"
        raise CheckpointError(
            f"{index_path}: field 'weight_map' must be a non-empty object of tensor name -> shard file name, "
            f"found {'an empty object' if weight_map == {} else found}"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(
                f"{index_path}: field 'weight_map' must map tensor names to shard file names, found "
                f"{strict_json.json_type(shard)} for tensor {name[:200]!r}"
            )
    return weight_map


def _sharded_tensors(model_dir: Path, index_path: Path) -> dict[str, TensorEntry]:
    """The tensors of a sharded checkpoint, once the index and the shards are known to agree."""
    weight_map = _read_weight_map(index_path)
    headers = {}
    for shard in sorted(set(weight_map.values())):
        path = _shard_path(model_dir, index_path, shard)
        if not path.exists():  # follows links: a dangling cache link is missing too
            tensor = next(name for name, listed in weight_map.items() if listed == shard)
            raise CheckpointError(f"{path}: file not found; {index_path} maps tensor {tensor[:200]!r} to it")
        headers[shard] = read_header(path, follow_symlinks=True, error=CheckpointError).tensors
    holders: dict[str, list[str]] = {}
    for shard, tensors in headers.items():
        for name in tensors:
            holders.setdefault(name, []).append(shard)
    for name, shards in holders.items():
        if len(shards) > 1:
            raise CheckpointError(
                f"{index_path}: tensor {name[:200]!r} is stored in {len(shards)} shards ({', '.join(shards[:2])}); "
                f"each tensor must be in exactly one"
            )
        listed = weight_map.get(name)
        if listed != shards[0]:
            where = "does not list it" if listed is None else f"maps it to {listed!r}"
            raise CheckpointError(
                f"{index_path}: tensor {name[:200]!r} is in shard {shards[0]!r}, but 'weight_map' {where}"
            )
    for name, shard in weight_map.items():
        if name not in holders:
            raise CheckpointError(
                f"{index_path}: 'weight_map' maps tensor {name[:200]!r} to {shard!r}, which does not hold it"
            )
    return {name: headers[shards[0]][name] for name, shards in holders.items()}


# A decoder layer's tensor, and its layer number.
_LAYER_TENSOR = re.compile(r"model\.layers\.([0-9]+)\.")


class Checkpoint:
    """A validated Hugging Face checkpoint directory whose tensors are read lazily, one at a time."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.config = load_config(self.model_dir)
        self.entries = self._index_tensors()
        self.expected_shapes = hf_tensor_shapes(self.config)
        self._check_tensors()

    def _index_tensors(self) -> dict[str, TensorEntry]:
        index_path = self.model_dir / SHARD_INDEX
        if os.path.lexists(index_path):
            return _sharded_tensors(self.model_dir, index_path)
        single = self.model_dir / SINGLE_FILE
        if os.path.lexists(single):
            return read_header(single, follow_symlinks=True, error=CheckpointError).tensors
        raise CheckpointError(
            f"{self.model_dir}: no weights found (expected {SINGLE_FILE} or {SHARD_INDEX} with its shards)"
        )

    def _check_tensors(self) -> None:
        for name, entry in self.entries.items():
            match = _LAYER_TENSOR.match(name)
            if match is not None and int(match[1]) >= self.config.num_layers:
                raise CheckpointError(
                    f"{entry.file}: tensor '{name}' belongs to layer {match[1]}, but config.json's num_hidden_layers "
                    f"is {self.config.num_layers}: the config and the weights describe different models"
                )
        for name, shape in self.expected_shapes.items():
            entry = self.entries.get(name)
            if entry is None:
                raise CheckpointError(f"{self.model_dir}: tensor '{name}' is missing from the weight files")
            if entry.dtype not in MODEL_DTYPES:
                raise CheckpointError(
                    f"{entry.file}: tensor '{name}' must be one of {', '.join(MODEL_DTYPES)}, found {entry.dtype}"
                )
            if entry.shape != shape:
                raise CheckpointError(
                    f"{entry.file}: tensor '{name}' has shape {list(entry.shape)}, expected {list(shape)} "
                    f"from config.json"
                )
        if self.config.tie_word_embeddings and "lm_head.weight" in self.entries:
            self._check_tied_head()

    def _check_tied_head(self) -> None:
        """config.json ties the LM head to the embedding, yet the files also hold an lm_head.weight. transformers
        (5.x) ties the two only when they are equal and otherwise keeps the stored head, untied; the decoder computes
        with the embedding, so a stored head that differs is refused instead of silently replaced. Compared in row
        blocks of at most 64 MiB, in float32 (the stored dtypes may differ)."""
        head, embed = self.entries["lm_head.weight"], self.entries["model.embed_tokens.weight"]
        equal = head.shape == embed.shape
        if equal:
            rows = head.shape[0]
            block = max(1, (64 << 20) // max(1, 4 * math.prod(head.shape[1:])))
            with safe_open(str(head.file), framework="pt") as h, safe_open(str(embed.file), framework="pt") as e:
                head_rows, embed_rows = h.get_slice("lm_head.weight"), e.get_slice("model.embed_tokens.weight")
                for start in range(0, rows, block):
                    stop = min(rows, start + block)
                    if not torch.equal(head_rows[start:stop].float(), embed_rows[start:stop].float()):
                        equal = False
                        break
        if not equal:
            raise CheckpointError(
                f"{head.file}: config.json sets tie_word_embeddings, but tensor 'lm_head.weight' differs from "
                "'model.embed_tokens.weight' (transformers then keeps the stored head, untied): set "
                "tie_word_embeddings to false to use lm_head.weight, or remove lm_head.weight to tie"
            )

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype of the FFN weights as stored (what `edge-sdk info` reports)."""
        return SAFETENSORS_DTYPES[self.entries["model.layers.0.mlp.gate_proj.weight"].dtype]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's tensors as stored: the memory loading them in their stored dtype takes, for callers
        that check memory before loading (in another dtype: config.parameter_count() * dtype.itemsize). Tensors in
        the files that the model does not use are not counted."""
        return sum(self.entries[name].end - self.entries[name].begin for name in self.expected_shapes)

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Read one tensor from the memory-mapped file, cast to dtype when given."""
        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.model_dir}: tensor '{name}' is missing from the weight files")
        # A handle per read: a tensor keeps only its own pages mapped, so pages of tensors a caller has
        # dropped leave memory at once (a cached handle would keep every page ever touched mapped).
        where = f"{entry.file}: tensor '{name}'"
        with safe_open(str(entry.file), framework="pt") as handle:
            tensor = require_finite(handle.get_tensor(name), where)
        return cast_weights(tensor, dtype, where)

    def layer_tensors(self, layer: int, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name without the layer prefix, tensor) for every tensor of one decoder layer."""
        prefix = f"model.layers.{layer}."
        for name in self.expected_shapes:
            if name.startswith(prefix):
                yield name[len(prefix) :], self.tensor(name, dtype)

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer files a bundle of this checkpoint carries (tokenizer.read_tokenizer_files)."""
        return read_tokenizer_files(self.model_dir)

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_dir(self.model_dir, self.config.eos_token_ids)


def _all_finite(values: torch.Tensor) -> bool:
    """Whether no value is NaN or infinite. A reduction, no mask: temporaries as large as a tensor, freed between the
    tensors a load keeps, would stay in the allocator's heap (the minimum and maximum are NaN when a value is,
    infinite when one is)."""
    if values.numel() == 0:
        return True
    smallest, largest = torch.aminmax(values.reshape(-1))
    return math.isfinite(float(smallest)) and math.isfinite(float(largest))


def require_finite(values: torch.Tensor, where: str) -> torch.Tensor:
    """values, unless one of them is NaN or infinite: a corrupted or overflowed checkpoint, whose model would compute
    NaN (an int8 / int4 export could not even quantize it). `where` names the tensor for the message."""
    if not _all_finite(values):
        raise CheckpointError(f"{where} holds NaN or infinite values; a model's weights must all be finite")
    return values


def cast_weights(values: torch.Tensor, dtype: torch.dtype | None, where: str) -> torch.Tensor:
    """values (finite) in dtype when given, unless a value overflows it (a float32 weight beyond fp16's 65504 read
    as fp16): that names the tensor and the dtypes that hold it, where a silent cast would store infinities."""
    if dtype is None or values.dtype == dtype:
        return values
    cast = values.to(dtype)
    narrower = cast.is_floating_point() and torch.finfo(cast.dtype).max < torch.finfo(values.dtype).max
    if narrower and not _all_finite(cast):
        largest = float(values.abs().max())
        raise CheckpointError(
            f"{where} holds values beyond {str(dtype).removeprefix('torch.')}'s range (max |w| = {largest:g}); "
            "export --dtype fp32 or bf16 keeps them"
        )
    return cast


def open_checkpoint(path: str | Path) -> Checkpoint | GgufCheckpoint:
    """A Hugging Face checkpoint directory, or a GGUF file (or a directory holding exactly one, without config.json),
    behind the same interface."""
    from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
    from edge_sdk.model.location import gguf_file

    found = gguf_file(path)
    return Checkpoint(path) if found is None else GgufCheckpoint(found)
