"""The few CUDA runtime calls the TensorRT backend makes, through cuda-python (`pip install 'edge-sdk[jetson]'`).

cuda-python 12.6 and later name the module cuda.bindings.runtime; older releases cuda.cudart. Every call returns
(error, results...); `call` turns an error into CudaError naming the call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from edge_sdk.errors import EdgeSdkError

_RUNTIME_MODULES = ("cuda.bindings.runtime", "cuda.cudart")


class CudaError(EdgeSdkError):
    """A CUDA runtime call failed, or there is no usable CUDA device."""


def runtime_module() -> ModuleType | None:
    """cuda-python's runtime module, or None when cuda-python is not installed."""
    for name in _RUNTIME_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _runtime() -> ModuleType:
    module = runtime_module()
    if module is None:
        raise CudaError("cuda-python is not installed (pip install 'edge-sdk[jetson]')")
    return module


def call(name: str, *args):
    """cudart.<name>(*args), raising CudaError on an error; returns the results (one value unwrapped)."""
    cudart = _runtime()
    error, *results = getattr(cudart, name)(*args)
    if error != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(error)
        raise CudaError(f"{name} failed: {text.decode() if isinstance(text, bytes) else text}")
    return results[0] if len(results) == 1 else tuple(results)


def device_description() -> tuple[str, str]:
    """(name, compute capability like "8.7") of CUDA device 0; CudaError when there is none."""
    if call("cudaGetDeviceCount") == 0:
        raise CudaError("no CUDA device: cudaGetDeviceCount found 0 devices")
    properties = call("cudaGetDeviceProperties", 0)
    name = properties.name.decode() if isinstance(properties.name, bytes) else str(properties.name)
    return name.rstrip("\x00"), f"{properties.major}.{properties.minor}"


class DeviceBuffer:
    """nbytes of device memory at `address` (cudaMalloc), freed by free()."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.address = int(call("cudaMalloc", max(nbytes, 1)))

    def upload(self, array: np.ndarray) -> None:
        """Copies a host array into the start of the buffer (synchronously)."""
        host = np.ascontiguousarray(array)
        if host.nbytes > self.nbytes:
            raise CudaError(f"upload of {host.nbytes} bytes into a {self.nbytes}-byte device buffer")
        kind = _runtime().cudaMemcpyKind.cudaMemcpyHostToDevice
        call("cudaMemcpy", self.address, host.ctypes.data, host.nbytes, kind)

    def download(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The start of the buffer as a new host array (synchronously)."""
        host = np.empty(shape, dtype=dtype)
        if host.nbytes > self.nbytes:
            raise CudaError(f"download of {host.nbytes} bytes from a {self.nbytes}-byte device buffer")
        kind = _runtime().cudaMemcpyKind.cudaMemcpyDeviceToHost
        call("cudaMemcpy", host.ctypes.data, self.address, host.nbytes, kind)
        return host

    def free(self) -> None:
        if self.address:
            call("cudaFree", self.address)
            self.address = 0


class Stream:
    """A CUDA stream; `handle` is what IExecutionContext.execute_async_v3 takes."""

    def __init__(self):
        self._stream = call("cudaStreamCreate")
        self.handle = int(self._stream)

    def synchronize(self) -> None:
        call("cudaStreamSynchronize", self._stream)

    def destroy(self) -> None:
        if self._stream is not None:
            call("cudaStreamDestroy", self._stream)
            self._stream = None
