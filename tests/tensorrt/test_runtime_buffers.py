"""TensorRTEngine's buffer handling (KV cache ping-pong, positions, logits, core masks) without TensorRT or a GPU.

TensorRT and cuda-python are replaced by fakes: device memory is a dict of byte arrays, and an "engine" runs the
bundle's decode.onnx in ONNX Runtime on the tensors found at the addresses the backend bound, refusing, as TensorRT
does, an input shape outside the optimization profile its context selected. The backend runs prompts and decode
steps through that one graph (the prefill and decode profiles of one engine) and must reproduce OrtBundleSession,
which runs prefill.onnx and decode.onnx, exactly, step by step.
"""

from __future__ import annotations

import itertools
import json
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from edge_sdk.backends.tensorrt import runtime
from edge_sdk.backends.tensorrt.cache import ENGINE_FILE
from edge_sdk.backends.tensorrt.profiles import ENGINE_GRAPH, PROFILES, profile_shapes

from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.runtime.backends import EngineOptions

MEMORY: dict[int, bytearray] = {}
_addresses = itertools.count(1 << 20, 1 << 20)


class FakeDeviceBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.address = next(_addresses)
        MEMORY[self.address] = bytearray(max(nbytes, 1))

    def upload(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).tobytes()
        assert len(data) <= self.nbytes
        MEMORY[self.address][: len(data)] = data

    def download(self, shape, dtype) -> np.ndarray:
        count = int(np.prod(shape))
        return np.frombuffer(bytes(MEMORY[self.address]), dtype=dtype, count=count).reshape(shape).copy()

    def free(self) -> None:
        del MEMORY[self.address]


class FakeStream:
    handle = 7

    def synchronize(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def numpy_type(value: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))


USER_MANAGED = "user-managed"
ACTIVATION_BYTES = {0: 4096, 1: 512}  # per profile, as get_device_memory_size_for_profile_v2 reports them


class FakeContext:
    """Reads its inputs at the bound addresses, runs the graph in ONNX Runtime, writes the outputs back."""

    def __init__(self, engine, strategy):
        assert strategy == USER_MANAGED  # the backend supplies the activation memory both contexts share
        self.engine, self.shapes, self.addresses = engine, {}, {}
        self.profile = 0  # TensorRT assigns a new context profile 0
        self.device_memory = None

    def set_device_memory(self, address, size) -> None:
        assert size == max(ACTIVATION_BYTES.values()) and len(MEMORY[address]) >= size
        self.device_memory = address

    def set_optimization_profile_async(self, index, stream_handle) -> bool:
        assert stream_handle == FakeStream.handle
        self.profile = index
        return 0 <= index < len(self.engine.profiles)

    def set_input_shape(self, name, shape) -> bool:
        bounds = self.engine.profiles[self.profile].get(name)
        if bounds is None or not all(low <= n <= high for low, high, n in zip(*bounds, shape, strict=True)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, address) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream_handle) -> bool:
        assert stream_handle == FakeStream.handle and self.device_memory is not None
        feed = {}
        for name, value in self.engine.inputs.items():
            shape = self.shapes.get(name, ())  # scalars have a static shape and are never set
            count = int(np.prod(shape))
            buffer = bytes(MEMORY[self.addresses[name]])
            feed[name] = np.frombuffer(buffer, dtype=numpy_type(value), count=count).reshape(shape)
        outputs = self.engine.session.run(list(self.engine.outputs), feed)
        for name, array in zip(self.engine.outputs, outputs, strict=True):
            data = np.ascontiguousarray(array).tobytes()
            assert len(data) <= len(MEMORY[self.addresses[name]]), f"{name} overflows its buffer"
            MEMORY[self.addresses[name]][: len(data)] = data
        return True


class FakeEngine:
    """The engine file holds the graph's path and each profile's {input: (min, max)}."""

    def __init__(self, plan: str):
        record = json.loads(plan)
        graph_path = record["graph"]
        self.profiles = record["profiles"]
        model = onnx.load(graph_path, load_external_data=False)
        self.inputs = {value.name: value for value in model.graph.input}
        self.outputs = {value.name: value for value in model.graph.output}
        self.names = [*self.inputs, *self.outputs]
        self.num_io_tensors = len(self.names)
        self.session = ort.InferenceSession(graph_path, providers=["CPUExecutionProvider"])

    def get_tensor_name(self, index: int) -> str:
        return self.names[index]

    def get_device_memory_size_for_profile_v2(self, index: int) -> int:
        return ACTIVATION_BYTES[index]

    def create_execution_context(self, strategy) -> FakeContext:
        return FakeContext(self, strategy)


def fake_tensorrt() -> types.SimpleNamespace:
    class Logger:
        WARNING = 2

        def __init__(self, severity):
            pass

    def make_runtime(logger):
        return types.SimpleNamespace(deserialize_cuda_engine=lambda plan: FakeEngine(bytes(plan).decode()))

    strategies = types.SimpleNamespace(USER_MANAGED=USER_MANAGED)
    return types.SimpleNamespace(Runtime=make_runtime, Logger=Logger, ExecutionContextAllocationStrategy=strategies)


@pytest.fixture
def fake_backend(monkeypatch, tmp_path):
    """The runtime module wired to the fakes; the engine file holds the graph and the profiles it was built with."""

    def fake_build_engine(bundle):
        profiles = []
        for profile in PROFILES:
            shapes = profile_shapes(bundle.config, bundle.max_seq_len, profile, bundle.sparsity.predictor)
            profiles.append({name: (shape.min, shape.max) for name, shape in shapes.items()})
        plan = {"graph": str(bundle.graph_path(ENGINE_GRAPH)), "profiles": profiles}
        (tmp_path / ENGINE_FILE).write_text(json.dumps(plan))
        return tmp_path

    monkeypatch.setattr(runtime, "import_tensorrt", fake_tensorrt)
    monkeypatch.setattr(runtime, "build_engine", fake_build_engine)
    monkeypatch.setattr(runtime, "load_plugin_library", lambda trt: None)
    monkeypatch.setattr(runtime, "current_key", lambda trt, bundle: None)
    monkeypatch.setattr(runtime.cuda, "DeviceBuffer", FakeDeviceBuffer)
    monkeypatch.setattr(runtime.cuda, "Stream", FakeStream)
    yield
    MEMORY.clear()


@pytest.mark.parametrize("kind", ["svd", "core"])
def test_backend_steps_reproduce_onnx_runtime(fake_backend, trt_bundles, kind):
    bundle = trt_bundles[kind]
    engine = runtime.TensorRTEngine(bundle, EngineOptions.of(bundle, sparsity=0.8 if kind == "svd" else None))
    reference = OrtBundleSession(bundle, level=0.8 if kind == "svd" else None)
    ids = [5, 17, 300, 42, 7, 99, 1000]
    for _ in range(2):  # a second sequence reuses the buffers from the start
        ours, theirs = engine.prefill(ids), reference.prefill(np.array([ids]))[0, -1]
        for _ in range(8):
            np.testing.assert_array_equal(ours, theirs)
            token = int(theirs.argmax())
            ours, theirs = engine.decode(token), reference.decode(np.array([[token]]))[0, -1]
        np.testing.assert_array_equal(ours, theirs)
        assert engine.length == len(ids) + 8
    engine.close()
    assert MEMORY == {}


def test_sequence_longer_than_max_seq_len_is_refused(fake_backend, trt_bundles):
    engine = runtime.TensorRTEngine(trt_bundles["svd"], EngineOptions.of(trt_bundles["svd"]))
    engine.prefill(list(range(60)))
    for token in range(4):
        engine.decode(token)
    with pytest.raises(runtime.EngineRunError, match="65 tokens exceeds the bundle's max_seq_len 64"):
        engine.decode(1)
    with pytest.raises(runtime.EngineRunError, match="decode called before prefill"):
        runtime.TensorRTEngine(trt_bundles["svd"], EngineOptions.of(trt_bundles["svd"])).decode(1)
