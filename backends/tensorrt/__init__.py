"""TensorRT backend with the edge-sdk CUDA plugins (Jetson Orin / Thor, any NVIDIA GPU with TensorRT >= 10.3).

Running is libedge_sdk's TensorRT engine (jetson/src/trt_engine.cpp) through the C runtime's ctypes wrapper
(../c_runtime.py), as the CPU backend runs its C engine: the engine cache key and lookup, the plugin loading and the
device buffers exist there only. It runs the one engine `edge-sdk build` made from the bundle's decode.onnx (reference
functions of the custom ops removed, so the parser maps them to the plugins in libedge_trt_plugins.so), with a prefill
and a decode optimization profile, so it holds the weights once: build_engine(bundle, cache_dir=None, force=False) ->
engine directory, with TensorRT's Python API (builder.py). Neither imports torch.
"""

from __future__ import annotations

from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions

from ..c_runtime import RuntimeEngine, tensorrt_engine_info
from .availability import probe
from .builder import EngineBuildError, build_engine

__all__ = ["BACKEND", "EngineBuildError", "TensorRTBackend", "build_engine"]


class TensorRTBackend:
    name = "tensorrt"

    def probe(self) -> tuple[bool, str]:
        return probe()

    def probe_bundle(self, bundle) -> tuple[bool, str]:
        """Whether this device has the bundle's engine cached (`edge-sdk build` makes it), after probe() passed."""
        info = tensorrt_engine_info(bundle)
        return (True, f"engine {info['engine_file']}") if info["cached"] else (False, info["reason"])

    def load(self, bundle, options: EngineOptions) -> RuntimeEngine:
        available, reason = self.probe()
        if not available:
            raise BackendUnavailable(f"backend 'tensorrt' is not available here: {reason}")
        return RuntimeEngine(bundle, options, backend="tensorrt")


BACKEND = TensorRTBackend()
