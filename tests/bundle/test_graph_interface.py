"""A bundle's graphs have the inputs and outputs of their phase (edge_sdk/bundle/graph_io.py): the wire reader reads
what onnx reads, every exported graph passes, and a graph of the other phase (swapped graphs, re-signed), one that
lost an input or output, or one whose value changed its element type, rank or size is refused by the file checks
(Bundle.open: `verify --files-only`, `run`) naming the file, the value and what was expected. What ONNX Runtime still
refuses in the full `verify` is one line too, naming the graph, never a traceback."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_sdk.bundle import Bundle, BundleError, graph_io, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD
from edge_sdk.export import verify
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.formats import onnx_wire


def resign(directory: Path) -> None:
    """Every listed file's size and sha256, and the manifest's digest, made to match again, as a tampering exporter
    would, so the checks past the checksums are reached."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (directory / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def copy_of(bundle_matrix, name: str, directory: Path) -> Path:
    shutil.copytree(bundle_matrix.path(name), directory)
    return directory


def edit_graph(directory: Path, graph: str, change: Callable[[onnx.ModelProto], object]) -> None:
    model = onnx.load(str(directory / graph), load_external_data=False)
    change(model)
    (directory / graph).write_bytes(model.SerializeToString())
    resign(directory)


def swap_graphs(directory: Path) -> None:
    prefill, decode = (directory / "prefill.onnx").read_bytes(), (directory / "decode.onnx").read_bytes()
    (directory / "prefill.onnx").write_bytes(decode)
    (directory / "decode.onnx").write_bytes(prefill)
    resign(directory)


def refusal(directory: Path) -> str:
    with pytest.raises(BundleError) as caught:
        Bundle.open(directory)
    return str(caught.value)


def edge_sdk(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_sdk", *map(str, args)], capture_output=True, text=True, timeout=600
    )


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 2, one line on stderr, no traceback; the line, which holds every fragment."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge-sdk: error: "), result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- the wire reader and the exporter's graphs --------------------------------------------------------------------


def onnx_values(values) -> tuple[graph_io.GraphValue, ...]:
    """The onnx package's reading of value infos, in graph_io's terms."""
    found = []
    for value in values:
        tensor = value.type.tensor_type
        dims = tuple(dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in tensor.shape.dim)
        found.append(graph_io.GraphValue(value.name, onnx_wire.ONNX_TO_SAFETENSORS[tensor.elem_type], dims))
    return tuple(found)


@pytest.mark.parametrize("name", ["svd-fp32", "core-fp16", "svd-int4"])
def test_exported_graphs_have_their_phase_interface_as_onnx_reads_it(bundle_matrix, name):
    bundle = bundle_matrix[name]
    config = bundle.config
    layers = range(config.num_layers)
    core = name.startswith("core")
    prompt_outputs = [f"core_activations.{layer}" for layer in layers] if core else []
    for phase in ("prefill", "decode"):
        data = bundle.graph_path(phase).read_bytes()
        model = onnx.load_from_string(data)
        found = graph_io.read_interface(data)
        assert found.inputs == onnx_values(model.graph.input)
        assert found.outputs == onnx_values(model.graph.output)
        expected = graph_io.graph_interface(config, phase)
        # the exporter's own values first, in its order, exactly as declared; the predictor kind's after them
        assert found.inputs[: len(expected.inputs)] == expected.inputs
        assert found.outputs[: len(expected.outputs)] == expected.outputs
        kind_inputs = [f"core_mask.{layer}" for layer in layers] if core and phase == "decode" else []
        assert [value.name for value in found.inputs[len(expected.inputs) :]] == kind_inputs
        assert [value.name for value in found.outputs[len(expected.outputs) :]] == prompt_outputs
        assert graph_io.interface_problem(found, config, phase, kind_inputs=core) is None
    head = (config.num_kv_heads, config.head_dim)
    decode = graph_io.graph_interface(config, "decode")
    assert [value.name for value in decode.inputs[:4]] == [
        "input_ids",
        "position_ids",
        "past_key_values.0.key",
        "past_key_values.0.value",
    ]
    assert decode.inputs[2].shape == ("batch", head[0], "past_seq", head[1])
    assert decode.inputs[-2:] == (
        graph_io.GraphValue("sparsity_level", "I64", ()),
        graph_io.GraphValue("dense", "BOOL", ()),
    )
    assert decode.outputs[0] == graph_io.GraphValue("logits", "F32", ("batch", "seq", config.vocab_size))
    assert decode.outputs[-1] == graph_io.GraphValue(
        f"present.{config.num_layers - 1}.value", "F32", ("batch", head[0], "total_seq", head[1])
    )
    assert len(decode.inputs) == 2 + 2 * config.num_layers + 2 and len(decode.outputs) == 1 + 2 * config.num_layers


# ---- swapped graphs ------------------------------------------------------------------------------------------------


def test_swapped_graphs_are_refused_by_the_file_checks_and_run(bundle_matrix, tmp_path):
    swapped = copy_of(bundle_matrix, "svd-fp32", tmp_path / "swapped")
    swap_graphs(swapped)
    message = refusal(swapped)
    assert message == (
        f"{swapped / 'prefill.onnx'}: input 'sparsity_level' is not an input of the prefill graph (expected its "
        "inputs, 10: input_ids, position_ids, past_key_values.0.key, ..., past_key_values.3.key, "
        "past_key_values.3.value); it has the decode graph's inputs and outputs (are prefill.onnx and decode.onnx "
        "swapped?)"
    )
    fragments = ("prefill.onnx: input 'sparsity_level' is not an input of the prefill graph", "swapped?")
    assert_refused(edge_sdk("verify", swapped, "--files-only"), *fragments)
    assert_refused(edge_sdk("verify", swapped, "--steps", "2"), *fragments)
    assert_refused(edge_sdk("run", swapped, "--prompt", "hi", "--max-new-tokens", "2", "--threads", "1"), *fragments)


def test_a_decode_graph_holding_the_prefill_graph_is_refused_naming_decode_onnx(bundle_matrix, tmp_path):
    copy = copy_of(bundle_matrix, "svd-fp32", tmp_path / "copy")
    shutil.copyfile(copy / "prefill.onnx", copy / "decode.onnx")
    resign(copy)
    assert refusal(copy) == (
        f"{copy / 'decode.onnx'}: the decode graph's input 'sparsity_level' is missing: expected I64 [] (rank 0); it "
        "has the prefill graph's inputs and outputs (are prefill.onnx and decode.onnx swapped?)"
    )


# ---- a graph that lost or changed a value --------------------------------------------------------------------------


def drop(role: str, name: str) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        values = getattr(model.graph, role)
        del values[next(index for index, value in enumerate(values) if value.name == name)]

    return change


def replace(role: str, name: str, elem_type: int, shape: list) -> Callable[[onnx.ModelProto], None]:
    def change(model: onnx.ModelProto) -> None:
        values = getattr(model.graph, role)
        index = next(index for index, value in enumerate(values) if value.name == name)
        values[index].CopyFrom(helper.make_tensor_value_info(name, elem_type, shape))

    return change


def add_input(value: onnx.ValueInfoProto) -> Callable[[onnx.ModelProto], None]:
    return lambda model: model.graph.input.append(value)


def value_cases(config) -> dict[str, tuple[str, Callable, str]]:
    """name -> (graph, its change, the refusal after the graph's path) for the tiny model's config."""
    heads, head_dim, vocab = config.num_kv_heads, config.head_dim, config.vocab_size
    return {
        "decode lost dense": (
            "decode.onnx",
            drop("input", "dense"),
            "the decode graph's input 'dense' is missing: expected BOOL [] (rank 0)",
        ),
        "prefill lost position_ids": (
            "prefill.onnx",
            drop("input", "position_ids"),
            "the prefill graph's input 'position_ids' is missing: expected I64 [batch, seq] (rank 2)",
        ),
        "decode lost an output": (
            "decode.onnx",
            drop("output", "present.1.value"),
            f"the decode graph's output 'present.1.value' is missing: expected F32 [batch, {heads}, total_seq, "
            f"{head_dim}] (rank 4)",
        ),
        "dense an int64": (
            "decode.onnx",
            replace("input", "dense", TensorProto.INT64, []),
            "input 'dense' is I64 [] (rank 0), expected BOOL [] (rank 0) as the decode graph's",
        ),
        "a KV input of rank 3": (
            "prefill.onnx",
            replace("input", "past_key_values.0.key", TensorProto.FLOAT, ["batch", heads, "past_seq"]),
            f"input 'past_key_values.0.key' is F32 [batch, {heads}, past_seq] (rank 3), expected F32 [batch, {heads}, "
            f"past_seq, {head_dim}] (rank 4) as the prefill graph's",
        ),
        "logits of another vocabulary": (
            "decode.onnx",
            replace("output", "logits", TensorProto.FLOAT, ["batch", "seq", vocab + 1]),
            f"output 'logits' is F32 [batch, seq, {vocab + 1}] (rank 3), expected F32 [batch, seq, {vocab}] (rank 3) "
            "as the decode graph's",
        ),
        "an input declared twice": (
            "prefill.onnx",
            add_input(helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])),
            "input 'input_ids' is declared twice",
        ),
        "a predictor input svd does not take": (
            "decode.onnx",
            add_input(helper.make_tensor_value_info("core_mask.0", TensorProto.INT32, ["batch", 64])),
            "input 'core_mask.0' is not an input of the decode graph of a bundle whose predictor takes no decode "
            "inputs (expected its inputs, 12: input_ids, position_ids, past_key_values.0.key, ..., sparsity_level, "
            "dense)",
        ),
    }


CASE_NAMES = [
    "decode lost dense",
    "prefill lost position_ids",
    "decode lost an output",
    "dense an int64",
    "a KV input of rank 3",
    "logits of another vocabulary",
    "an input declared twice",
    "a predictor input svd does not take",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_graph_whose_values_differ_is_refused_naming_the_file_and_the_value(bundle_matrix, tmp_path, case):
    copy = copy_of(bundle_matrix, "svd-fp32", tmp_path / "copy")
    graph, change, expected = value_cases(bundle_matrix["svd-fp32"].config)[case]
    edit_graph(copy, graph, change)
    message = refusal(copy)
    assert message == f"{copy / graph}: {expected}"
    assert "swapped" not in message


def test_the_lost_input_is_refused_by_verify_files_only_in_one_line(bundle_matrix, tmp_path):
    copy = copy_of(bundle_matrix, "svd-fp32", tmp_path / "copy")
    edit_graph(copy, "decode.onnx", drop("input", "dense"))
    assert_refused(
        edge_sdk("verify", copy, "--files-only"),
        "decode.onnx: the decode graph's input 'dense' is missing: expected BOOL [] (rank 0)",
    )


def test_predictor_outputs_must_be_the_same_in_both_graphs(bundle_matrix, tmp_path):
    copy = copy_of(bundle_matrix, "core-fp16", tmp_path / "copy")
    assert Bundle.open(copy)  # a core bundle's decode inputs (core_mask.{i}) and prompt outputs are accepted
    edit_graph(copy, "decode.onnx", drop("output", "core_activations.2"))
    intermediate = bundle_matrix["core-fp16"].config.intermediate_size
    assert refusal(copy) == (
        f"{copy / 'decode.onnx'}: the decode graph's output 'core_activations.2' is missing: expected F32 "
        f"[batch, seq, {intermediate}] (rank 3), as the prefill graph has it (the predictor's outputs are the same "
        "in both graphs)"
    )


# ---- ONNX Runtime's own refusals in the full verify ----------------------------------------------------------------


def test_a_graph_onnx_runtime_cannot_load_fails_verify_in_one_line_naming_it(bundle_matrix, tmp_path):
    copy = copy_of(bundle_matrix, "svd-fp32", tmp_path / "copy")

    def unknown_op(model: onnx.ModelProto) -> None:
        next(node for node in model.graph.node if node.op_type == "Softmax").op_type = "NoSuchOp"

    edit_graph(copy, "decode.onnx", unknown_op)
    assert Bundle.open(copy)  # the file checks read the graph's interface, not its nodes
    line = assert_refused(
        edge_sdk("verify", copy, "--steps", "1"), f"{copy / 'decode.onnx'}: ONNX Runtime could not load the graph"
    )
    assert "InvalidGraph" in line and "NoSuchOp" in line and "prefill.onnx" not in line


def test_an_onnx_runtime_error_while_running_is_a_verification_error_naming_the_graph(bundle_matrix, monkeypatch):
    bundle = bundle_matrix["svd-fp32"]

    def missing_inputs(self, ids: np.ndarray) -> np.ndarray:
        raise ValueError("Required inputs (['sparsity_level', 'dense']) are missing from input feed\n(['input_ids'])")

    monkeypatch.setattr(OrtBundleSession, "decode", missing_inputs)
    with pytest.raises(verify.VerificationError) as caught:
        verify.verify_graphs(bundle, decode_steps=1)
    assert str(caught.value) == (
        f"{bundle.path / 'decode.onnx'}: ONNX Runtime could not run the graph (ValueError: Required inputs "
        "(['sparsity_level', 'dense']) are missing from input feed (['input_ids'])); expected the graph edge-sdk "
        "export writes"
    )
