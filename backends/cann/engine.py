"""The CANN backend's engine: a bundle's reference decoder on a torch device with the gather-plus-matmul decode FFN.

Attention, the KV cache, norms and the dense prefill are the reference decoder's torch code, which is
device-agnostic; each layer's FFN is a GatherSparseFFN on the same device. The CANN backend runs this on "npu" in
fp16; the tests run it on "cpu" in fp32 against the reference and the CPU backend; CUDA works the same way.

int8 / int4 bundles (quantized.py): each FFN gets its layer's quantized matrices, read through the bundle layer
(sparsity/bundle_model.quantized_matrix); with `weight_quant` operators the gate and up rows, the attention
projections and the LM head go through the weight-quant matmul, without them everything is dequantized (the FFN
rows on gather, the dense matrices once at load, which the reference decoder already holds in the compute dtype).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from edge_sdk.bundle import Bundle
from edge_sdk.runtime.backends import EngineOptions
from edge_sdk.sparsity.bundle_model import TorchEngine, is_quantized, quantized_matrix

from .gather_ffn import GatherSparseFFN
from .quantized import (
    DEQUANTIZE,
    WEIGHT_QUANT_MATMUL,
    DequantizingMatrix,
    QuantizedFFN,
    QuantizedLinear,
    WeightQuantMatrix,
    WeightQuantOps,
    device_matrix,
)

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
# where an int8 / int4 bundle may hold its LM head's codes: its own matrix, or the embedding it is tied to
LM_HEAD_TENSORS = ("lm_head.weight", "embed_tokens.weight")


def load_gather_engine(
    bundle: Bundle,
    options: EngineOptions,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    mode: str = "dynamic",
    weight_quant: WeightQuantOps | None = None,
) -> TorchEngine:
    """The bundle on `device` in `dtype`, the decode FFN gathering rows in `mode` (dynamic | static).

    weight_quant: the weight-quant matmul's operators for an int8 / int4 bundle (None: the dequantize path); the
    engine's `quant_path` says which path it took (None for a float bundle)."""
    device = torch.device(device)
    if device.type == "cpu" and options.threads > 0:
        torch.set_num_threads(options.threads)
    gather = functools.partial(GatherSparseFFN, device=device, dtype=dtype, mode=mode)
    if bundle.manifest.group_size is None:
        engine = TorchEngine.load(
            bundle, options.level, device=device, dtype=dtype, ffn_class=gather, ffn_as_stored=True
        )
        engine.quant_path = None
        return engine
    layers = _quantized_ffns(bundle, device, dtype, weight_quant)

    def quantized_ffn(*args) -> GatherSparseFFN:  # SparseDecoder builds the FFNs in layer order
        return gather(*args, quantized=next(layers))

    prepare = (
        None
        if weight_quant is None
        else functools.partial(_use_quantized_linears, bundle=bundle, device=device, dtype=dtype, ops=weight_quant)
    )
    engine = TorchEngine.load(
        bundle, options.level, device=device, dtype=dtype, ffn_class=quantized_ffn, ffn_as_stored=True, prepare=prepare
    )
    engine.quant_path = DEQUANTIZE if weight_quant is None else WEIGHT_QUANT_MATMUL
    return engine


def _quantized_ffns(
    bundle: Bundle, device: torch.device, dtype: torch.dtype, ops: WeightQuantOps | None
) -> Iterator[QuantizedFFN]:
    """Each layer's gate, up and down_t matrices on the device, one layer at a time."""
    for index in range(bundle.config.num_layers):
        prefix = f"layers.{index}.mlp."
        gate, up, down = (
            quantized_matrix(bundle, prefix + name)
            for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight_t")
        )
        yield QuantizedFFN(
            device_matrix(gate, device, dtype, ops),
            device_matrix(up, device, dtype, ops),
            DequantizingMatrix(down, device, dtype),
        )


def _use_quantized_linears(model, bundle: Bundle, device: torch.device, dtype: torch.dtype, ops: WeightQuantOps):
    """Point the attention projections and the LM head at their codes and scales through the weight-quant matmul.
    The replaced modules' dequantized weights are dropped before the decoder moves to the device."""
    decoder = model.decoder

    def quantized(module: torch.nn.Linear, name: str) -> QuantizedLinear:
        return QuantizedLinear(WeightQuantMatrix(quantized_matrix(bundle, name), device, dtype, ops), module.bias)

    for index, layer in enumerate(decoder.layers):
        attention = layer.self_attn
        for name in ATTENTION_PROJECTIONS:
            weight_name = f"layers.{index}.self_attn.{name}.weight"
            setattr(attention, name, quantized(getattr(attention, name), weight_name))
    lm_head = quantized_lm_head(bundle)
    if lm_head is not None:  # otherwise an fp16 head (tied to an fp16 embedding) stays a torch Linear
        decoder.lm_head = quantized(decoder.lm_head, lm_head)


def quantized_lm_head(bundle: Bundle) -> str | None:
    """The tensor holding the LM head's codes: its own matrix, else the embedding it is tied to when that is stored
    quantized; None when the head is float."""
    return next((name for name in LM_HEAD_TENSORS if is_quantized(bundle, name)), None)
