"""Ascend (CANN) backend through torch_npu.

Not part of this edge-sdk version: the probe reports why it cannot run, and load refuses.
"""

from __future__ import annotations

import importlib.util

from edge_sdk.runtime.backends import BackendUnavailable


class CannBackend:
    name = "cann"

    def probe(self) -> tuple[bool, str]:
        if importlib.util.find_spec("torch_npu") is None:
            return False, "torch_npu is not installed (pip install edge-sdk[ascend] on a machine with CANN)"
        return False, "the torch_npu gather-plus-matmul engine is not part of this edge-sdk version yet"

    def load(self, bundle, options):
        raise BackendUnavailable(f"backend 'cann' is not available here: {self.probe()[1]}")


BACKEND = CannBackend()
