"""int4 bundles whose FFN down projections are int8 (export --down-dtype int8; bundle format version 7), symmetric and
tied asymmetric with an int8 head: the stored layout, the graphs, every engine on them, and the refusals of everything
else. The down rows stay neuron-major, so a skipped neuron still skips one row of each matrix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from edge_sdk.backends.c_runtime import RuntimeEngine
from edge_sdk.backends.cann.engine import load_gather_engine
from edge_sdk.backends.cann.quantized import DEQUANTIZE, DequantizingMatrix
from edge_sdk.backends.cpu.torch_engine import load_torch_cpu_engine
from edge_sdk.backends.tensorrt import compatibility

from edge_sdk import quant
from edge_sdk.bundle import Bundle, BundleError
from edge_sdk.bundle.check import check_bundle
from edge_sdk.bundle.layout import MINS_SUFFIX, SCALES_SUFFIX, is_predictor_tensor
from edge_sdk.cli import main
from edge_sdk.export.exporter import ExportError, ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import load_reference_decoder, quantized_matrix

from .test_head_dtype import restamped_copy
from .test_quantized_bundles import (
    LOGIT_TOLERANCE,
    assert_dense_engines_follow_the_reference,
    assert_follow_the_reference_up_to_near_ties,
    greedy,
    held_out_ids,
    prompt_ids,
)

SYMMETRIC, ASYMMETRIC = "svd-int4-down-int8", "tied-svd-int4-asym-head-int8-down-int8"
BUNDLES = (SYMMETRIC, ASYMMETRIC)
# the bundles of the same model and predictor that differ from each only in the down projections' format
PLAIN = {SYMMETRIC: "svd-int4", ASYMMETRIC: "tied-svd-int4-asym-head-int8"}


def down(layer: int) -> str:
    return f"layers.{layer}.mlp.down_proj.weight_t"


@pytest.mark.parametrize("name", BUNDLES)
def test_the_down_rows_are_int8_and_every_other_model_tensor_is_the_int4_bundles(bundle_matrix, name):
    bundle, plain, int8 = bundle_matrix[name], bundle_matrix[PLAIN[name]], bundle_matrix["svd-int8"]
    config = bundle.config
    assert bundle.manifest.raw["down_dtype"] == "int8" and bundle.manifest.down_dtype == "int8"
    assert bundle.manifest.ffn_down_dtype == "int8" and plain.manifest.ffn_down_dtype == "int4"
    assert bundle.manifest.format_version == 7 and bundle.dtype == "int4"
    assert "down_dtype" not in plain.manifest.raw and plain.manifest.down_dtype is None
    shown = check_bundle(bundle.path)[1]["dtype"]  # what `edge-sdk verify` prints
    expected = "int4 (FFN down int8)" if name == SYMMETRIC else "int4 asymmetric (LM head int8, FFN down int8)"
    assert shown == expected
    downs = {down(layer) for layer in range(config.num_layers)}
    for layer in range(config.num_layers):
        matrix = quantized_matrix(bundle, down(layer))
        assert matrix.format == "int8" and matrix.mins is None and not bundle.has_tensor(down(layer) + MINS_SUFFIX)
        assert bundle.header.tensors[down(layer)].dtype == "I8"
        assert matrix.shape == (config.intermediate_size, config.hidden_size)
        assert matrix.scales.shape == (config.intermediate_size, config.hidden_size // 32)
        if name == SYMMETRIC:  # the int8 bundle's down rows: the same neuron-major matrix in int8 groups of 32
            theirs = quantized_matrix(int8, down(layer))
            assert np.array_equal(matrix.data, theirs.data) and np.array_equal(matrix.scales, theirs.scales)
        gate = quantized_matrix(bundle, f"layers.{layer}.mlp.gate_proj.weight")
        assert gate.format == "int4" and (gate.mins is not None) == (name == ASYMMETRIC)
    # every other model tensor is declared as in the bundle with int4 down rows, and holds its bytes (the predictors
    # are fitted on the model as stored, so theirs differ)
    parts = {tensor for tensor in plain.manifest.tensors if tensor.startswith(tuple(downs))}
    others = {tensor for tensor in set(plain.manifest.tensors) - parts if not is_predictor_tensor(tensor)}
    assert {tensor for tensor in bundle.manifest.tensors if tensor.startswith(tuple(downs))} == {
        tensor for d in downs for tensor in (d, d + SCALES_SUFFIX)
    }
    for tensor in sorted(others):
        assert bundle.manifest.tensors[tensor] == plain.manifest.tensors[tensor], tensor
        assert np.array_equal(bundle.array(tensor), plain.array(tensor)), tensor


@pytest.mark.parametrize("name", BUNDLES)
def test_graphs_read_the_down_rows_as_int8_and_keep_tensorrts_rules(bundle_matrix, name):
    bundle = bundle_matrix[name]
    weight_format = "int4_asymmetric" if name == ASYMMETRIC else "int4"
    decode = onnx.load(str(bundle.graph_path("decode")), load_external_data=False)
    ffns = [node for node in decode.graph.node if node.op_type == "QuantizedSparseFFN"]
    assert len(ffns) == bundle.config.num_layers
    for node in ffns:
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        assert attributes["weight_format"] == weight_format.encode() and attributes["down_weight_format"] == b"int8"
        # x, three matrices' codes and scales, mask (svd: no thresholds), and for the asymmetric gate and up, zero
        # thresholds and their minimums: the int8 down rows have none
        assert len(node.input) == (11 if name == ASYMMETRIC else 8), list(node.input)
        assert node.input[5].endswith("down_proj.weight_t") and not any(i.endswith("weight_t.mins") for i in node.input)
    products = {}
    for node in decode.graph.node:
        if node.op_type == "QuantizedMatMul":
            attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
            products[node.input[1]] = attributes["weight_format"].decode()
    assert {products[down(layer)] for layer in range(bundle.config.num_layers)} == {"int8"}  # the prompt's FFN
    assert products["layers.0.mlp.gate_proj.weight"] == weight_format
    prefill = onnx.load(str(bundle.graph_path("prefill")), load_external_data=False)
    types = {initializer.name: initializer.data_type for initializer in prefill.graph.initializer}
    assert types[down(0)] == onnx.TensorProto.INT8 and types["layers.0.mlp.up_proj.weight"] == onnx.TensorProto.INT4
    # TensorRT 10.3's parser rules hold, and its engine would hold exactly the bundle's bytes (no GPU needed)
    violations, memory = compatibility.check_bundle(bundle)
    assert violations == [] and memory.engine == memory.bundle_weights


@pytest.mark.parametrize("name", BUNDLES)
def test_every_engine_gives_the_references_greedy_ids_and_held_out_logits(bundle_matrix, tiny_model_dir, name):
    """Dense, greedy on a prompt and teacher-forced on held-out text: the C runtime, the CPU torch engine and ONNX
    Runtime (prefill.onnx and decode.onnx, unmodified) give the reference's ids and its logits (the matrices
    dequantized, each in its own format, then float32) within LOGIT_TOLERANCE."""
    bundle = bundle_matrix[name]
    engines = assert_dense_engines_follow_the_reference(bundle, held_out_ids(bundle, tiny_model_dir))
    # the down rows are read as stored: the bundle with int4 down rows gives other logits
    ids = prompt_ids(bundle)
    runtime = engines["c_runtime"]
    plain = RuntimeEngine(bundle_matrix[PLAIN[name]], EngineOptions.of(bundle, dense=True, threads=1))
    runtime.reset()
    assert float(np.abs(runtime.prefill(ids) - plain.prefill(ids)).max()) > 1e-3


@pytest.mark.parametrize("engine_name", ["c_runtime", "torch_cpu"])
@pytest.mark.parametrize("name", BUNDLES)
def test_sparse_decode_follows_the_reference_at_the_default_level_up_to_near_ties(bundle_matrix, name, engine_name):
    bundle = bundle_matrix[name]
    options = EngineOptions.of(bundle, threads=1)
    engine = RuntimeEngine(bundle, options) if engine_name == "c_runtime" else load_torch_cpu_engine(bundle, options)
    assert_follow_the_reference_up_to_near_ties(bundle, engine)


def test_c_runtime_is_bit_identical_for_any_thread_count(bundle_matrix):
    bundle = bundle_matrix[ASYMMETRIC]
    ids = prompt_ids(bundle)
    one = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=1)), ids)[1]
    for threads in (2, 3):
        found = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=threads)), ids)[1]
        assert all(np.array_equal(a, b) for a, b in zip(one, found, strict=True)), threads


def test_the_ascend_path_dequantizes_the_int8_down_rows(bundle_matrix):
    """The gather engine (on the CPU here, the same code as on an NPU) reads each FFN's down rows as int8 codes and
    follows the reference."""
    bundle = bundle_matrix[ASYMMETRIC]
    engine = load_gather_engine(bundle, EngineOptions.of(bundle), device="cpu")
    assert engine.quant_path == DEQUANTIZE
    for ffn in engine.model.ffns:
        assert isinstance(ffn.quantized.down, DequantizingMatrix) and ffn.quantized.down.mins is None
        assert ffn.quantized.gate.mins is not None
    matrix = quantized_matrix(bundle, down(1))
    rows = torch.tensor([5, 0, bundle.config.intermediate_size - 1])
    expected = quant.dequantize(matrix)[rows.numpy()]
    assert torch.equal(engine.model.ffns[1].quantized.down.rows(rows).float(), torch.from_numpy(expected))
    ids = Tokenizer.from_bundle(bundle).encode("def main():")
    reference = load_reference_decoder(bundle)
    expected_logits = reference.prefill(torch.tensor([ids]))[0, -1].numpy()
    found = engine.prefill(ids)
    assert float(np.abs(found - expected_logits).max()) <= LOGIT_TOLERANCE * float(np.abs(expected_logits).max())


@pytest.mark.parametrize(
    ("dtype", "down_dtype"), [("int8", "int4"), ("int8", "int8x"), ("fp16", "int8"), ("fp32", "int4"), ("bf16", "int8")]
)
def test_export_refuses_a_down_dtype_other_than_int8_with_int4(tiny_model_dir, tmp_path, dtype, down_dtype):
    """Only int8 down rows in an int4 bundle (or the bundle's own dtype, the default): one line naming the option and
    what is allowed, exit status 2, nothing written; the Python API raises ExportError with the same words."""
    out = tmp_path / "bundle"
    settings = ExportSettings(dtype=dtype, down_dtype=down_dtype)
    with pytest.raises(ExportError, match=f"--down-dtype {down_dtype} is not allowed .* int8 with --dtype int4"):
        export_bundle(tiny_model_dir, out, settings)
    assert not out.exists()
    if down_dtype not in ("int8", "int4"):
        return  # click refuses a value outside its choices: test_the_cli_names_the_down_dtypes_it_takes
    args = ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", "--dtype", dtype]
    result = CliRunner().invoke(main, [*args, "--down-dtype", down_dtype])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert f"--down-dtype {down_dtype} is not allowed with --dtype {dtype}" in message
    assert "int8 with --dtype int4" in message
    assert not out.exists()


def test_the_cli_names_the_down_dtypes_it_takes(tiny_model_dir, tmp_path):
    args = ["export", str(tiny_model_dir), "-o", str(tmp_path / "b"), "--predictor", "none", "--dtype", "int4"]
    result = CliRunner().invoke(main, [*args, "--down-dtype", "fp16"])
    assert result.exit_code == 2 and "'--down-dtype'" in result.output and "int8" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("source", "change", "message"),
    [
        # a version 6 reader does not know down_dtype: it expects int4 down rows, and says the I8 ones are not them
        (SYMMETRIC, lambda m: m.update(format_version=6), r"tensor '.*down_proj.*' is declared I8 .*, .* needs U8"),
        (SYMMETRIC, lambda m: m.pop("down_dtype"), r"tensor '.*down_proj.*' is declared I8 .*, .* needs U8"),
        (SYMMETRIC, lambda m: m.update(down_dtype="int4"), r"field 'down_dtype' must be one of int8, found 'int4'"),
        (SYMMETRIC, lambda m: m.update(down_dtype=8), r"field 'down_dtype' must be .*, found 8"),
        # an asymmetric reader of the int4 down rows would expect their minimums
        (ASYMMETRIC, lambda m: m.pop("down_dtype"), r"tensor '.*down_proj.*' is declared I8 .*, .* needs U8"),
        ("svd-int4", lambda m: m.update(format_version=7, down_dtype="int8"), r"'.*down_proj.*' is declared U8"),
        ("svd-int8", lambda m: m.update(format_version=7, down_dtype="int8"), r"null or absent for dtype int8"),
    ],
)
def test_a_manifest_that_contradicts_its_down_rows_is_refused(bundle_matrix, tmp_path, source, change, message):
    copy = tmp_path / "bundle"
    restamped_copy(bundle_matrix.path(source), copy, change)
    with pytest.raises(BundleError, match=message):
        Bundle.open(copy)


def test_a_null_down_dtype_reads_as_the_plain_int4_bundle(bundle_matrix, tmp_path):
    copy = tmp_path / "bundle"
    restamped_copy(bundle_matrix.path("svd-int4"), copy, lambda m: m.update(format_version=7, down_dtype=None))
    bundle = Bundle.open(copy)
    assert bundle.manifest.down_dtype is None and bundle.manifest.ffn_down_dtype == "int4"
