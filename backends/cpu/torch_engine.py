"""The CPU backend's torch engine: torch modules with the decode step's matrices in the native C kernels.

At decode, the FFN (predictor + sequential SparseFFN), the attention projections and the LM head run in the C
kernels on the memory-mapped tensors of weights.safetensors (fp32 or fp16, read in place); attention itself, norms
and RoPE stay in torch. The prompt (prefill) runs through torch's GEMMs. Core masks come from the prefill. It serves
bundles the C runtime does not run (bf16) and needs torch (the `export` extra).

int8 / int4 bundles run through the quantized kernels (edge_cpu_sparse_ffn_q, dense as the same kernel with every
neuron a candidate, and edge_cpu_matvec_q) on the memory-mapped codes and scales; the prompt runs torch's GEMMs on
the dequantized float32 matrices the reference decoder holds.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.bundle import Bundle
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import TorchEngine, bundle_tensor, is_quantized, quantized_matrix
from edge_sdk.sparsity.sparse_model import SparseFeedForward

from . import kernels

NATIVE_WEIGHT_DTYPES = (torch.float32, torch.float16)


class NativeFeedForward(SparseFeedForward):
    """SparseFeedForward whose decode step runs the C predictor and SparseFFN kernels, one token at a time."""

    def __init__(self, *args, threads: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.quantized: tuple[kernels.QuantizedWeight, ...] | None = None  # gate, up, down_t of a quantized bundle
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
        self.masker = self.kind.native_masker(self.predictor, kernels)  # the kind's mask through the C kernels

    def _native_mask(self, token: torch.Tensor, row: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The predictor mask [D] (None = every neuron) and CHESS thresholds for one decode token."""
        if self.dense:
            return None, None
        prefill_row = None if self.prefill_mask is None else self.prefill_mask[row]
        return self.masker(token, self.level_index, prefill_row)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d]
        if self.phase == "prefill":
            return self._prefill(x)
        tokens = x.reshape(-1, x.shape[-1]).float()
        outputs = []
        for row, token in enumerate(tokens):
            if self.quantized is not None:
                mask, thresholds = self._native_mask(token.contiguous(), row)
                y = self.kernel.quantized(
                    token.contiguous(), *self.quantized, self.activation, mask, thresholds, out=self.output
                )
                outputs.append(y.clone())
                continue
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


class NativeQuantizedLinear(nn.Module):
    """NativeLinear for a quantized matrix: single-token calls run edge_cpu_matvec_q on the stored codes and scales,
    multi-token calls torch's GEMM on the dequantized float32 weight."""

    def __init__(
        self, weight: torch.Tensor, quantized: kernels.QuantizedWeight, bias: torch.Tensor | None, threads: int
    ):
        super().__init__()
        self.weight = weight  # [out, in] float32, dequantized
        self.quantized = quantized  # the same matrix as stored
        self.bias = bias  # [out] float32 or None
        self.threads = threads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] float32 -> [..., out]
        if x.shape[:-1].numel() != 1:
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        y = kernels.matvec_quantized(x.reshape(-1).contiguous(), self.quantized, self.bias, threads=self.threads)
        return y.view(*x.shape[:-1], -1)


def _quantized_weight(bundle: Bundle, name: str) -> kernels.QuantizedWeight:
    return kernels.QuantizedWeight.from_matrix(quantized_matrix(bundle, name))


def _use_quantized_ffns(model, bundle: Bundle) -> None:
    """Give each FFN its layer's quantized gate, up and down rows (the kernels read them in place)."""
    for index, ffn in enumerate(model.ffns):
        prefix = f"layers.{index}.mlp."
        names = ("gate_proj.weight", "up_proj.weight", "down_proj.weight_t")
        ffn.quantized = tuple(_quantized_weight(bundle, prefix + name) for name in names)


def _use_native_linears(model, bundle: Bundle, threads: int) -> None:
    """Point the attention projections and the LM head at the stored weights through NativeLinear, so the decode
    step reads them once, in their stored precision, at the native kernel's bandwidth."""
    decoder = model.decoder

    def native(module: nn.Linear, weight_name: str) -> nn.Module:
        bias = module.bias.detach().float().contiguous() if module.bias is not None else None
        if is_quantized(bundle, weight_name):
            return NativeQuantizedLinear(module.weight.detach(), _quantized_weight(bundle, weight_name), bias, threads)
        weight = bundle_tensor(bundle, weight_name)
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


def load_torch_cpu_engine(bundle: Bundle, options: EngineOptions) -> TorchEngine:
    """The CPU backend's torch engine: the reference decoder with the decode step's matrices in the native kernels."""
    if options.threads > 0:
        torch.set_num_threads(options.threads)
    return TorchEngine.load(
        bundle,
        options.level,
        ffn_class=functools.partial(NativeFeedForward, threads=options.threads),
        ffn_as_stored=True,
        prepare=lambda model: _prepare(model, bundle, options.threads),
    )


def _prepare(model, bundle: Bundle, threads: int) -> None:
    _use_native_linears(model, bundle, threads)
    if bundle.manifest.group_size is not None:
        _use_quantized_ffns(model, bundle)
