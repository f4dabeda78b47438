"""int8 / int4 bundles of the tiny model (and of its tied variant, whose one embedding matrix is also the LM head and
stored quantized): the stored format, and one greedy continuation from every CPU engine.

The reference is the float32 decoder on the dequantized weights (load_reference_decoder); the C runtime and the
CPU torch engine read the codes and scales in place through the quantized kernels, which take x as two int8 planes
(QUANT.md: about 2e-5 of max |y| per product). Dense, that is all the logits differ by. At a sparsity level a mask
decision that close to its boundary may go the other way, a jump the KV cache keeps: such a step must be
reproduced by the reference with that one decision inverted (edge_sdk/export/verify.py, the same check verify
makes of ONNX Runtime), with the integer path's margin QUANTIZED_TIE_TOLERANCE.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from edge_sdk.backends.c_runtime import RuntimeEngine
from edge_sdk.backends.cpu.torch_engine import load_torch_cpu_engine

from edge_sdk import quant
from edge_sdk.bundle import Bundle, BundleError, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.export.verify import explain_by_a_near_tie
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import TorchEngine, configure, load_reference_decoder, quantized_matrix

UNTIED = ("svd-int8", "svd-int4")
TIED = ("tied-svd-int8", "tied-svd-int4")
QUANTIZED = UNTIED + TIED
CODE_DTYPES = {"int8": "I8", "int4": "U8"}
STEPS = 24
# logits of the whole decoder: the per-product bound of QUANT.md carried through 4 layers, on logits of size ~10
LOGIT_TOLERANCE = 2e-3
# x_hat's error is up to 2^-15 of its block's max (QUANT.md); a decision's value moves by that share of the sum of
# its absolute terms, and a little more through the layers before it
QUANTIZED_TIE_TOLERANCE = 1e-4


def prompt_ids(bundle) -> list[int]:
    return Tokenizer.from_bundle(bundle).encode("def parse_config(path):\n    with open(path) as handle:")


def greedy(engine, ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
    logits = engine.prefill(ids)
    out, seen = [], [logits]
    for _ in range(STEPS):
        token = int(np.argmax(logits))
        out.append(token)
        logits = engine.decode(token)
        seen.append(logits)
    return out, seen


@pytest.mark.parametrize("name", QUANTIZED)
def test_stored_matrices_are_the_quant_format(bundle_matrix, name):
    bundle = bundle_matrix[name]
    fmt = name.split("-")[-1]
    tied = name in TIED
    assert bundle.dtype == fmt and bundle.manifest.group_size == 32
    # an untied embedding is a row lookup and stays F16; a tied one is the LM head, stored once, quantized, in the
    # layout of format version 3; svd bundles store F16 predictor factors, format version 5 (every other bundle keeps
    # version 2, its bytes unchanged)
    assert bundle.header.tensors["embed_tokens.weight"].dtype == (CODE_DTYPES[fmt] if tied else "F16")
    assert bundle.has_tensor("lm_head.weight") is not tied
    svd = bundle.sparsity.predictor == "svd"
    assert bundle.manifest.format_version == (5 if svd else 3 if tied else 2)
    head = "embed_tokens.weight" if tied else "lm_head.weight"
    for tensor in ("layers.1.mlp.down_proj.weight_t", "layers.2.self_attn.o_proj.weight", head):
        matrix = quantized_matrix(bundle, tensor)
        weights = quant.dequantize(matrix)
        # requantizing the dequantized matrix gives back the same codes and scales: the stored bytes are the format
        again = quant.quantize(weights, fmt, 32)
        assert np.array_equal(again.data, matrix.data) and np.array_equal(again.scales, matrix.scales)
    # one neuron's down row is one contiguous row of codes: d values in d bytes (int8) or d / 2 (int4)
    down = bundle.header.tensors["layers.0.mlp.down_proj.weight_t"]
    assert down.shape == (768, 192 if fmt == "int8" else 96)


@pytest.mark.parametrize("name", QUANTIZED)
def test_c_runtime_and_torch_engine_match_the_dequantized_reference_dense(bundle_matrix, name):
    bundle = bundle_matrix[name]
    ids = prompt_ids(bundle)
    choice = bundle.sparsity.resolve(None, True)
    reference, reference_logits = greedy(TorchEngine.load(bundle, choice), ids)
    runtime, runtime_logits = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, dense=True, threads=1)), ids)
    torch_cpu, torch_logits = greedy(
        load_torch_cpu_engine(bundle, EngineOptions.of(bundle, dense=True, threads=1)), ids
    )
    assert runtime == reference
    assert torch_cpu == reference
    scale = max(float(np.abs(step).max()) for step in reference_logits)
    for ours in (runtime_logits, torch_logits):
        worst = max(float(np.abs(a - b).max()) for a, b in zip(ours, reference_logits, strict=True))
        assert worst <= LOGIT_TOLERANCE * scale


def _engines(bundle):
    options = EngineOptions.of(bundle, threads=1)
    return {"c_runtime": RuntimeEngine(bundle, options), "torch_cpu": load_torch_cpu_engine(bundle, options)}


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("engine_name", ["c_runtime", "torch_cpu"])
def test_engines_follow_the_reference_at_the_default_level_up_to_near_ties(bundle_matrix, name, engine_name):
    bundle = bundle_matrix[name]
    assert_follow_the_reference_up_to_near_ties(bundle, _engines(bundle)[engine_name])


def assert_follow_the_reference_up_to_near_ties(bundle, engine) -> None:
    """At the bundle's default level, teacher-forced on the reference's greedy tokens: every step within
    LOGIT_TOLERANCE, or explained by one mask decision within QUANTIZED_TIE_TOLERANCE of its boundary, after which the
    reference takes it as the engine did."""
    ids = prompt_ids(bundle)
    reference = load_reference_decoder(bundle)
    configure(reference, bundle.sparsity.resolve(None, False))
    for ffn in reference.ffns:
        ffn.tie_tolerance = QUANTIZED_TIE_TOLERANCE
    expected = reference.prefill(torch.tensor([ids]))[0, -1]
    found = engine.prefill(ids).reshape(-1)
    tolerance = LOGIT_TOLERANCE * float(expected.abs().max())
    assert float(np.abs(found - expected.numpy()).max()) <= tolerance
    for step in range(STEPS):
        token = int(expected.argmax())
        assert int(np.argmax(found)) == token, f"step {step}: greedy tokens differ"
        expected = reference.decode(torch.tensor([[token]]))[0, -1]
        found = engine.decode(token).reshape(-1)
        if float(np.abs(found - expected.numpy()).max()) > tolerance:
            tie = explain_by_a_near_tie(reference, token, torch.from_numpy(found), tolerance)
            assert tie is not None, f"step {step}: logits differ beyond {tolerance:.3g} and no near-tie explains it"
            expected = tie[-1]


def test_int4_continuation_differs_from_int8(bundle_matrix):
    """The two formats are different weights: identical logits would mean one of them was not read as stored."""
    logits = {}
    for name in UNTIED:
        bundle = bundle_matrix[name]
        engine = RuntimeEngine(bundle, EngineOptions.of(bundle, dense=True, threads=1))
        logits[name] = engine.prefill(prompt_ids(bundle))
    assert float(np.abs(logits["svd-int8"] - logits["svd-int4"]).max()) > 1e-3


def test_c_runtime_is_bit_identical_for_any_thread_count(bundle_matrix):
    bundle = bundle_matrix["svd-int4"]
    ids = prompt_ids(bundle)
    one = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=1)), ids)[1]
    two = greedy(RuntimeEngine(bundle, EngineOptions.of(bundle, threads=2)), ids)[1]
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))


def held_out_ids(bundle, tiny_model_dir, count: int = 48) -> list[int]:
    text = (tiny_model_dir / "held_out.txt").read_text()[:2000]
    return Tokenizer.from_bundle(bundle).encode(text)[:count]


class OrtSteps:
    """An engine's prefill(ids) / decode(id) / reset() over an OrtBundleSession (batch 1, last position's logits)."""

    def __init__(self, session: OrtBundleSession):
        self.session = session

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.session.prefill(np.array([ids]))[0, -1]

    def decode(self, token: int) -> np.ndarray:
        return self.session.decode(np.array([[token]]))[0, -1]

    def reset(self) -> None:
        self.session.reset()


def dense_engines(bundle) -> dict:
    """The C runtime, the CPU torch engine and ONNX Runtime (prefill.onnx and decode.onnx, unmodified) on the bundle,
    dense, one thread, each with prefill(ids) / decode(id) / reset()."""
    options = EngineOptions.of(bundle, dense=True, threads=1)
    return {
        "c_runtime": RuntimeEngine(bundle, options),
        "torch_cpu": load_torch_cpu_engine(bundle, options),
        "onnx_runtime": OrtSteps(OrtBundleSession(bundle, None, True)),
    }


def assert_follow_the_reference_teacher_forced(bundle, engines: dict, ids: list[int]) -> None:
    """Teacher-forced on ids (prefill of the first 4, then a decode step per token), every engine gives the
    reference's logits (the matrices dequantized, then float32) within LOGIT_TOLERANCE and its argmax at every step;
    the reference must predict at least 20 distinct tokens, so that many rows of the head are compared."""
    reference = load_reference_decoder(bundle)
    configure(reference, bundle.sparsity.resolve(None, True))
    expected = [reference.prefill(torch.tensor([ids[:4]]))[0, -1].numpy()]
    expected += [reference.decode(torch.tensor([[token]]))[0, -1].numpy() for token in ids[4:]]
    assert len({int(np.argmax(step)) for step in expected}) >= 20  # many distinct predictions, not one repeated
    scale = max(float(np.abs(step).max()) for step in expected)
    for name, engine in engines.items():
        engine.reset()
        found = [np.asarray(engine.prefill(ids[:4])).reshape(-1)]
        found += [np.asarray(engine.decode(token)).reshape(-1) for token in ids[4:]]
        worst = max(float(np.abs(a - b).max()) for a, b in zip(found, expected, strict=True))
        assert worst <= LOGIT_TOLERANCE * scale, f"{name}: logits differ by {worst:.3g}"
        assert [int(np.argmax(step)) for step in found] == [int(np.argmax(step)) for step in expected], name


def assert_dense_engines_follow_the_reference(bundle, held_out: list[int]) -> dict:
    """dense_engines(bundle) give the reference's greedy ids (the CPU torch reference engine) on the bundle's prompt,
    and its logits teacher-forced on held_out (assert_follow_the_reference_teacher_forced); returns the engines."""
    engines = dense_engines(bundle)
    ids = prompt_ids(bundle)
    expected_ids, _ = greedy(TorchEngine.load(bundle, bundle.sparsity.resolve(None, True)), ids)
    for name, engine in engines.items():
        engine.reset()
        assert greedy(engine, ids)[0] == expected_ids, name
    assert_follow_the_reference_teacher_forced(bundle, engines, held_out)
    return engines


@pytest.mark.parametrize("name", TIED)
def test_tied_lookup_and_head_follow_the_reference_on_held_out_text(bundle_matrix, tiny_model_dir, name):
    """The tied matrix is every input token's lookup and the LM head. Teacher-forced on held-out text, so that many
    distinct rows are looked up (a greedy continuation of this derived model repeats one token), the C runtime, the
    CPU torch engine and ONNX Runtime (decode.onnx, whose lookup unpacks the codes from INT32 words) give the logits
    of the reference (the matrix dequantized, then float32) within LOGIT_TOLERANCE, dense."""
    bundle = bundle_matrix[name]
    assert_follow_the_reference_teacher_forced(bundle, dense_engines(bundle), held_out_ids(bundle, tiny_model_dir))


@pytest.mark.parametrize("version", [1, 2])
def test_a_tied_quantized_bundle_of_an_older_format_version_is_refused(bundle_matrix, tmp_path, version):
    """Before format version 3 an int8 / int4 bundle of a tied model stored the embedding F16: refused with a request
    to re-export, never misread as codes."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_matrix.path("tied-svd-int8"), copy)
    manifest = json.loads((copy / "manifest.json").read_text()) | {"format_version": version}
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    with pytest.raises(BundleError, match=rf"format version {version} of a model with tied embeddings .*re-export"):
        Bundle.open(copy)
