"""Reference semantics of the sparse gated FFN (DESIGN 3.1): every other implementation is tested against this.

A gated FFN computes y = W_down (act.gate(W_gate x) * act.up(W_up x)). Weights are stored neuron-major:
w_gate, w_up: [D, d] and w_down_t = W_down^T: [D, d], so neuron i owns row i of all three.

Given a predictor mask m over the D neurons, two pipelines decide which neurons reach up/down:

- sequential (SVDP, SparseInfer): the gate is computed for the neurons in m; a neuron whose activated gate
  is exactly zero is a false positive of the predictor and is dropped before up/down.
- parallel (PowerInfer): gate and up are both computed for every neuron in m, no false-positive check.

Optional CHESS thresholds t[D] additionally require |act.gate(g_i)| > t_i in both pipelines.

Both pipelines give the same output (a dropped neuron contributes a_i * u_i = 0); they differ in which
neurons count as `active`, i.e. which rows of W_up / W_down a kernel must read. The math here is masked
dense fp32 math: readable and deterministic, not fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_sdk.model.activation import Activation

PIPELINES = ("sequential", "parallel")


@dataclass
class FFNResult:
    """What a sparse FFN step produced. Shapes are [T, ...] for [T, d] input and drop T for [d] input."""

    output: torch.Tensor  # [T, d] float32
    computed_gate: torch.Tensor  # [T, D] bool: neurons whose gate dot-product was computed (the mask)
    active: torch.Tensor  # [T, D] bool: neurons that reached up/down


def _as_tokens(x: torch.Tensor, d: int) -> torch.Tensor:
    """x: [T, d] or [d] -> [T, d] float32."""
    if x.dim() not in (1, 2) or x.shape[-1] != d:
        raise ValueError(f"x: expected shape [T, {d}] or [{d}], found {list(x.shape)}")
    return x.reshape(-1, d).to(torch.float32)


def _check_weights(w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor | None = None) -> None:
    if w_gate.dim() != 2:
        raise ValueError(f"w_gate: expected shape [D, d], found {list(w_gate.shape)}")
    named = {"w_up": w_up} if w_down_t is None else {"w_up": w_up, "w_down_t": w_down_t}
    for name, w in named.items():
        if w.shape != w_gate.shape:
            raise ValueError(f"{name}: expected shape {list(w_gate.shape)} (same as w_gate), found {list(w.shape)}")


def ffn_intermediates(
    x: torch.Tensor,  # [T, d] or [d]
    w_gate: torch.Tensor,  # [D, d]
    w_up: torch.Tensor,  # [D, d]
    activation: Activation,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense activated gate and up projections in fp32: (act.gate(W_gate x), act.up(W_up x)), each [T, D].

    Weights of any float dtype are upcast to fp32 first, so fp16 weights give fp32 math on their fp16 values.
    A [d] input gives [D] outputs.
    """
    _check_weights(w_gate, w_up)
    xt = _as_tokens(x, w_gate.shape[1])
    gate_act = activation.gate(xt @ w_gate.to(torch.float32).T)
    up_act = activation.up(xt @ w_up.to(torch.float32).T)
    if x.dim() == 1:
        return gate_act[0], up_act[0]
    return gate_act, up_act


def dense_ffn(
    x: torch.Tensor,  # [T, d] or [d]
    w_gate: torch.Tensor,  # [D, d]
    w_up: torch.Tensor,  # [D, d]
    w_down_t: torch.Tensor,  # [D, d], W_down transposed
    activation: Activation,
) -> torch.Tensor:
    """The dense gated FFN, y = (act.gate(W_gate x) * act.up(W_up x)) W_down^T, in fp32: [T, d] or [d]."""
    _check_weights(w_gate, w_up, w_down_t)
    gate_act, up_act = ffn_intermediates(x, w_gate, w_up, activation)
    return (gate_act * up_act) @ w_down_t.to(torch.float32)


def sparse_ffn(
    x: torch.Tensor,  # [T, d] or [d]
    w_gate: torch.Tensor,  # [D, d]
    w_up: torch.Tensor,  # [D, d]
    w_down_t: torch.Tensor,  # [D, d], W_down transposed
    mask: torch.Tensor,  # [T, D] or [D] bool, the predictor's mask ([D] applies to every token)
    activation: Activation,
    *,
    pipeline: str = "sequential",
    thresholds: torch.Tensor | None = None,  # [D] CHESS per-channel thresholds on |act.gate(g)|
) -> FFNResult:
    """One sparse FFN step with the predictor's mask, as DESIGN 3.1 defines it.

    sequential: active = mask & (a != 0) [& |a| > t]; parallel: active = mask [& |a| > t], where
    a = act.gate(W_gate x). Output y = sum over active neurons i of a_i * act.up(W_up_i . x) * w_down_t[i],
    in fp32. An all-ones mask reproduces dense_ffn.
    """
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline: expected one of {', '.join(PIPELINES)}, found {pipeline!r}")
    _check_weights(w_gate, w_up, w_down_t)
    n_neurons, d = w_gate.shape
    xt = _as_tokens(x, d)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected a bool tensor, found {mask.dtype}")
    valid_mask_shapes = ([n_neurons],) if x.dim() == 1 else ([n_neurons], [xt.shape[0], n_neurons])
    if list(mask.shape) not in valid_mask_shapes:
        raise ValueError(f"mask: expected shape {' or '.join(map(str, valid_mask_shapes))}, found {list(mask.shape)}")
    if thresholds is not None and list(thresholds.shape) != [n_neurons]:
        raise ValueError(f"thresholds: expected shape [{n_neurons}], found {list(thresholds.shape)}")

    computed_gate = mask.expand(xt.shape[0], n_neurons).clone()  # [T, D]
    gate_act, up_act = ffn_intermediates(xt, w_gate, w_up, activation)  # [T, D] each
    gate_act = torch.where(computed_gate, gate_act, torch.zeros_like(gate_act))
    active = computed_gate & (gate_act != 0) if pipeline == "sequential" else computed_gate.clone()
    if thresholds is not None:
        active &= gate_act.abs() > thresholds.to(torch.float32)
    hidden = torch.where(active, gate_act * up_act, torch.zeros_like(gate_act))  # [T, D]
    output = hidden @ w_down_t.to(torch.float32)  # [T, d]
    if x.dim() == 1:
        return FFNResult(output=output[0], computed_gate=computed_gate[0], active=active[0])
    return FFNResult(output=output, computed_gate=computed_gate, active=active)
