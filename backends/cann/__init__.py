"""Ascend (CANN) backend: torch_npu, fp16, the decode FFN as gather-plus-matmul (SVDP Algorithm 4).

The engine is backends/cann/engine.py's gather engine on device "npu" in fp16: the Ascend 310P cube
unit has no fp32 matmul, so fp32 and bf16 bundles are cast once at load, with a warning. The decode FFN
runs in dynamic mode (nonzero: exact, one host synchronisation per nonzero) unless $EDGE_SDK_CANN_MODE
is "static" (top-k to the bundle's calibrated capacity: static shapes, no synchronisation).
int8 / int4 bundles keep their codes on the NPU: the chip decides at load whether gate, up and the dense matrices go
through torch_npu's weight-quant matmul (Atlas A2 / A3) or are dequantized (310P and the rest; quantized.py).
See backends/cann/README.md.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import TYPE_CHECKING

from edge_sdk.errors import EdgeSdkError
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions

if TYPE_CHECKING:  # quantized.py imports torch, which the device install need not have
    from .quantized import QuantPlan

MODES = ("dynamic", "static")  # gather_ffn.py's decode FFN modes
MODE_ENV = "EDGE_SDK_CANN_MODE"
NOT_INSTALLED = "torch_npu is not installed (pip install edge-sdk[ascend] on a machine with CANN)"
NPU_WEIGHT_DTYPE = "fp16"  # the 310P cube unit has no fp32 matmul
QUANTIZED_DTYPES = ("int8", "int4")  # kept quantized on the NPU (quantized.py)


def npu_weight_notice(bundle_dtype: str) -> str | None:
    """The notice to give when a bundle's weights are cast to fp16 for the NPU (None when they are fp16 already, or
    quantized: those keep their codes, see quant_notice)."""
    if bundle_dtype == NPU_WEIGHT_DTYPE or bundle_dtype in QUANTIZED_DTYPES:
        return None
    return f"casting {bundle_dtype} bundle to fp16 for the Ascend cube unit"


def quant_notice(plan: QuantPlan) -> str | None:
    """The notice for a quantized bundle whose chip cannot multiply it quantized (None on the weight-quant path)."""
    from .quantized import DEQUANTIZE

    return plan.reason if plan.path == DEQUANTIZE else None


def _cann_version(torch_npu) -> str:
    """The CANN toolkit version torch_npu runs on. get_cann_version() is torch_npu.npu.utils' since torch_npu 2.5.1
    and also torch_npu.utils' since 2.7.1, and answers "" on a CANN older than 8.1.RC1; torch.version.cann is set by
    every torch_npu at import (utils/collect_env.py, from the toolkit's ascend_*_install.info). torch_npu/version.py
    holds __version__ and git_version only: there is no torch_npu.version.cann."""
    for owner in (getattr(torch_npu, "utils", None), getattr(getattr(torch_npu, "npu", None), "utils", None)):
        query = getattr(owner, "get_cann_version", None)
        if query is None:
            continue
        try:
            version = str(query() or "")
        except Exception:  # a query that cannot read the toolkit's version: the fallback below
            version = ""
        if version:
            return version
    import torch

    return str(getattr(torch.version, "cann", None) or "unknown")


class CannBackend:
    name = "cann"

    def __init__(self, device: str = "npu"):
        self.device = device

    def mode(self) -> str:
        """The decode FFN mode: $EDGE_SDK_CANN_MODE, dynamic by default."""
        mode = os.environ.get(MODE_ENV, "dynamic")
        if mode not in MODES:
            raise EdgeSdkError(f"${MODE_ENV}: expected one of {', '.join(MODES)}, found {mode!r}")
        return mode

    def probe(self) -> tuple[bool, str]:
        try:
            torch_npu = importlib.import_module("torch_npu")  # without torch_npu this imports nothing, torch included
        # a missing libascendcl.so surfaces as ImportError or OSError, a CANN / torch mismatch as RuntimeError
        except Exception as error:
            if isinstance(error, ModuleNotFoundError) and error.name == "torch_npu":
                return False, NOT_INSTALLED
            return False, f"torch_npu import failed (CANN libraries missing?): {type(error).__name__}: {error}"
        import torch

        npu = torch_npu.npu
        versions = f"torch_npu {torch_npu.__version__}, torch {torch.__version__}"
        if not npu.is_available():
            return False, f"no NPU visible ({versions}; check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES)"
        device = f"{npu.get_device_name(0)} ({npu.device_count()} visible)"
        mode = os.environ.get(MODE_ENV, "dynamic")
        return True, f"{device}, CANN {_cann_version(torch_npu)}, {versions}, decode FFN {mode} gather-plus-matmul"

    def load(self, bundle, options: EngineOptions):
        available, reason = self.probe()
        if not available:
            raise BackendUnavailable(f"backend 'cann' is not available here: {reason}")
        mode = self.mode()
        notice = npu_weight_notice(bundle.dtype)
        weight_quant = None
        if bundle.dtype in QUANTIZED_DTYPES:
            from .quantized import DEQUANTIZE, TorchNpuWeightQuant, choose_quant_path, requested_quant_path

            torch_npu = importlib.import_module("torch_npu")
            plan = choose_quant_path(
                torch_npu.npu.get_device_name(0),
                torch_npu,
                bundle.dtype,
                requested_quant_path(),
                bundle.manifest.asymmetric,
            )
            notice = quant_notice(plan)
            weight_quant = None if plan.path == DEQUANTIZE else TorchNpuWeightQuant(torch_npu)
        if notice is not None:
            warnings.warn(notice, stacklevel=2)
        import torch

        from .engine import load_gather_engine

        return load_gather_engine(
            bundle, options, device=self.device, dtype=torch.float16, mode=mode, weight_quant=weight_quant
        )


BACKEND = CannBackend()
