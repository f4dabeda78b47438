"""The model an int8 / int4 bundle holds, seen as a checkpoint, and the activation-aware scales folded into it.

A quantized bundle stores every matrix as group-wise codes (edge_sdk/quant.py) but the embedding of a model with an
LM head of its own, which it keeps in fp16 (a tied embedding is the LM head, and quantized like it); the C runtime,
the engines and the ONNX graphs all compute with those values. Calibration and the choice
of the default level must see the same model (quantization error and sparsity error add up), so the exporter hands
them a QuantizedCheckpoint: the checkpoint's interface, whose tensors are the bundle's values dequantized to fp32.

AWQ-style scales (Lin et al., 2023): a linear layer's input channel j is multiplied by s_j in the weight and divided
by s_j in whatever produces the input (the RMSNorm weight before q/k/v and before gate/up, the rows of v_proj before
o_proj, the rows of up_proj before down_proj), which leaves the fp model's function unchanged but gives the salient
input channels (large mean |x|) finer quantization steps. s = mean|x|^alpha per channel, alpha chosen on a grid per
group of layers sharing an input so that their quantized outputs on calibration activations are closest to the fp
ones. Every scale is positive, so folding it never flips a sign: the FFN keeps one contiguous row per neuron in
gate, up and neuron-major down, and a neuron's gate activation is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edge_sdk import quant
from edge_sdk.bundle.layout import EMBEDDING, LM_HEAD, is_quantized_matrix
from edge_sdk.errors import CheckpointError
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.config import ModelConfig
from edge_sdk.model.decoder import rope_tables
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.loader import load_layer

QUANT_METHODS = ("rtn", "awq")
AWQ_ALPHAS = tuple(step / 10 for step in range(11))  # alpha 0 is s = 1: plain round-to-nearest is always a candidate
AWQ_SEARCH_TOKENS = 2048  # calibration tokens the output error is measured on, per layer group


@dataclass(frozen=True)
class LayerScales:
    """One layer's per-input-channel scales, each folded into the weights that read the input and out of what
    produces it."""

    attention_input: torch.Tensor  # [d]: q/k/v columns; input_layernorm weight
    attention_output: torch.Tensor  # [heads * head_dim]: o_proj columns; v_proj rows (equal within a kv group)
    ffn_input: torch.Tensor  # [d]: gate/up columns; post_attention_layernorm weight
    ffn_hidden: torch.Tensor  # [D]: down columns (rows of the neuron-major down); up rows


def _layer_and_name(hf_name: str) -> tuple[int | None, str]:
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"]:
        return int(parts[2]), ".".join(parts[3:])
    return None, hf_name


def fold_scales(name: str, tensor: torch.Tensor, scales: LayerScales, config: ModelConfig) -> torch.Tensor:
    """tensor (fp32, Hugging Face orientation, `name` without the layer prefix) with the layer's scales folded in."""
    kv_output = scales.attention_output.view(config.num_kv_heads, -1, config.head_dim)[:, 0].flatten()
    if name == "input_layernorm.weight":
        return tensor / scales.attention_input
    if name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
        return tensor * scales.attention_input
    if name == "self_attn.v_proj.weight":
        return tensor * scales.attention_input / kv_output[:, None]
    if name == "self_attn.v_proj.bias":
        return tensor / kv_output
    if name == "self_attn.o_proj.weight":
        return tensor * scales.attention_output
    if name == "post_attention_layernorm.weight":
        return tensor / scales.ffn_input
    if name == "mlp.gate_proj.weight":
        return tensor * scales.ffn_input
    if name == "mlp.up_proj.weight":
        return tensor * scales.ffn_input / scales.ffn_hidden[:, None]
    if name == "mlp.down_proj.weight":
        return tensor * scales.ffn_hidden
    return tensor


def fake_quantize(weight: torch.Tensor, format: str, group_size: int, asymmetric: bool = False) -> torch.Tensor:
    """weight [rows, cols] through the bundle's quantization and back: fp32, the values the kernels compute with
    (asymmetric: int4 with group minimums)."""
    matrix = quant.quantize(weight.detach().numpy(), format, group_size, asymmetric and format == "int4")
    return torch.from_numpy(quant.dequantize(matrix))


class QuantizedCheckpoint:
    """A checkpoint as an int8 / int4 bundle of it holds it: AWQ scales (if any) folded in, every quantized matrix
    dequantized (a tied embedding, which is also the LM head, among them), an untied embedding rounded to fp16.
    Everything else (config, tokenizer, shapes) is the checkpoint's.

    head_format: the LM head's format where it differs from format (int8 in an int4 bundle), else None; asymmetric:
    the int4 matrices have group minimums (bundle int4_scheme "asymmetric"; an int8 head has none); down_format: the
    FFN down projections' format where it differs from format (int8 in an int4 bundle, without minimums), else None."""

    def __init__(
        self,
        checkpoint: Checkpoint | GgufCheckpoint,
        format: str,
        group_size: int,
        scales: dict[int, LayerScales] | None = None,
        head_format: str | None = None,
        asymmetric: bool = False,
        down_format: str | None = None,
    ):
        self.checkpoint = checkpoint
        self.asymmetric = asymmetric
        self.format = format
        self.group_size = group_size
        self.scales = scales or {}
        self.head_format = head_format
        self.down_format = down_format
        self.lm_head = f"model.{EMBEDDING}" if checkpoint.config.tie_word_embeddings else LM_HEAD  # Hugging Face's name

    def __getattr__(self, name: str):
        return getattr(self.checkpoint, name)

    def is_quantized(self, hf_name: str) -> bool:
        """Whether the bundle stores the tensor as codes and scales (bundle/layout.py)."""
        shape = self.checkpoint.expected_shapes[hf_name]
        return is_quantized_matrix(hf_name.removeprefix("model."), shape, self.checkpoint.config.tie_word_embeddings)

    def scaled_tensor(self, hf_name: str) -> torch.Tensor:
        """fp32, with the AWQ scales folded in: the values the bundle quantizes (or stores, for norms)."""
        tensor = self.checkpoint.tensor(hf_name, torch.float32)
        layer, name = _layer_and_name(hf_name)
        if layer in self.scales:
            tensor = fold_scales(name, tensor, self.scales[layer], self.checkpoint.config)
        return tensor

    def quantized_matrix(self, hf_name: str, neuron_major: bool = False) -> quant.QuantizedMatrix:
        """The codes and scales the bundle stores for a matrix (neuron_major: down_proj transposed, as stored)."""
        weight = self.scaled_tensor(hf_name)
        if neuron_major:
            weight = weight.T.contiguous()
        format = self.matrix_format(hf_name)
        try:
            return quant.quantize(weight.numpy(), format, self.group_size, self.asymmetric and format == "int4")
        except ValueError as error:  # a finite weight too large for the format's fp16 scales
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: tensor '{hf_name}' cannot be stored as {format}: "
                f"{str(error).removeprefix('weight: ')}; export --dtype fp32 or bf16 keeps it"
            ) from None

    def matrix_format(self, hf_name: str) -> str:
        """The format a quantized matrix is stored in: the head's or the down projections' own, if they have one,
        else the bundle's."""
        if hf_name == self.lm_head and self.head_format is not None:
            return self.head_format
        if hf_name.endswith("mlp.down_proj.weight") and self.down_format is not None:
            return self.down_format
        return self.format

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.is_quantized(name):
            # down_proj is quantized neuron-major, so its groups run along the columns of the HF matrix
            neuron_major = name.endswith("mlp.down_proj.weight")
            dequantized = torch.from_numpy(quant.dequantize(self.quantized_matrix(name, neuron_major)))
            tensor = dequantized.T.contiguous() if neuron_major else dequantized
        elif name == f"model.{EMBEDDING}":  # an untied embedding, stored fp16
            tensor = self.checkpoint.tensor(name, torch.float16).float()
        else:
            tensor = self.scaled_tensor(name)
        return tensor if dtype is None else tensor.to(dtype)

    def layer_tensors(self, layer: int, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        prefix = f"model.layers.{layer}."
        for name in self.checkpoint.expected_shapes:
            if name.startswith(prefix):
                yield name[len(prefix) :], self.tensor(name, dtype)


@dataclass
class _LayerInputs:
    """A layer's calibration activations at the four inputs that take scales, in the fp model."""

    attention_input: torch.Tensor  # [N, d]
    attention_output: torch.Tensor  # [N, heads * head_dim], o_proj's input
    ffn_input: torch.Tensor  # [N, d]
    ffn_hidden: torch.Tensor  # [N, D], down_proj's input


def _output_error(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    scale: torch.Tensor,
    format: str,
    group_size: int,
    asymmetric: bool = False,
    neuron_major: bool = False,
):
    """Sum over weights W [out, in] of ||x W^T - (x / s) Q(W s)^T||^2 on inputs x [N, in].

    neuron_major: Q quantizes (W s)^T, as the bundle stores the down projection ([D, d], groups along d), so the
    error is the one of the grid the bundle holds (and in need not be a multiple of group_size)."""
    error = 0.0
    scaled_x = x / scale
    for weight in weights:
        reference = x @ weight.T
        scaled = weight * scale
        if neuron_major:
            dequantized = fake_quantize(scaled.T.contiguous(), format, group_size, asymmetric).T
        else:
            dequantized = fake_quantize(scaled, format, group_size, asymmetric)
        quantized = scaled_x @ dequantized.T
        error += float((quantized - reference).double().square().sum())
    return error


def search_scale(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    format: str,
    group_size: int,
    magnitude: torch.Tensor | None = None,
    asymmetric: bool = False,
    neuron_major: bool = False,
) -> tuple[torch.Tensor, float, dict[float, float]]:
    """The scale s = magnitude^alpha [in] (normalized to a geometric mid-range of 1) of the alpha in AWQ_ALPHAS with
    the least output error of the quantized weights on x [N, in]; also that alpha and the error per alpha.
    magnitude: per input channel, mean|x| unless given. neuron_major: the weights are stored transposed (the FFN
    down projection), see _output_error."""
    magnitude = (x.abs().mean(dim=0) if magnitude is None else magnitude).clamp_min(1e-5)
    sample = x[:: max(1, x.shape[0] // AWQ_SEARCH_TOKENS)][:AWQ_SEARCH_TOKENS]
    errors, candidates = {}, {}
    for alpha in AWQ_ALPHAS:
        scale = magnitude.pow(alpha)
        scale = scale / (scale.max() * scale.min()).sqrt()
        candidates[alpha] = scale
        errors[alpha] = _output_error(sample, weights, scale, format, group_size, asymmetric, neuron_major)
    best = min(errors, key=errors.get)
    return candidates[best], best, errors


@torch.inference_mode()
def _layer_inputs(block, hidden: torch.Tensor, cos, sin, batch_chunks: int = 4) -> tuple[_LayerInputs, torch.Tensor]:
    """The layer's inputs over hidden [C, L, d] and the residual stream after the layer."""
    captured: list[torch.Tensor] = []
    hook = block.self_attn.o_proj.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    attention_inputs, ffn_inputs, ffn_hiddens, after = [], [], [], []
    try:
        for start in range(0, hidden.shape[0], batch_chunks):
            h = hidden[start : start + batch_chunks]
            x = block.input_layernorm(h)
            h = h + block.self_attn(x, cos, sin, 0)
            y = block.post_attention_layernorm(h)
            mlp = block.mlp
            hidden_act = mlp.activation.gate(mlp.gate_proj(y)) * mlp.activation.up(mlp.up_proj(y))
            after.append(h + mlp.down_proj(hidden_act))
            attention_inputs.append(x.flatten(0, 1))
            ffn_inputs.append(y.flatten(0, 1))
            ffn_hiddens.append(hidden_act.flatten(0, 1))
    finally:
        hook.remove()
    inputs = _LayerInputs(
        torch.cat(attention_inputs),
        torch.cat([c.flatten(0, 1) for c in captured]),
        torch.cat(ffn_inputs),
        torch.cat(ffn_hiddens),
    )
    return inputs, torch.cat(after)


def search_awq_scales(
    checkpoint: Checkpoint | GgufCheckpoint,
    chunks: torch.Tensor,
    format: str,
    group_size: int,
    scale_ffn_hidden: bool = True,
    asymmetric: bool = False,
    down_format: str | None = None,
) -> tuple[dict[int, LayerScales], list[dict]]:
    """Per layer, the AWQ scales of its four input groups from the fp model's activations on chunks [C, L] (one
    layer at a time), and a report per layer: the chosen alpha and the output error relative to alpha 0 (RTN).

    scale_ffn_hidden False leaves down's input unscaled (s = 1): the threshold predictor (CHESS) ranks neuron i by
    E|up_i| * |act(gate_i)|, which a per-neuron scale folded into up's rows would reorder (down's norm, which
    takes the scale back, is not in its score). down_format: the down projection's format where it differs from
    format (QuantizedCheckpoint.down_format)."""
    config = checkpoint.config
    hidden = F.embedding(chunks, checkpoint.tensor("model.embed_tokens.weight", torch.float32))  # [C, L, d]
    cos, sin = rope_tables(config.rope, config.head_dim, chunks.shape[1])
    scales, report = {}, []
    for index in range(config.num_layers):
        block = load_layer(checkpoint, index)
        inputs, hidden = _layer_inputs(block, hidden, cos, sin)
        attn, mlp = block.self_attn, block.mlp
        groups = {
            "attention_input": (inputs.attention_input, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            "attention_output": (inputs.attention_output, [attn.o_proj.weight]),
            "ffn_input": (inputs.ffn_input, [mlp.gate_proj.weight, mlp.up_proj.weight]),
            "ffn_hidden": (inputs.ffn_hidden, [mlp.down_proj.weight]),
        }
        chosen, layer_report = {}, {"layer": index}
        for group, (x, weights) in groups.items():
            if group == "ffn_hidden" and not scale_ffn_hidden:
                chosen[group] = torch.ones(x.shape[1])
                continue
            magnitude = _kv_shared_magnitude(x, config) if group == "attention_output" else None
            group_format = down_format if group == "ffn_hidden" and down_format is not None else format
            # down_proj is stored neuron-major (its groups run along d, QuantizedCheckpoint.tensor): search on that grid
            chosen[group], alpha, errors = search_scale(
                x,
                [w.float() for w in weights],
                group_format,
                group_size,
                magnitude,
                asymmetric,
                neuron_major=group == "ffn_hidden",
            )
            layer_report[group] = {"alpha": alpha, "error_vs_rtn": errors[alpha] / max(errors[0.0], 1e-300)}
        scales[index] = LayerScales(**chosen)
        report.append(layer_report)
        del block, inputs
    return scales, report


def _kv_shared_magnitude(x: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """mean|x| per channel of o_proj's input x [N, heads * head_dim], averaged over the query heads that share a kv
    head, so the scale is equal across the channels the fold divides out of one v row (query head h reads kv head
    h // group, as scaled_dot_product_attention's enable_gqa repeats them)."""
    group = config.num_heads // config.num_kv_heads
    magnitude = x.abs().mean(dim=0).view(config.num_kv_heads, group, config.head_dim).mean(dim=1, keepdim=True)
    return magnitude.expand(-1, group, -1).flatten()
