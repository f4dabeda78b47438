"""TensorRTEngine's buffer handling (KV cache ping-pong, positions, logits, core masks) without TensorRT or a GPU.

TensorRT and cuda-python are replaced by fakes: device memory is a dict of byte arrays, and an "engine" runs the
bundle's graph in ONNX Runtime on the tensors found at the addresses the backend bound. The backend must then
reproduce OrtBundleSession exactly, step by step.
"""

from __future__ import annotations

import itertools
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from edge_sdk.backends.tensorrt import runtime
from edge_sdk.backends.tensorrt.cache import ENGINE_FILES

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


class FakeContext:
    """Reads its inputs at the bound addresses, runs the graph in ONNX Runtime, writes the outputs back."""

    def __init__(self, engine):
        self.engine, self.shapes, self.addresses = engine, {}, {}

    def set_input_shape(self, name, shape) -> bool:
        self.shapes[name] = tuple(shape)
        return name in self.engine.inputs

    def set_tensor_address(self, name, address) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream_handle) -> bool:
        assert stream_handle == FakeStream.handle
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
    def __init__(self, graph_path: str):
        model = onnx.load(graph_path, load_external_data=False)
        self.inputs = {value.name: value for value in model.graph.input}
        self.outputs = {value.name: value for value in model.graph.output}
        self.names = [*self.inputs, *self.outputs]
        self.num_io_tensors = len(self.names)
        self.session = ort.InferenceSession(graph_path, providers=["CPUExecutionProvider"])

    def get_tensor_name(self, index: int) -> str:
        return self.names[index]

    def create_execution_context(self) -> FakeContext:
        return FakeContext(self)


def fake_tensorrt() -> types.SimpleNamespace:
    class Logger:
        WARNING = 2

        def __init__(self, severity):
            pass

    def make_runtime(logger):
        return types.SimpleNamespace(deserialize_cuda_engine=lambda data: FakeEngine(data.decode()))

    return types.SimpleNamespace(Runtime=make_runtime, Logger=Logger)


@pytest.fixture
def fake_backend(monkeypatch, tmp_path):
    """The runtime module wired to the fakes; engine files hold the path of the graph they stand for."""

    def fake_build_engine(bundle):
        for phase, name in ENGINE_FILES.items():
            (tmp_path / name).write_text(str(bundle.graph_path(phase)))
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
    engine = runtime.TensorRTEngine(bundle, EngineOptions(sparsity=0.8 if kind == "svd" else None))
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
    engine = runtime.TensorRTEngine(trt_bundles["svd"], EngineOptions())
    engine.prefill(list(range(60)))
    for token in range(4):
        engine.decode(token)
    with pytest.raises(runtime.EngineRunError, match="65 tokens exceeds the bundle's max_seq_len 64"):
        engine.decode(1)
    with pytest.raises(runtime.EngineRunError, match="decode called before prefill"):
        runtime.TensorRTEngine(trt_bundles["svd"], EngineOptions()).decode(1)
