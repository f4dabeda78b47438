"""End to end on a device with TensorRT >= 10.3 (its Python package too, for `edge-sdk build`), a libedge_sdk built
with it and the plugin library: the engine built from a bundle, run by libedge_sdk's TensorRT engine, gives ONNX
Runtime's logits (same fp16 weights, fp32 math; for int8 / int4 bundles the same dequantized weights, through the
QuantizedMatMul / QuantizedSparseFFN plugins) and the same greedy tokens, and the cache is reused.
tests/tensorrt/test_engine_buffers.py runs the same path on a fake TensorRT everywhere."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from edge_sdk.backends.tensorrt import BACKEND, build_engine

from edge_sdk.bundle import Bundle
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions

AVAILABLE, REASON = BACKEND.probe()
if AVAILABLE and importlib.util.find_spec("tensorrt") is None:
    AVAILABLE, REASON = False, "the tensorrt Python package, which builds the engine, is not installed"
pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu, pytest.mark.skipif(not AVAILABLE, reason=REASON)]

PROMPT = "def parse_args(self, args=None, namespace=None):\n    "
DECODE_STEPS = 16
# fp32 everywhere (TF32 off), summation orders differ from ONNX Runtime's
LOGITS_TOLERANCE = 1e-3


def assert_engine_matches_onnx_runtime(bundle: Bundle, tiny_model_dir) -> None:
    ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    build_engine(bundle)  # into $EDGE_SDK_ENGINE_CACHE, where the C engine looks
    engine = BACKEND.load(bundle, EngineOptions.of(bundle))
    reference = OrtBundleSession(bundle)
    try:
        ours, theirs = engine.prefill(ids), reference.prefill(np.array([ids]))[0, -1]
        for _ in range(DECODE_STEPS):
            assert np.abs(ours - theirs).max() <= LOGITS_TOLERANCE
            token = int(theirs.argmax())
            assert int(ours.argmax()) == token
            ours, theirs = engine.decode(token), reference.decode(np.array([[token]]))[0, -1]
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["svd", "core"])
def test_engine_matches_onnx_runtime(trt_bundles, tiny_model_dir, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path))
    assert_engine_matches_onnx_runtime(Bundle.open(trt_bundles[kind]), tiny_model_dir)


@pytest.mark.parametrize("name", ["svd-int8", "svd-int4"])
def test_quantized_engine_matches_onnx_runtime(bundle_matrix, tiny_model_dir, tmp_path, monkeypatch, name):
    """The int8 / int4 engine: every quantized product in the plugins, prompt (QuantizedMatMul, both layouts) and
    decode steps (QuantizedSparseFFN), against ONNX Runtime's reference functions on the same bundle."""
    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path))
    assert_engine_matches_onnx_runtime(Bundle.open(bundle_matrix.path(name)), tiny_model_dir)


def test_engine_cache_is_reused(trt_bundles, tmp_path):
    first = build_engine(trt_bundles["svd"], cache_dir=tmp_path)
    stamps = {path.name: path.stat().st_mtime_ns for path in first.glob("*.engine")}
    assert build_engine(trt_bundles["svd"], cache_dir=tmp_path) == first
    assert {path.name: path.stat().st_mtime_ns for path in first.glob("*.engine")} == stamps
    rebuilt = build_engine(trt_bundles["svd"], cache_dir=tmp_path, force=True)
    assert rebuilt == first and any(path.stat().st_mtime_ns != stamps[path.name] for path in rebuilt.glob("*.engine"))
