"""none: no predictor. Every neuron is a candidate at every decode step; the FFN still skips the rows of neurons
whose gate activation is zero (the sequential pipeline, DESIGN 3.1). Nothing is calibrated or stored."""

from __future__ import annotations

from edge_sdk.predictors.kind import PredictorKind

KIND = PredictorKind("none", "", has_levels=False, relu_only=False, calibrated=False)
