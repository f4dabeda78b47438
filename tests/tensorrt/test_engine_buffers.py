"""The TensorRT backend end to end on a fake TensorRT: `edge-sdk build`'s build_engine writes the engine where
libedge_sdk's TensorRT engine (jetson/src/trt_engine.cpp) finds it, and the backend runs it through the C runtime's
ctypes wrapper, with the engine's buffer handling checked step by step.

The fake (fake_engine.py) is libnvinfer and libcudart in one library: device memory is host memory, each allocation
recorded; its "engine" runs the bundle's decode.onnx in ONNX Runtime on the tensors at the addresses the C engine
bound, refusing, as TensorRT does, a shape outside the profile the context selected. One graph runs prompts (profile
0) and decode steps (profile 1) and must reproduce OrtBundleSession, which runs prefill.onnx and decode.onnx, exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from edge_sdk.backends.tensorrt import BACKEND, build_engine

from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions

from .fake_engine import ACTIVATION_BYTES, USER_MANAGED

IDS = [5, 17, 300, 42, 7, 99, 1000]
DECODE_STEPS = 8


def live_memory(report: dict) -> tuple[int, int, int]:
    return report["device_allocations"], report["host_allocations"], report["streams"]


@pytest.mark.parametrize("kind", ["svd", "core"])
def test_engine_steps_reproduce_onnx_runtime(fake_trt, trt_bundles, kind):
    bundle = trt_bundles[kind]
    level = 0.8 if kind == "svd" else None
    build_engine(bundle)
    before = fake_trt.report()
    engine = BACKEND.load(bundle, EngineOptions.of(bundle, level))
    assert engine.backend == "tensorrt"
    reference = OrtBundleSession(bundle, level=level)
    loaded = fake_trt.report()
    calls = []
    for _ in range(2):  # a second sequence reuses the buffers from the start
        ours, theirs = engine.prefill(IDS), reference.prefill(np.array([IDS]))[0, -1]
        calls.append(fake_trt.report()["allocation_calls"])
        for _ in range(DECODE_STEPS):
            np.testing.assert_array_equal(ours, theirs)
            token = int(theirs.argmax())
            ours, theirs = engine.decode(token), reference.decode(np.array([[token]]))[0, -1]
        np.testing.assert_array_equal(ours, theirs)
        assert engine.length == len(IDS) + DECODE_STEPS
        calls.append(fake_trt.report()["allocation_calls"])
    # the first prompt grew the logits buffer once (from one row to len(IDS)); nothing else was allocated after
    # loading: no decode step and no second prompt of that length allocates
    assert calls == [loaded["allocation_calls"] + 1] * 4
    report = fake_trt.report()
    contexts = report["context_records"][len(before["context_records"]) :]
    # one execution context per profile, each set to its profile once, both over one block of activation memory
    # of the larger profile's size; prompts ran in the prefill profile, decode steps in the decode profile
    assert [context["strategy"] for context in contexts] == [USER_MANAGED, USER_MANAGED]
    assert [context["profiles_set"] for context in contexts] == [[0], [1]]
    assert contexts[0]["device_memory"] == contexts[1]["device_memory"] != 0
    assert [context["device_memory_size"] for context in contexts] == [max(ACTIVATION_BYTES)] * 2
    assert [context["enqueues"] for context in contexts] == [[2, 0], [0, 2 * DECODE_STEPS]]
    # the plan was mapped from the engine file, not read into the heap
    assert report["plan_mapping"].endswith("/model.engine")
    assert report["memory_errors"] == 0
    engine.close()
    after = fake_trt.report()
    assert live_memory(after) == live_memory(before)
    assert (after["runtimes"], after["engines"], after["contexts"]) == (0, 0, 0)


@pytest.mark.parametrize(
    "name",
    [
        "svd-int8",
        "svd-int4",
        "tied-svd-int4",
        "svd-int4-asym",
        "tied-svd-int4-asym-head-int8",
        "svd-int4-down-int8",
        "tied-svd-int4-asym-head-int8-down-int8",
    ],
)
def test_quantized_engine_steps_reproduce_onnx_runtime(fake_trt, bundle_matrix, name):
    """An int8 / int4 bundle's engine (decode.onnx: every quantized product a QuantizedMatMul / QuantizedSparseFFN
    node, run here by the ops' reference functions; an asymmetric int4 bundle's with the group minimums, and int8 down
    rows under int4 gate and up rows) goes through
    libedge_sdk's TensorRT engine as a float one does: prompt and decode steps give OrtBundleSession's logits
    (prefill.onnx's DequantizeLinear -> Gemm for the prompt) exactly, so the greedy ids are the same."""
    bundle = bundle_matrix[name]
    build_engine(bundle)
    engine = BACKEND.load(bundle, EngineOptions.of(bundle, 0.8))
    reference = OrtBundleSession(bundle, level=0.8)
    try:
        ours, theirs = engine.prefill(IDS), reference.prefill(np.array([IDS]))[0, -1]
        for _ in range(DECODE_STEPS):
            np.testing.assert_array_equal(ours, theirs)
            token = int(theirs.argmax())
            ours, theirs = engine.decode(token), reference.decode(np.array([[token]]))[0, -1]
        np.testing.assert_array_equal(ours, theirs)
    finally:
        engine.close()


def test_only_a_longer_prompt_allocates(fake_trt, trt_bundles):
    bundle = trt_bundles["svd"]
    build_engine(bundle)
    engine = BACKEND.load(bundle, EngineOptions.of(bundle))
    try:
        start = fake_trt.report()["allocation_calls"]
        engine.prefill(IDS[:3])
        grown = fake_trt.report()["allocation_calls"]
        assert grown == start + 1  # logits [1, 3, vocab] outgrow the one row allocated with the session
        for token in range(4):
            engine.decode(token)
        engine.prefill(IDS[:2])
        assert fake_trt.report()["allocation_calls"] == grown
        engine.prefill(IDS)
        assert fake_trt.report()["allocation_calls"] == grown + 1
    finally:
        engine.close()


def test_sequence_longer_than_max_seq_len_is_refused(fake_trt, trt_bundles):
    bundle = trt_bundles["svd"]
    build_engine(bundle)
    engine = BACKEND.load(bundle, EngineOptions.of(bundle))
    try:
        with pytest.raises(EdgeSdkError, match="decode: call edge_session_prefill first"):
            engine.decode(1)
        engine.prefill(list(range(60)))
        for token in range(4):
            engine.decode(token)
        with pytest.raises(EdgeSdkError, match="decode: the sequence fills all 64 positions of the KV cache"):
            engine.decode(1)
        with pytest.raises(EdgeSdkError, match="prefill: 65 tokens do not fit the KV cache of 64 positions"):
            engine.prefill(list(range(65)))
    finally:
        engine.close()


def test_without_an_engine_the_backend_says_to_build_it(fake_trt, trt_bundles):
    from edge_sdk.runtime.backends import select_backend

    bundle = trt_bundles["svd"]
    expected = f"no TensorRT engine cached for this bundle on this device: run `edge-sdk build {bundle.path}` first"
    with pytest.raises(BackendUnavailable, match=expected.replace("(", r"\(")):
        BACKEND.load(bundle, EngineOptions.of(bundle))
    with pytest.raises(BackendUnavailable, match=r"backend 'tensorrt' \(--backend\) is not available here: no Tens"):
        select_backend("tensorrt", bundle)
    selection = select_backend(None, bundle)  # auto: skipped, with the reason, for the next backend that runs it
    assert selection.backend.name != "tensorrt"
    assert selection.skipped[0][0] == "tensorrt" and selection.skipped[0][1].startswith(expected)
    build_engine(bundle)
    selection = select_backend(None, bundle)
    assert selection.backend.name == "tensorrt" and selection.reason.endswith("/model.engine")


def test_engine_of_another_tensorrt_says_to_rebuild(fake_trt, trt_bundles, monkeypatch):
    bundle = trt_bundles["svd"]
    build_engine(bundle)
    monkeypatch.setenv("EDGE_FAKE_TENSORRT_VERSION", "100700")
    with pytest.raises(BackendUnavailable) as refused:
        BACKEND.load(bundle, EngineOptions.of(bundle))
    message = str(refused.value)
    assert "engine built by TensorRT 10.3.0, this is 10.7.0" in message
    assert f"rebuild with `edge-sdk build {bundle.path} --force`" in message


def test_engine_tensorrt_refuses_says_what_it_said_and_how_to_rebuild(fake_trt, trt_bundles):
    bundle = trt_bundles["svd"]
    directory = build_engine(bundle)
    (directory / "model.engine").write_bytes(b"a plan serialized by another TensorRT")
    with pytest.raises(BackendUnavailable) as refused:
        BACKEND.load(bundle, EngineOptions.of(bundle))
    message = str(refused.value)
    assert "model.engine: TensorRT could not load this engine (TensorRT: fake TensorRT: the plan is no fake" in message
    assert "this process has TensorRT 10.3.0, Fake Orin (compute capability 8.7)" in message
    assert message.endswith(f"rebuild it on this device with `edge-sdk build {bundle.path} --force`")


def test_tensorrt_log_goes_to_python_logging_and_the_library_prints_nothing(fake_trt, trt_bundles, caplog, capfd):
    """libedge_sdk never prints (edge_sdk.h): TensorRT's log reaches edge_set_log_callback's receiver, which the
    Python runtime points at the logger edge_sdk.runtime."""
    bundle = trt_bundles["svd"]
    directory = build_engine(bundle)
    (directory / "model.engine").write_bytes(b"a plan serialized by another TensorRT")
    capfd.readouterr()
    with pytest.raises(BackendUnavailable):
        BACKEND.load(bundle, EngineOptions.of(bundle))
    assert capfd.readouterr().err == ""
    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name == "edge_sdk.runtime"]
    assert len(logged) == 1
    assert logged[0][:2] == ("edge_sdk.runtime", "ERROR")
    assert logged[0][2].startswith("TensorRT error: fake TensorRT: the plan is no fake")
