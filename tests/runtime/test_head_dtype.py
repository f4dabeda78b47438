"""int4 bundles with an int8 LM head (export --head-dtype int8; bundle format version 4), of the tiny model and of its
tied variant, whose one embedding matrix is the head and the lookup: the stored layout, every engine on it, its
quality between plain int4 and int8, and the refusals of everything else."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from edge_sdk.backends.c_runtime import RuntimeEngine
from edge_sdk.backends.tensorrt import compatibility

from edge_sdk.bundle import Bundle, BundleError, manifest_digest
from edge_sdk.bundle.format import FORMAT_VERSION, MANIFEST_DIGEST_FIELD
from edge_sdk.bundle.layout import is_predictor_tensor
from edge_sdk.cli import main
from edge_sdk.eval.evaluate import evaluate_bundle
from edge_sdk.export.exporter import ExportError, ExportSettings, export_bundle
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import quantized_matrix

from .test_quantized_bundles import (
    assert_dense_engines_follow_the_reference,
    held_out_ids,
    prompt_ids,
)

VARIANTS = ("", "tied-")  # the tiny model, and its tied variant (tests/conftest.py tied_checkpoint)
# about a thousand tokens: the fixture's int4 / int8 gap is a few tenths of a percent, which 320 tokens do not order
# (untied: int4 31.15, int8 head 30.98, int8 31.21; at 1024 tokens 45.01 > 44.90 > 44.85, at 4096 42.43 > 42.09 > 41.89)
WINDOW = {"max_tokens": 1024, "context": 64, "prompt_tokens": 8, "threads": 1}


def head_of(bundle) -> str:
    return "embed_tokens.weight" if bundle.config.tie_word_embeddings else "lm_head.weight"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_head_is_int8_and_every_other_tensor_is_the_plain_int4_bundles(bundle_matrix, variant):
    bundle = bundle_matrix[f"{variant}svd-int4-head-int8"]
    plain, int8 = bundle_matrix[f"{variant}svd-int4"], bundle_matrix[f"{variant}svd-int8"]
    head = head_of(bundle)
    config = bundle.config
    assert bundle.manifest.raw["head_dtype"] == "int8" and bundle.manifest.head_dtype == "int8"
    # version 5, not 4: its svd factors are F16 (bundle format 5), as in the plain int4 bundles
    assert bundle.manifest.format_version == 5 and bundle.dtype == "int4"
    # the field is written only where the head differs
    assert "head_dtype" not in plain.manifest.raw and plain.manifest.format_version == 5
    assert bundle.header.tensors[head].dtype == "I8"
    assert bundle.header.tensors[head].shape == (config.vocab_size, config.hidden_size)
    assert bundle.header.tensors[head + ".scales"].dtype == "F16"
    assert bundle.header.tensors[head + ".scales"].shape == (config.vocab_size, config.hidden_size // 32)
    # the head's codes and scales are those of the int8 bundle's head: the same matrix in int8 groups of 32
    ours, theirs = quantized_matrix(bundle, head), quantized_matrix(int8, head)
    assert ours.format == "int8"
    assert np.array_equal(ours.data, theirs.data) and np.array_equal(ours.scales, theirs.scales)
    # every other tensor is declared as in the plain int4 bundle, and holds its bytes: the predictors too where the
    # head is not the lookup (a tied int8 lookup changes the activations the predictors are fitted on)
    others = set(plain.manifest.tensors) - {head, head + ".scales"}
    assert set(bundle.manifest.tensors) - {head, head + ".scales"} == others
    for name in sorted(others):
        assert bundle.manifest.tensors[name] == plain.manifest.tensors[name], name
        if not (variant and is_predictor_tensor(name)):
            assert np.array_equal(bundle.array(name), plain.array(name)), name
    assert plain.header.tensors[head].dtype == "U8"


@pytest.mark.parametrize("variant", VARIANTS)
def test_graphs_read_the_head_as_int8_and_keep_tensorrts_rules(bundle_matrix, variant):
    bundle = bundle_matrix[f"{variant}svd-int4-head-int8"]
    head = head_of(bundle)
    decode = onnx.load(str(bundle.graph_path("decode")), load_external_data=False)
    formats = {}
    for node in decode.graph.node:
        if node.op_type == "QuantizedMatMul":
            attributes = {attribute.name: attribute for attribute in node.attribute}
            formats[node.input[1]] = attributes["weight_format"].s.decode()
    assert formats.pop(head) == "int8"
    assert formats and set(formats.values()) == {"int4"}
    prefill = onnx.load(str(bundle.graph_path("prefill")), load_external_data=False)
    types = {initializer.name: initializer.data_type for initializer in prefill.graph.initializer}
    assert types[head] == onnx.TensorProto.INT8
    assert types["layers.0.self_attn.q_proj.weight"] == onnx.TensorProto.INT4
    # TensorRT 10.3's parser rules hold, and its engine would hold exactly the bundle's bytes (no GPU needed)
    violations, memory = compatibility.check_bundle(bundle)
    assert violations == [] and memory.engine == memory.bundle_weights


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_engine_gives_the_references_greedy_ids_and_held_out_logits(bundle_matrix, tiny_model_dir, variant):
    """Dense, greedy on a prompt and teacher-forced on held-out text (many distinct rows looked up from a tied int8
    matrix): the C runtime, the CPU torch engine and ONNX Runtime (prefill.onnx and decode.onnx, unmodified) give the
    reference's ids and its logits (the matrices dequantized, then float32) within LOGIT_TOLERANCE."""
    bundle = bundle_matrix[f"{variant}svd-int4-head-int8"]
    engines = assert_dense_engines_follow_the_reference(bundle, held_out_ids(bundle, tiny_model_dir))
    ids = prompt_ids(bundle)
    # the head is read as stored: the plain int4 bundle's head gives other logits
    runtime = engines["c_runtime"]
    plain = RuntimeEngine(bundle_matrix[f"{variant}svd-int4"], EngineOptions.of(bundle, dense=True, threads=1))
    runtime.reset()
    assert float(np.abs(runtime.prefill(ids) - plain.prefill(ids)).max()) > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_dense_perplexity_lies_between_plain_int4_and_int8(bundle_matrix, tiny_model_dir, variant):
    """Held-out perplexity (edge-sdk eval's evaluate_bundle, dense, C runtime) of the int8 head is below plain
    int4's and above int8's, whose every matrix is int8."""
    held_out = tiny_model_dir / "held_out.txt"
    perplexity = {
        name: evaluate_bundle(
            bundle_matrix.path(f"{variant}{name}"), [held_out], backend="cpu", layer_stats=False, **WINDOW
        )["dense_perplexity"]
        for name in ("svd-int4", "svd-int4-head-int8", "svd-int8")
    }
    assert perplexity["svd-int4"] > perplexity["svd-int4-head-int8"] > perplexity["svd-int8"], perplexity


@pytest.mark.parametrize(
    ("dtype", "head_dtype"), [("int8", "int4"), ("fp16", "int8"), ("fp32", "int4"), ("bf16", "int8")]
)
def test_export_refuses_a_head_dtype_other_than_int8_with_int4(tiny_model_dir, tmp_path, dtype, head_dtype):
    """Only an int8 head in an int4 bundle (or the bundle's own dtype, the default): one line naming the option and
    what is allowed, exit status 2, nothing written; the Python API raises ExportError with the same words."""
    out = tmp_path / "bundle"
    args = ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", "--dtype", dtype]
    result = CliRunner().invoke(main, [*args, "--head-dtype", head_dtype])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert f"--head-dtype {head_dtype} is not allowed with --dtype {dtype}" in message
    assert "int8 with --dtype int4" in message
    assert not out.exists()
    settings = ExportSettings(dtype=dtype, head_dtype=head_dtype)
    with pytest.raises(ExportError, match=f"--head-dtype {head_dtype} is not allowed .* int8 with --dtype int4"):
        export_bundle(tiny_model_dir, out, settings)
    assert not out.exists()


def test_the_cli_names_the_head_dtypes_it_takes(tiny_model_dir, tmp_path):
    args = ["export", str(tiny_model_dir), "-o", str(tmp_path / "b"), "--predictor", "none", "--dtype", "int4"]
    result = CliRunner().invoke(main, [*args, "--head-dtype", "fp16"])
    assert result.exit_code == 2 and "'--head-dtype'" in result.output and "int8" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "b").exists()


def restamped_copy(source, directory, change) -> None:
    shutil.copytree(source, directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    change(manifest)
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # a version 3 reader does not know head_dtype: it expects the int4 head, and says the I8 one is not it
        (lambda m: m.update(format_version=3), r"tensor '.*' is declared I8 .*, the model config needs U8"),
        (lambda m: m.pop("head_dtype"), r"tensor '.*' is declared I8 .*, the model config needs U8"),
        (lambda m: m.update(head_dtype="int4"), r"field 'head_dtype' must be one of int8, found 'int4'"),
        (lambda m: m.update(head_dtype="fp16"), r"field 'head_dtype' must be one of int8, found 'fp16'"),
        (
            lambda m: m.update(format_version=FORMAT_VERSION + 1),
            rf"format version {FORMAT_VERSION + 1} is newer than this edge-sdk supports \({FORMAT_VERSION}\)",
        ),
    ],
)
def test_a_head_dtype_bundle_with_another_version_or_head_dtype_is_refused(bundle_matrix, tmp_path, change, message):
    copy = tmp_path / "bundle"
    restamped_copy(bundle_matrix.path("tied-svd-int4-head-int8"), copy, change)
    with pytest.raises(BundleError, match=message):
        Bundle.open(copy)


def test_older_and_plain_bundles_still_read_with_version_4_readers(bundle_matrix, tmp_path):
    """head_dtype null reads as absent; head_dtype is a field of version 4 on, in an int4 bundle only. (A plain int4
    svd bundle is version 5 for its F16 factors, which versions 2 to 4 store F32: tests/runtime/
    test_half_predictor_factors.py.)"""
    copy = tmp_path / "v5"
    restamped_copy(bundle_matrix.path("svd-int4"), copy, lambda m: m.update(format_version=5, head_dtype=None))
    assert Bundle.open(copy).manifest.head_dtype is None
    copy = tmp_path / "int8"
    restamped_copy(bundle_matrix.path("svd-int8"), copy, lambda m: m.update(format_version=4, head_dtype="int8"))
    with pytest.raises(BundleError, match=r"field 'head_dtype' must be null or absent for dtype int8"):
        Bundle.open(copy)
