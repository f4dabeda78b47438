"""verify's comparison at mask decisions that sit on their boundary.

ONNX Runtime is replaced here by a second torch reference that takes one chosen decision the other way at one
step, which is what a different summation order does to a decision within rounding of its threshold. The check
must name that exact decision when it is a near-tie, and must refuse the same difference when it is not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edge_sdk.export.verify as verify
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder

STEPS = 6
FLIP_STEP = 3
# (bundle, level, CHESS threshold put in every neuron's row): the fixture is ReLU, its calibrated thresholds are 0
# at both levels (below its own sparsity), which adds no decision to test, so the threshold case sets its own
CASES = [("svd-fp32", 0.5, None), ("threshold-fp32", 0.5, 0.05)]


def _reference_loader(threshold: float | None):
    def load(bundle):
        reference = load_reference_decoder(bundle)
        if threshold is not None:
            for ffn in reference.ffns:
                rows = ffn.predictor.tensors["threshold.thresholds"]
                ffn.predictor.tensors["threshold.thresholds"] = torch.full_like(rows, threshold)
        return reference

    return load


def _at_flip_step(bundle, ids, level: float):
    """The reference after decode step FLIP_STEP with every decision's margin recorded, its logits and the
    token that step was fed."""
    reference = _FlippingSession.load(bundle)
    configure(reference, bundle.sparsity.resolve(level, False))
    for ffn in reference.ffns:
        ffn.tie_tolerance = float("inf")
    logits = reference.prefill(torch.tensor([ids]))[0, -1]
    for _ in range(FLIP_STEP + 1):
        token = int(logits.argmax())
        logits = reference.decode(torch.tensor([[token]]))[0, -1]
    return reference, logits, token


def _candidates(bundle, ids, level: float) -> list[tuple[float, int, int]]:
    """(margin, layer, neuron) of the decisions at FLIP_STEP whose inversion moves the logits by more than
    verify's tolerance (a predicted-active ReLU neuron that is 0 anyway moves nothing), nearest first."""
    reference, logits, token = _at_flip_step(bundle, ids, level)
    ranked = sorted(
        (margin, layer, neuron) for layer, ffn in enumerate(reference.ffns) for neuron, margin in ffn.near_ties
    )
    decisive = []
    for margin, layer, neuron in ranked[:100] + ranked[-100:]:
        reference.ffns[layer].flipped = frozenset({neuron})
        reference.decoder.position -= 1
        retaken = reference.decode(torch.tensor([[token]]))[0, -1]
        if (retaken - logits).abs().max().item() > verify.LOGITS_TOLERANCE:
            decisive.append((margin, layer, neuron))
    return decisive


class _FlippingSession:
    """Stands in for OrtBundleSession: the reference with one decision inverted at one decode step."""

    flip: tuple[int, int] = (0, 0)
    load = staticmethod(load_reference_decoder)

    def __init__(self, bundle, level=None, dense=False):
        self.reference = self.load(bundle)
        configure(self.reference, bundle.sparsity.resolve(level, dense))
        self.step = 0

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        return self.reference.prefill(torch.from_numpy(ids)).numpy()

    def decode(self, ids: np.ndarray) -> np.ndarray:
        if self.step == FLIP_STEP:
            layer, neuron = self.flip
            self.reference.ffns[layer].flipped = frozenset({neuron})
        self.step += 1
        return self.reference.decode(torch.from_numpy(ids)).numpy()


@pytest.fixture(scope="module", params=CASES, ids=[name for name, _, _ in CASES])
def case(request, bundle_matrix):
    name, level, threshold = request.param
    bundle = bundle_matrix[name]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_FlippingSession, "load", staticmethod(_reference_loader(threshold)))
        patch.setattr(verify, "load_reference_decoder", _reference_loader(threshold))
        ids = Tokenizer.from_bundle(bundle).encode(verify.DEFAULT_PROMPT)
        yield bundle, ids, level, _candidates(bundle, ids, level)


def test_a_flipped_near_tie_is_found_and_followed(case, monkeypatch):
    bundle, ids, level, candidates = case
    margin, layer, neuron = candidates[0]
    # the chosen decision counts as a near-tie, and only the ones as close as it do (those that move nothing
    # included, which verify tries first and must pass over)
    monkeypatch.setattr(verify, "TIE_TOLERANCE", margin * 1.0001)
    monkeypatch.setattr(verify, "MAX_TIES_TRIED", 100)
    monkeypatch.setattr(verify, "OrtBundleSession", _FlippingSession)
    _FlippingSession.flip = (layer, neuron)
    result = verify._compare(bundle, ids, level, False, STEPS)
    assert result["near_ties"] == [f"step {FLIP_STEP}: layer {layer} neuron {neuron} (relative margin {margin:.2g})"]
    assert result["max_diff"] <= verify.LOGITS_TOLERANCE  # the reference followed the flip for the later steps
    assert result["reference"] == result["ort"]


def test_the_same_flip_is_refused_when_the_decision_was_not_close(case, monkeypatch):
    bundle, ids, level, candidates = case
    margin, layer, neuron = candidates[-1]
    assert margin > verify.TIE_TOLERANCE
    monkeypatch.setattr(verify, "OrtBundleSession", _FlippingSession)
    _FlippingSession.flip = (layer, neuron)
    result = verify._compare(bundle, ids, level, False, STEPS)
    assert result["near_ties"] == []
    assert result["max_diff"] > verify.LOGITS_TOLERANCE
