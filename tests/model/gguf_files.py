"""GGUF files written by the tests from Hugging Face checkpoints, the way llama.cpp's convert_hf_to_gguf.py writes
them: llama.cpp's metadata keys and tensor names, llama q/k rows permuted (LlamaModel.permute), norms and biases F32,
the 2-D weights in the requested type (quantized with gguf.quants.quantize, or random blocks for the K-quants and the
IQ types, which the gguf package cannot quantize: RANDOM_BLOCK_SCALES)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

Q = gguf.GGMLQuantizationType
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
HF_LAYER_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# The types the gguf package cannot quantize, written as random blocks: the byte offsets of the fp16 scale fields in
# one block (ggml-common.h block_q2_K ... block_iq4_xs) and the scale written there, small enough that the weights'
# magnitudes are like a trained model's whatever the codes and sub-block scales (IQ4_XS's reach 32 x 127 x d).
RANDOM_BLOCK_SCALES = {
    Q.Q2_K: ((80, 82), 0.001),
    Q.Q3_K: ((108,), 0.001),
    Q.Q4_K: ((0, 2), 0.001),
    Q.Q5_K: ((0, 2), 0.001),
    Q.Q6_K: ((208,), 0.0004),
    Q.IQ1_S: ((0,), 0.001),
    Q.IQ2_XXS: ((0,), 0.001),
    Q.IQ2_XS: ((0,), 0.001),
    Q.IQ2_S: ((0,), 0.001),
    Q.IQ3_XXS: ((0,), 0.001),
    Q.IQ3_S: ((0,), 0.001),
    Q.IQ4_NL: ((0,), 0.001),
    Q.IQ4_XS: ((0,), 0.0001),
    Q.TQ2_0: ((64,), 0.001),
}


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{HF_LAYER_TO_GGUF[rest]}"


def llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def random_blocks(rows: int, columns: int, kind: gguf.GGMLQuantizationType, seed: int) -> np.ndarray:
    """Random blocks of `kind` (RANDOM_BLOCK_SCALES) [rows, bytes per row] with small finite fp16 scales, so the
    weights they dequantize to have magnitudes like a trained model's."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    blocks = np.random.default_rng(seed).integers(0, 256, (rows, columns // block_size, type_size), dtype=np.uint8)
    offsets, value = RANDOM_BLOCK_SCALES[kind]
    scale = np.float16(value)
    for offset in offsets:
        blocks[..., offset : offset + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def write_gguf(
    model_dir: Path,
    path: Path,
    tensor_type: gguf.GGMLQuantizationType = Q.F32,
    *,
    extra_keys: dict | None = None,
    hidden_act: bool = True,
    extra_tensors: dict[str, np.ndarray] | None = None,
    skip_keys: tuple[str, ...] = (),
    architecture: str | None = None,
    tensor_types: dict[str, gguf.GGMLQuantizationType] | None = None,
) -> dict[str, np.ndarray]:
    """Write model_dir (config.json + model.safetensors) as a GGUF at path; returns the Hugging Face tensors the
    GGUF holds, dequantized (for RANDOM_BLOCK_SCALES types: the random weights written, which replace the checkpoint's).

    extra_keys: more metadata keys as {key: (kind, value)}, such as tokenizer_keys(); they replace written ones.
    hidden_act: state config.json's activation under {arch}.hidden_act. skip_keys: metadata keys to leave out.
    tensor_types: {Hugging Face name: type} for 2-D weights stored in another type than tensor_type (a 4-bit file's
    Q8_0 head, say)."""
    config = json.loads((model_dir / "config.json").read_text())
    arch = architecture or ("qwen2" if config["model_type"] == "qwen2" else "llama")
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    writer = gguf.GGUFWriter(str(path), arch)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    # transformers >= 5 writes the RoPE settings as rope_parameters
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    theta = config.get("rope_theta") or scaling.get("rope_theta", 10000.0)
    keys = {
        f"{arch}.context_length": ("uint32", config["max_position_embeddings"]),
        f"{arch}.embedding_length": ("uint32", config["hidden_size"]),
        f"{arch}.block_count": ("uint32", config["num_hidden_layers"]),
        f"{arch}.feed_forward_length": ("uint32", config["intermediate_size"]),
        f"{arch}.attention.head_count": ("uint32", heads),
        f"{arch}.attention.head_count_kv": ("uint32", kv_heads),
        f"{arch}.attention.layer_norm_rms_epsilon": ("float32", config["rms_norm_eps"]),
        f"{arch}.rope.freq_base": ("float32", theta),
        f"{arch}.rope.dimension_count": ("uint32", head_dim),
        f"{arch}.attention.key_length": ("uint32", head_dim),
        f"{arch}.attention.value_length": ("uint32", head_dim),
    }
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        keys[f"{arch}.rope.scaling.type"] = ("string", "linear")
        keys[f"{arch}.rope.scaling.factor"] = ("float32", scaling["factor"])
    # llama.cpp's converter writes config.json's special token ids even without a tokenizer (gguf.SpecialVocab)
    for name in ("bos_token_id", "eos_token_id"):
        if isinstance(config.get(name), int):
            keys[f"tokenizer.ggml.{name}"] = ("uint32", config[name])
    if hidden_act:
        keys[f"{arch}.hidden_act"] = ("string", config.get("hidden_act", "silu"))
    for key, (kind, value) in {**keys, **(extra_keys or {})}.items():
        if key in skip_keys:
            continue
        if kind == "array":
            writer.add_array(key, value)
        else:
            getattr(writer, f"add_{kind}")(key, value)

    written = {}
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as handle:
        for index, hf_name in enumerate(handle.keys()):
            values = handle.get_tensor(hf_name).to(torch.float32).numpy()
            kind = (tensor_types or {}).get(hf_name, tensor_type) if values.ndim == 2 else Q.F32
            if kind == Q.F32:
                data = values
            elif kind == Q.F16:
                data = values.astype(np.float16)
            elif kind in RANDOM_BLOCK_SCALES:
                data = random_blocks(values.shape[0], values.shape[1], kind, seed=index)
            else:
                data = gguf.quants.quantize(values, kind)
            written[hf_name] = gguf.quants.dequantize(data, kind) if kind != Q.F32 else values
            # rows permute alike as values or as quantized blocks: each row's blocks are its own
            if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                data = llama_permute(data, heads)
            elif arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                data = llama_permute(data, kv_heads)
            writer.add_tensor(gguf_name(hf_name), data, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def tokenizer_keys(model_dir: Path, kind: str) -> dict[str, tuple[str, object]]:
    """The tokenizer.ggml.* keys llama.cpp's converter writes for model_dir's tokenizer: `gpt2` (byte-level BPE with
    merges) or `llama` (SentencePiece: scores instead of merges, the score of a token ranking the merge that makes
    it, as in a SentencePiece BPE model)."""
    from edge_sdk.model.tokenizer import Tokenizer

    backend = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = backend["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in backend["model"]["merges"]]
    specials = {token["content"] for token in backend["added_tokens"] if token["special"]}
    tokenizer = Tokenizer.from_dir(model_dir)
    keys: dict[str, tuple[str, object]] = {
        "tokenizer.ggml.model": ("string", kind),
        "tokenizer.ggml.tokens": ("array", tokens),
        "tokenizer.ggml.add_bos_token": ("bool", tokenizer.add_bos),
    }
    if tokenizer.bos_token_id is not None:
        keys["tokenizer.ggml.bos_token_id"] = ("uint32", tokenizer.bos_token_id)
    if tokenizer.eos_token_ids:
        keys["tokenizer.ggml.eos_token_id"] = ("uint32", tokenizer.eos_token_ids[0])
    if tokenizer.chat_template is not None:
        keys["tokenizer.chat_template"] = ("string", tokenizer.chat_template)
    if kind == "gpt2":
        keys["tokenizer.ggml.pre"] = ("string", "gpt-2")
        keys["tokenizer.ggml.merges"] = ("array", merges)
        keys["tokenizer.ggml.token_type"] = ("array", [3 if token in specials else 1 for token in tokens])
        return keys
    rank = {"".join(merge.split(" ")): index for index, merge in reversed(list(enumerate(merges)))}
    keys["tokenizer.ggml.scores"] = ("array", [-float(rank.get(token, len(merges))) for token in tokens])
    unknown = config.get("unk_token")
    types = [
        2 if token == unknown else 3 if token in specials else 6 if token.startswith("<0x") else 1 for token in tokens
    ]
    keys["tokenizer.ggml.token_type"] = ("array", types)
    keys["tokenizer.ggml.unknown_token_id"] = ("uint32", vocab[unknown])
    return keys


@dataclass(frozen=True)
class GgufLayout:
    """Where the parts of an intact GGUF file lie (byte offsets), for tests that corrupt them."""

    size: int
    kv_count: int
    tensor_count: int
    keys: dict[str, int]  # where each key/value starts (its key's length)
    values: dict[str, int]  # where each value starts (after its type)
    tensor_infos: dict[str, int]  # where each tensor info starts (its name's length)
    n_dims: dict[str, int]
    data_start: int  # where the tensor data section starts (tensor offsets count from here)
    tensor_data: dict[str, tuple[int, int]]  # each tensor's data: (byte offset, bytes)

    def value_type(self, key: str) -> int:
        return self.values[key] - 4

    def tensor_type(self, name: str) -> int:
        return self.tensor_infos[name] + 8 + len(name.encode()) + 4 + 8 * self.n_dims[name]

    def tensor_offset(self, name: str) -> int:
        return self.tensor_type(name) + 4


def gguf_layout(path: Path) -> GgufLayout:
    reader = gguf.GGUFReader(path)
    fields = {key: field for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    return GgufLayout(
        size=path.stat().st_size,
        kv_count=len(fields),
        tensor_count=len(reader.tensors),
        keys={key: field.offset for key, field in fields.items()},
        values={key: field.offset + 8 + len(key.encode()) + 4 for key, field in fields.items()},
        tensor_infos={tensor.name: tensor.field.offset for tensor in reader.tensors},
        n_dims={tensor.name: len(tensor.shape) for tensor in reader.tensors},
        data_start=reader.data_offset,
        tensor_data={tensor.name: (tensor.data_offset, int(tensor.n_bytes)) for tensor in reader.tensors},
    )


def patch_gguf(path: Path, offset: int, fmt: str, value: int) -> None:
    """Overwrite the little-endian struct `fmt` (e.g. '<Q') at offset with value."""
    data = bytearray(path.read_bytes())
    data[offset : offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
    path.write_bytes(bytes(data))


def truncate_gguf(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])
