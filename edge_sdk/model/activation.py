"""The gated-FFN activations edge-sdk understands, as one small value type.

A gated FFN computes h = gate_act(W_gate x) * up_act(W_up x). ReLU-family activations make most of h
exactly zero, which is what the sparse kernels exploit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SUPPORTED_ACTIVATIONS = ("relu", "fatrelu", "drelu", "silu")


@dataclass(frozen=True)
class Activation:
    """kind: relu | fatrelu | drelu | silu; threshold: fatrelu's cut-off (g > threshold keeps g)."""

    kind: str
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"activation kind {self.kind!r} is not one of {', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.kind == "fatrelu" and self.threshold < 0:
            raise ValueError(f"fatrelu threshold must be >= 0, got {self.threshold}")

    @property
    def is_relu_family(self) -> bool:
        """True when the gate activation outputs exact zeros (the predictors need this)."""
        return self.kind != "silu"

    def gate(self, g: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        if self.kind == "silu":
            return F.silu(g)
        if self.kind == "fatrelu":
            return torch.where(g > self.threshold, g, torch.zeros_like(g))
        return F.relu(g)

    def up(self, u: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.relu(u) if self.kind == "drelu" else u
