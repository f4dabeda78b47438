"""TensorRT backend with the edge-sdk CUDA plugins (Jetson Orin / Thor).

Not part of this edge-sdk version: the probe reports why it cannot run, and load refuses.
"""

from __future__ import annotations

import importlib.util

from edge_sdk.runtime.backends import BackendUnavailable


class TensorRTBackend:
    name = "tensorrt"

    def probe(self) -> tuple[bool, str]:
        if importlib.util.find_spec("tensorrt") is None:
            return False, "the tensorrt Python package is not installed (JetPack ships it on Jetson)"
        return False, "the TensorRT engine builder and plugins are not part of this edge-sdk version yet"

    def load(self, bundle, options):
        raise BackendUnavailable(f"backend 'tensorrt' is not available here: {self.probe()[1]}")


BACKEND = TensorRTBackend()
