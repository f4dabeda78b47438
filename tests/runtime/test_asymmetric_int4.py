"""Asymmetric int4 bundles (export --int4-scheme asymmetric; bundle format version 6): every int4 matrix with fp16
group minimums, value (code + 8) * scale + min, llama.cpp's Q4_1 grid. The stored layout, every CPU engine and ONNX
Runtime against the reference on the dequantized weights, the refusals of the option where it has no meaning and of
manifests that say otherwise than the tensors, the TensorRT compatibility check (the quantized plugins take the
minimums) and the Ascend path, which dequantizes such rows."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from edge_sdk.backends.c_runtime import RuntimeEngine
from edge_sdk.backends.cann.quantized import DEQUANTIZE, DequantizingMatrix, choose_quant_path
from edge_sdk.backends.cpu.torch_engine import load_torch_cpu_engine
from edge_sdk.backends.tensorrt import EngineBuildError, build_engine, compatibility
from edge_sdk.backends.tensorrt.builder import check_quantized_ops
from edge_sdk.backends.tensorrt.profiles import ENGINE_GRAPH

from edge_sdk import quant
from edge_sdk.bundle import Bundle, BundleError
from edge_sdk.bundle.check import check_bundle
from edge_sdk.bundle.format import FORMAT_VERSION
from edge_sdk.bundle.graph_ops import DOMAIN
from edge_sdk.bundle.layout import MINS_SUFFIX, SCALES_SUFFIX
from edge_sdk.cli import main
from edge_sdk.export.exporter import ExportError, ExportSettings, export_bundle
from edge_sdk.formats.onnx_wire import graph_op_types
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import quantized_matrix

from .test_head_dtype import restamped_copy
from .test_quantized_bundles import (
    assert_dense_engines_follow_the_reference,
    assert_follow_the_reference_up_to_near_ties,
    greedy,
    held_out_ids,
    prompt_ids,
)

BUNDLES = ("svd-int4-asym", "tied-svd-int4-asym", "tied-svd-int4-asym-head-int8")


def head_of(bundle) -> str:
    return "embed_tokens.weight" if bundle.config.tie_word_embeddings else "lm_head.weight"


@pytest.mark.parametrize("name", BUNDLES)
def test_every_int4_matrix_stores_its_minimums(bundle_matrix, name):
    bundle = bundle_matrix[name]
    symmetric = bundle_matrix[name.replace("-asym", "")] if "head-int8" not in name else None
    assert bundle.manifest.format_version == 6 and bundle.manifest.raw["int4_scheme"] == "asymmetric"
    assert bundle.manifest.asymmetric and bundle.dtype == "int4"
    shown = check_bundle(bundle.path)[1]["dtype"]  # what `edge-sdk verify` prints
    assert shown == ("int4 asymmetric (LM head int8)" if name.endswith("head-int8") else "int4 asymmetric")
    head = head_of(bundle)
    int8_head = name.endswith("head-int8")
    matrices = [name_ for name_ in bundle.manifest.tensors if name_ + SCALES_SUFFIX in bundle.manifest.tensors]
    assert head in matrices and "layers.1.mlp.down_proj.weight_t" in matrices
    for matrix_name in matrices:
        has_mins = bundle.has_tensor(matrix_name + MINS_SUFFIX)
        matrix = quantized_matrix(bundle, matrix_name)
        if matrix_name == head and int8_head:
            assert not has_mins and matrix.format == "int8"  # the int8 head stays symmetric
            continue
        assert has_mins, matrix_name
        assert bundle.header.tensors[matrix_name + MINS_SUFFIX].dtype == "F16"
        assert matrix.mins.shape == matrix.scales.shape == (matrix.shape[0], matrix.shape[1] // 32)
        # the stored bytes are the format: quantizing the dequantized matrix again gives them back
        again = quant.quantize(quant.dequantize(matrix), "int4", 32, asymmetric=True)
        assert np.array_equal(again.data, matrix.data), matrix_name
        assert np.array_equal(again.scales, matrix.scales) and np.array_equal(again.mins, matrix.mins)
        # minimums far from zero: a reader that dropped them, or the + 8, would read other values
        assert float(np.abs(matrix.mins.astype(np.float32)).mean()) > 4 * float(matrix.scales.astype(np.float32).mean())
    if not bundle.config.tie_word_embeddings:
        assert bundle.header.tensors["embed_tokens.weight"].dtype == "F16"
        assert not bundle.has_tensor("embed_tokens.weight" + MINS_SUFFIX)
    if symmetric is not None:  # the symmetric bundle has no minimums, and other values
        assert not any(tensor.endswith(MINS_SUFFIX) for tensor in symmetric.manifest.tensors)
        assert "int4_scheme" not in symmetric.manifest.raw and not symmetric.manifest.asymmetric
        ours = quant.dequantize(quantized_matrix(bundle, "layers.0.mlp.gate_proj.weight"))
        theirs = quant.dequantize(quantized_matrix(symmetric, "layers.0.mlp.gate_proj.weight"))
        assert not np.array_equal(ours, theirs)


@pytest.mark.parametrize("name", BUNDLES)
def test_every_engine_gives_the_references_greedy_ids_and_held_out_logits(bundle_matrix, tiny_model_dir, name):
    """Dense, greedy on a prompt and teacher-forced on held-out text: the C runtime, the CPU torch engine and ONNX
    Runtime (prefill.onnx and decode.onnx, unmodified) give the reference's ids and its logits (the matrices
    dequantized with their minimums, then float32) within LOGIT_TOLERANCE."""
    bundle = bundle_matrix[name]
    assert_dense_engines_follow_the_reference(bundle, held_out_ids(bundle, tiny_model_dir))


@pytest.mark.parametrize("engine_name", ["c_runtime", "torch_cpu"])
def test_sparse_decode_follows_the_reference_at_the_default_level_up_to_near_ties(bundle_matrix, engine_name):
    bundle = bundle_matrix["svd-int4-asym"]
    options = EngineOptions.of(bundle, threads=1)
    engine = RuntimeEngine(bundle, options) if engine_name == "c_runtime" else load_torch_cpu_engine(bundle, options)
    assert_follow_the_reference_up_to_near_ties(bundle, engine)


def test_c_runtime_is_bit_identical_for_any_thread_count(bundle_matrix):
    bundle = bundle_matrix["tied-svd-int4-asym"]
    ids = prompt_ids(bundle)
    one = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=1)), ids)[1]
    for threads in (2, 3):
        found = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=threads)), ids)[1]
        assert all(np.array_equal(a, b) for a, b in zip(one, found, strict=True)), threads


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_export_refuses_the_asymmetric_scheme_without_int4(tiny_model_dir, tmp_path, dtype):
    """One line naming the option and what it needs, exit status 2, nothing written; the Python API raises
    ExportError with the same words."""
    out = tmp_path / "bundle"
    args = ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", "--dtype", dtype]
    result = CliRunner().invoke(main, [*args, "--int4-scheme", "asymmetric"])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert f"--int4-scheme asymmetric needs --dtype int4, found --dtype {dtype}" in message
    assert not out.exists()
    with pytest.raises(ExportError, match="--int4-scheme asymmetric needs --dtype int4"):
        export_bundle(tiny_model_dir, out, ExportSettings(dtype=dtype, int4_scheme="asymmetric"))
    with pytest.raises(ExportError, match="--int4-scheme must be one of symmetric, asymmetric, found 'q4_1'"):
        export_bundle(tiny_model_dir, out, ExportSettings(dtype="int4", int4_scheme="q4_1"))
    assert not out.exists()


@pytest.mark.parametrize(
    ("source", "change", "message"),
    [
        # a version 5 reader does not know int4_scheme: the minimums belong to nothing it expects
        ("svd-int4-asym", lambda m: m.update(format_version=5), r"tensor '.*\.mins' belongs to no part of this model"),
        ("svd-int4-asym", lambda m: m.pop("int4_scheme"), r"tensor '.*\.mins' belongs to no part of this model"),
        ("svd-int4-asym", lambda m: m.update(int4_scheme="q4_1"), r"field 'int4_scheme' must be one of symmetric"),
        (
            "svd-int4-asym",
            lambda m: m.update(format_version=FORMAT_VERSION + 1),
            rf"format version {FORMAT_VERSION + 1} is newer than this edge-sdk",
        ),
        ("svd-int4", lambda m: m.update(format_version=6, int4_scheme="asymmetric"), r"'.*\.mins' is missing"),
        ("svd-int8", lambda m: m.update(format_version=6, int4_scheme="asymmetric"), r"null or absent for dtype int8"),
    ],
)
def test_a_manifest_that_contradicts_its_minimums_is_refused(bundle_matrix, tmp_path, source, change, message):
    copy = tmp_path / "bundle"
    restamped_copy(bundle_matrix.path(source), copy, change)
    with pytest.raises(BundleError, match=message):
        Bundle.open(copy)


def test_a_symmetric_scheme_field_reads_as_the_plain_int4_bundle(bundle_matrix, tmp_path):
    copy = tmp_path / "bundle"
    restamped_copy(bundle_matrix.path("svd-int4"), copy, lambda m: m.update(format_version=6, int4_scheme="symmetric"))
    bundle = Bundle.open(copy)
    assert bundle.manifest.int4_scheme == "symmetric" and not bundle.manifest.asymmetric


def test_tensorrt_compatibility_passes_the_bundle(bundle_matrix):
    """decode.onnx hands every asymmetric matrix, minimums included, to the quantized plugins
    (tests/export/test_asymmetric_decode_graph.py): the static check finds nothing, and `edge-sdk verify --target
    tensorrt` passes."""
    bundle = bundle_matrix["svd-int4-asym"]
    violations, memory = compatibility.check_bundle(bundle)
    assert violations == [] and memory.engine == memory.bundle_weights
    result = CliRunner().invoke(main, ["verify", str(bundle.path), "--target", "tensorrt", "--files-only"])
    assert result.exit_code == 0, result.output


def test_tensorrt_builds_no_engine_from_a_graph_that_dequantizes_the_minimums(bundle_matrix, tmp_path):
    """A bundle exported before the quantized ops took minimums has a decode.onnx whose FFNs are SparseFFN over float32
    matrices dequantized in standard ops: `edge-sdk build` says to export it again, before it needs TensorRT, instead
    of building an engine that holds float32 weights, and the compatibility check says the same in one violation. The
    graph's op types are read from the wire format (a device has no onnx package), as onnx reads them."""
    source = bundle_matrix["svd-int4-asym"]
    graph_bytes = source.graph_path(ENGINE_GRAPH).read_bytes()
    graph = onnx.load_from_string(graph_bytes)
    assert graph_op_types(graph_bytes) == {(node.domain, node.op_type) for node in graph.graph.node}
    assert (DOMAIN, "QuantizedSparseFFN") in graph_op_types(graph_bytes)
    check_quantized_ops(source)  # today's graph passes
    for node in graph.graph.node:  # as the earlier exporter wrote it, the FFN's op type at least
        if node.op_type == "QuantizedSparseFFN":
            node.op_type = "SparseFFN"
    old_graph = graph.SerializeToString()
    copy = tmp_path / "bundle"

    def with_old_graph(manifest):
        manifest["files"][f"{ENGINE_GRAPH}.onnx"] = {
            "size": len(old_graph),
            "sha256": hashlib.sha256(old_graph).hexdigest(),
        }

    restamped_copy(source.path, copy, with_old_graph)
    (copy / f"{ENGINE_GRAPH}.onnx").write_bytes(old_graph)
    old_bundle = Bundle.open(copy)
    with pytest.raises(EngineBuildError, match=r"dequantizes the asymmetric int4 matrices to float32.*export it again"):
        build_engine(old_bundle)
    violations, _ = compatibility.check_bundle(old_bundle)  # `verify --target tensorrt`: one violation, the way out
    assert [violation.rule for violation in violations] == ["asymmetric-int4-graph"]
    assert "export it again" in violations[0].message


def test_the_ascend_path_dequantizes_asymmetric_rows_on_every_chip(bundle_matrix):
    class Operators:  # a chip whose weight-quant matmul takes per-group scales and int4
        __version__ = "2.5.1"

        def npu_weight_quant_batchmatmul(self, *args, **kwargs): ...

        def npu_convert_weight_to_int4pack(self, *args, **kwargs): ...

    plan = choose_quant_path("Ascend910B2", Operators(), "int4", asymmetric=True)
    assert plan.path == DEQUANTIZE and "asymmetric int4" in plan.reason
    matrix = quantized_matrix(bundle_matrix["svd-int4-asym"], "layers.2.mlp.up_proj.weight")
    device = DequantizingMatrix(matrix, torch.device("cpu"), torch.float32)
    rows = torch.tensor([5, 0, 700])
    expected = quant.dequantize(matrix)[rows.numpy()]
    assert torch.equal(device.rows(rows), torch.from_numpy(expected))


def test_export_refuses_a_quantization_method_for_unquantized_weights(tiny_model_dir, tmp_path):
    out = tmp_path / "bundle"
    args = ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", "--dtype", "fp16"]
    result = CliRunner().invoke(main, [*args, "--quant-method", "awq"])
    assert result.exit_code == 2, result.output
    assert "--quant-method awq chooses how int8 / int4 weights are rounded; --dtype fp16 keeps them" in result.output
    assert "Traceback" not in result.output and not out.exists()
