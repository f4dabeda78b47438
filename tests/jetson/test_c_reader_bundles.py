"""The C reader (edge_model_open + edge_tokenizer_create, through jetson/tests/edge_check_bundle.c) against the Python
reader (Bundle.open + Tokenizer.from_bundle) on bundles the shared corpus (test_bundle_verdicts.py) does not build:
the corners of each rule of edge_sdk/bundle/README.md, accepted and refused, each with the verdict the rule gives.
The C reader also runs under AddressSanitizer + UBSan on every case."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from onnx import helper

from edge_sdk.bundle import Bundle, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats.files import sha256_of
from edge_sdk.model.tokenizer import Tokenizer

from .support import Build, c_verdicts, sanitizer_env

ACCEPT, REFUSE = "accept", "refuse"


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Path], None]
    expected: str
    base: str = "svd-fp16"


# ---- editing a bundle copy ---------------------------------------------------------------------------------------


def relist(directory: Path, *names: str) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in names:
        size, digest = sha256_of(directory / name, follow_symlinks=True)
        manifest["files"][name] = {"size": size, "sha256": digest}
    write_manifest(directory, manifest)


def write_manifest(directory: Path, manifest: dict) -> None:
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))


def edit_manifest(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        manifest = json.loads((directory / "manifest.json").read_text())
        change(manifest)
        write_manifest(directory, manifest)

    return mutate


def setting(*keys_and_value) -> Callable[[dict], None]:
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


def respelled_manifest(transform: Callable[[str], str]) -> Callable[[Path], None]:
    """The manifest text rewritten as another JSON tool might write it, then stamped with the digest Python computes
    from the values it reads (so both readers must agree on the canonical form to accept it)."""

    def mutate(directory: Path) -> None:
        manifest = json.loads((directory / "manifest.json").read_text())
        del manifest[MANIFEST_DIGEST_FIELD]
        text = transform(json.dumps(manifest, indent=1, ensure_ascii=False))
        digest = manifest_digest(json.loads(text))
        text = text.replace("{", '{"manifest_sha256": "' + digest + '",', 1)
        (directory / "manifest.json").write_bytes(text.encode("utf-8"))

    return mutate


def replace_json_file(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        value = json.loads((directory / name).read_text())
        change(value)
        (directory / name).write_text(json.dumps(value))
        relist(directory, name)

    return mutate


def replace_bytes(name: str, transform: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        (directory / name).write_bytes(transform((directory / name).read_bytes()))
        relist(directory, name)

    return mutate


# ---- weights.safetensors: header edits that keep its length (the graphs' offsets stay right) -------------------


def read_header(directory: Path) -> tuple[int, dict]:
    data = (directory / "weights.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return size, json.loads(data[8 : 8 + size])


def same_length_header(text: Callable[[dict], str]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        data = (directory / "weights.safetensors").read_bytes()
        size, header = read_header(directory)
        new = text(header).encode()
        assert len(new) <= size
        (directory / "weights.safetensors").write_bytes(data[:8] + new + b" " * (size - len(new)) + data[8 + size :])
        relist(directory, "weights.safetensors")

    return mutate


def compact(header: dict) -> str:
    return json.dumps(header, separators=(",", ":"))


def without_metadata(header: dict) -> dict:
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def roomy(header: dict) -> str:
    """The header without its metadata: room for edits that lengthen it."""
    return compact(without_metadata(header))


# ---- graphs: protobuf wire format written by hand -------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            return bytes(out + bytes([byte]))
        out.append(byte | 0x80)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint_field(number: int, value: int | bytes) -> bytes:
    return varint(number << 3) + (value if isinstance(value, bytes) else varint(value))


def external_tensor(
    name: bytes,
    entries: list[tuple[str, str]],
    data_type: int = 1,
    dims: list[bytes] | None = None,
    packed: bool = True,
    location: int = 1,
) -> bytes:
    """A TensorProto with data_location `location` and external_data `entries`; dims as encoded varints."""
    dims = [varint(192)] if dims is None else dims
    encoded = field(1, b"".join(dims)) if packed else b"".join(varint_field(1, dim) for dim in dims)
    entry_bytes = b"".join(field(13, field(1, key.encode()) + field(2, value.encode())) for key, value in entries)
    return encoded + varint_field(2, data_type) + field(8, name) + entry_bytes + varint_field(14, location)


def norm_weight_entries(directory: Path, offset_delta: int = 0) -> list[tuple[str, str]]:
    """External data entries of weights.safetensors' norm.weight (F32 [192])."""
    size, header = read_header(directory)
    begin, end = header["norm.weight"]["data_offsets"]
    return [
        ("location", "weights.safetensors"),
        ("offset", str(8 + size + begin + offset_delta)),
        ("length", str(end - begin)),
    ]


def graph_with(
    extra_graph: Callable[[Path], bytes] = lambda d: b"", extra_model: Callable[[Path], bytes] = lambda d: b""
):
    """decode.onnx with bytes appended to its graph (repeated fields: nodes, initializers, ...) and to the model."""

    def mutate(directory: Path) -> None:
        model = onnx.load(str(directory / "decode.onnx"), load_external_data=False)
        graph = model.graph.SerializeToString() + extra_graph(directory)
        model.ClearField("graph")
        (directory / "decode.onnx").write_bytes(model.SerializeToString() + field(7, graph) + extra_model(directory))
        relist(directory, "decode.onnx")

    return mutate


def initializer(make: Callable[[Path], bytes]) -> Callable[[Path], bytes]:
    return lambda directory: field(5, make(directory))


def norm_tensor(
    entries=None, offset_delta: int = 0, name: bytes = b"norm.weight", **options
) -> Callable[[Path], bytes]:
    """An external tensor named norm.weight (by default exactly weights.safetensors' one)."""
    return lambda directory: external_tensor(
        name, entries if entries is not None else norm_weight_entries(directory, offset_delta), **options
    )


def zeros(key: str, value: str, count: int) -> str:
    """An offset or length written with leading zeros (Python's int() reads them)."""
    return "0" * count + value if key in ("offset", "length") else value


def wrong_location(directory: Path) -> bytes:
    return external_tensor(b"norm.weight", [("location", "/etc/passwd"), *norm_weight_entries(directory)[1:]])


def nested_if(depth: int) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        leaf = helper.make_graph([], "leaf", [], [])
        graph = leaf
        for level in range(depth):
            node = helper.make_node("If", ["cond"], [], then_branch=graph, else_branch=leaf, name=f"if{level}")
            graph = helper.make_graph([node], f"g{level}", [], [])
        model.graph.node.append(helper.make_node("If", ["cond"], [], then_branch=graph, else_branch=leaf, name="deep"))

    return change


def edit_graph(change: Callable[[onnx.ModelProto], object]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        model = onnx.load(str(directory / "decode.onnx"), load_external_data=False)
        change(model)
        (directory / "decode.onnx").write_bytes(model.SerializeToString())
        relist(directory, "decode.onnx")

    return mutate


# ---- graphs: inputs and outputs written by hand (ValueInfoProto, TypeProto, TensorShapeProto) ------------------------


def dim_value(size: int) -> bytes:
    """A TensorShapeProto.Dimension of a size (negative ones as int64 two's complement)."""
    return varint_field(1, size % (1 << 64))


def dim_param(symbol: bytes) -> bytes:
    return field(2, symbol)


def tensor_type(element_type: int, dims: list[bytes] | None, extra: bytes = b"") -> bytes:
    """A TypeProto whose tensor_type has the element type and (dims None: no) shape of these Dimensions."""
    shape = b"" if dims is None else field(2, b"".join(field(1, dim) for dim in dims))
    return field(1, varint_field(1, element_type) + shape + extra)


def value_info(name: bytes, *types: bytes, extra: bytes = b"") -> bytes:
    """A ValueInfoProto named name with these TypeProtos (the last wins), then extra bytes."""
    return field(1, name) + b"".join(field(2, kind) for kind in types) + extra


def graph_values(
    inputs: bytes = b"", outputs: bytes = b"", drop: tuple[str, ...] = (), graph: str = "decode.onnx"
) -> Callable[[Path], None]:
    """The graph without its inputs named in drop, then with raw ValueInfoProtos (ready fields) appended."""

    def mutate(directory: Path) -> None:
        model = onnx.load(str(directory / graph), load_external_data=False)
        kept = [value for value in model.graph.input if value.name not in drop]
        assert len(kept) == len(model.graph.input) - len(drop), drop
        del model.graph.input[:]
        model.graph.input.extend(kept)
        serialized = model.graph.SerializeToString() + inputs + outputs
        model.ClearField("graph")
        (directory / graph).write_bytes(model.SerializeToString() + field(7, serialized))
        relist(directory, graph)

    return mutate


def both_graphs(prefill: bytes, decode: bytes | None = None) -> Callable[[Path], None]:
    """Raw outputs appended to each graph (the same unless decode is given)."""
    first = graph_values(outputs=prefill, graph="prefill.onnx")
    second = graph_values(outputs=prefill if decode is None else decode)
    return lambda directory: (first(directory), second(directory))


def dense(*types: bytes, extra: bytes = b"") -> Callable[[Path], None]:
    """The decode graph's input dense written by hand."""
    return graph_values(inputs=field(11, value_info(b"dense", *types, extra=extra)), drop=("dense",))


def past_key(dims: list[bytes], element_type: int = 1) -> Callable[[Path], None]:
    """The decode graph's input past_key_values.0.key written by hand (the fixtures: 2 KV heads of 32)."""
    return graph_values(
        inputs=field(11, value_info(b"past_key_values.0.key", tensor_type(element_type, dims))),
        drop=("past_key_values.0.key",),
    )


def interface_cases() -> list[Case]:
    batch, past = dim_param(b"batch"), dim_param(b"past_seq")
    scalar_bool = tensor_type(9, [])
    prompt_output = field(12, value_info(b"scores", tensor_type(1, [batch, dim_value(8)])))
    accepted = {
        "dense's type given twice, the last right": dense(tensor_type(7, []), scalar_bool),
        "dense's shape given twice, the last right": dense(
            field(1, varint_field(1, 9) + field(2, field(1, dim_value(1))) + field(2, b""))
        ),
        "dense's tensor_type given twice, the last right": dense(field(1, varint_field(1, 1)) + scalar_bool),
        "unknown fields in a value, its type and its tensor type": dense(
            tensor_type(9, [], extra=varint_field(9, 1)) + field(6, b"denotation"),
            extra=field(3, field(1, b"key") + field(2, b"value")) + varint(100 << 3 | 5) + b"\0" * 4,
        ),
        "a size where the exporter writes a symbol": past_key(
            [dim_value(1), dim_value(2), dim_value(5), dim_value(32)]
        ),
        "a dimension whose last field is its size": past_key(
            [batch, dim_param(b"h") + dim_value(2), past, dim_value(32)]
        ),
        "a prompt output in both graphs": both_graphs(prompt_output),
        "prompt outputs whose symbols differ after 200 characters": both_graphs(
            field(12, value_info(b"scores", tensor_type(1, [dim_param("\u00e9".encode() * 200 + b"a")]))),
            field(12, value_info(b"scores", tensor_type(1, [dim_param("\u00e9".encode() * 200 + b"b")]))),
        ),
        "prompt outputs, a dimension with neither beside a symbol '?'": both_graphs(
            field(12, value_info(b"scores", tensor_type(1, [b""]))),
            field(12, value_info(b"scores", tensor_type(1, [dim_param(b"?")]))),
        ),
        "prompt outputs that are not tensors in both graphs": both_graphs(field(12, value_info(b"scores"))),
    }
    refused = {
        "dense's type given twice, the last wrong": dense(scalar_bool, tensor_type(7, [])),
        "dense's tensor_type given twice, the last without a shape": dense(scalar_bool + field(1, varint_field(1, 9))),
        "dense without a type": dense(),
        "dense without a shape": dense(field(1, varint_field(1, 9))),
        "dense of rank 1": dense(tensor_type(9, [dim_value(1)])),
        "dense with an element type beyond 64 bits": dense(field(1, varint_field(1, b"\xff" * 9 + b"\x02"))),
        "a negative KV head count": past_key([batch, dim_value(-2), past, dim_value(32)]),
        "a KV head count with neither size nor symbol": past_key([batch, b"", past, dim_value(32)]),
        "a KV head count as a symbol": past_key([batch, dim_param(b"2"), past, dim_value(32)]),
        "a KV cache of rank 5": past_key([batch, dim_value(2), past, dim_value(32), dim_value(1)]),
        "a KV cache of float16": past_key([batch, dim_value(2), past, dim_value(32)], element_type=10),
        "an input declared twice": graph_values(inputs=field(11, value_info(b"dense", scalar_bool))),
        "two outputs without a name": graph_values(outputs=field(12, b"") * 2),
        "an input named with U+0000": graph_values(inputs=field(11, value_info(b"dense\0", scalar_bool))),
        "an input name that is not UTF-8": graph_values(inputs=field(11, value_info(b"\xff", scalar_bool))),
        "a dim_param that is not UTF-8": graph_values(
            outputs=field(12, value_info(b"x", tensor_type(1, [dim_param(b"\xed\xa0\x80")])))
        ),
        "a value info cut short": graph_values(inputs=field(11, b"\x0a\x05ab")),
        "a dimension cut short": graph_values(outputs=field(12, value_info(b"x", tensor_type(1, [b"\x08"])))),
        "a shape with a group field": graph_values(outputs=field(12, value_info(b"x", field(1, field(2, b"\x0b"))))),
        "a prompt output only in the decode graph": graph_values(outputs=prompt_output),
        "a prompt output only in the prefill graph": graph_values(outputs=prompt_output, graph="prefill.onnx"),
        "prompt outputs of other element types": both_graphs(
            prompt_output, field(12, value_info(b"scores", tensor_type(10, [batch, dim_value(8)])))
        ),
        "prompt outputs, one without a shape": both_graphs(
            prompt_output, field(12, value_info(b"scores", tensor_type(1, None)))
        ),
        "prompt outputs, one not a tensor": both_graphs(prompt_output, field(12, value_info(b"scores"))),
        "prompt outputs whose symbols differ": both_graphs(
            field(12, value_info(b"scores", tensor_type(1, [dim_param(b"a")]))),
            field(12, value_info(b"scores", tensor_type(1, [dim_param(b"b")]))),
        ),
    }
    cases = [Case(f"graph interface: {name}", mutate, ACCEPT) for name, mutate in accepted.items()]
    cases += [Case(f"graph interface: {name}", mutate, REFUSE) for name, mutate in refused.items()]
    # a decode graph may take inputs of its own in a bundle whose predictor's mask is fixed at prefill (core), and
    # only the decode graph
    core_input = field(11, value_info(b"core_mask.9", tensor_type(6, [batch, dim_value(768)])))
    cases.append(
        Case("graph interface: one more core decode input", graph_values(inputs=core_input), ACCEPT, "core-fp16")
    )
    cases.append(
        Case(
            "graph interface: one more core prefill input",
            graph_values(inputs=core_input, graph="prefill.onnx"),
            REFUSE,
            "core-fp16",
        )
    )
    return cases


# ---- the cases -----------------------------------------------------------------------------------------------------


def manifest_cases() -> list[Case]:
    accepted = {
        "unknown key holding U+0000": setting("notes\u0000x", [1, "a\u0000b"]),
        "unknown key 'format' + U+0000 beside format": setting("format\u0000", 5),
        "unknown keys sorted around others": setting("\U0001f600", {"\u00e9": 1, "e": 2, "\u0000": 3}),
        "exporter missing": setting("exporter", DELETE),
        "integers written as floats": lambda m: (
            m["model"].update(vocab_size=2048.0, num_layers=4.0, head_dim=32.0),
            m.update(max_seq_len=128.0),
            m["sparsity"]["layers"][0].update(layer=0.0),
        ),
        "tensor shape as floats": setting("tensors", "norm.weight", "shape", [192.0]),
        "file size as a float": lambda m: m["files"]["report.png"].update(size=float(m["files"]["report.png"]["size"])),
        "file entry with more keys": lambda m: m["files"]["report.png"].update(note="x"),
        "sliding_window set": setting("model", "sliding_window", 4096),
        "bos_token_id null": setting("model", "bos_token_id", None),
        "eos_token_ids empty": setting("model", "eos_token_ids", []),
        "rope linear": setting("model", "rope", "rope_type", "linear"),
        "rms_norm_eps tiny (a float32 subnormal)": setting("model", "rms_norm_eps", 1e-40),
        "threshold positive": setting("model", "activation", "threshold", 0.5),
        "mistral": lambda m: m["model"].update(model_type="mistral", architecture="MistralForCausalLM"),
        "torch_dtype any string": setting("model", "torch_dtype", "whatever"),
        "default_level the other level": setting("sparsity", "default_level", 0.8),
        "default_level null for svd (dense by default)": setting("sparsity", "default_level", None),
        "core_alpha 1": setting("sparsity", "core_alpha", 1),
        "settings null": setting("sparsity", "settings", None),
        "layer entries with more keys": lambda m: m["sparsity"]["layers"][1].update(note=[1]),
        "files listed in another order": lambda m: m.update(files=dict(reversed(list(m["files"].items())))),
    }
    refused = {
        # the decode graph's inputs are not the prefill graph's (edge_sdk/bundle/graph_io.py)
        "prefill graph is the decode graph": setting("graphs", "prefill", "decode.onnx"),
        "dtype with U+0000": setting("dtype", "fp16\u0000"),
        "file name with U+0000": lambda m: m["files"].update({"weights.safetensors\u0000": m["files"]["report.png"]}),
        "exporter null": setting("exporter", None),
        "exporter version a number": setting("exporter", "version", 1),
        "format_version 2^31": setting("format_version", 2**31),
        "format_version above 2^53": setting("format_version", 2**60),
        "architecture missing": setting("model", "architecture", DELETE),
        "rope factor 0": setting("model", "rope", "factor", 0),
        "rope low_freq_factor negative": setting("model", "rope", "low_freq_factor", -1.0),
        "rope original_max_position_embeddings 0": setting("model", "rope", "original_max_position_embeddings", 0),
        "rope missing": setting("model", "rope", DELETE),
        "rms_norm_eps true": setting("model", "rms_norm_eps", True),
        "rms_norm_eps 0 in float32": setting("model", "rms_norm_eps", 1e-300),
        "max_position_embeddings above 2^24": setting("model", "max_position_embeddings", 2**24 + 1),
        "bos_token_id 2047.5": setting("model", "bos_token_id", 2047.5),
        "o_bias null": setting("model", "o_bias", None),
        "qkv_bias true without bias tensors": setting("model", "qkv_bias", True),
        "max_seq_len 1024 with 128-row rope tables": setting("max_seq_len", 1024),
        "levels equal": setting("sparsity", "levels", [0.5, 0.5]),
        "levels -0.0 and 0.0": setting("sparsity", "levels", [-0.0, 0.0]),
        "levels true": setting("sparsity", "levels", [True, 0.8]),
        "levels 65 entries": setting("sparsity", "levels", [i / 100 for i in range(65)]),
        "default_level almost a level": setting("sparsity", "default_level", 0.5000000001),
        "core_alpha above 1": setting("sparsity", "core_alpha", 1.0000001),
        "core_beta missing": setting("sparsity", "core_beta", DELETE),
        "core_alpha true": setting("sparsity", "core_alpha", True),
        "layer true": lambda m: m["sparsity"]["layers"][1].update(layer=True),
        "layer missing": lambda m: m["sparsity"]["layers"][3].pop("layer"),
        "layers a dict": setting("sparsity", "layers", {"0": 1}),
        "graphs prefill with a slash": setting("graphs", "prefill", "sub/prefill.onnx"),
        "graphs a list": setting("graphs", ["prefill.onnx", "decode.onnx"]),
        "tensor dtype lowercase": setting("tensors", "norm.weight", "dtype", "f32"),
        "tensor with 9 dimensions": setting("tensors", "norm.weight", "shape", [1] * 8 + [192]),
        "tensor dimension 2^40 + 1": setting("tensors", "norm.weight", "shape", [2**40 + 1]),
        "tensor entry a list": setting("tensors", "norm.weight", ["F32", [192]]),
        "svd rank 0": setting("tensors", "layers.1.svd.a", "shape", [768, 0]),
        "svd.a of rank 3": setting("tensors", "layers.1.svd.a", "shape", [768, 16, 1]),
        "file size 0.5": setting("files", "report.png", "size", 0.5),
        "file entry a string": setting("files", "report.png", "x"),
        "file name 256 bytes": lambda m: m["files"].update({"a" * 256: m["files"]["report.png"]}),
        "file name with a space": lambda m: m["files"].update({"a b": m["files"]["report.png"]}),
        "report listed with a wrong size": lambda m: m["files"]["report.png"].update(size=1),
    }
    cases = [Case(f"manifest: {name}", edit_manifest(change), ACCEPT) for name, change in accepted.items()]
    cases += [Case(f"manifest: {name}", edit_manifest(change), REFUSE) for name, change in refused.items()]
    cases.append(Case("manifest: file name 255 bytes", sequence(copy_report("a" * 255)), ACCEPT))
    cases.append(Case("manifest: manifest_sha256 uppercase", uppercase_digest, REFUSE))
    respelled = {
        "numbers respelled": lambda t: (
            t.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1.0E-5')
            .replace('"theta": 10000.0', '"theta": 1e4')
            .replace('"threshold": 0.0', '"threshold": -0.0e7')
        ),
        "strings with escapes": lambda t: t.replace('"llama"', '"\\u006c\\u006C\\u0061ma"').replace(
            '"edge-sdk-bundle"', '"edge\\u002dsdk\\u002Dbundle"'
        ),
        "raw UTF-8 and an astral escape in unknown fields": lambda t: t.replace(
            "{", '{"n\u00f6tes": "caf\u00e9 \U0001f600", "x": "\\ud83d\\ude00\\u0000\\/\\b",', 1
        ),
        "tabs and CR line ends": lambda t: t.replace("\n", "\r\n").replace("  ", "\t"),
    }
    cases += [Case(f"manifest respelled: {name}", respelled_manifest(t), ACCEPT) for name, t in respelled.items()]
    return cases


def uppercase_digest(directory: Path) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest).upper()
    (directory / "manifest.json").write_text(json.dumps(manifest))


def copy_report(name: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        shutil.copyfile(directory / "report.png", directory / name)
        relist(directory, name)

    return mutate


def sequence(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        for step in steps:
            step(directory)

    return mutate


def safetensors_cases() -> list[Case]:
    accepted = {
        "no metadata": roomy,
        "offset written -0": lambda h: roomy(h).replace('"data_offsets":[0,', '"data_offsets":[-0,', 1),
        "keys and escapes respelled": lambda h: roomy(h).replace('"norm.weight"', '"norm\\u002eweight"'),
        "whitespace inside": lambda h: roomy(h).replace(",", ", ", 30),
    }
    refused = {
        "metadata null": lambda h: compact({**h, "__metadata__": None}),
        "metadata with an object": lambda h: compact({**h, "__metadata__": {"a": {}}}),
        "a shape entry 192.0": lambda h: roomy(h).replace('"shape":[192]', '"shape":[192.0]', 1),
        "an offset 0e1": lambda h: roomy(h).replace('"data_offsets":[0,', '"data_offsets":[0e1,', 1),
        "a key twice, once escaped": lambda h: roomy(h).replace('"rope.cos"', '"norm\\u002eweight"'),
        "an extra empty tensor": lambda h: compact(
            {**without_metadata(h), "x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}
        ),
        "a tensor renamed with U+0000": lambda h: roomy(h).replace('"norm.weight"', '"norm.weight\\u0000"'),
        "dtype with a space": lambda h: roomy(h).replace('"dtype":"F32"', '"dtype":"F32 "', 1),
        "offsets of 2^53 + 2": lambda h: roomy(h).replace('"data_offsets":[0,', f'"data_offsets":[{2**53 + 2},', 1),
        "header a string": lambda h: json.dumps("x"),
        "shape null": lambda h: roomy(h).replace('"shape":[192]', '"shape":null', 1),
    }
    cases = [Case(f"safetensors: {name}", same_length_header(text), ACCEPT) for name, text in accepted.items()]
    cases += [Case(f"safetensors: {name}", same_length_header(text), REFUSE) for name, text in refused.items()]
    return cases


def graph_cases() -> list[Case]:
    ten_byte_192 = bytes([0xC0, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00])
    minus_192 = varint((1 << 64) - 192)
    nul_name = b"norm.weight\x00"
    accepted = {
        "an external initializer, packed dims": graph_with(initializer(norm_tensor())),
        "an external initializer, unpacked dims": graph_with(initializer(norm_tensor(packed=False))),
        "a dim as a 10-byte varint": graph_with(initializer(norm_tensor(dims=[ten_byte_192]))),
        "offset with leading zeros": graph_with(
            initializer(
                lambda d: external_tensor(b"norm.weight", [(k, zeros(k, v, 3)) for k, v in norm_weight_entries(d)])
            )
        ),
        "location given twice, the last right": graph_with(
            initializer(lambda d: external_tensor(b"norm.weight", [("location", "../x"), *norm_weight_entries(d)]))
        ),
        "data_location 2 with any external_data": graph_with(
            initializer(lambda d: external_tensor(b"x", [("location", "/etc/passwd")], location=2))
        ),
        "a function holding a right external tensor": graph_with(
            extra_model=lambda d: field(25, field(7, field(5, field(5, norm_tensor()(d)))))
        ),
        "garbage inside an opset_import": graph_with(extra_model=lambda d: field(8, b"\x0f\x0f\x0f")),
        "garbage inside value_info": graph_with(lambda d: field(13, b"\xff\xff")),
        "an unknown fixed64 and fixed32 field": graph_with(
            extra_model=lambda d: varint(100 << 3 | 1) + b"\0" * 8 + varint(101 << 3 | 5) + b"\0" * 4
        ),
        "ir_version 2^63": graph_with(extra_model=lambda d: varint_field(1, 1 << 63)),
        "ir_version 0 then 7": graph_with(extra_model=lambda d: varint_field(1, 0) + varint_field(1, 7)),
        "a varint field 7 beside the graph": graph_with(extra_model=lambda d: varint_field(7, 1)),
        "If nested 20 deep (64 messages)": edit_graph(nested_if(20)),
    }
    refused = {
        "a dim varint with a 10th byte of 2": graph_with(initializer(norm_tensor(dims=[ten_byte_192[:-1] + b"\x02"]))),
        "a dim varint of 11 bytes": graph_with(initializer(norm_tensor(dims=[ten_byte_192[:-1] + b"\x80\x00"]))),
        "a negative dim": graph_with(initializer(norm_tensor(dims=[minus_192]))),
        "data type BF16 for an F32 tensor": graph_with(initializer(norm_tensor(data_type=16))),
        "data type 0": graph_with(initializer(norm_tensor(data_type=0))),
        "offset off by one": graph_with(initializer(norm_tensor(offset_delta=1))),
        "location given twice, the last wrong": graph_with(
            initializer(lambda d: external_tensor(b"norm.weight", [*norm_weight_entries(d), ("location", "x")]))
        ),
        "external without external_data": graph_with(initializer(norm_tensor(entries=[]))),
        "offset of 18 digits": graph_with(
            initializer(
                lambda d: external_tensor(
                    b"norm.weight", [(k, zeros(k, v, 18 - len(v))) for k, v in norm_weight_entries(d)]
                )
            )
        ),
        "offset with a plus sign": graph_with(
            initializer(
                lambda d: external_tensor(
                    b"norm.weight", [(k, "+" + v if k == "offset" else v) for k, v in norm_weight_entries(d)]
                )
            )
        ),
        "a tensor name that is not UTF-8": graph_with(initializer(lambda d: field(8, b"\xff") + varint_field(2, 1))),
        "an external data key that is not UTF-8": graph_with(
            initializer(lambda d: field(13, field(1, b"\xc0\x80")) + varint_field(2, 1))
        ),
        "an external name with U+0000": graph_with(
            initializer(lambda d: external_tensor(nul_name, norm_weight_entries(d)))
        ),
        "a function's attribute tensor reading elsewhere": graph_with(
            extra_model=lambda d: field(25, field(11, field(5, wrong_location(d))))
        ),
        "a function node's tensor reading elsewhere": graph_with(
            extra_model=lambda d: field(25, field(7, field(5, field(5, wrong_location(d)))))
        ),
        "training_info reading elsewhere": graph_with(
            extra_model=lambda d: field(20, field(2, field(5, wrong_location(d))))
        ),
        "a sparse initializer's values reading elsewhere": graph_with(lambda d: field(15, field(1, wrong_location(d)))),
        "a sparse initializer's indices reading elsewhere": graph_with(
            lambda d: field(15, field(2, wrong_location(d)))
        ),
        "an attribute's tensors reading elsewhere": graph_with(
            lambda d: field(1, field(5, field(10, wrong_location(d))))
        ),
        "an attribute's sparse_tensors reading elsewhere": graph_with(
            lambda d: field(1, field(5, field(23, field(1, wrong_location(d)))))
        ),
        "an attribute's graphs reading elsewhere": graph_with(
            lambda d: field(1, field(5, field(11, field(5, wrong_location(d)))))
        ),
        "field number 0": graph_with(extra_model=lambda d: varint_field(0, 1)),
        "wire type 6": graph_with(extra_model=lambda d: varint(100 << 3 | 6)),
        "a fixed32 cut short": graph_with(extra_model=lambda d: varint(101 << 3 | 5) + b"\0\0"),
        "ir_version 7 then 0": graph_with(extra_model=lambda d: varint_field(1, 7) + varint_field(1, 0)),
        "a malformed node": graph_with(lambda d: field(1, b"\x0a\x05ab")),
        "If nested 21 deep (67 messages)": edit_graph(nested_if(21)),
    }
    cases = [Case(f"graph: {name}", mutate, ACCEPT) for name, mutate in accepted.items()]
    return cases + [Case(f"graph: {name}", mutate, REFUSE) for name, mutate in refused.items()]


# transformers writes int(1e30) when a tokenizer sets no length: an integer literal beyond 2^53, read as a float64
UNSET_MODEL_MAX_LENGTH = b'"model_max_length": 1000000000000000019884624838656'


def tokenizer_cases() -> list[Case]:
    config = "tokenizer_config.json"

    def update(**fields) -> Callable[[Path], None]:
        return replace_json_file(config, lambda c: c.update(fields))

    def vocabulary_token(directory: Path) -> str:
        return next(iter(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]))

    accepted = {
        "bos_token null": update(bos_token=None),
        "bos_token an object": update(bos_token={"content": "<s>", "lstrip": False}),
        "bos_token removed, add_bos_token kept": replace_json_file(config, lambda c: c.pop("bos_token")),
        "eos_token an object": update(eos_token={"content": "</s>"}),
        "bos_token a vocabulary token": lambda d: replace_json_file(
            config, lambda c: c.update(bos_token=vocabulary_token(d))
        )(d),
        "chat_template null": update(chat_template=None),
        "chat_template list with an unnamed entry": update(
            chat_template=[{"template": "x"}, {"name": "default", "template": "y"}]
        ),
        "chat_template list, names of every type": update(
            chat_template=[
                {"name": "default", "template": "y"},
                {"name": 1},
                {"name": 2.5},
                {"name": False},
                {"name": "1"},
            ]
        ),
        "unknown fields": update(x={"\u0000": [1e300, None]}),
        "model_max_length as transformers writes it": replace_bytes(
            config, lambda d: re.sub(rb'"model_max_length": *\d+', UNSET_MODEL_MAX_LENGTH, d)
        ),
        "tokenizer.json model with an unknown key holding U+0000": replace_json_file(
            "tokenizer.json", lambda t: t["model"].update({"x\u0000": "\u0000"})
        ),
        "tokenizer.json without version": replace_json_file("tokenizer.json", lambda t: t.pop("version")),
    }
    refused = {
        "bos_token content null": update(bos_token={"content": None}),
        "bos_token empty": update(bos_token=""),
        "bos_token U+0000": update(bos_token="\u0000"),
        "bos_token '<s>' + U+0000": update(bos_token="<s>\u0000"),
        "bos_token a list": update(bos_token=["<s>"]),
        "eos_token false": update(eos_token=False),
        "add_bos_token null": update(add_bos_token=None),
        "add_bos_token 1": update(add_bos_token=1),
        "chat_template an object": update(chat_template={"default": "x"}),
        "chat_template empty list": update(chat_template=[]),
        "chat_template default not a string": update(chat_template=[{"name": "default", "template": None}]),
        "chat_template two unnamed entries": update(
            chat_template=[{"template": "x"}, {"name": None}, {"name": "default", "template": "y"}]
        ),
        "chat_template names 1 and true": update(
            chat_template=[{"name": 1}, {"name": True}, {"name": "default", "template": "y"}]
        ),
        "chat_template names 0 and -0.0": update(
            chat_template=[{"name": 0}, {"name": -0.0}, {"name": "default", "template": "y"}]
        ),
        "chat_template default twice": update(
            chat_template=[{"name": "default", "template": "y"}, {"name": "default", "template": "z"}]
        ),
        "tokenizer.json integer beyond 2^53": replace_bytes(
            "tokenizer.json", lambda d: d[:-1] + b', "x": 9007199254740993}'
        ),
        "tokenizer.json with an unknown top-level key": replace_json_file("tokenizer.json", lambda t: t.update(x=1)),
        "tokenizer.json version 2.0": replace_json_file("tokenizer.json", lambda t: t.update(version="2.0")),
        "tokenizer.json version 1": replace_json_file("tokenizer.json", lambda t: t.update(version=1)),
        "config 1e400": replace_bytes(config, lambda d: d.rstrip()[:-1] + b', "x": 1e400}'),
        "tokenizer.json lone surrogate": replace_bytes("tokenizer.json", lambda d: d[:-1] + b', "x": "\\udfff"}'),
    }
    cases = [Case(f"tokenizer: {name}", mutate, ACCEPT) for name, mutate in accepted.items()]
    return cases + [Case(f"tokenizer: {name}", mutate, REFUSE) for name, mutate in refused.items()]


def file_cases() -> list[Case]:
    def hard_link(name: str) -> Callable[[Path], None]:
        def mutate(directory: Path) -> None:
            outside = directory.parent / f"linked-{name}"
            shutil.copyfile(directory / name, outside)
            (directory / name).unlink()
            os.link(outside, directory / name)

        return mutate

    def manifest_link_inside(directory: Path) -> None:
        (directory / "real-manifest.json").write_bytes((directory / "manifest.json").read_bytes())
        (directory / "manifest.json").unlink()
        (directory / "manifest.json").symlink_to("real-manifest.json")

    def dangling_manifest(directory: Path) -> None:
        (directory / "manifest.json").unlink()
        (directory / "manifest.json").symlink_to("nowhere.json")

    def report_to_directory(directory: Path) -> None:
        (directory / "report.png").unlink()
        (directory / "report.png").mkdir()

    return [
        Case("files: a hard link", hard_link("tokenizer.json"), ACCEPT),
        Case("files: manifest a link inside the bundle", manifest_link_inside, REFUSE),
        Case("files: manifest a dangling link", dangling_manifest, REFUSE),
        Case("files: a listed report is a directory", report_to_directory, REFUSE),
        Case("files: signbit bundle, alpha infinite", signbit_alpha(float("inf")), REFUSE, "signbit-fp32"),
        Case("files: signbit bundle, alpha negative", signbit_alpha(-2.0), ACCEPT, "signbit-fp32"),
    ]


def signbit_alpha(value: float) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        data = bytearray((directory / "weights.safetensors").read_bytes())
        size, header = read_header(directory)
        start = 8 + size + header["layers.3.signbit.alpha"]["data_offsets"][0]
        data[start : start + 4] = struct.pack("<f", value)
        (directory / "weights.safetensors").write_bytes(bytes(data))
        relist(directory, "weights.safetensors")

    return mutate


def corpus() -> list[Case]:
    return [
        *manifest_cases(),
        *safetensors_cases(),
        *graph_cases(),
        *interface_cases(),
        *tokenizer_cases(),
        *file_cases(),
    ]


# ---- the readers -----------------------------------------------------------------------------------------------------


def python_verdict(path: Path) -> str | None:
    try:
        Tokenizer.from_bundle(Bundle.open(path))
    except EdgeSdkError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def corpus_dirs(bundles, tmp_path_factory) -> list[tuple[Case, Path]]:
    root = tmp_path_factory.mktemp("c-reader-cases")
    made = []
    for index, case in enumerate(corpus()):
        directory = root / f"{index:03d}" / "bundle"
        shutil.copytree(bundles[case.base], directory)
        case.mutate(directory)
        made.append((case, directory))
    return made


def test_c_and_python_readers_give_the_rule_s_verdict(x86_build: Build, asan_build: Build, corpus_dirs):
    paths = [path for _, path in corpus_dirs]
    # The sanitized build's checks take longest (a debug build under ASan): they run in the background while the
    # plain build and the Python reader, which leave a core idle, give their verdicts.
    with ThreadPoolExecutor(max_workers=1) as background:
        sanitizing = background.submit(c_verdicts, asan_build, paths, env=sanitizer_env())
        plain = c_verdicts(x86_build, paths)
        python_messages = [python_verdict(path) for path in paths]
        sanitized = sanitizing.result()
    wrong = []
    readers = zip(corpus_dirs, python_messages, plain, sanitized, strict=True)
    for (case, path), python_message, c_message, asan_message in readers:
        verdicts = {"Python": python_message, "C": c_message, "C (ASan)": asan_message}
        for reader, message in verdicts.items():
            verdict = ACCEPT if message is None else REFUSE
            if verdict != case.expected:
                wrong.append(f"{case.name}: {reader} {verdict}s, expected {case.expected} ({message})")
            elif message is not None:
                assert message.strip() and "\n" not in message, f"{case.name}: {reader}: {message!r}"
        if c_message is not None:
            assert str(path) in c_message or "tokenizer" in c_message, f"{case.name}: {c_message}"
    assert not wrong, "\n".join(wrong)
    assert len(corpus_dirs) >= 150


def test_bundle_directory_through_a_link_opens(x86_build: Build, bundles, tmp_path):
    """Only the bundle's own files must not be links: the directory may be reached through one."""
    link = tmp_path / "linked-bundle"
    link.symlink_to(bundles["svd-fp16"])
    assert python_verdict(link) is None
    assert c_verdicts(x86_build, [link]) == [None]
