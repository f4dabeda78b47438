"""libedge_sdk's TensorRT engine on a fake TensorRT and CUDA runtime (fake_tensorrt/), and a fake of TensorRT's Python
package for `edge-sdk build`, so the TensorRT backend runs end to end without TensorRT or a GPU.

build_fake_tensorrt compiles fake_tensorrt/fake_tensorrt.cpp into one library that stands in for libnvinfer and
libcudart, and configures jetson/ against its headers and that library (the CMake TensorRT path of a device build),
with an empty libedge_trt_plugins.so next to libedge_sdk.so, where the engine looks for the plugins. FakeTensorRT
drives the fake: its runner runs the graph an "engine" names in ONNX Runtime, reading the inputs from and writing the
outputs to the device memory the engine bound, and refuses an output larger than the allocation it is bound to.
fake_tensorrt_package is TensorRT's Python API as builder.py uses it: the "serialized engine" it builds is the fake's
JSON plan (the parsed graph's tensors and types, the profiles builder.py added, ACTIVATION_BYTES).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import json
import types
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ..jetson.support import build_jetson, require_tools, run

FAKE = Path(__file__).resolve().parent / "fake_tensorrt"
# TensorRT's DataType values (NvInferRuntimeBase.h) of the ONNX element types the graphs use, and their numpy types
DATA_TYPES = {
    onnx.TensorProto.FLOAT: 0,
    onnx.TensorProto.FLOAT16: 1,
    onnx.TensorProto.INT8: 2,
    onnx.TensorProto.INT32: 3,
    onnx.TensorProto.BOOL: 4,
    onnx.TensorProto.UINT8: 5,
    onnx.TensorProto.BFLOAT16: 7,
    onnx.TensorProto.INT64: 8,
}
NUMPY_TYPES = {0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 4: np.bool_, 5: np.uint8, 8: np.int64}
ACTIVATION_BYTES = (4096, 512)  # per profile, what getDeviceMemorySizeForProfileV2 reports
USER_MANAGED = 2  # ExecutionContextAllocationStrategy::kUSER_MANAGED


@dataclass(frozen=True)
class FakeBuild:
    runtime: Path  # libedge_sdk.so with the TensorRT engine, linked against the fake
    fake: Path  # the fake libnvinfer + libcudart
    plugins: Path  # the (empty) plugin library next to runtime


def build_fake_tensorrt(root: Path) -> FakeBuild:
    require_tools(("cmake", "cmake"), ("g++", "g++"))
    fake = root / "libedge_fake_tensorrt.so"
    compiled = run(
        ["g++", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", FAKE / "include",
         FAKE / "fake_tensorrt.cpp", "-lcjson", "-Wl,-soname,libedge_fake_tensorrt.so", "-o", fake],
        timeout=300,
    )  # fmt: skip
    if compiled.returncode != 0 and "cjson/cJSON.h" in compiled.stderr:
        pytest.skip("cJSON headers not found: apt-get install libcjson-dev")
    assert compiled.returncode == 0, compiled.stderr
    include = FAKE / "include"
    build = build_jetson(
        root / "build",
        "-DEDGE_SDK_BUILD_TESTS=OFF",
        f"-DTENSORRT_INCLUDE_DIR={include}",
        f"-DTENSORRT_LIBRARY={fake}",
        f"-DCUDA_RUNTIME_INCLUDE_DIR={include}",
        f"-DCUDA_RUNTIME_LIBRARY={fake}",
    )
    assert "trt_engine.cpp" in build.log, build.log  # CMake took the TensorRT path
    assert "warning" not in build.log.lower(), build.log
    plugins = build.directory / "libedge_trt_plugins.so"
    plugins.write_bytes(b"")
    return FakeBuild(build.directory / "libedge_sdk.so", fake, plugins)


_runner_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)


class FakeTensorRT:
    """The loaded fake: its report, and the runner that executes the engines' graphs in ONNX Runtime."""

    def __init__(self, build: FakeBuild):
        self.library = ctypes.CDLL(str(build.fake))  # the instance libedge_sdk.so links (one file, one soname)
        self.library.edge_fake_set_runner.argtypes = [_runner_type]
        self.library.edge_fake_set_runner.restype = None
        self.library.edge_fake_set_output_shape.argtypes = [
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int64),
        ]
        self.library.edge_fake_set_output_shape.restype = ctypes.c_int
        self.library.edge_fake_device_bytes_from.argtypes = [ctypes.c_uint64]
        self.library.edge_fake_device_bytes_from.restype = ctypes.c_int64
        self.library.edge_fake_report.restype = ctypes.c_char_p
        self.sessions: dict[str, ort.InferenceSession] = {}
        self.failures: list[str] = []
        self._runner = _runner_type(self._run)  # kept alive as long as the library may call it
        self.library.edge_fake_set_runner(self._runner)

    def report(self) -> dict[str, Any]:
        return json.loads(self.library.edge_fake_report())

    def _run(self, request: bytes) -> int:
        try:
            self._execute(json.loads(request))
            return 1
        except Exception as error:  # the fake only sees a failed enqueue; the test reads self.failures
            self.failures.append(f"{type(error).__name__}: {error}")
            return 0

    def _execute(self, request: dict[str, Any]) -> None:
        graph = request["graph"]
        if graph not in self.sessions:
            self.sessions[graph] = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
        session = self.sessions[graph]
        tensors = request["tensors"]
        feed = {}
        for name, tensor in tensors.items():
            if tensor["input"]:
                dtype = np.dtype(NUMPY_TYPES[tensor["type"]])
                shape = tuple(tensor["shape"])
                data = ctypes.string_at(tensor["address"], int(np.prod(shape)) * dtype.itemsize)
                feed[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
        names = [output.name for output in session.get_outputs()]
        for name, array in zip(names, session.run(names, feed), strict=True):
            data = np.ascontiguousarray(array)
            address = tensors[name]["address"]
            room = self.library.edge_fake_device_bytes_from(address)
            if data.nbytes > room:
                raise AssertionError(f"output {name} of {data.nbytes} bytes overflows its buffer ({room} bytes left)")
            ctypes.memmove(address, data.ctypes.data, data.nbytes)
            shape = (ctypes.c_int64 * data.ndim)(*data.shape)
            assert self.library.edge_fake_set_output_shape(name.encode(), data.ndim, shape)


def plan(model: onnx.ModelProto, graph: str, profiles: list[dict[str, tuple]]) -> bytes:
    """The fake's serialized engine: the graph's tensors and types, the profiles' {input: (min, max)}, activations."""
    tensors = []
    dynamic = set().union(*profiles)
    for values, is_input in ((model.graph.input, True), (model.graph.output, False)):
        for value in values:
            tensor = {"name": value.name, "type": DATA_TYPES[value.type.tensor_type.elem_type], "input": is_input}
            if is_input and value.name not in dynamic:
                tensor["shape"] = [dim.dim_value for dim in value.type.tensor_type.shape.dim]
            tensors.append(tensor)
    record = {"graph": graph, "tensors": tensors, "profiles": profiles, "device_memory": list(ACTIVATION_BYTES)}
    return json.dumps(record).encode()


def fake_tensorrt_package(fake: FakeTensorRT, plugins_visible: bool = True) -> types.ModuleType:
    """TensorRT's Python API as builder.py uses it. Its plugin registry shows the plugins libedge_sdk registered with
    the fake libnvinfer (one registry, as when both run one libnvinfer) unless plugins_visible is False. `builds`
    records each build: (the parsed graph's path, its profiles as set_shape got them, their extra_memory_target).
    build_serialized_network returns an IHostMemory as TensorRT's does: library memory read through the buffer
    protocol; `host_copies` counts the bytes() copies made of it and `live_parsers` holds the parsers (each with its
    host copy of the weights) still alive."""
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = "10.3.0.30"
    trt.builds = []
    trt.host_copies = 0
    trt.live_parsers = weakref.WeakSet()

    class IHostMemory(bytearray):
        """The serialized engine: a buffer (memoryview, file.write) that bytes() would copy."""

        @property
        def nbytes(self) -> int:
            return len(self)

        def __bytes__(self) -> bytes:
            trt.host_copies += 1
            return bytes(memoryview(self))

    class Logger:
        WARNING = 2

        def __init__(self, severity):
            pass

    class Registry:
        def get_creator(self, name, version, namespace):
            registered = plugins_visible and bool(fake.report()["plugin_libraries"])
            return object() if registered and (version, namespace) == ("1", "edge_sdk") else None

    class Network:
        model = None
        path = None

    class OnnxParser:
        num_errors = 0

        def __init__(self, network, logger):
            self.network = network
            trt.live_parsers.add(self)

        def parse(self, model: bytes, path: str) -> bool:
            self.network.model, self.network.path = onnx.load_from_string(model), path
            return True

    class Profile:
        def __init__(self):
            self.shapes, self.extra_memory_target = {}, 1.0  # TensorRT's default target

        def set_shape(self, name, low, opt, high):
            self.shapes[name] = (tuple(low), tuple(opt), tuple(high))

    class Config:
        def __init__(self):
            self.profiles, self.cleared = [], []

        def clear_flag(self, flag):
            self.cleared.append(flag)

        def add_optimization_profile(self, profile):
            self.profiles.append(profile)

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            return Network()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            profiles = config.profiles
            trt.builds.append((network.path, [p.shapes for p in profiles], [p.extra_memory_target for p in profiles]))
            bounds = [{name: (low, high) for name, (low, _, high) in p.shapes.items()} for p in profiles]
            return IHostMemory(plan(network.model, network.path, bounds))

    trt.Logger, trt.Builder, trt.OnnxParser = Logger, Builder, OnnxParser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)
    trt.BuilderFlag = types.SimpleNamespace(TF32=7)
    registry = Registry()
    trt.get_plugin_registry = lambda: registry
    return trt
