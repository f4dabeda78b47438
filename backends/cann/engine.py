"""An Engine (DESIGN 3.5) over a bundle on one torch device, with the gather-plus-matmul decode FFN.

Attention, the KV cache, norms and the dense prefill are the reference decoder's torch code, which is
device-agnostic: the bundle is loaded through export.exporter.load_reference_decoder and moved to the
device; each layer's FFN is a GatherSparseFFN on the same device. The CANN backend runs this on "npu" in
fp16; the tests run it on "cpu" in fp32 against the reference and the CPU backend; CUDA works the same way.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from edge_sdk.export.bundle import Bundle
from edge_sdk.export.exporter import load_reference_decoder
from edge_sdk.runtime.backends import EngineOptions, configure_sparse_decoder

from .gather_ffn import GatherSparseFFN


class TorchDeviceEngine:
    """Engine protocol over a bundle on `device` in `dtype`, the decode FFN in `mode` (dynamic | static)."""

    def __init__(
        self,
        bundle: Bundle,
        options: EngineOptions,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        mode: str = "dynamic",
    ):
        self.device = torch.device(device)
        self.dtype, self.mode = dtype, mode
        if self.device.type == "cpu" and options.threads > 0:
            torch.set_num_threads(options.threads)
        feed_forward = functools.partial(GatherSparseFFN, device=self.device, dtype=dtype, mode=mode)
        self.model = load_reference_decoder(bundle, dtype=dtype, ffn_class=feed_forward, ffn_as_stored=True)
        decoder = self.model.decoder
        decoder.to(self.device)  # parameters and KV caches; the FFN weights are already there
        decoder.rope_cos, decoder.rope_sin = decoder.rope_cos.to(self.device), decoder.rope_sin.to(self.device)
        self.level = configure_sparse_decoder(self.model, bundle.sparsity, options)
        self.vocab_size = bundle.config.vocab_size
        self.max_seq_len = bundle.manifest["max_seq_len"]

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, S]

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.model.prefill(self._ids(ids))[0, -1].float().cpu().numpy()

    def decode(self, token: int) -> np.ndarray:
        return self.model.decode(self._ids([token]))[0, -1].float().cpu().numpy()

    def reset(self) -> None:
        self.model.reset()
