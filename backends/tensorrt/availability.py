"""Whether the TensorRT backend can run here, and why not: libedge_sdk's own probe, never an exception."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from edge_sdk.runtime.backends import BackendUnavailable

from ..c_runtime import probe_backend

NO_TENSORRT_PYTHON = (
    "`edge-sdk build` needs the tensorrt Python package, which is not installed (JetPack 6.1/6.2 ships it as "
    "python3-libnvinfer; see plugins/tensorrt/JETSON.md)"
)


def probe() -> tuple[bool, str]:
    """(available, reason). The engine runs in libedge_sdk, which says, first failure first: the library is not built,
    it was built without TensorRT, TensorRT is older than 10.3, there is no CUDA device, the plugin library does not
    load. Whether a bundle's engine is cached is the bundle's question (TensorRTBackend.probe_bundle)."""
    return probe_backend("tensorrt")


def import_tensorrt() -> ModuleType:
    """TensorRT's Python package, which `edge-sdk build` builds engines with; BackendUnavailable when it is missing."""
    if importlib.util.find_spec("tensorrt") is None:
        raise BackendUnavailable(NO_TENSORRT_PYTHON)
    return importlib.import_module("tensorrt")
