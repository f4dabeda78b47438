"""What the optional parts of edge-sdk need, and the one message that says which extra to install.

`pip install edge-sdk` is the device runtime (run, doctor, verify of files, build, pack/unpack, the Python API, the
CPU backend through libedge_sdk, TensorRT): numpy, tokenizers, click and jinja2. `edge-sdk[export]` adds torch,
onnx and what info, calibrate, export, eval, verify's numeric check and the torch engines need; `edge-sdk[ascend]`
adds torch_npu.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from edge_sdk.errors import EdgeSdkError

EXTRA_PACKAGES = {"export": ("torch", "onnx", "safetensors"), "ascend": ("torch", "torch_npu")}


class MissingExtra(EdgeSdkError):
    """A command needs packages of an extra that is not installed."""


def require_extra(extra: str, purpose: str) -> None:
    """Raise MissingExtra naming the extra when one of its packages is missing; purpose: what needs it."""
    for package in EXTRA_PACKAGES[extra]:
        if importlib.util.find_spec(package) is None:
            raise MissingExtra(f"{purpose} needs {package}, which this install lacks: pip install 'edge-sdk[{extra}]'")


def import_from_extra(extra: str, module: str, purpose: str) -> ModuleType:
    """Import module, which needs the given extra (see require_extra)."""
    require_extra(extra, purpose)
    return importlib.import_module(module)
