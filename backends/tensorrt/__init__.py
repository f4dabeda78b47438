"""TensorRT backend with the edge-sdk CUDA plugins (Jetson Orin / Thor, any NVIDIA GPU with TensorRT >= 10.3).

One engine is built on the device from the bundle's decode.onnx, which runs prompts too (reference functions of the
custom ops removed, so the parser maps them to the plugins in libedge_trt_plugins.so), with a prefill and a decode
optimization profile, so it holds the weights once; it is cached, keyed by TensorRT version, GPU and bundle hash:
build_engine(bundle, cache_dir=None, force=False) -> engine directory.
Running uses cuda-python device buffers; this package does not import torch.
"""

from __future__ import annotations

from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions

from .availability import probe
from .builder import EngineBuildError, build_engine
from .cache import EngineCacheError, default_cache_dir

__all__ = ["BACKEND", "EngineBuildError", "EngineCacheError", "TensorRTBackend", "build_engine", "default_cache_dir"]


class TensorRTBackend:
    name = "tensorrt"

    def probe(self) -> tuple[bool, str]:
        return probe()

    def load(self, bundle, options: EngineOptions):
        available, reason = self.probe()
        if not available:
            raise BackendUnavailable(f"backend 'tensorrt' is not available here: {reason}")
        from .runtime import TensorRTEngine

        return TensorRTEngine(bundle, options)


BACKEND = TensorRTBackend()
