"""One bundle, one verdict: a corpus of corrupted and hostile bundles, generated here, through `edge-sdk verify`'s
file checks, `edge-sdk run` (Python reader, tokenizer, and the C runtime as the CPU backend's engine) and the C
library alone (edge_model_open + edge_tokenizer_create, under AddressSanitizer + UBSan too). All three must
accept and refuse the same bundles, each refusal one clean line naming what is wrong (edge_sdk/bundle/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import edge_sdk
from edge_sdk import predictors
from edge_sdk.bundle import Bundle, manifest_digest
from edge_sdk.bundle.check import check_bundle
from edge_sdk.bundle.format import FORMAT_VERSION, MANIFEST_DIGEST_FIELD
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats.files import sha256_of

from .support import Build, c_verdicts, sanitizer_env

ACCEPT, REFUSE = "accept", "refuse"
OLD_INT4 = "int4 format_version 1 (codes stored as code + 8)"
OLD_TIED = "tied int4 format_version 2 (embedding stored F16)"
SWAPPED = "prefill and decode graphs swapped"
NO_DENSE = "decode graph without its dense input"
DENSE_INT64 = "decode input dense of element type INT64"
HALF_FACTORS_AS_OLD = "fp16 format_version 3 (its svd factors F16, which version 3 stores F32)"
INT8_HEAD = "tied-svd-int4-head-int8"  # an int4 bundle whose head (its tied embedding) is int8 (format version 5)
ASYMMETRIC = "tied-svd-int4-asym"  # an asymmetric int4 bundle: every int4 matrix with its .mins (format version 6)


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    base: str  # key of the `bundles` fixture
    mutate: Callable[[Path], None]
    expected: str = REFUSE


# ---- editing a bundle copy ----------------------------------------------------------------------------------


def read_manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def write_manifest(directory: Path, manifest: dict, stamp: bool = True) -> None:
    """Save a manifest; stamp: with a matching digest, as a tampering exporter would, so field rules are reached."""
    if stamp:
        manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))


def edit_manifest(change: Callable[[dict], object], stamp: bool = True) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        manifest = read_manifest(directory)
        change(manifest)
        write_manifest(directory, manifest, stamp)

    return mutate


def setting(*keys_and_value) -> Callable[[dict], None]:
    """manifest[k1][k2]... = value (the last argument); a value of DELETE removes the key."""
    *keys, value = keys_and_value

    def change(manifest: dict) -> None:
        node = manifest
        for key in keys[:-1]:
            node = node[key]
        if value is DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return change


DELETE = object()


def relist(directory: Path, *names: str) -> None:
    """Record the current size and sha256 of listed files in the manifest (and re-stamp it)."""
    manifest = read_manifest(directory)
    for name in names:
        size, digest = sha256_of(directory / name, follow_symlinks=True)
        manifest["files"][name] = {"size": size, "sha256": digest}
    write_manifest(directory, manifest)


def replace_file(name: str, data: bytes | Callable[[bytes], bytes], listed: bool = True) -> Callable[[Path], None]:
    """Replace a file's bytes; listed: update its manifest entry, so the content reaches the readers."""

    def mutate(directory: Path) -> None:
        path = directory / name
        new = data(path.read_bytes()) if callable(data) else data
        path.write_bytes(new)
        if listed:
            relist(directory, name)

    return mutate


def raw_manifest(transform: Callable[[str], str]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        path = directory / "manifest.json"
        path.write_text(transform(path.read_text()))

    return mutate


def raw_manifest_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda directory: (directory / "manifest.json").write_bytes(data)


def nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def deep_json_text(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


# ---- weights.safetensors -----------------------------------------------------------------------------------------


def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def join_safetensors(header: dict | str, body: bytes, pad_to: int = 8) -> bytes:
    text = (header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))).encode()
    text += b" " * (-len(text) % pad_to)
    return struct.pack("<Q", len(text)) + text + body


def edit_weights(
    change_header: Callable[[dict], object] | None = None,
    *,
    raw_header: Callable[[dict], str] | None = None,
    body: Callable[[bytes], bytes] | None = None,
    extra_padding: int = 0,
) -> Callable[[Path], None]:
    def transform(data: bytes) -> bytes:
        header, payload = split_safetensors(data)
        if change_header is not None:
            change_header(header)
        text = raw_header(header) if raw_header is not None else json.dumps(header, separators=(",", ":"))
        text += " " * (-len(text) % 8 + extra_padding)
        payload = body(payload) if body is not None else payload
        return struct.pack("<Q", len(text.encode())) + text.encode() + payload

    return replace_file("weights.safetensors", transform)


def first_tensor(header: dict, dtype: str | None = None) -> str:
    names = sorted(
        (name for name in header if name != "__metadata__" and (dtype is None or header[name]["dtype"] == dtype)),
        key=lambda name: header[name]["data_offsets"][0],
    )
    return names[0]


def overlap(header: dict) -> None:
    ordered = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    a, b = ordered[1], ordered[2]
    begin = header[a]["data_offsets"][0]
    span = header[b]["data_offsets"][1] - header[b]["data_offsets"][0]
    header[b]["data_offsets"] = [begin, begin + span]


def same_length_header_note(directory: Path) -> None:
    """An unknown key in a tensor entry (safetensors ignores those), the header kept at its length so that the
    graphs' offsets stay right: the metadata's producer field makes room for it."""
    data = (directory / "weights.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    del header["__metadata__"]["producer"]
    header["norm.weight"]["note"] = "x"
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= size
    (directory / "weights.safetensors").write_bytes(data[:8] + text + b" " * (size - len(text)) + data[8 + size :])
    relist(directory, "weights.safetensors")


def signbit_alpha_nan(directory: Path) -> None:
    data = bytearray((directory / "weights.safetensors").read_bytes())
    header, _ = split_safetensors(bytes(data))
    start = 8 + struct.unpack("<Q", data[:8])[0] + header["layers.1.signbit.alpha"]["data_offsets"][0]
    data[start : start + 4] = struct.pack("<f", float("nan"))
    (directory / "weights.safetensors").write_bytes(bytes(data))
    relist(directory, "weights.safetensors")


# ---- graphs ------------------------------------------------------------------------------------------------------


def edit_graph(change: Callable[[onnx.ModelProto], object], graph: str = "decode.onnx") -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        model = onnx.load(str(directory / graph), load_external_data=False)
        change(model)
        (directory / graph).write_bytes(model.SerializeToString())
        relist(directory, graph)

    return mutate


def external_entry(model: onnx.ModelProto, key: str, value: str, index: int = 0) -> None:
    tensor = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL][index]
    next(entry for entry in tensor.external_data if entry.key == key).value = value


def first_external(model: onnx.ModelProto) -> TensorProto:
    return next(t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL)


def nested_subgraphs(model: onnx.ModelProto, depth: int) -> None:
    """An If node whose then_branch nests depth graphs (each level is several protobuf messages deep)."""
    leaf = helper.make_graph([], "leaf", [], [])
    graph = leaf
    for level in range(depth):
        node = helper.make_node("If", ["cond"], [], then_branch=graph, else_branch=leaf, name=f"if{level}")
        graph = helper.make_graph([node], f"g{level}", [], [])
    model.graph.node.append(helper.make_node("If", ["cond"], [], then_branch=graph, else_branch=leaf, name="deep"))


def constant_reading_outside(model: onnx.ModelProto) -> None:
    tensor = TensorProto(name="stolen", data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../../etc/passwd"), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model.graph.node.append(helper.make_node("Constant", [], ["stolen_value"], value=tensor, name="steal"))


def swap_graphs(directory: Path) -> None:
    """prefill.onnx and decode.onnx trade bytes, both re-listed: each file is a well-formed graph of the other phase
    (the manifest still names prefill.onnx as the prefill graph)."""
    prefill, decode = (directory / "prefill.onnx").read_bytes(), (directory / "decode.onnx").read_bytes()
    (directory / "prefill.onnx").write_bytes(decode)
    (directory / "decode.onnx").write_bytes(prefill)
    relist(directory, "prefill.onnx", "decode.onnx")


def drop_input(name: str) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        kept = [value for value in model.graph.input if value.name != name]
        assert len(kept) == len(model.graph.input) - 1, name
        del model.graph.input[:]
        model.graph.input.extend(kept)

    return change


def input_element_type(name: str, element_type: int) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        next(value for value in model.graph.input if value.name == name).type.tensor_type.elem_type = element_type

    return change


def one_more_input(model: onnx.ModelProto) -> None:
    model.graph.input.append(helper.make_tensor_value_info("extra_mask", TensorProto.INT32, ["batch", 8]))


def append_bytes(extra: bytes) -> Callable[[bytes], bytes]:
    return lambda data: data + extra


# ---- tokenizer files ------------------------------------------------------------------------------------------


def edit_json_file(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def transform(data: bytes) -> bytes:
        value = json.loads(data)
        change(value)
        return json.dumps(value).encode()

    return replace_file(name, transform)


# ---- file types and links ------------------------------------------------------------------------------------


def symlink_outside(name: str) -> Callable[[Path], None]:
    """name becomes a link to an identical file outside the bundle: the same bytes, so only the link is wrong."""

    def mutate(directory: Path) -> None:
        outside = directory.parent / f"outside-{name}"
        shutil.copyfile(directory / name, outside)
        (directory / name).unlink()
        (directory / name).symlink_to(outside)

    return mutate


def symlink_inside(name: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        shutil.copyfile(directory / name, directory / f"real-{name}")
        (directory / name).unlink()
        (directory / name).symlink_to(f"real-{name}")

    return mutate


def as_directory(name: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        (directory / name).unlink()
        (directory / name).mkdir()

    return mutate


def as_fifo(name: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        (directory / name).unlink()
        os.mkfifo(directory / name)

    return mutate


def remove(name: str) -> Callable[[Path], None]:
    return lambda directory: (directory / name).unlink()


def unlisted(name: str, data: bytes | None = None, link: str | None = None) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        if link is not None:
            (directory / name).symlink_to(link)
        else:
            (directory / name).write_bytes(data or b"")

    return mutate


def unlist(name: str) -> Callable[[Path], None]:
    return edit_manifest(lambda manifest: manifest["files"].pop(name))


def sequence(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        for step in steps:
            step(directory)

    return mutate


def flip_byte(name: str, position: float = 0.5) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        data = bytearray((directory / name).read_bytes())
        index = int(len(data) * position)
        data[index] ^= 0x01
        (directory / name).write_bytes(bytes(data))

    return mutate


# ---- the corpus ---------------------------------------------------------------------------------------------------


def manifest_json_cases() -> list[Case]:
    cases = {
        "empty file": raw_manifest_bytes(b""),
        "binary garbage": raw_manifest_bytes(bytes(range(256)) * 4),
        "a JSON list": raw_manifest_bytes(b"[1, 2, 3]"),
        "a JSON string": raw_manifest_bytes(b'"edge-sdk-bundle"'),
        "byte order mark": raw_manifest(lambda text: "\ufeff" + text),
        "invalid UTF-8 in a string": lambda d: (d / "manifest.json").write_bytes(
            (d / "manifest.json").read_bytes().replace(b'"llama"', b'"ll\xffa"')
        ),
        "truncated": raw_manifest(lambda text: text[: len(text) // 2]),
        "trailing text": raw_manifest(lambda text: text + "\nxyz"),
        "two objects": raw_manifest(lambda text: text + text),
        "NaN literal": raw_manifest(lambda text: text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN')),
        "Infinity literal": raw_manifest(lambda text: text.replace('"max_seq_len": 128', '"max_seq_len": Infinity')),
        "duplicate key": raw_manifest(lambda text: text.replace('"dtype": "fp16"', '"dtype": "fp16", "dtype": "fp32"')),
        "comment": raw_manifest(lambda text: "// a comment\n" + text),
        "single quotes": raw_manifest(lambda text: text.replace('"format"', "'format'")),
        "trailing comma": raw_manifest(lambda text: text.rstrip().removesuffix("}") + ",}"),
        "leading zero": raw_manifest(lambda text: text.replace('"max_seq_len": 128', '"max_seq_len": 0128')),
        "raw control character": raw_manifest(lambda text: text.replace('"llama"', '"lla\x01ma"')),
        "100000-deep nesting": raw_manifest(
            lambda text: text.replace('"format"', f'"deep": {deep_json_text(100_000)}, "format"', 1)
        ),
        "65-deep nesting": edit_manifest(setting("notes", nested(64))),
        "lone surrogate": edit_manifest(setting("notes", "\ud800x")),
        "integer above 2^53": raw_manifest(
            lambda text: text.replace('"format"', '"notes": 9007199254740993, "format"')
        ),
        "number beyond float64": raw_manifest(lambda text: text.replace('"format"', '"notes": 1e400, "format"')),
        "over 64 MiB": raw_manifest(lambda text: text.replace('"format"', f'"notes": "{"x" * (65 << 20)}", "format"')),
    }
    return [Case("manifest JSON", name, "svd-fp16", mutate) for name, mutate in cases.items()]


def manifest_field_cases() -> list[Case]:
    refused = {
        "format other": setting("format", "other-bundle"),
        "format missing": setting("format", DELETE),
        "format_version newer": setting("format_version", FORMAT_VERSION + 1),
        "format_version 0": setting("format_version", 0),
        "format_version -1": setting("format_version", -1),
        "format_version string": setting("format_version", "1"),
        "format_version 1.5": setting("format_version", 1.5),
        "format_version true": setting("format_version", True),
        "format_version null": setting("format_version", None),
        "exporter a string": setting("exporter", "edge-sdk"),
        "model a list": setting("model", []),
        "model missing": setting("model", DELETE),
        "vocab_size string": setting("model", "vocab_size", "2048"),
        "vocab_size 0": setting("model", "vocab_size", 0),
        "vocab_size above 2^24": setting("model", "vocab_size", (1 << 24) + 1),
        "vocab_size fractional": setting("model", "vocab_size", 2048.5),
        "vocab_size true": setting("model", "vocab_size", True),
        "vocab_size null": setting("model", "vocab_size", None),
        "hidden_size missing": setting("model", "hidden_size", DELETE),
        "intermediate_size negative": setting("model", "intermediate_size", -768),
        "num_layers 2000": setting("model", "num_layers", 2000),
        "num_kv_heads not dividing": setting("model", "num_kv_heads", 4),
        "num_kv_heads string": setting("model", "num_kv_heads", "2"),
        "head_dim odd": setting("model", "head_dim", 31),
        "heads times head_dim too large": setting("model", "head_dim", 16384),
        "rms_norm_eps 0": setting("model", "rms_norm_eps", 0),
        "rms_norm_eps string": setting("model", "rms_norm_eps", "1e-5"),
        "rms_norm_eps beyond float32": setting("model", "rms_norm_eps", 1e300),
        "rms_norm_eps rounding to float32 0": setting("model", "rms_norm_eps", 1e-50),
        "max_position_embeddings 1": setting("model", "max_position_embeddings", 1),
        "activation kind gelu": setting("model", "activation", "kind", "gelu"),
        "activation threshold negative": setting("model", "activation", "threshold", -1.0),
        "activation threshold missing": setting("model", "activation", "threshold", DELETE),
        "activation threshold beyond float32": setting("model", "activation", "threshold", 4e38),
        "activation a string": setting("model", "activation", "relu"),
        "rope a string": setting("model", "rope", "linear"),
        "rope theta 0": setting("model", "rope", "theta", 0),
        "rope type yarn": setting("model", "rope", "rope_type", "yarn"),
        "tie_word_embeddings string": setting("model", "tie_word_embeddings", "false"),
        "qkv_bias 0": setting("model", "qkv_bias", 0),
        "sliding_window 0": setting("model", "sliding_window", 0),
        "sliding_window string": setting("model", "sliding_window", "4096"),
        "bos_token_id equal to vocab_size": setting("model", "bos_token_id", 2048),
        "bos_token_id -1": setting("model", "bos_token_id", -1),
        "eos_token_ids a number": setting("model", "eos_token_ids", 1),
        "eos_token_ids 17 entries": setting("model", "eos_token_ids", [1] * 17),
        "eos_token_ids out of range": setting("model", "eos_token_ids", [1, 5000]),
        "eos_token_ids with a string": setting("model", "eos_token_ids", ["1"]),
        "model_type gpt2": setting("model", "model_type", "gpt2"),
        "architecture mismatch": setting("model", "architecture", "Qwen2ForCausalLM"),
        "torch_dtype a number": setting("model", "torch_dtype", 16),
        "dtype int4": setting("dtype", "int4"),
        "dtype missing": setting("dtype", DELETE),
        "max_seq_len 1": setting("max_seq_len", 1),
        "max_seq_len beyond max_position_embeddings": setting("max_seq_len", 4096),
        "max_seq_len string": setting("max_seq_len", "128"),
        "predictor unknown": setting("sparsity", "predictor", "magic"),
        "levels decreasing": setting("sparsity", "levels", [0.8, 0.5]),
        "levels above 1": setting("sparsity", "levels", [0.5, 1.5]),
        "levels empty for svd": setting("sparsity", "levels", []),
        "levels with a string": setting("sparsity", "levels", ["0.5", 0.8]),
        "default_level not calibrated": setting("sparsity", "default_level", 0.7),
        "default_level missing": setting("sparsity", "default_level", DELETE),
        "core_alpha 0": setting("sparsity", "core_alpha", 0),
        "core_beta 1.5": setting("sparsity", "core_beta", 1.5),
        "settings missing": setting("sparsity", "settings", DELETE),
        "settings a list": setting("sparsity", "settings", []),
        "layers too few": lambda m: m["sparsity"]["layers"].pop(),
        "layers wrong index": lambda m: m["sparsity"]["layers"][2].update(layer=7),
        "layers wrong kind": lambda m: m["sparsity"]["layers"][0].update(kind="signbit"),
        "layers not objects": setting("sparsity", "layers", [0, 1, 2, 3]),
        "graphs missing decode": setting("graphs", "decode", DELETE),
        "graphs leaving the bundle": setting("graphs", "decode", "../decode.onnx"),
        "graphs naming an unlisted file": setting("graphs", "decode", "other.onnx"),
        "tensor dtype changed": setting("tensors", "layers.0.mlp.gate_proj.weight", "dtype", "F32"),
        "tensor shape changed": setting("tensors", "layers.0.mlp.gate_proj.weight", "shape", [768, 191]),
        "tensor missing": setting("tensors", "norm.weight", DELETE),
        "tensor extra": setting("tensors", "extra.weight", {"dtype": "F32", "shape": [1]}),
        "svd rank above d": setting("tensors", "layers.0.svd.a", "shape", [768, 193]),
        "tensors a list": setting("tensors", []),
        "files a list": setting("files", []),
        "weights unlisted": lambda m: m["files"].pop("weights.safetensors"),
        "tokenizer unlisted": lambda m: m["files"].pop("tokenizer.json"),
        "file name leaving the bundle": setting("files", "../x", {"size": 1, "sha256": "0" * 64}),
        "file name hidden": setting("files", ".hidden", {"size": 1, "sha256": "0" * 64}),
        "file name with a directory": setting("files", "sub/x", {"size": 1, "sha256": "0" * 64}),
        "file name absolute": setting("files", "/etc/passwd", {"size": 1, "sha256": "0" * 64}),
        "manifest lists itself": setting("files", "manifest.json", {"size": 1, "sha256": "0" * 64}),
        "size negative": setting("files", "report.png", "size", -1),
        "size string": setting("files", "report.png", "size", "1"),
        "size above 2^53": setting("files", "report.png", "size", 2**53 + 2),
        "sha256 uppercase": lambda m: m["files"]["report.png"].update(
            sha256=m["files"]["report.png"]["sha256"].upper()
        ),
        "sha256 short": setting("files", "report.png", "sha256", "abc"),
        "listed file missing": setting(
            "files",
            "extra.bin",
            {"size": 0, "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        ),
    }
    accepted = {
        "format_version 5.0": setting("format_version", 5.0),
        "unknown field": setting("notes", {"made by": "a test", "list": [1, 2.5, None, True]}),
        "64-deep nesting in an unknown field": setting("notes", nested(63)),
        "escaped surrogate pair": setting("notes", "\U0001f600 and \u00e9"),
        "default_level null (dense by default)": setting("sparsity", "default_level", None),
    }
    cases = [Case("manifest fields", name, "svd-fp16", edit_manifest(change)) for name, change in refused.items()]
    gate = "layers.0.mlp.gate_proj.weight"
    quantized_refused = {
        "int8 scales shape wrong": ("svd-int8", setting("tensors", gate + ".scales", "shape", [768, 3])),
        "int8 scales missing": ("svd-int8", setting("tensors", gate + ".scales", DELETE)),
        "int8 code dtype U8": ("svd-int8", setting("tensors", gate, "dtype", "U8")),
        "int8 group_size 128 not dividing d": ("svd-int8", setting("group_size", 128)),
        "int8 group_size 48": ("svd-int8", setting("group_size", 48)),
        "int8 group_size missing": ("svd-int8", setting("group_size", DELETE)),
        "int8 embedding quantized": ("svd-int8", setting("tensors", "embed_tokens.weight", "dtype", "I8")),
        "int4 codes unpacked": ("svd-int4", setting("tensors", gate, "shape", [768, 192])),
        "int4 code dtype I8": ("svd-int4", setting("tensors", gate, "dtype", "I8")),
        "int4 read as int8": ("svd-int4", setting("dtype", "int8")),
        # an int4 bundle written before signed nibbles (its codes code + 8): refused, never misread
        OLD_INT4: ("svd-int4", setting("format_version", 1)),
        # an int4 bundle of a tied model written before its embedding was quantized: refused, never misread
        OLD_TIED: ("tied-svd-int4", setting("format_version", 2)),
        "tied int4 embedding F16": ("tied-svd-int4", setting("tensors", "embed_tokens.weight", "dtype", "F16")),
        "tied int4 embedding scales missing": (
            "tied-svd-int4",
            setting("tensors", "embed_tokens.weight.scales", DELETE),
        ),
        "fp16 with a group_size": ("svd-fp16", setting("group_size", 32)),
        # svd factors are F16 from format version 5 on in bundles whose weights are not fp32, F32 otherwise
        HALF_FACTORS_AS_OLD: ("svd-fp16", setting("format_version", 3)),
        "int4 format_version 3 (svd factors F16)": ("svd-int4", setting("format_version", 3)),
        "fp16 svd factor declared F32": ("svd-fp16", setting("tensors", "layers.1.svd.b", "dtype", "F32")),
        "fp32 svd factor declared F16": ("svd-fp32", setting("tensors", "layers.0.svd.a", "dtype", "F16")),
        # the int8 head of an int4 bundle: its codes, its scales and the manifest's head_dtype must agree
        "int8 head scales F32": (INT8_HEAD, setting("tensors", "embed_tokens.weight.scales", "dtype", "F32")),
        "int8 head codes declared U8": (INT8_HEAD, setting("tensors", "embed_tokens.weight", "dtype", "U8")),
        "int8 head scales missing": (INT8_HEAD, setting("tensors", "embed_tokens.weight.scales", DELETE)),
        "int8 head without head_dtype": (INT8_HEAD, setting("head_dtype", DELETE)),
        "int8 head as format_version 3 (head_dtype not read)": (INT8_HEAD, setting("format_version", 3)),
        "head_dtype int4 (not wider)": (INT8_HEAD, setting("head_dtype", "int4")),
        "head_dtype fp16": (INT8_HEAD, setting("head_dtype", "fp16")),
        "head_dtype a number": (INT8_HEAD, setting("head_dtype", 8)),
        "head_dtype on a plain int4 bundle": ("svd-int4", lambda m: m.update(format_version=4, head_dtype="int8")),
        "head_dtype on an int8 bundle": ("svd-int8", lambda m: m.update(format_version=4, head_dtype="int8")),
        # asymmetric int4: the minimums and the manifest's int4_scheme must agree
        "asymmetric minimums missing": (ASYMMETRIC, setting("tensors", "embed_tokens.weight.mins", DELETE)),
        "asymmetric minimums F32": (
            ASYMMETRIC,
            setting("tensors", "layers.0.mlp.gate_proj.weight.mins", "dtype", "F32"),
        ),
        "asymmetric without int4_scheme": (ASYMMETRIC, setting("int4_scheme", DELETE)),
        "asymmetric as format_version 5 (int4_scheme not read)": (ASYMMETRIC, setting("format_version", 5)),
        "int4_scheme q4_1": (ASYMMETRIC, setting("int4_scheme", "q4_1")),
        "int4_scheme a number": (ASYMMETRIC, setting("int4_scheme", 1)),
        "int4_scheme asymmetric on a plain int4 bundle": (
            "svd-int4",
            lambda m: m.update(format_version=6, int4_scheme="asymmetric"),
        ),
        "int4_scheme on an int8 bundle": ("svd-int8", lambda m: m.update(format_version=6, int4_scheme="symmetric")),
    }
    cases += [
        Case("manifest fields", name, base, edit_manifest(change)) for name, (base, change) in quantized_refused.items()
    ]
    cases += [
        Case("manifest fields", name, "svd-fp16", edit_manifest(change), ACCEPT) for name, change in accepted.items()
    ]
    # format version 1 changed only int4 codes: the other dtypes' bundles of version 1 still read (svd bundles of
    # those dtypes but fp32 are version 5 for their F16 factors)
    cases += [
        Case("manifest fields", f"{base} format_version 1", base, edit_manifest(setting("format_version", 1)), ACCEPT)
        for base in ("svd-fp32", "core-fp16")
    ]
    # version 6 added int4_scheme: absent, null or symmetric, an int4 bundle reads as before; older versions do not
    # read the field
    cases += [
        Case("manifest fields", "asymmetric as exported", ASYMMETRIC, edit_manifest(lambda m: None), ACCEPT),
        Case(
            "manifest fields",
            "int4 format_version 6, int4_scheme symmetric",
            "svd-int4",
            edit_manifest(lambda m: m.update(format_version=6, int4_scheme="symmetric")),
            ACCEPT,
        ),
        Case(
            "manifest fields",
            "fp32 format_version 5 with an int4_scheme it does not read",
            "svd-fp32",
            edit_manifest(lambda m: m.update(format_version=5, int4_scheme="asymmetric")),
            ACCEPT,
        ),
    ]
    # version 4 added head_dtype: absent or null, a bundle reads as before; versions before 4 do not read the field
    cases += [
        Case("manifest fields", "int8 head as exported", INT8_HEAD, edit_manifest(lambda m: None), ACCEPT),
        Case(
            "manifest fields",
            "int4 format_version 5, head_dtype null",
            "svd-int4",
            edit_manifest(lambda m: m.update(format_version=5, head_dtype=None)),
            ACCEPT,
        ),
        Case(
            "manifest fields",
            "fp32 format_version 3 with a head_dtype it does not read",
            "svd-fp32",
            edit_manifest(lambda m: m.update(format_version=3, head_dtype="int8")),
            ACCEPT,
        ),
    ]
    # version 3 changed only int8 / int4 bundles of tied models, version 5 only svd bundles whose weights are not
    # fp32: the exporter writes 2 for every other, and 3 and 5 read them
    cases += [
        Case(
            "manifest fields",
            f"{base} format_version {version}",
            base,
            edit_manifest(setting("format_version", version)),
            ACCEPT,
        )
        for base in ("svd-fp32", "core-fp16")
        for version in (3, 5)
    ]
    cases += [
        Case("manifest fields", "digest not re-stamped", "svd-fp16", edit_manifest(setting("dtype", "fp32"), False)),
        Case(
            "manifest fields",
            "digest missing",
            "svd-fp16",
            edit_manifest(setting(MANIFEST_DIGEST_FIELD, DELETE), False),
        ),
        Case(
            "manifest fields",
            "digest not a string",
            "svd-fp16",
            edit_manifest(setting(MANIFEST_DIGEST_FIELD, 5), False),
        ),
        Case(
            "manifest fields",
            "re-indented",
            "svd-fp16",
            raw_manifest(lambda t: json.dumps(json.loads(t), indent=7)),
            ACCEPT,
        ),
        Case(
            "manifest fields",
            "levels non-empty for signbit",
            "signbit-fp32",
            edit_manifest(setting("sparsity", "levels", [0.5])),
        ),
        Case(
            "manifest fields",
            "default_level for signbit",
            "signbit-fp32",
            edit_manifest(setting("sparsity", "default_level", 0.5)),
        ),
    ]
    return cases


def file_cases() -> list[Case]:
    cases = {
        "weights byte changed": flip_byte("weights.safetensors", 0.6),
        "tokenizer byte changed": flip_byte("tokenizer.json", 0.5),
        "decode graph byte changed": flip_byte("decode.onnx", 0.5),
        "report image byte changed": flip_byte("report.png", 0.5),
        "weights truncated": lambda d: (d / "weights.safetensors").write_bytes(
            (d / "weights.safetensors").read_bytes()[:-8]
        ),
        "weights grown": lambda d: (d / "weights.safetensors").write_bytes(
            (d / "weights.safetensors").read_bytes() + b"\0"
        ),
        "manifest missing": remove("manifest.json"),
        "weights missing": remove("weights.safetensors"),
        "tokenizer missing": remove("tokenizer.json"),
        "prefill graph missing": remove("prefill.onnx"),
        "bundle is a file": lambda d: (shutil.rmtree(d), d.write_text("not a bundle")),
    }
    accepted = {
        "unlisted junk file": unlisted("junk.bin", os.urandom(1000)),
        "unlisted link to /etc/passwd": unlisted("passwd", link="/etc/passwd"),
        "unlisted hidden directory": lambda d: (d / ".cache").mkdir(),
        "tokenizer config unlisted and binary": sequence(
            unlist("tokenizer_config.json"), replace_file("tokenizer_config.json", bytes(range(256)), listed=False)
        ),
    }
    return [Case("files and checksums", name, "svd-fp16", mutate) for name, mutate in cases.items()] + [
        Case("files and checksums", name, "svd-fp16", mutate, ACCEPT) for name, mutate in accepted.items()
    ]


def safetensors_cases() -> list[Case]:
    cases = {
        "header length beyond the file": replace_file(
            "weights.safetensors", lambda d: struct.pack("<Q", len(d)) + d[8:]
        ),
        "header length 0": replace_file("weights.safetensors", lambda d: struct.pack("<Q", 0) + d[8:]),
        "header length above 100 MiB": replace_file(
            "weights.safetensors", lambda d: struct.pack("<Q", 101 << 20) + d[8:]
        ),
        "file of 4 bytes": replace_file("weights.safetensors", b"\x08\0\0\0"),
        "header not JSON": edit_weights(raw_header=lambda h: "{not json" + " " * 8),
        "header a list": edit_weights(raw_header=lambda h: "[]"),
        "float offsets": edit_weights(
            raw_header=lambda h: json.dumps(h).replace('"data_offsets": [0,', '"data_offsets": [0.0,')
        ),
        "duplicate tensor name": edit_weights(
            raw_header=lambda h: json.dumps(h)[:-1] + ', "norm.weight": ' + json.dumps(h["norm.weight"]) + "}"
        ),
        "overlapping offsets": edit_weights(overlap),
        "gap between tensors": edit_weights(
            body=lambda b: b + b"\0" * 4,
            change_header=lambda h: [
                info.update(data_offsets=[info["data_offsets"][0] + 4, info["data_offsets"][1] + 4])
                for name, info in h.items()
                if name != "__metadata__"
            ],
        ),
        "trailing data bytes": edit_weights(body=lambda b: b + b"\0" * 8),
        "unknown dtype": edit_weights(lambda h: h[first_tensor(h, "F32")].update(dtype="Q4_0")),
        "negative dimension": edit_weights(lambda h: h["norm.weight"].update(shape=[-192])),
        "nine dimensions": edit_weights(lambda h: h["norm.weight"].update(shape=[1] * 8 + [192])),
        "span mismatch": edit_weights(lambda h: h["norm.weight"].update(shape=[191])),
        "begin after end": edit_weights(
            lambda h: h["norm.weight"].update(data_offsets=h["norm.weight"]["data_offsets"][::-1])
        ),
        "three offsets": edit_weights(lambda h: h["norm.weight"]["data_offsets"].append(0)),
        "entry not an object": edit_weights(lambda h: h.update({"norm.weight": [1, 2]})),
        "metadata not an object": edit_weights(lambda h: h.update({"__metadata__": ["pt"]})),
        "metadata with a number": edit_weights(lambda h: h["__metadata__"].update(producer=5)),
        "tensor renamed": edit_weights(lambda h: h.update({"norm.weight_renamed": h.pop("norm.weight")})),
        "dtype differs from the manifest": edit_weights(lambda h: h["norm.weight"].update(dtype="I32")),
        "misaligned tensors": edit_weights(extra_padding=2),
        "100000-deep nesting": edit_weights(
            raw_header=lambda h: json.dumps(h)[:-1] + ', "deep": ' + deep_json_text(100_000) + "}"
        ),
        "NaN in the header": edit_weights(raw_header=lambda h: json.dumps(h)[:-1] + ', "x": NaN}'),
    }
    made = [Case("safetensors header", name, "svd-fp16", mutate) for name, mutate in cases.items()]
    made.append(Case("safetensors header", "signbit alpha NaN", "signbit-fp32", signbit_alpha_nan))
    made.append(Case("safetensors header", "extra entry keys", "svd-fp16", same_length_header_note, ACCEPT))
    return made


def graph_cases() -> list[Case]:
    def set_dtype(model):
        first_external(model).data_type = TensorProto.FLOAT

    def set_dims(model):
        tensor = first_external(model)
        tensor.dims[0] += 1

    def set_name(model):
        first_external(model).name = "not_a_tensor"

    def int4_codes_unsigned(model):
        next(t for t in model.graph.initializer if t.data_type == TensorProto.INT4).data_type = TensorProto.UINT4

    def code_words(model) -> TensorProto:
        """decode.onnx's first quantized codes read as INT32 words (the quantized custom ops' view of them)."""
        initializers = model.graph.initializer
        return next(t for t in initializers if t.data_type == TensorProto.INT32 and t.name.endswith("weight"))

    def code_words_one_short(model):
        code_words(model).dims[1] -= 1

    def code_words_as_int8(model):
        words = code_words(model)
        words.data_type, words.dims[1] = TensorProto.INT8, 4 * words.dims[1]  # what prefill.onnx holds: accepted

    def drop_graph(model):
        model.ClearField("graph")

    def drop_opsets(model):
        del model.opset_import[:]

    def second_graph(data: bytes) -> bytes:
        return data + b"\x3a\x02\x0a\x00"  # field 7 (graph), 2 bytes: an empty name

    cases = {
        "zero-byte decode graph": replace_file("decode.onnx", b""),
        "zero-byte prefill graph": replace_file("prefill.onnx", b""),
        "random bytes": replace_file("decode.onnx", os.urandom(4096)),
        "truncated": replace_file("decode.onnx", lambda d: d[: len(d) // 2]),
        "a group field": replace_file("decode.onnx", append_bytes(b"\x0b\x0c")),
        "a 12-byte varint": replace_file("decode.onnx", append_bytes(b"\x08" + b"\xff" * 11 + b"\x01")),
        "external data leaving the bundle": edit_graph(lambda m: external_entry(m, "location", "../../etc/passwd")),
        "external data in another file": edit_graph(lambda m: external_entry(m, "location", "tokenizer.json")),
        "external offset off by 4": edit_graph(
            lambda m: external_entry(
                m, "offset", str(int(next(e.value for e in first_external(m).external_data if e.key == "offset")) + 4)
            )
        ),
        "external length off by 2": edit_graph(
            lambda m: external_entry(
                m, "length", str(int(next(e.value for e in first_external(m).external_data if e.key == "length")) - 2)
            )
        ),
        "external offset in hex": edit_graph(lambda m: external_entry(m, "offset", "0x10")),
        "external data type changed": edit_graph(set_dtype),
        "external dims changed": edit_graph(set_dims),
        "external name unknown": edit_graph(set_name),
        "no graph": edit_graph(drop_graph),
        "no opset import": edit_graph(drop_opsets),
        "ir_version 0": edit_graph(lambda m: setattr(m, "ir_version", 0)),
        "two graphs": replace_file("decode.onnx", second_graph),
        "attribute tensor reading outside": edit_graph(constant_reading_outside),
        "subgraphs nested 30 deep": edit_graph(lambda m: nested_subgraphs(m, 30)),
        "prefill external data leaving": edit_graph(
            lambda m: external_entry(m, "location", "/etc/passwd"), "prefill.onnx"
        ),
    }
    made = [Case("graphs", name, "svd-fp16", mutate) for name, mutate in cases.items()]
    # the inputs and outputs of each graph are those of its phase (edge_sdk/bundle/graph_io.py)
    made += [
        Case("graph interface", SWAPPED, "svd-fp16", swap_graphs),
        Case("graph interface", "core graphs swapped", "core-fp16", swap_graphs),
        Case("graph interface", NO_DENSE, "svd-fp16", edit_graph(drop_input("dense"))),
        Case(
            "graph interface",
            "prefill graph without position_ids",
            "svd-fp16",
            edit_graph(drop_input("position_ids"), "prefill.onnx"),
        ),
        Case("graph interface", DENSE_INT64, "svd-fp16", edit_graph(input_element_type("dense", TensorProto.INT64))),
        Case(
            "graph interface",
            "prefill input_ids of element type INT32",
            "svd-fp16",
            edit_graph(input_element_type("input_ids", TensorProto.INT32), "prefill.onnx"),
        ),
        Case(
            "graph interface",
            "prefill graph with one more input",
            "core-fp16",
            edit_graph(one_more_input, "prefill.onnx"),
        ),
        Case(
            "graph interface",
            "a prompt output only in the decode graph",
            "svd-fp16",
            edit_graph(lambda m: m.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]))),
        ),
    ]
    # a decode graph may take inputs of its own only when the kind's mask is fixed at prefill (core): one more input
    # is refused for the other kinds, so the C runtime's copy of PredictorKind.fixed_at_prefill is checked per kind
    made += [
        Case(
            "graph interface",
            f"{base} decode graph with one more input",
            base,
            edit_graph(one_more_input),
            ACCEPT if predictors.kind(base.split("-")[0]).fixed_at_prefill else REFUSE,
        )
        for base in ("svd-fp16", "signbit-fp32", "core-fp16", "threshold-fp32")
    ]
    # prefill.onnx holds the int4 codes as INT4 (decode.onnx as the quantized ops' INT32 words)
    made.append(Case("graphs", "int4 codes read as UINT4", "svd-int4", edit_graph(int4_codes_unsigned, "prefill.onnx")))
    # the quantized ops' INT32 words must cover exactly the codes' bytes, rows and width
    made.append(Case("graphs", "int8 code words one word short", "svd-int8", edit_graph(code_words_one_short)))
    made.append(Case("graphs", "int4 code words one word short", "svd-int4", edit_graph(code_words_one_short)))
    made.append(Case("graphs", "int8 code words read as INT8", "svd-int8", edit_graph(code_words_as_int8), ACCEPT))
    made.append(
        Case("graphs", "subgraphs nested 10 deep", "svd-fp16", edit_graph(lambda m: nested_subgraphs(m, 10)), ACCEPT)
    )
    return made


def tokenizer_cases() -> list[Case]:
    refused = {
        "tokenizer binary": replace_file("tokenizer.json", bytes(range(256)) * 8),
        "tokenizer a list": replace_file("tokenizer.json", b"[]"),
        "tokenizer without a model": edit_json_file("tokenizer.json", lambda t: t.pop("model")),
        "tokenizer truncated": replace_file("tokenizer.json", lambda d: d[: len(d) // 2]),
        "tokenizer 100000-deep": replace_file(
            "tokenizer.json", lambda d: d[:-1] + b', "deep": ' + deep_json_text(100_000).encode() + b"}"
        ),
        "tokenizer duplicate key": replace_file(
            "tokenizer.json", lambda d: d[:-1] + b', "version": "1.0", "version": "2.0"}'
        ),
        "tokenizer NaN": replace_file("tokenizer.json", lambda d: d[:-1] + b', "x": NaN}'),
        "tokenizer invalid UTF-8": replace_file("tokenizer.json", lambda d: d[:-1] + b', "x": "\xc3\x28"}'),
        # ids the tokenizers library would not encode with (it renumbers or picks one, warning at most): the C
        # tokenizer, which reads the ids as written, would give other ids
        "tokenizer added token not at its vocab id": edit_json_file(
            "tokenizer.json", lambda t: t["added_tokens"][1].update(id=5)
        ),
        "tokenizer added token listed twice": edit_json_file(
            "tokenizer.json", lambda t: t["added_tokens"].append(dict(t["added_tokens"][0]))
        ),
        "tokenizer vocab id given to two tokens": edit_json_file(
            "tokenizer.json", lambda t: t["model"]["vocab"].update(zzzz=5)
        ),
        "config binary": replace_file("tokenizer_config.json", bytes(range(256)) * 8),
        "config a list": replace_file("tokenizer_config.json", b'["bos_token"]'),
        "config bos_token a number": edit_json_file("tokenizer_config.json", lambda c: c.update(bos_token=5)),
        "config bos_token not in the vocabulary": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(bos_token="<not-a-token>")
        ),
        "config bos_token object without content": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(bos_token={"lstrip": False})
        ),
        "config eos_token content a number": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(eos_token={"content": 5})
        ),
        "config eos_token not in the vocabulary": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(eos_token="<nope>")
        ),
        "config add_bos_token a string": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(add_bos_token="true")
        ),
        "config chat_template a number": edit_json_file("tokenizer_config.json", lambda c: c.update(chat_template=5)),
        "config chat_template list without default": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(chat_template=[{"name": "tool_use", "template": "x"}])
        ),
        "config chat_template list of strings": edit_json_file(
            "tokenizer_config.json", lambda c: c.update(chat_template=["x"])
        ),
        "config duplicate key": replace_file(
            "tokenizer_config.json", lambda d: d[:-1] + b', "add_bos_token": true, "add_bos_token": false}'
        ),
    }
    accepted = {
        "config chat_template list with default": edit_json_file(
            "tokenizer_config.json",
            lambda c: c.update(
                chat_template=[
                    {"name": "default", "template": "{{ messages[0]['content'] }}"},
                    {"name": "rag", "template": "x"},
                ]
            ),
        ),
        "config removed": sequence(unlist("tokenizer_config.json"), remove("tokenizer_config.json")),
        "config add_bos_token false": edit_json_file("tokenizer_config.json", lambda c: c.update(add_bos_token=False)),
    }
    return [Case("tokenizer files", name, "svd-fp16", mutate) for name, mutate in refused.items()] + [
        Case("tokenizer files", name, "svd-fp16", mutate, ACCEPT) for name, mutate in accepted.items()
    ]


def link_and_type_cases() -> list[Case]:
    refused = {
        "tokenizer config links outside": symlink_outside("tokenizer_config.json"),
        "tokenizer links outside": symlink_outside("tokenizer.json"),
        "weights link outside": symlink_outside("weights.safetensors"),
        "manifest links outside": symlink_outside("manifest.json"),
        "decode graph links outside": symlink_outside("decode.onnx"),
        "weights link inside the bundle": symlink_inside("weights.safetensors"),
        "tokenizer a directory": as_directory("tokenizer.json"),
        "manifest a directory": as_directory("manifest.json"),
        "decode graph a directory": as_directory("decode.onnx"),
        "tokenizer config a FIFO": as_fifo("tokenizer_config.json"),
        "weights a FIFO": as_fifo("weights.safetensors"),
        "manifest a FIFO": as_fifo("manifest.json"),
    }
    return [Case("links and file types", name, "svd-fp16", mutate) for name, mutate in refused.items()]


def corpus() -> list[Case]:
    return [
        *manifest_json_cases(),
        *manifest_field_cases(),
        *file_cases(),
        *safetensors_cases(),
        *graph_cases(),
        *tokenizer_cases(),
        *link_and_type_cases(),
    ]


# ---- the three readers ----------------------------------------------------------------------------------------


def python_verify(path: Path) -> str | None:
    """`edge-sdk verify --files-only`, in process: None when accepted, else the one-line message."""
    try:
        check_bundle(path)
    except EdgeSdkError as error:
        return str(error)
    return None


def python_run(path: Path) -> str | None:
    """`edge-sdk run` in process: load on the CPU backend (the C runtime engine) and generate two tokens."""
    try:
        session = edge_sdk.load(path, backend="cpu", threads=1)
        "".join(session.generate("def main():", max_new_tokens=2))
    except EdgeSdkError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def corpus_dirs(bundles, bundle_matrix, tmp_path_factory) -> dict[str, tuple[Case, Path]]:
    root = tmp_path_factory.mktemp("verdicts")
    made = {}
    for index, case in enumerate(corpus()):
        holder = root / f"{index:03d}"
        holder.mkdir()
        directory = holder / "bundle"
        shutil.copytree(bundles[case.base] if case.base in bundles else bundle_matrix.path(case.base), directory)
        case.mutate(directory)
        made[f"{case.family}: {case.name}"] = (case, directory)
    return made


def assert_clean(message: str, reader: str, case_id: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, f"{case_id}: {reader}: {message!r}"


def test_python_verify_run_and_the_c_library_give_one_verdict(x86_build: Build, asan_build: Build, corpus_dirs):
    ids = list(corpus_dirs)
    paths = [corpus_dirs[case_id][1] for case_id in ids]
    # The sanitized build's checks take longest (a debug build under ASan): they run in the background while the
    # plain build and the Python readers, which leave a core idle, give their verdicts.
    with ThreadPoolExecutor(max_workers=1) as background:
        c_sanitizing = background.submit(c_verdicts, asan_build, paths, env=sanitizer_env())
        c_plain = c_verdicts(x86_build, paths)
        python_verdicts = [(python_verify(path), python_run(path)) for path in paths]
        c_sanitized = c_sanitizing.result()
    disagreements, counts = [], Counter()
    readers = zip(ids, python_verdicts, c_plain, c_sanitized, strict=True)
    for case_id, (verify_message, run_message), c_message, c_asan_message in readers:
        case = corpus_dirs[case_id][0]
        verdicts = {"verify": verify_message, "run": run_message, "C": c_message, "C (ASan)": c_asan_message}
        for reader, message in verdicts.items():
            if message is not None:
                assert_clean(message, reader, case_id)
        outcome = {reader: ACCEPT if message is None else REFUSE for reader, message in verdicts.items()}
        for reader, verdict in outcome.items():
            counts[(case.family, reader, verdict)] += 1
        if set(outcome.values()) != {case.expected}:
            disagreements.append(
                f"{case_id}: expected {case.expected}, "
                + ", ".join(
                    f"{reader} {verdict}" + (f" ({verdicts[reader][:160]})" if verdicts[reader] else "")
                    for reader, verdict in outcome.items()
                )
            )
    families = Counter(corpus_dirs[case_id][0].family for case_id in ids)
    summary = "\n".join(
        f"{family}: {count} cases; "
        + ", ".join(f"{reader} {counts[(family, reader, REFUSE)]} refused" for reader in ("verify", "run", "C"))
        for family, count in families.items()
    )
    print(f"\n{len(ids)} hostile or careless bundles\n{summary}")
    assert not disagreements, "\n".join(disagreements)
    assert len(ids) >= 180


def test_an_int4_bundle_of_format_version_1_is_refused_with_re_export(x86_build: Build, corpus_dirs):
    """Its codes are code + 8: every reader says so in one line and asks for a re-export, before reading a weight."""
    path = corpus_dirs[f"manifest fields: {OLD_INT4}"][1]
    (c_message,) = c_verdicts(x86_build, [path])
    for message in (python_verify(path), python_run(path), c_message):
        assert "format version 1" in message and "code + 8" in message and "re-export the bundle" in message, message


def test_a_tied_int4_bundle_of_format_version_2_is_refused_with_re_export(x86_build: Build, corpus_dirs):
    """Its embedding (the LM head) is F16 where version 3 stores codes: every reader says so, asks for a re-export."""
    path = corpus_dirs[f"manifest fields: {OLD_TIED}"][1]
    (c_message,) = c_verdicts(x86_build, [path])
    for message in (python_verify(path), python_run(path), c_message):
        assert "format version 2" in message and "tied embeddings" in message, message
        assert "re-export the bundle" in message, message


def test_svd_factors_of_the_wrong_dtype_for_the_version_are_refused_naming_the_rule(x86_build: Build, corpus_dirs):
    """F16 factors in a bundle that says version 3: every reader names the factor and the version's rule, alike."""
    path = corpus_dirs[f"manifest fields: {HALF_FACTORS_AS_OLD}"][1]
    (c_message,) = c_verdicts(x86_build, [path])
    for message in (python_verify(path), python_run(path), c_message):
        assert "tensor 'layers.0.svd.a' is declared F16, expected F32" in message, message
        assert "format version 3 stores predictor factors in F32 (F16 since version 5)" in message, message


@pytest.mark.parametrize(
    ("case_id", "fragments"),
    [
        (
            SWAPPED,
            [
                "prefill.onnx: input 'sparsity_level' is not an input of the prefill graph (expected its inputs, 10: ",
                "; it has the decode graph's inputs and outputs (are prefill.onnx and decode.onnx swapped?)",
            ],
        ),
        (NO_DENSE, ["decode.onnx: the decode graph's input 'dense' is missing: expected BOOL [] (rank 0)"]),
        (
            DENSE_INT64,
            ["decode.onnx: input 'dense' is I64 [] (rank 0), expected BOOL [] (rank 0) as the decode graph's"],
        ),
    ],
)
def test_graph_interface_refusals_say_the_same(x86_build: Build, corpus_dirs, case_id, fragments):
    """A graph of the wrong phase or inputs: every reader names the graph, the value and what the exporter writes, alike
    (the Python reader's words, edge_sdk/bundle/graph_io.py, and the C reader's, jetson/src/bundle.c)."""
    path = corpus_dirs[f"graph interface: {case_id}"][1]
    (c_message,) = c_verdicts(x86_build, [path])
    for message in (python_verify(path), python_run(path), c_message):
        assert message is not None, case_id
        for fragment in fragments:
            assert fragment in message, message


def test_python_messages_name_the_bundle(corpus_dirs):
    for case_id, (case, path) in corpus_dirs.items():
        message = python_verify(path)
        if case.expected == REFUSE and message is not None:
            assert str(path.parent) in message or "text:" in message, f"{case_id}: {message}"


def test_accepted_bundles_also_pass_the_numeric_check(corpus_dirs):
    from edge_sdk.export.verify import verify_graphs

    accepted = [(case_id, path) for case_id, (case, path) in corpus_dirs.items() if case.expected == ACCEPT]
    assert len(accepted) >= 10
    for _, path in accepted[:3]:
        verify_graphs(Bundle.open(path))


@pytest.mark.parametrize(
    "case_id",
    [
        "manifest JSON: 100000-deep nesting",
        "manifest fields: num_kv_heads string",
        f"manifest fields: {OLD_INT4}",
        "files and checksums: weights byte changed",
        "safetensors header: overlapping offsets",
        "graphs: zero-byte decode graph",
        "tokenizer files: config binary",
        "links and file types: tokenizer config links outside",
    ],
)
@pytest.mark.parametrize("command", ["verify", "run"])
def test_the_cli_refuses_in_one_line_without_a_traceback(corpus_dirs, case_id, command):
    path = corpus_dirs[case_id][1]
    extra = ["--prompt", "x", "--max-new-tokens", "1"] if command == "run" else []
    result = subprocess.run(
        [sys.executable, "-m", "edge_sdk", command, str(path), *extra], capture_output=True, text=True, timeout=120
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
