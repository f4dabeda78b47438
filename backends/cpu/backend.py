"""CPU backend: the C runtime's decoder (runtime.py) when the package build made libedge_sdk, else this module's
torch engine with the decode step's matrices in the native C kernels.

$EDGE_SDK_CPU_ENGINE picks one: "runtime", "torch", or "auto" (the default: the runtime when it is built and
runs the bundle -- fp32 and fp16 weights -- else torch, with the reason in the probe message).

Torch engine: at decode, the FFN (predictor + sequential SparseFFN), the attention projections and the LM head run in
the C kernels on the memory-mapped tensors of weights.safetensors (fp32 or fp16, read in place); attention itself,
norms and RoPE stay in torch. The prompt (prefill) runs through torch's GEMMs. Core masks come from the prefill.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.bundle import Bundle
from edge_sdk.export.exporter import load_reference_decoder
from edge_sdk.native import NativeLibraryError, load_cpu_kernels
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, configure_sparse_decoder
from edge_sdk.sparsity.sparse_model import SparseFeedForward

from . import kernels
from .runtime import RuntimeEngine, RuntimeUnsupported, runtime_version

ENGINE_ENV = "EDGE_SDK_CPU_ENGINE"
ENGINE_CHOICES = ("auto", "runtime", "torch")

NATIVE_WEIGHT_DTYPES = (torch.float32, torch.float16)


class NativeFeedForward(SparseFeedForward):
    """SparseFeedForward whose decode step runs the C predictor and SparseFFN kernels, one token at a time."""

    def __init__(self, *args, threads: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        if self.w_gate.dtype not in NATIVE_WEIGHT_DTYPES:
            # the kernels read fp32 or fp16; bf16 bundles are widened once at load
            # (as frozen Parameters: the loaded decoder hands its weights over as Parameters)
            weights = (self.w_gate, self.w_up, self.w_down_t)
            widened = (nn.Parameter(w.detach().float(), requires_grad=False) for w in weights)
            self.w_gate, self.w_up, self.w_down_t = widened
        self.w_down_t = self.w_down_t.contiguous()
        n_neurons, d = self.w_gate.shape
        self.kernel = kernels.SparseFFNKernel(d, n_neurons, threads)
        self.output = torch.empty(d, dtype=torch.float32)
        if self.predictor.kind == "svd":
            self.svd_a_t = self.predictor.tensors["svd.a"].t().contiguous()  # the layout the kernel reads

    def _native_mask(self, token: torch.Tensor, row: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The predictor mask [D] (None = every neuron) and CHESS thresholds for one decode token."""
        kind, tensors = self.predictor.kind, self.predictor.tensors
        if self.dense:
            return None, None
        if kind == "svd":
            bias = tensors["svd.biases"][self.level_index]
            return kernels.svd_predictor(token, self.svd_a_t, tensors["svd.b"], bias), None
        if kind == "signbit":
            return kernels.signbit_predictor(token, tensors["signbit.packed"], float(tensors["signbit.alpha"][0])), None
        if kind == "core":
            if self.core_mask is None:
                raise EdgeSdkError("core predictor: decode called before prefill chose the core neurons")
            return self.core_mask[row].contiguous(), None
        if kind == "threshold":
            return None, tensors["threshold.thresholds"][self.level_index].contiguous()
        return None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d]
        if self.phase == "prefill":
            return self._prefill(x)
        tokens = x.reshape(-1, x.shape[-1]).float()
        outputs = []
        for row, token in enumerate(tokens):
            if self.dense:
                weights = (self.w_gate, self.w_up, self.w_down_t)
                outputs.append(
                    self.kernel.dense(token.contiguous(), *weights, self.activation, out=self.output).clone()
                )
                continue
            mask, thresholds = self._native_mask(token.contiguous(), row)
            y = self.kernel(
                token.contiguous(),
                self.w_gate,
                self.w_up,
                self.w_down_t,
                self.activation,
                mask=mask,
                thresholds=thresholds,
                out=self.output,
            )
            outputs.append(y.clone())
        return torch.stack(outputs).to(x.dtype).view_as(x)


class NativeLinear(nn.Module):
    """A linear layer whose single-token calls (the decode step) run the native matvec on the weight as stored
    in weights.safetensors (fp32 or fp16, read in place); multi-token calls (the prompt) use torch's GEMM."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, threads: int):
        super().__init__()
        self.weight = weight  # [out, in], the memory-mapped stored tensor
        self.bias = bias  # [out] float32 or None
        self.threads = threads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] float32 -> [..., out]
        if x.shape[:-1].numel() != 1:
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        y = kernels.matvec(x.reshape(-1).contiguous(), self.weight, self.bias, threads=self.threads)
        return y.view(*x.shape[:-1], -1)


def _use_native_linears(model, bundle: Bundle, threads: int) -> None:
    """Point the attention projections and the LM head at the stored weights through NativeLinear, so the decode
    step reads them once, in their stored precision, at the native kernel's bandwidth."""
    decoder = model.decoder

    def native(module: nn.Linear, weight_name: str) -> nn.Module:
        weight = bundle.tensor(weight_name)
        if weight.dtype not in NATIVE_WEIGHT_DTYPES:
            return module  # bf16: the kernels read fp32 or fp16; keep torch on the widened copy
        bias = module.bias.detach().float().contiguous() if module.bias is not None else None
        return NativeLinear(weight, bias, threads)

    for index, layer in enumerate(decoder.layers):
        attention = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(attention, name, native(getattr(attention, name), f"layers.{index}.self_attn.{name}.weight"))
    lm_head = "embed_tokens.weight" if decoder.config.tie_word_embeddings else "lm_head.weight"
    decoder.lm_head = native(decoder.lm_head, lm_head)


class TorchCpuEngine:
    """Engine protocol over a bundle on the CPU: torch modules with the decode matrices in the native kernels."""

    def __init__(self, bundle: Bundle, options: EngineOptions):
        if options.threads > 0:
            torch.set_num_threads(options.threads)
        feed_forward = functools.partial(NativeFeedForward, threads=options.threads)
        self.model = load_reference_decoder(bundle, ffn_class=feed_forward, ffn_as_stored=True)
        _use_native_linears(self.model, bundle, options.threads)
        self.level = configure_sparse_decoder(self.model, bundle.sparsity, options)
        self.vocab_size = bundle.config.vocab_size
        self.max_seq_len = bundle.manifest["max_seq_len"]

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.model.prefill(torch.tensor([ids], dtype=torch.long))[0, -1].numpy()

    def decode(self, token: int) -> np.ndarray:
        return self.model.decode(torch.tensor([[token]], dtype=torch.long))[0, -1].numpy()

    def reset(self) -> None:
        self.model.reset()


def _engine_choice() -> str:
    choice = os.environ.get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if choice not in ENGINE_CHOICES:
        raise EdgeSdkError(f"${ENGINE_ENV}={choice!r}: expected one of {', '.join(ENGINE_CHOICES)}")
    return choice


def _runtime_available() -> tuple[bool, str]:
    try:
        return True, f"C runtime libedge_sdk {runtime_version()}"
    except (NativeLibraryError, OSError) as error:
        return False, str(error)


class CpuBackend:
    name = "cpu"

    def probe(self) -> tuple[bool, str]:
        try:
            library = load_cpu_kernels()
        except (NativeLibraryError, OSError) as error:
            return False, str(error)
        kernels_text = f"native kernels {library.edge_cpu_version().decode()}, {library.edge_cpu_max_threads()} threads"
        choice = _engine_choice()
        runtime, runtime_text = _runtime_available()
        if choice == "torch":
            return True, f"{kernels_text}; decode in torch + kernels (${ENGINE_ENV}=torch)"
        if runtime:
            return True, f"{kernels_text}; decode in the {runtime_text}"
        if choice == "runtime":
            return False, f"${ENGINE_ENV}=runtime, but {runtime_text}"
        return True, f"{kernels_text}; decode in torch + kernels ({runtime_text})"

    def load(self, bundle: Bundle, options: EngineOptions) -> RuntimeEngine | TorchCpuEngine:
        available, reason = self.probe()
        if not available:
            raise BackendUnavailable(f"backend 'cpu' is not available here: {reason}")
        choice = _engine_choice()
        if choice != "torch" and _runtime_available()[0]:
            try:
                return RuntimeEngine(bundle, options)
            except RuntimeUnsupported as error:
                if choice == "runtime":
                    raise BackendUnavailable(f"backend 'cpu' (${ENGINE_ENV}=runtime): {error}") from error
        return TorchCpuEngine(bundle, options)


BACKEND = CpuBackend()
