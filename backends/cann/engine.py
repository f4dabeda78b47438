"""The CANN backend's engine: a bundle's reference decoder on a torch device with the gather-plus-matmul decode FFN.

Attention, the KV cache, norms and the dense prefill are the reference decoder's torch code, which is
device-agnostic; each layer's FFN is a GatherSparseFFN on the same device. The CANN backend runs this on "npu" in
fp16; the tests run it on "cpu" in fp32 against the reference and the CPU backend; CUDA works the same way.
"""

from __future__ import annotations

import functools

import torch

from edge_sdk.bundle import Bundle
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import TorchEngine

from .gather_ffn import GatherSparseFFN


def load_gather_engine(
    bundle: Bundle,
    options: EngineOptions,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    mode: str = "dynamic",
) -> TorchEngine:
    """The bundle on `device` in `dtype`, the decode FFN gathering rows in `mode` (dynamic | static)."""
    device = torch.device(device)
    if device.type == "cpu" and options.threads > 0:
        torch.set_num_threads(options.threads)
    return TorchEngine.load(
        bundle,
        options.level,
        device=device,
        dtype=dtype,
        ffn_class=functools.partial(GatherSparseFFN, device=device, dtype=dtype, mode=mode),
        ffn_as_stored=True,
    )
