"""A GGUF file (llama.cpp's format) read behind the Checkpoint interface: config, tokenizer and HF-named tensors.

Supported: general.architecture `llama` (which is also what llama.cpp writes for Mistral models) and `qwen2`, with
tensors of the types in TENSOR_TYPES. The metadata becomes the equivalent config.json dict, validated by
config.parse_config like any checkpoint's:

- context_length, embedding_length, block_count, feed_forward_length, attention.head_count and
  attention.layer_norm_rms_epsilon are required; attention.head_count_kv (default: head_count),
  attention.key_length (default: embedding_length / head_count), rope.freq_base (default 10000) and linear rope
  scaling are read when present, RoPE scaling as llama.cpp reads it (llama-model.cpp load_hparams, llama-context.cpp):
  rope.scaling.type defaults to linear, the factor is rope.scaling.factor or else the older rope.scale_linear (0 or
  absent: none), and type none never scales; each integer is checked under its GGUF
  key against config.json's limits (config.py: head counts >= 1, head_count_kv dividing head_count, head_count
  dividing embedding_length when key_length is absent), and `{arch}.vocab_size`, when present, must equal the rows
  of token_embd.weight, which give the vocabulary size;
- llama.cpp stores no sliding window for Mistral and attends over the whole context; so does the loaded model;
- GGUF has no activation key: edge-sdk reads `{arch}.hidden_act` (config.json's hidden_act values, with
  `{arch}.hidden_act_param` for fatrelu) when a file states it, and otherwise uses silu, as llama.cpp does;
- tied embeddings: no `output.weight` tensor.
- llama attention biases as llama.cpp reads them: q/k/v biases where `blk.0.attn_q.bias` is present, the output
  projection's where `blk.0.attn_output.bias` is, independently.

Quantized weights are dequantized (gguf.quants.dequantize) one tensor at a time when read; llama.cpp's converter
permutes the rows of the llama q/k projections for its RoPE layout (convert_hf_to_gguf.py LlamaModel.permute),
which is undone here. Files this reader refuses, in one line naming the key or tensor: other architectures,
PowerInfer GGUFs (transposed `ffn_down_t` weights and predictor tensors), per-dimension RoPE factors
(`rope_freqs`, llama3 scaling), tensor types outside TENSOR_TYPES and tensors the architecture does not have.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

from edge_sdk.errors import CheckpointError
from edge_sdk.model.config import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB_SIZE,
    hf_tensor_shapes,
    parse_config,
)
from edge_sdk.model.gguf_metadata import GgufMetadata, open_reader
from edge_sdk.model.gguf_tokenizer import gguf_tokenizer_files
from edge_sdk.model.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer

if TYPE_CHECKING:
    import torch

ARCHITECTURES = ("llama", "qwen2")
Q = gguf.GGMLQuantizationType
TENSOR_TYPES = (
    *(Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1),
    *(Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K),
    *(Q.IQ1_S, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS),
)
# the dtype a tensor of each type is read into when the caller names none: float types as stored, the rest fp32.
# Named, not torch dtypes: opening a file needs no torch, so the command line refuses a bad file before importing it.
STORED_DTYPES = {Q.F16: "float16", Q.BF16: "bfloat16"}
# the types whose blocks carry a minimum besides their scale (value = scale * q + min): an asymmetric grid, which
# asymmetric int4 (edge_sdk/quant.py) keeps and symmetric int4 loses (QUANT.md, "Asymmetric INT4")
ASYMMETRIC_TYPES = (Q.Q4_1, Q.Q5_1, Q.Q2_K, Q.Q4_K, Q.Q5_K)
# the types with codes of 4 bits or fewer (the IQ types: indices into non-uniform grids): a file whose FFN rows are one
# of them is one that `export --dtype int4` re-stores at its own precision or wider (int4_head_dtype, int4_down_dtype
# below; from a 1- to 3-bit file, a bundle larger than the file)
LOW_BIT_TYPES = (
    *(Q.Q2_K, Q.Q3_K, Q.Q4_0, Q.Q4_1, Q.Q4_K),
    *(Q.IQ1_S, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS),
)
DEQUANTIZE_CALL_BYTES = 4 << 20
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
# PowerInfer's GGUFs store W_down transposed and their own predictor MLPs; their layout is not llama.cpp's
POWERINFER_TENSOR = re.compile(r"blk\.\d+\.(ffn_down_t|fc1|fc2)\.weight")
HIDDEN_ACT_KEY = "{arch}.hidden_act"
HIDDEN_ACT_PARAM_KEY = "{arch}.hidden_act_param"


@dataclass(frozen=True)
class GgufTensorEntry:
    """Where one Hugging Face-named tensor is in the GGUF file."""

    file: Path
    gguf_name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # Hugging Face order (rows first), as dequantized
    begin: int  # byte range in the file
    end: int
    data: np.ndarray  # the memory-mapped bytes (or values, for float types)


def _dequantize(entry: GgufTensorEntry) -> np.ndarray:
    """The entry's values as gguf.quants.dequantize gives them, converted a block of rows at a time: its numpy
    code makes several full-size temporaries per call (the SmolLM2 embedding's 113 MB of float32 peaked 400 MB
    above it in one call), so one call covers at most DEQUANTIZE_CALL_BYTES of stored bytes."""
    data = entry.data
    if data.dtype != np.uint8 or data.ndim != 2:  # F32 / F16: a view or a plain cast, nothing to split
        return gguf.quants.dequantize(data, entry.tensor_type)
    rows_per_call = max(1, DEQUANTIZE_CALL_BYTES // data.shape[1])
    first = gguf.quants.dequantize(data[:rows_per_call], entry.tensor_type)
    values = np.empty((data.shape[0], first.shape[1]), dtype=first.dtype)
    values[: first.shape[0]] = first
    for start in range(rows_per_call, data.shape[0], rows_per_call):
        values[start : start + rows_per_call] = gguf.quants.dequantize(
            data[start : start + rows_per_call], entry.tensor_type
        )
    return values


def _stored_dtype(tensor_type: gguf.GGMLQuantizationType) -> torch.dtype:
    import torch

    return getattr(torch, STORED_DTYPES.get(tensor_type, "float32"))


def _reverse_permute(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's LlamaModel.permute of q/k rows (weights [heads * head_dim, d] or biases [heads * head_dim]):
    it interleaves each head's two RoPE halves; this restores the halves Hugging Face's rotate_half expects."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


class GgufCheckpoint:
    """A validated GGUF file whose tensors are dequantized lazily, one at a time, under Hugging Face names.

    `model_dir` is the GGUF file: the Checkpoint interface's name for where the model was read from."""

    def __init__(self, path: str | Path):
        self.model_dir = Path(path)
        if not self.model_dir.is_file():
            problem = "is not a file" if self.model_dir.exists() else "file not found"
            raise CheckpointError(f"{self.model_dir}: {problem} (expected a GGUF file)")
        reader = open_reader(self.model_dir)
        # the metadata is read here and not kept: gguf holds every field as numpy arrays, the vocabulary's strings
        # included (130 MB for SmolLM2's 49,152 tokens), which an export would otherwise carry to its end
        metadata = GgufMetadata(reader, self.model_dir)
        self.architecture = metadata.string("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise CheckpointError(
                f"{self.model_dir}: metadata key 'general.architecture' must be one of {', '.join(ARCHITECTURES)} "
                f"(llama.cpp writes Mistral models as llama), found {self.architecture!r}"
            )
        self._tensors = {tensor.name: tensor for tensor in reader.tensors}
        self._check_tensor_names()
        self.config = parse_config(self._hf_config(metadata), Path(f"{self.model_dir} (metadata read as config.json)"))
        if self.architecture == "llama":
            # llama.cpp's llama reads attn_q/k/v.bias and attn_output.bias each as optional: a llamafied checkpoint
            # may carry q/k/v biases without an output bias (or the reverse), which config.json's one attention_bias
            # cannot state
            self.config = replace(
                self.config,
                qkv_bias="blk.0.attn_q.bias" in self._tensors,
                o_bias="blk.0.attn_output.bias" in self._tensors,
            )
        self.expected_shapes = hf_tensor_shapes(self.config)
        self.entries = self._index_tensors()
        self._tokenizer_files = gguf_tokenizer_files(metadata)

    def _check_tensor_names(self) -> None:
        for name in self._tensors:
            if POWERINFER_TENSOR.fullmatch(name):
                raise CheckpointError(
                    f"{self.model_dir}: tensor '{name}' marks a PowerInfer GGUF (transposed FFN down weights and "
                    f"predictor tensors), which edge-sdk does not read; export the original Hugging Face checkpoint"
                )
            if name == "rope_freqs.weight":
                raise CheckpointError(
                    f"{self.model_dir}: tensor '{name}' holds per-dimension RoPE frequency factors (llama3 rope "
                    f"scaling), which edge-sdk reads only from a Hugging Face config.json; export that checkpoint"
                )
            layer = LAYER_TENSOR.fullmatch(name)
            if name not in GLOBAL_TENSORS and (layer is None or layer.group(2) not in LAYER_TENSORS):
                raise CheckpointError(
                    f"{self.model_dir}: tensor '{name}' is not one of the {self.architecture} architecture (expected "
                    f"{', '.join(GLOBAL_TENSORS)} and blk.N.{{{', '.join(LAYER_TENSORS)}}})"
                )
        if "token_embd.weight" not in self._tensors:
            raise CheckpointError(f"{self.model_dir}: tensor 'token_embd.weight' is missing")

    def _key(self, name: str) -> str:
        return f"{self.architecture}.{name}"

    def _rope_scaling(self, meta: GgufMetadata) -> dict[str, Any] | None:
        """The rope_scaling llama.cpp applies to this file: rope.scaling.type defaults to linear (a file with a factor
        and no type is scaled); the factor is rope.scaling.factor when present, else the older rope.scale_linear, and
        0 means 1; type none never scales, whatever factor the file also states."""
        scaling = meta.string(self._key("rope.scaling.type"), default="linear")
        if scaling not in ("none", "linear"):
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{self._key('rope.scaling.type')}' must be none or linear, "
                f"found {scaling!r}"
            )
        factor = meta.number(self._key("rope.scaling.factor"), default=None)
        if factor is None:
            factor = meta.number(self._key("rope.scale_linear"), default=None)
        if scaling == "none" or factor is None or factor in (0.0, 1.0):
            return None
        return {"rope_type": "linear", "factor": factor}

    def _hf_config(self, meta: GgufMetadata) -> dict[str, Any]:
        """The config.json dict this file's metadata states (see the module docstring). The integer keys are checked
        here, under their GGUF names, with config.json's limits (config.py), before anything divides by them."""
        key = self._key
        heads = meta.integer(key("attention.head_count"), low=1, high=MAX_HEADS)
        kv_heads = meta.integer(key("attention.head_count_kv"), default=heads, low=1, high=MAX_HEADS)
        if heads % kv_heads:
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{key('attention.head_count_kv')}' must divide "
                f"{key('attention.head_count')} ({heads}), found {kv_heads}"
            )
        hidden_size = meta.integer(key("embedding_length"), low=1, high=MAX_HIDDEN_SIZE)
        key_length = meta.integer(key("attention.key_length"), default=None, low=1, high=MAX_HEAD_DIM)
        value_length = meta.integer(key("attention.value_length"), default=key_length, low=1, high=MAX_HEAD_DIM)
        if value_length != key_length:
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{key('attention.value_length')}' must equal "
                f"{key('attention.key_length')} ({key_length}), found {value_length}"
            )
        if key_length is None and hidden_size % heads:
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{key('attention.head_count')}' must divide "
                f"{key('embedding_length')} ({hidden_size}) when {key('attention.key_length')} is not given, "
                f"found {heads}"
            )
        head_dim = key_length or hidden_size // heads
        rope_dimensions = meta.integer(key("rope.dimension_count"), default=None)
        if rope_dimensions is not None and rope_dimensions != head_dim:
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{key('rope.dimension_count')}' must equal the head dimension "
                f"({head_dim}: RoPE over part of each head is not supported), found {rope_dimensions}"
            )
        vocab_size = self._vocab_size(meta)
        return {
            "model_type": self.architecture,
            "vocab_size": vocab_size,
            "max_position_embeddings": meta.integer(key("context_length"), low=2, high=MAX_POSITIONS),
            "hidden_size": hidden_size,
            "num_hidden_layers": meta.integer(key("block_count"), low=1, high=MAX_LAYERS),
            "intermediate_size": meta.integer(key("feed_forward_length"), low=1, high=MAX_HIDDEN_SIZE),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": key_length,
            "rms_norm_eps": meta.number(key("attention.layer_norm_rms_epsilon")),
            "rope_theta": meta.number(key("rope.freq_base"), default=10000.0),
            "rope_scaling": self._rope_scaling(meta),
            "hidden_act": meta.string(HIDDEN_ACT_KEY.format(arch=self.architecture), default="silu"),
            "hidden_act_param": meta.number(HIDDEN_ACT_PARAM_KEY.format(arch=self.architecture), default=None),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "attention_bias": self.architecture == "llama" and "blk.0.attn_q.bias" in self._tensors,
            "torch_dtype": self._stored_dtype_name(),
            "bos_token_id": meta.token_id("tokenizer.ggml.bos_token_id", vocab_size),
            "eos_token_id": meta.token_id("tokenizer.ggml.eos_token_id", vocab_size),
        }

    def _vocab_size(self, meta: GgufMetadata) -> int:
        """The vocabulary size: token_embd.weight's rows, which `{arch}.vocab_size` must equal where it is given."""
        shape = [int(size) for size in self._tensors["token_embd.weight"].shape]  # fastest-varying dimension first
        if len(shape) != 2 or not 1 <= shape[1] <= MAX_VOCAB_SIZE:
            raise CheckpointError(
                f"{self.model_dir}: tensor 'token_embd.weight' has shape {shape[::-1]} (rows first), expected "
                f"[vocabulary size in [1, {MAX_VOCAB_SIZE}], {self._key('embedding_length')}]"
            )
        stated = meta.integer(self._key("vocab_size"), default=None, low=1, high=MAX_VOCAB_SIZE)
        if stated is not None and stated != shape[1]:
            raise CheckpointError(
                f"{self.model_dir}: metadata key '{self._key('vocab_size')}' must equal the rows of tensor "
                f"'token_embd.weight' ({shape[1]}), found {stated}"
            )
        return shape[1]

    def _stored_dtype_name(self) -> str:
        """config.json's torch_dtype for this file: that of its FFN weights (quantized ones read as fp32)."""
        gate = self._tensors.get("blk.0.ffn_gate.weight")
        return "float32" if gate is None else STORED_DTYPES.get(gate.tensor_type, "float32")

    def _index_tensors(self) -> dict[str, GgufTensorEntry]:
        hf_to_gguf = {hf: name for name, hf in GLOBAL_TENSORS.items()}
        for layer in range(self.config.num_layers):
            hf_to_gguf |= {f"model.layers.{layer}.{hf}": f"blk.{layer}.{name}" for name, hf in LAYER_TENSORS.items()}
        used = {}
        for hf_name, shape in self.expected_shapes.items():
            gguf_name = hf_to_gguf[hf_name]
            tensor = self._tensors.get(gguf_name)
            if tensor is None:
                raise CheckpointError(f"{self.model_dir}: tensor '{gguf_name}' ({hf_name}) is missing")
            if tensor.tensor_type not in TENSOR_TYPES:
                raise CheckpointError(
                    f"{self.model_dir}: tensor '{gguf_name}' has type {tensor.tensor_type.name}, expected one of "
                    f"{', '.join(kind.name for kind in TENSOR_TYPES)}"
                )
            found = tuple(int(size) for size in reversed(tensor.shape.tolist()))
            if found != shape:
                raise CheckpointError(
                    f"{self.model_dir}: tensor '{gguf_name}' has shape {list(found)} (rows first), expected "
                    f"{list(shape)} from the metadata"
                )
            used[hf_name] = GgufTensorEntry(
                self.model_dir,
                gguf_name,
                tensor.tensor_type,
                shape,
                tensor.data_offset,
                tensor.data_offset + int(tensor.n_bytes),
                tensor.data,
            )
        unused = sorted(set(self._tensors) - {entry.gguf_name for entry in used.values()})
        if unused:
            raise CheckpointError(
                f"{self.model_dir}: tensor '{unused[0]}' is not used by the model the metadata describes "
                f"({self.config.num_layers} layers, tied embeddings {self.config.tie_word_embeddings})"
            )
        return used

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype the FFN weights are read into: fp16 / bf16 as stored, fp32 for quantized types."""
        return _stored_dtype(self.entries["model.layers.0.mlp.gate_proj.weight"].tensor_type)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's tensors once read (dequantized into stored_dtype, norms and biases fp32)."""
        total = 0
        for entry in self.entries.values():
            total += int(np.prod(entry.shape)) * _stored_dtype(entry.tensor_type).itemsize
        return total

    @property
    def asymmetric_grid(self) -> bool:
        """Whether the FFN weights are stored on an asymmetric grid (ASYMMETRIC_TYPES, e.g. Q4_1)."""
        return self.entries["model.layers.0.mlp.gate_proj.weight"].tensor_type in ASYMMETRIC_TYPES

    @property
    def low_bit_ffn(self) -> bool:
        """Whether the FFN gate rows are stored with codes of 4 bits or fewer (LOW_BIT_TYPES: Q4_0, Q4_1, Q4_K, Q3_K,
        Q2_K and the IQ types; a Q4_K_M or Q3_K_M file's too, whose ffn_gate is Q4_K or Q3_K)."""
        return self.entries["model.layers.0.mlp.gate_proj.weight"].tensor_type in LOW_BIT_TYPES

    @property
    def head_type(self) -> Q:
        """The LM head's stored type: output.weight's, or token_embd.weight's for a tied model (its head)."""
        head = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return self.entries[head].tensor_type

    @property
    def int4_head_dtype(self) -> str:
        """The LM head's storage in an int4 bundle of this file (`export --dtype int4 --head-dtype auto`): int8 where
        the file's FFN rows have 4 bits or fewer and its head more (Q8_0 at groups of 32 is int8 to the bit; Q6_K,
        Q5_K and float heads lose far less at int8 than at int4), int4 otherwise."""
        return "int8" if self.low_bit_ffn and self.head_type not in LOW_BIT_TYPES else "int4"

    @property
    def int4_down_dtype(self) -> str:
        """The FFN down projections' storage in an int4 bundle of this file (`--down-dtype auto`): int8 where the
        file's FFN rows have 4 bits or fewer, int4 otherwise. The file groups ffn_down's codes along the neurons, a
        bundle's neuron-major down rows along d, so int4 rows would round the file's values again."""
        return "int8" if self.low_bit_ffn else "int4"

    def tensor_types(self) -> dict[str, int]:
        """How many of the model's tensors are stored in each GGUF type (what `edge-sdk info` shows)."""
        return dict(Counter(entry.tensor_type.name for entry in self.entries.values()).most_common())

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, dequantized, with llama's q/k rows back in Hugging Face order, cast to dtype when given."""
        import torch

        from edge_sdk.model.checkpoint import cast_weights, require_finite

        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.model_dir}: tensor '{name}' is not one the model uses")
        array = _dequantize(entry).reshape(entry.shape)
        # F32 comes back as a view of the read-only memory map: the caller gets its own copy
        values = torch.from_numpy(array if array.flags.writeable else array.copy())
        where = f"{self.model_dir}: tensor '{entry.gguf_name}' ({name})"
        require_finite(values, where)
        if self.architecture == "llama" and ".self_attn.q_proj." in name:
            values = _reverse_permute(values, self.config.num_heads)
        elif self.architecture == "llama" and ".self_attn.k_proj." in name:
            values = _reverse_permute(values, self.config.num_kv_heads)
        return cast_weights(values, dtype or _stored_dtype(entry.tensor_type), where).contiguous()

    def layer_tensors(self, layer: int, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name without the layer prefix, tensor) for every tensor of one decoder layer."""
        prefix = f"model.layers.{layer}."
        for name in self.expected_shapes:
            if name.startswith(prefix):
                yield name[len(prefix) :], self.tensor(name, dtype)

    def tokenizer_files(self) -> dict[str, bytes]:
        """tokenizer.json and tokenizer_config.json rebuilt from the metadata (gguf_tokenizer.py)."""
        return dict(self._tokenizer_files)

    def tokenizer(self) -> Tokenizer:
        files = self.tokenizer_files()
        if not files:
            raise CheckpointError(f"{self.model_dir}: metadata key 'tokenizer.ggml.model' is missing (no tokenizer)")
        return Tokenizer.from_bytes(
            files[TOKENIZER_FILE],
            f"{self.model_dir} (tokenizer.json from metadata)",
            files[TOKENIZER_CONFIG_FILE],
            f"{self.model_dir} (tokenizer_config.json from metadata)",
            self.config.eos_token_ids,
        )
