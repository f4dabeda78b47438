"""What a predictor kind is: its torch-free description (PredictorKind's fields) and the behaviour every kind
implements (PredictorKind's methods), each kind overriding what it does differently.

The description is what the device runtime reads (bundle readers, the C kind table). The behaviour runs where
torch or onnx is installed -- calibration, the exporter's graphs, the torch engines -- and each method imports
what it needs when it runs, so describing a kind costs no torch.

Tensor shapes are written in the bundle's sizes: d (hidden size), D (intermediate size), levels (the calibrated
levels' count), rank (an svd layer's rank, read from its stored `svd.a`), words (= ceil(d / 32)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge_sdk.errors import CalibrationError

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import torch

    from edge_sdk.bundle.manifest import SparsityConfig
    from edge_sdk.export.graph import GraphBuilder
    from edge_sdk.export.graph import _Context as StepContext
    from edge_sdk.model.activation import Activation
    from edge_sdk.model.config import ModelConfig
    from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights
    from edge_sdk.sparsity.settings import CalibrationSettings
    from edge_sdk.sparsity.sparse_model import LayerPredictor

# One decode token's predictor result for an engine: the predicted-active mask [D] (None: every neuron a candidate)
# and the CHESS thresholds [D] (None: no threshold condition).
MaskAndThresholds = tuple["torch.Tensor | None", "torch.Tensor | None"]


@dataclass(frozen=True)
class StoredTensor:
    """One tensor a predictor stores per layer, as `layers.{i}.{kind}.{name}`."""

    name: str
    dtype: str  # safetensors dtype
    shape: tuple[str | int, ...]  # symbols d, D, levels, rank, words, or fixed sizes
    finite: bool = False  # every value must be finite (readers refuse a bundle where one is not); F32 only
    # a low-rank factor: stored in the bundle's predictor factor dtype (bundle/format.py predictor_factor_dtype, F16
    # in bundles whose weights are not fp32) instead of dtype; F32 only
    factor: bool = False

    def __post_init__(self) -> None:
        if (self.finite or self.factor) and self.dtype != "F32":
            raise ValueError(f"stored tensor {self.name}: finite and factor apply to F32 tensors, found {self.dtype}")


def check_fraction(name: str, value: float, low_open: bool = False) -> None:
    """CalibrationError unless value is a number in [0, 1] ((0, 1] with low_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= 1):
        raise CalibrationError(f"{name} must be a number in [0, 1], found {value!r}")
    if low_open and value == 0:
        raise CalibrationError(f"{name} must be in (0, 1], found {value!r}")


def capacity(rows: str | int) -> StoredTensor:
    """Every kind stores the 99th percentile of its per-token predicted-active count, for static-shape executors."""
    return StoredTensor("capacity", "I32", (rows,))


@dataclass(frozen=True)
class PredictorKind:
    """A predictor kind: its description (fields) and its behaviour (methods; the defaults are "no predictor")."""

    name: str
    paper: str
    has_levels: bool  # calibrated at several model-wide sparsity levels, one row per level
    relu_only: bool  # needs exact zeros from the gate activation (relu, fatrelu, drelu)
    tensors: tuple[StoredTensor, ...] = field(default=())
    calibrated: bool = True  # fitted on calibration text ("none" is not)
    fixed_at_prefill: bool = False  # the mask is chosen from the prompt and held for the whole decode (core)
    gate_first: bool = True  # no mask before the gate: the gate runs densely, then thresholds select (if any)
    ranks_by_up: bool = False  # the fit ranks neurons by their up activations (AWQ must not rescale the hidden)
    # the CalibrationSettings fields of this kind's own knobs: every kind's are recorded, only this kind reads them
    knobs: tuple[str, ...] = ()

    # --- calibration (torch) ------------------------------------------------------------------------------------

    def check_settings(self, settings: CalibrationSettings, config: ModelConfig) -> None:
        """Raise CalibrationError for a knob of this kind out of range (every kind's knobs are recorded, so every
        kind checks its own whichever predictor is chosen)."""

    def fit(
        self,
        acts: LayerActivations,
        weights: LayerWeights,
        settings: CalibrationSettings,
        config: ModelConfig,
        factor_dtype: str = "F32",
    ) -> FittedLayer:
        """The layer's predictor fitted on its calibration activations; factor_dtype: the dtype the bundle stores
        the kind's low-rank factors in (StoredTensor.factor), which the fit calibrates with. A kind that is not
        calibrated has nothing to fit (validate_settings refuses it before any work starts; this is the same refusal
        for a direct call)."""
        raise CalibrationError(f"predictor {self.name!r} is not calibrated: it has nothing to fit")

    # --- the torch reference (sparsity/sparse_model.py) -----------------------------------------------------------

    def prefill_mask(self, predictor: LayerPredictor, gate: torch.Tensor) -> torch.Tensor | None:
        """gate [B, S, D] float32 activations of a prompt -> the decode's fixed mask [B, D] (fixed_at_prefill)."""
        return None

    def decode_mask(
        self, predictor: LayerPredictor, tokens: torch.Tensor, level_index: int, prefill_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """tokens [T, d] -> (predicted-active mask [T, D] bool or None for every neuron, thresholds [D] or None)."""
        return None, None

    def decision_margins(
        self,
        predictor: LayerPredictor,
        x: torch.Tensor,
        level_index: int,
        thresholds: torch.Tensor | None,
        w_gate: torch.Tensor,
        activation: Activation,
    ) -> torch.Tensor | None:
        """Each neuron's mask decision value over the magnitude its rounding error scales with ([D]) for token x
        [d]; None when the decisions have no floating-point boundary."""
        return None

    # --- engines: the CPU backend's torch engine (C kernels) and the gather executor (CANN path) ---------------

    def native_masker(self, predictor: LayerPredictor, kernels: Any) -> Callable[..., MaskAndThresholds]:
        """A function (token [d] float32, level_index, prefill_row [D] or None) -> (mask, thresholds) for one decode
        token, computed by the C predictor kernels (backends/cpu/kernels.py) where the kind has one."""
        return lambda token, level_index, prefill_row: (None, None)

    def device_scorer(
        self, predictor: LayerPredictor, d: int, device: torch.device
    ) -> Callable[..., torch.Tensor] | None:
        """A function (x [d], level_index, prefill_row [D] or None) -> scores [D] float32 on device, positive
        exactly where the kind predicts a neuron active; None for gate_first kinds."""
        return None

    def device_thresholds(self, predictor: LayerPredictor, device: torch.device) -> torch.Tensor | None:
        """[levels, D] float32 thresholds on device, applied after the gate; None when the kind has none."""
        return None

    # --- the exporter's graphs (export/graph.py) ------------------------------------------------------------------

    def graph_attributes(self, tensor: Callable[[str], torch.Tensor]) -> dict[str, float]:
        """A layer's node attributes read from its fitted tensors (tensor(name) -> the layer's `{kind}.{name}`)."""
        return {}

    def decode_inputs(self, config: ModelConfig) -> list[onnx.ValueInfoProto]:
        """The decode graph's inputs this kind adds."""
        return []

    def emit_prompt_outputs(
        self, g: GraphBuilder, layer: int, gate: str, rows: str, ctx: StepContext, outputs: list
    ) -> None:
        """Outputs a prompt's dense FFN adds for this kind, from its gate activations gate [T, D] (rows: [1] = T)."""

    def emit_step_mask(
        self, g: GraphBuilder, layer: int, x2d: str, prompt_rows: str, ctx: StepContext
    ) -> tuple[str, str | None]:
        """The decode step's int32 mask [T, D] for SparseFFN and its thresholds [D] (None: no such input)."""
        return g.every_neuron_mask(x2d), None

    # --- runtimes that run the graphs (ONNX Runtime, TensorRT) ----------------------------------------------------

    def decode_feed(self, prompt_outputs: dict[str, np.ndarray], sparsity: SparsityConfig) -> dict[str, np.ndarray]:
        """The decode graph's inputs this kind adds, from a prompt's outputs (emit_prompt_outputs)."""
        return {}
