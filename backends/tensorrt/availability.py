"""Whether the TensorRT backend can run here, and why not: cheap checks first, never an exception."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from edge_sdk.native import find_library
from edge_sdk.runtime.backends import BackendUnavailable

from . import cuda

PLUGIN_LIBRARY = "libedge_trt_plugins.so"
PLUGIN_LIBRARY_ENV = "EDGE_SDK_TRT_PLUGINS"
# IPluginV3 plugins loaded by IPluginRegistry::loadLibrary: TensorRT 10.3 (JetPack 6.1) and later.
MIN_TENSORRT_VERSION = (10, 3)

NO_TENSORRT = (
    "the tensorrt Python package is not installed (JetPack 6.1/6.2 ships it as python3-libnvinfer; "
    "see plugins/tensorrt/JETSON.md)"
)
NO_CUDA_PYTHON = "cuda-python is not installed (pip install 'edge-sdk[jetson]')"


def plugin_library_missing() -> str:
    return (
        f"the plugin library {PLUGIN_LIBRARY} was not found (in edge_sdk/_native, or at ${PLUGIN_LIBRARY_ENV}); "
        f"build it on this device by "
        f"reinstalling edge-sdk (`pip install -e .`) with TensorRT's headers and nvcc present (JETSON.md), "
        f"or set {PLUGIN_LIBRARY_ENV} to its path"
    )


def find_plugin_library() -> Path | None:
    return find_library(PLUGIN_LIBRARY, PLUGIN_LIBRARY_ENV)


def version_tuple(version: str) -> tuple[int, ...]:
    """'10.3.0.30' -> (10, 3, 0, 30); stops at the first part that is not a number."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def too_old(version: str) -> str | None:
    """Why this TensorRT version cannot load the plugins, or None."""
    if version_tuple(version)[:2] >= MIN_TENSORRT_VERSION:
        return None
    return (
        f"TensorRT {version} is too old: the edge-sdk plugins implement IPluginV3, which needs TensorRT "
        f"{'.'.join(map(str, MIN_TENSORRT_VERSION))} or later (JetPack 6.1); JetPack 6.0's TensorRT 8.6 lacks it"
    )


def import_tensorrt() -> ModuleType:
    """The tensorrt module, checked to be recent enough; BackendUnavailable otherwise."""
    if importlib.util.find_spec("tensorrt") is None:
        raise BackendUnavailable(f"backend 'tensorrt' is not available here: {NO_TENSORRT}")
    trt = importlib.import_module("tensorrt")
    reason = too_old(trt.__version__)
    if reason is not None:
        raise BackendUnavailable(f"backend 'tensorrt' is not available here: {reason}")
    return trt


def probe() -> tuple[bool, str]:
    """(available, reason). Checks, in order: tensorrt installed, cuda-python installed, plugin library built,
    a CUDA device, the TensorRT version. Only the last imports tensorrt, once everything else is there."""
    try:
        if importlib.util.find_spec("tensorrt") is None:
            return False, NO_TENSORRT
        if cuda.runtime_module() is None:
            return False, NO_CUDA_PYTHON
        plugins = find_plugin_library()
        if plugins is None:
            return False, plugin_library_missing()
        name, capability = cuda.device_description()
        trt = importlib.import_module("tensorrt")
        reason = too_old(trt.__version__)
        if reason is not None:
            return False, reason
        return True, f"TensorRT {trt.__version__} on {name} (compute capability {capability}), plugins {plugins}"
    except Exception as error:  # a probe reports, never raises: any failure is a reason to skip this backend
        return False, f"{type(error).__name__}: {error}"
