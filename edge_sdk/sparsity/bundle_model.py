"""The torch reference of a bundle: its weights in the reference decoder with sparse FFNs, and TorchEngine, the one
Engine (DESIGN 3.5) that runs a bundle through torch.

Every torch engine is this one with a different FFN module and device: the reference itself (`verify`, evaluation's
statistics), the CPU backend's torch engine (the native kernels' FFN and projections), the CANN path (the
gather-plus-matmul FFN on an NPU). Every backend is compared against the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from edge_sdk import quant
from edge_sdk.bundle import Bundle, LevelChoice
from edge_sdk.bundle.layout import (
    MINS_SUFFIX,
    SCALES_SUFFIX,
    TRANSPOSED_SUFFIX,
    is_predictor_tensor,
    quantized_format,
    quantized_part,
)
from edge_sdk.model.decoder import Decoder
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseDecoder, SparseFeedForward


def bundle_tensor(bundle: Bundle, name: str) -> torch.Tensor:
    """A tensor of weights.safetensors over the memory-mapped file (no copy)."""
    array = bundle.array(name)
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if bundle.header.tensors[name].dtype == "BF16" else tensor


def is_quantized(bundle: Bundle, name: str) -> bool:
    """Whether a bundle tensor is the codes of a quantized matrix (it has scales beside it)."""
    return bundle.has_tensor(name + SCALES_SUFFIX)


def quantized_matrix(bundle: Bundle, name: str) -> quant.QuantizedMatrix:
    """A quantized matrix of an int8 / int4 bundle: its codes and scales (and an asymmetric int4 matrix's minimums)
    over the memory-mapped file (no copy), in the format its codes are stored in (the LM head may be int8 in an int4
    bundle: manifest head_dtype)."""
    codes, scales = bundle.array(name), bundle.array(name + SCALES_SUFFIX)
    format = quantized_format(bundle.header.tensors[name].dtype)
    mins = bundle.array(name + MINS_SUFFIX) if bundle.has_tensor(name + MINS_SUFFIX) else None
    return quant.QuantizedMatrix(format, bundle.manifest.group_size, codes, scales, mins)


def load_reference_decoder(
    bundle: Bundle,
    dtype: torch.dtype = torch.float32,
    ffn_class: Callable[..., SparseFeedForward] = SparseFeedForward,
    ffn_as_stored: bool = False,
    choice: LevelChoice | None = None,
) -> SparseDecoder:
    """The bundle's decoder at an operating point (choice, resolved by SparsityConfig.resolve; None: the bundle's
    default level).

    ffn_as_stored keeps the FFN matrices as the memory-mapped tensors of weights.safetensors (no cast, no
    copy) for FFN implementations that read fp16 directly; ffn_class picks that implementation. The matrices of
    an int8 / int4 bundle are dequantized (edge_sdk.quant.dequantize, exact in float32), so every quantized path
    is compared with this float32 reference on the dequantized weights."""
    decoder = bundle_decoder(bundle, dtype, ffn_as_stored)
    decoder.setup_cache(bundle.max_seq_len)
    # the bundle's RoPE tables are what every backend uses, so the reference uses them too
    decoder.rope_cos, decoder.rope_sin = bundle_tensor(bundle, "rope.cos"), bundle_tensor(bundle, "rope.sin")
    model = SparseDecoder(decoder, bundle_predictors(bundle), ffn_class)
    configure(model, bundle.sparsity.resolve(None) if choice is None else choice)
    return model


def bundle_decoder(bundle: Bundle, dtype: torch.dtype = torch.float32, ffn_as_stored: bool = False) -> Decoder:
    """The bundle's weights in the dense reference Decoder (the layout of a Hugging Face checkpoint without its
    `model.` prefix, down_proj as [d, D]), without a KV cache; see load_reference_decoder."""
    config = bundle.config
    with torch.device("meta"):
        decoder = Decoder(config)
    for name in bundle.manifest.tensors:
        if name.startswith("rope.") or is_predictor_tensor(name) or quantized_part(name)[1]:
            continue
        quantized = is_quantized(bundle, name)
        if quantized:
            tensor = torch.from_numpy(quant.dequantize(quantized_matrix(bundle, name)))
        else:
            tensor = bundle_tensor(bundle, name)
        is_ffn_matrix = ".mlp." in name
        if quantized or not (ffn_as_stored and is_ffn_matrix):
            tensor = tensor.to(dtype)
        target_name = name
        if name.endswith(TRANSPOSED_SUFFIX):
            tensor, target_name = tensor.T, name.removesuffix(TRANSPOSED_SUFFIX)
        *path, leaf = target_name.split(".")
        module = decoder
        for part in path:
            module = getattr(module, part)
        setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=False))
    if config.tie_word_embeddings:
        decoder.lm_head.weight = decoder.embed_tokens.weight
    return decoder.eval()


def configure(model: SparseDecoder, choice: LevelChoice) -> None:
    """Set every layer of model to a resolved operating point (SparsityConfig.resolve)."""
    model.configure(level_index=0 if choice.index is None else choice.index, dense=choice.dense)


def bundle_predictors(bundle: Bundle) -> list[LayerPredictor]:
    """Each layer's predictor as the bundle stores it (tensors memory-mapped, names without `layers.{i}.`)."""
    sparsity = bundle.sparsity
    predictors = []
    for index in range(bundle.config.num_layers):
        prefix = f"layers.{index}."
        tensors = {
            name.removeprefix(prefix): bundle_tensor(bundle, name)
            for name in bundle.manifest.tensors
            if name.startswith(prefix) and is_predictor_tensor(name)
        }
        predictors.append(LayerPredictor(sparsity.predictor, tensors, sparsity.core_alpha, sparsity.core_beta))
    return predictors


class TorchEngine:
    """Engine protocol over a configured SparseDecoder on one torch device, batch 1."""

    def __init__(self, model: SparseDecoder, max_seq_len: int, device: torch.device | str = "cpu"):
        self.model = model
        self.device = torch.device(device)
        self.max_seq_len = max_seq_len
        self.vocab_size = model.decoder.config.vocab_size

    @classmethod
    def load(
        cls,
        bundle: Bundle,
        choice: LevelChoice,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        ffn_class: Callable[..., SparseFeedForward] = SparseFeedForward,
        ffn_as_stored: bool = False,
        prepare: Callable[[SparseDecoder], None] | None = None,
    ) -> TorchEngine:
        """The bundle's decoder at an operating point: FFNs of ffn_class (see load_reference_decoder), prepare(model)
        applied before the model moves to device."""
        model = load_reference_decoder(
            bundle, dtype=dtype, ffn_class=ffn_class, ffn_as_stored=ffn_as_stored, choice=choice
        )
        if prepare is not None:
            prepare(model)
        decoder = model.decoder
        decoder.to(device)  # parameters and KV caches; FFN weights created on the device stay there
        decoder.rope_cos, decoder.rope_sin = decoder.rope_cos.to(device), decoder.rope_sin.to(device)
        return cls(model, bundle.max_seq_len, device)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, S]

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.model.prefill(self._ids(ids))[0, -1].float().cpu().numpy()

    def decode(self, token: int) -> np.ndarray:
        return self.model.decode(self._ids([token]))[0, -1].float().cpu().numpy()

    def reset(self) -> None:
        self.model.reset()
