"""int8 / int4 bundles of the tiny model: the stored format, and one greedy continuation from every CPU engine.

The reference is the float32 decoder on the dequantized weights (load_reference_decoder); the C runtime and the
CPU torch engine read the codes and scales in place through the quantized kernels, whose results differ from the
reference only by float32 rounding in another order (QUANT.md: |y - y_ref| <= 1e-5 max |y_ref| per product).
"""

from __future__ import annotations

import numpy as np
import pytest
from edge_sdk.backends.cpu.runtime import RuntimeEngine
from edge_sdk.backends.cpu.torch_engine import load_torch_cpu_engine

from edge_sdk import quant
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import TorchEngine, quantized_matrix

QUANTIZED = ("svd-int8", "svd-int4")
STEPS = 24
# logits of the whole decoder: the per-product bound of QUANT.md carried through 4 layers, on logits of size ~10
LOGIT_TOLERANCE = 2e-3


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
    fmt = name.split("-")[1]
    assert bundle.dtype == fmt and bundle.manifest.group_size == 32
    assert bundle.header.tensors["embed_tokens.weight"].dtype == "F16"
    for tensor in ("layers.1.mlp.down_proj.weight_t", "layers.2.self_attn.o_proj.weight", "lm_head.weight"):
        matrix = quantized_matrix(bundle, tensor)
        weights = quant.dequantize(matrix)
        # requantizing the dequantized matrix gives back the same codes and scales: the stored bytes are the format
        again = quant.quantize(weights, fmt, 32)
        assert np.array_equal(again.data, matrix.data) and np.array_equal(again.scales, matrix.scales)
    # one neuron's down row is one contiguous row of codes: d values in d bytes (int8) or d / 2 (int4)
    down = bundle.header.tensors["layers.0.mlp.down_proj.weight_t"]
    assert down.shape == (768, 192 if fmt == "int8" else 96)


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "default-level"])
def test_c_runtime_and_torch_engine_match_the_dequantized_reference(bundle_matrix, name, dense):
    bundle = bundle_matrix[name]
    ids = prompt_ids(bundle)
    choice = bundle.sparsity.resolve(None, dense)
    reference, reference_logits = greedy(TorchEngine.load(bundle, choice), ids)
    runtime, runtime_logits = greedy(RuntimeEngine(bundle, EngineOptions(dense=dense, threads=1)), ids)
    torch_cpu, torch_logits = greedy(load_torch_cpu_engine(bundle, EngineOptions(dense=dense, threads=1)), ids)
    assert runtime == reference
    assert torch_cpu == reference
    scale = max(float(np.abs(step).max()) for step in reference_logits)
    for ours in (runtime_logits, torch_logits):
        worst = max(float(np.abs(a - b).max()) for a, b in zip(ours, reference_logits, strict=True))
        assert worst <= LOGIT_TOLERANCE * scale


def test_int4_continuation_differs_from_int8(bundle_matrix):
    """The two formats are different weights: identical logits would mean one of them was not read as stored."""
    logits = {}
    for name in QUANTIZED:
        bundle = bundle_matrix[name]
        engine = RuntimeEngine(bundle, EngineOptions(dense=True, threads=1))
        logits[name] = engine.prefill(prompt_ids(bundle))
    assert float(np.abs(logits["svd-int8"] - logits["svd-int4"]).max()) > 1e-3


def test_c_runtime_is_bit_identical_for_any_thread_count(bundle_matrix):
    bundle = bundle_matrix["svd-int4"]
    ids = prompt_ids(bundle)
    one = greedy(RuntimeEngine(bundle, EngineOptions(threads=1)), ids)[1]
    two = greedy(RuntimeEngine(bundle, EngineOptions(threads=2)), ids)[1]
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
