"""The predictor kinds, each described once: name, whether it is calibrated at several sparsity levels, which
FFN activations it serves, its default settings, and the tensors it stores in a bundle.

Everything else derives from this table: the CLI's choices, the exporter, the bundle reader's expected tensors
and the C runtime's kind table (jetson/src/predictor_kinds.{h,c}, generated from it by `python -m
edge_sdk.predictors.c_table jetson/src`; tests/bundle/test_predictor_kinds.py fails when they are stale). It
imports no torch: the device runtime reads it too.

Tensor shapes are written in the bundle's sizes: d (hidden size), D (intermediate size), levels (the calibrated
levels' count), rank (an svd layer's rank, read from its stored `svd.a`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_PREDICTOR = "none"


@dataclass(frozen=True)
class StoredTensor:
    """One tensor a predictor stores per layer, as `layers.{i}.{kind}.{name}`."""

    name: str
    dtype: str  # safetensors dtype
    shape: tuple[str | int, ...]  # symbols d, D, levels, rank, words (= ceil(d / 32)), or fixed sizes


@dataclass(frozen=True)
class CoreSettings:
    """SparseInfer (semantic) core neurons: per prompt token its top `alpha` share of positive activations, counted
    per neuron over the prompt; the top `beta` share of neurons is the decode's fixed mask."""

    alpha: float = 0.4
    beta: float = 0.2


@dataclass(frozen=True)
class PredictorKind:
    name: str
    paper: str
    has_levels: bool  # calibrated at several model-wide sparsity levels, one row per level
    relu_only: bool  # needs exact zeros from the gate activation (relu, fatrelu, drelu)
    tensors: tuple[StoredTensor, ...] = field(default=())


def _capacity(rows: str | int) -> StoredTensor:
    # every kind stores the 99th percentile of its per-token predicted-active count, for static-shape executors
    return StoredTensor("capacity", "I32", (rows,))


KINDS: dict[str, PredictorKind] = {
    "svd": PredictorKind(
        "svd",
        "SVDP",
        has_levels=True,
        relu_only=True,
        tensors=(
            StoredTensor("a", "F32", ("D", "rank")),
            StoredTensor("b", "F32", ("rank", "d")),
            StoredTensor("biases", "F32", ("levels", "D")),
            _capacity("levels"),
        ),
    ),
    "signbit": PredictorKind(
        "signbit",
        "SparseInfer (Jetson)",
        has_levels=False,
        relu_only=True,
        tensors=(StoredTensor("packed", "I32", ("D", "words")), StoredTensor("alpha", "F32", (1,)), _capacity(1)),
    ),
    "core": PredictorKind("core", "SparseInfer (semantic)", has_levels=False, relu_only=True, tensors=(_capacity(1),)),
    "threshold": PredictorKind(
        "threshold",
        "CHESS",
        has_levels=True,
        relu_only=False,
        tensors=(StoredTensor("thresholds", "F32", ("levels", "D")), _capacity("levels")),
    ),
    NO_PREDICTOR: PredictorKind(NO_PREDICTOR, "", has_levels=False, relu_only=False),
}
CALIBRATED_KINDS = tuple(name for name in KINDS if name != NO_PREDICTOR)
LEVEL_KINDS = tuple(name for name, kind in KINDS.items() if kind.has_levels)
DEFAULT_CORE = CoreSettings()


def kind(name: str) -> PredictorKind:
    """The kind called name; KeyError names the known kinds."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"predictor {name!r} is not one of {', '.join(KINDS)}") from None


def tensor_name(layer: int, kind_name: str, tensor: str) -> str:
    return f"layers.{layer}.{kind_name}.{tensor}"
