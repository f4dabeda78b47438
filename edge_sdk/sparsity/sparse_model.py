"""The torch reference of a sparse decoder: dense prefill, predictor + SparseFFN at decode.

Every exported graph and every backend is compared against this: it puts the predictor semantics of
DESIGN.md 3.2 in front of sparsity/ffn.py's sequential SparseFFN, per layer, inside the reference
decoder. What each predictor kind computes is its kind's (edge_sdk/predictors/<kind>.py); predictor tensors use the
names its kind stores (`svd.a`, `signbit.packed`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from edge_sdk import predictors
from edge_sdk.model.activation import Activation
from edge_sdk.model.decoder import Decoder
from edge_sdk.predictors.core import CoreSettings
from edge_sdk.sparsity.ffn import sparse_ffn


@dataclass
class LayerPredictor:
    """One layer's predictor: its kind's name, tensors (without the `layers.{i}.` prefix) and scalar settings."""

    kind: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    core_alpha: float = CoreSettings.alpha
    core_beta: float = CoreSettings.beta


class SparseFeedForward(nn.Module):
    """A gated FFN that runs dense during prefill and through its predictor + SparseFFN during decode."""

    def __init__(
        self,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down_t: torch.Tensor,
        activation: Activation,
        predictor: LayerPredictor,
    ):
        super().__init__()
        self.w_gate, self.w_up, self.w_down_t = w_gate, w_up, w_down_t  # [D, d] each
        self.activation = activation
        self.predictor = predictor
        self.kind = predictors.kind(predictor.kind)
        self.phase = "prefill"
        self.level_index = 0
        self.dense = False
        self.prefill_mask: torch.Tensor | None = None  # [B, D], chosen at prefill by a kind fixed_at_prefill
        self.last_active: torch.Tensor | None = None  # [T, D] neurons that reached up/down at the last decode
        # Near-tie bookkeeping for comparing implementations (export/verify.py): with tie_tolerance set, each decode
        # records the mask decisions within that relative margin of their boundary; flipped names neurons whose
        # decision the next decode (only) takes the other way, as another summation order may have rounded them.
        self.tie_tolerance: float | None = None
        self.near_ties: list[tuple[int, float]] = []  # (neuron, relative margin) of token 0 at the last decode
        self.flipped: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d] -> [B, S, d] in x's dtype
        if self.phase == "prefill":
            return self._prefill(x)
        tokens = x.reshape(-1, x.shape[-1])  # [T = B*S, d]
        mask, thresholds = self._decode_mask(tokens)
        if self.tie_tolerance is not None:
            self.near_ties = self._near_ties(tokens[0], thresholds)
        if self.flipped:
            mask, thresholds = self._flip(tokens, mask, thresholds), None
            self.flipped = frozenset()
        result = sparse_ffn(tokens, self.w_gate, self.w_up, self.w_down_t, mask, self.activation, thresholds=thresholds)
        self.last_active = result.active
        return result.output.to(x.dtype).view_as(x)

    def _prefill(self, x: torch.Tensor) -> torch.Tensor:
        # weights stored in half precision are cast for the prompt's GEMMs (a no-op when dtypes match)
        gate = self.activation.gate(x @ self.w_gate.to(x.dtype).T)  # [B, S, D]
        hidden = gate * self.activation.up(x @ self.w_up.to(x.dtype).T)
        self.prefill_mask = self.kind.prefill_mask(self.predictor, gate)
        return hidden @ self.w_down_t.to(x.dtype)

    def _decode_mask(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The predictor's mask [T, D] for decode tokens [T, d], and CHESS thresholds [D] if any."""
        n_tokens, n_neurons = tokens.shape[0], self.w_gate.shape[0]
        if self.dense:
            return torch.ones(n_tokens, n_neurons, dtype=torch.bool), None
        mask, thresholds = self.kind.decode_mask(self.predictor, tokens, self.level_index, self.prefill_mask)
        if mask is None:
            mask = torch.ones(n_tokens, n_neurons, dtype=torch.bool)
        return mask, thresholds

    def _decision_margins(self, x: torch.Tensor, thresholds: torch.Tensor | None) -> torch.Tensor | None:
        """Each neuron's mask decision value over the magnitude its rounding error scales with ([D]), for token x
        [d]; None when this predictor's decisions have no floating-point boundary (core, signbit's integer
        counts, dense): the kind's decision_margins."""
        if self.dense:
            return None
        return self.kind.decision_margins(
            self.predictor, x.float(), self.level_index, thresholds, self.w_gate, self.activation
        )

    def _near_ties(self, x: torch.Tensor, thresholds: torch.Tensor | None) -> list[tuple[int, float]]:
        margins = self._decision_margins(x, thresholds)
        if margins is None:
            return []
        close = torch.nonzero(margins < self.tie_tolerance).flatten()
        return sorted(((int(i), float(margins[i])) for i in close), key=lambda tie: tie[1])

    def _flip(self, tokens: torch.Tensor, mask: torch.Tensor, thresholds: torch.Tensor | None) -> torch.Tensor:
        """The mask with the flipped neurons' decisions inverted; a threshold condition is folded into the mask
        first (mask & (a != 0) & |a| > t is what sparse_ffn would compute from it)."""
        if thresholds is not None:
            gate = self.activation.gate(tokens.float() @ self.w_gate.to(torch.float32).T)
            mask = mask & (gate.abs() > thresholds.float())
        flips = torch.zeros(mask.shape[-1], dtype=torch.bool)
        flips[list(self.flipped)] = True
        return mask ^ flips


class SparseDecoder:
    """A reference Decoder whose FFNs are SparseFeedForward modules; prefill and decode like the Decoder."""

    def __init__(
        self,
        decoder: Decoder,
        predictors: list[LayerPredictor],
        ffn_class: Callable[..., SparseFeedForward] = SparseFeedForward,
    ):
        if len(predictors) != len(decoder.layers):
            raise ValueError(f"expected {len(decoder.layers)} layer predictors, found {len(predictors)}")
        self.decoder = decoder
        self.ffns = []
        for layer, predictor in zip(decoder.layers, predictors, strict=True):
            mlp = layer.mlp
            ffn = ffn_class(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.T, mlp.activation, predictor)
            layer.mlp = ffn
            self.ffns.append(ffn)

    def configure(self, level_index: int = 0, dense: bool = False) -> None:
        """Choose the calibrated sparsity level (index into the bundle's levels) or dense decoding."""
        for ffn in self.ffns:
            ffn.level_index, ffn.dense = level_index, dense

    def _set_phase(self, phase: str) -> None:
        for ffn in self.ffns:
            ffn.phase = phase

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] -> logits [B, S, V]; dense FFNs (core predictors pick their neurons here)."""
        self._set_phase("prefill")
        return self.decoder.prefill(ids)

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, 1] -> logits [B, 1, V] through the predictors and the sparse FFNs."""
        self._set_phase("decode")
        return self.decoder.decode(ids)

    def reset(self) -> None:
        self.decoder.reset()
        for ffn in self.ffns:
            ffn.prefill_mask = None
