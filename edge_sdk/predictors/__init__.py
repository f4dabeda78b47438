"""The predictor kinds: one module per kind, and this registry of them.

A kind's module (svd.py, signbit.py, core.py, threshold.py, none.py) holds everything about it: its name, whether it
is calibrated at several sparsity levels, which FFN activations it serves, the tensors it stores in a bundle, its
calibration knobs with their defaults (a settings dataclass), its fit, its torch masks (the reference, the C
kernels' and the gather executor's) and its ONNX emission. Everything else derives from KINDS: the CLI's choices,
the calibration, the exporter and its graphs, the torch engines, the bundle readers' expected tensors, and the C
runtime's kind table (jetson/src/predictor_kinds.{h,c}, generated from it by `python -m
edge_sdk.predictors.c_table jetson/src`; tests/bundle/test_predictor_kinds.py fails when they are stale). Adding a
kind to the Python side means adding its module and naming it below; a kind with knobs of its own also records them
as CalibrationSettings fields (sparsity/settings.py: the record's fields are a format, in a fixed order) and names
them in its `knobs` (the CLI refuses a knob the chosen kind does not read), and the
native engines (the C runtime's decoder, the TensorRT plugins) implement each kind's kernels themselves.

Why one module per kind can serve the device runtime, which has neither torch nor onnx: a kind is a PredictorKind
(kind.py) whose fields are the torch-free description the bundle readers and the C table need, and whose methods
are the behaviour; a method imports torch, onnx or the calibration code when it runs, never when its module is
imported. So `import edge_sdk.predictors` loads the descriptions only, and the behaviour is reached only from the
calibration, the exporter and the torch engines, which have the `export` extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_sdk.predictors import core, none, signbit, svd, threshold
from edge_sdk.predictors.kind import PredictorKind

if TYPE_CHECKING:
    from edge_sdk.model.activation import Activation

NO_PREDICTOR = none.KIND.name
AUTO = "auto"  # the CLI's default --predictor: default_kind of the model's FFN activation

# In this order: the CLI lists them so, and the C enum numbers them so.
KINDS: dict[str, PredictorKind] = {
    kind.name: kind for kind in (svd.KIND, signbit.KIND, core.KIND, threshold.KIND, none.KIND)
}
CALIBRATED_KINDS = tuple(name for name, kind in KINDS.items() if kind.calibrated)
LEVEL_KINDS = tuple(name for name, kind in KINDS.items() if kind.has_levels)


def kind(name: str) -> PredictorKind:
    """The kind called name; KeyError names the known kinds."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"predictor {name!r} is not one of {', '.join(KINDS)}") from None


# what a kind with relu_only needs, in every refusal of one for a model without it
NEEDS_EXACT_ZEROS = "a ReLU-family FFN (relu, fatrelu, drelu) whose inactive neurons are exact zeros"


def serves(name: str, activation: Activation) -> bool:
    """Whether kind name can predict this FFN activation (a kind needing exact zeros serves only the ReLU family)."""
    return not kind(name).relu_only or activation.is_relu_family


def default_kind(activation: Activation) -> str:
    """The predictor fitted when none is named: SVDP (svd) where inactive neurons are exact zeros, the ReLU family;
    CHESS channel-wise thresholds (threshold) for SiLU, whose neurons are never exactly zero."""
    return svd.KIND.name if activation.is_relu_family else threshold.KIND.name


def tensor_name(layer: int, kind_name: str, tensor: str) -> str:
    return f"layers.{layer}.{kind_name}.{tensor}"
