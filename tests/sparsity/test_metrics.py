"""Predictor metrics (SVDP): hand-computed sparsities and recalls, exact AUROC, eq. 5, and the report PNG."""

import math

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.sparsity import metrics
from edge_sdk.sparsity.metrics import layer_metrics, multiply_count, roc_auc
from edge_sdk.sparsity.report import write_report_plot

TRULY = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
PREDICTED = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
IMPORTANCE = torch.tensor([[1.0, 3.0, 9.0, 9.0], [2.0, 9.0, 9.0, 9.0]])
SCORES = torch.tensor([[0.9, 0.1, 0.8, 0.1], [0.7, 0.5, 0.2, 0.1]])


def test_hand_computed_layer():
    result = layer_metrics(TRULY, PREDICTED, IMPORTANCE, SCORES, rank=2, d=8)
    assert result["true_sparsity"] == pytest.approx(5 / 8)  # 3 of 8 pairs truly active
    assert result["predicted_sparsity"] == pytest.approx(4 / 8)
    assert result["realized_sparsity"] == pytest.approx(6 / 8)  # predicted & true: 2 pairs
    assert result["recall"] == pytest.approx(2 / 3)
    assert result["importance_weighted_recall"] == pytest.approx((1 + 2) / (1 + 3 + 2))
    # positives 0.9, 0.1, 0.7 vs negatives 0.8, 0.1, 0.5, 0.2, 0.1: wins 5 + (0 + 2 ties / 2) + 4 = 10 of 15
    assert result["auroc"] == pytest.approx(10 / 15)
    # r(d + D) + d(1 - s)D + 2d(1 - s')D = 2*12 + 8*0.5*4 + 2*8*0.25*4 = 56 of 3*8*4 = 96
    assert result["multiply_count_ratio"] == pytest.approx(56 / 96)
    assert all(type(value) is float for value in result.values())


def test_given_true_totals_are_used_and_equal_the_computed_ones():
    """A layer's levels share its truly active count and mass, which the pipeline passes in rather than
    recounting them per level: the result is the same to the bit, and the given totals are the ones used."""
    computed = layer_metrics(TRULY, PREDICTED, IMPORTANCE, rank=2, d=8)
    assert layer_metrics(TRULY, PREDICTED, IMPORTANCE, rank=2, d=8, true_totals=(3, 6.0)) == computed
    doubled = layer_metrics(TRULY, PREDICTED, IMPORTANCE, true_totals=(6, 12.0))
    assert doubled["recall"] == pytest.approx(2 / 6) and doubled["importance_weighted_recall"] == pytest.approx(3 / 12)


def test_optional_fields():
    result = layer_metrics(TRULY, PREDICTED)
    assert result["importance_weighted_recall"] == result["recall"]
    assert "auroc" not in result and "multiply_count_ratio" not in result
    weightless = layer_metrics(TRULY, PREDICTED, importance=torch.zeros(2, 4))
    assert weightless["importance_weighted_recall"] == 1.0
    nothing_active = torch.zeros(2, 4, dtype=torch.bool)
    quiet = layer_metrics(nothing_active, PREDICTED, scores=SCORES)
    assert quiet["recall"] == 1.0 and quiet["true_sparsity"] == 1.0 and quiet["auroc"] is None


def brute_force_auc(scores: list[float], labels: list[bool]) -> float:
    positives = [s for s, y in zip(scores, labels, strict=True) if y]
    negatives = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_equals_brute_force_pair_count_with_ties(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (7, 11), generator=generator).to(torch.float32)
    labels = torch.rand(7, 11, generator=generator) < 0.3 + 0.1 * scores
    expected = brute_force_auc(scores.flatten().tolist(), labels.flatten().tolist())
    assert roc_auc(scores, labels) == pytest.approx(expected)


def test_auroc_edge_cases():
    assert roc_auc(torch.ones(6), torch.tensor([1, 0, 1, 0, 1, 0], dtype=torch.bool)) == 0.5
    assert roc_auc(torch.arange(4.0), torch.tensor([0, 0, 1, 1], dtype=torch.bool)) == 1.0
    assert roc_auc(torch.arange(4.0), torch.tensor([1, 1, 0, 0], dtype=torch.bool)) == 0.0
    assert math.isnan(roc_auc(torch.arange(4.0), torch.ones(4, dtype=torch.bool)))


def test_auroc_on_a_fixed_sample_for_large_layers(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(200, 100, generator=generator)
    truly = scores + torch.randn(200, 100, generator=generator) > 0.5
    exact = layer_metrics(truly, truly, scores=scores)["auroc"]
    monkeypatch.setattr(metrics, "AUROC_MAX_PAIRS", 5000)
    sampled = layer_metrics(truly, truly, scores=scores)["auroc"]
    assert sampled != exact and abs(sampled - exact) < 0.03
    assert layer_metrics(truly, truly, scores=scores)["auroc"] == sampled


def test_eq5_multiply_count_by_hand():
    sparse, dense = multiply_count(4096, 11008, 256, 0.8, 0.85)
    # 256 * (4096 + 11008) + 4096 * 0.2 * 11008 + 2 * 4096 * 0.15 * 11008
    assert sparse == pytest.approx(3_866_624 + 9_017_753.6 + 13_526_630.4)
    assert dense == 135_266_304
    # the paper's own example: s = 0.5, s' = 0.9 cuts multiplies by 3.8x
    paper_sparse, _ = multiply_count(4096, 11008, 256, 0.5, 0.9)
    assert dense / paper_sparse == pytest.approx(3.818, abs=1e-3)


def test_layer_metrics_rejects_mismatched_inputs():
    with pytest.raises(CalibrationError, match="predicted_active"):
        layer_metrics(TRULY, PREDICTED[:, :3])
    with pytest.raises(CalibrationError, match="truly_active"):
        layer_metrics(TRULY.float(), PREDICTED)
    with pytest.raises(CalibrationError, match="importance"):
        layer_metrics(TRULY, PREDICTED, importance=IMPORTANCE[:1])


def layer_entry(layer: int, per_level: bool) -> dict:
    entry = {
        "layer": layer,
        "true_sparsity": 0.85 + 0.01 * layer,
        "predicted_sparsity": 0.7 + 0.02 * layer,
        "realized_sparsity": 0.86 + 0.01 * layer,
        "recall": 0.99 - 0.005 * layer,
        "importance_weighted_recall": 0.995 - 0.002 * layer,
        "auroc": 0.97,
        "multiply_count_ratio": 0.3,
    }
    if per_level:
        entry["per_level"] = {
            str(level): {"predicted_sparsity": level, "importance_weighted_recall": 1 - level**4 / 10}
            for level in (0.5, 0.7, 0.9)
        }
    return entry


@pytest.mark.parametrize(
    "report",
    [
        {
            "model": "prosparse-tiny",
            "predictor": "svd r=64",
            "levels": [0.5, 0.7, 0.9],
            "layers": [layer_entry(i, per_level=True) for i in range(4)],
        },
        {
            "model": "relu-tiny",
            "predictor": "signbit",
            "layers": [
                {k: v for k, v in layer_entry(i, per_level=False).items() if k not in ("auroc", "multiply_count_ratio")}
                for i in range(3)
            ],
        },
        {"model": "empty", "predictor": "core", "layers": []},
    ],
    ids=["full", "optional-keys-missing", "no-layers"],
)
def test_report_plot_is_a_png(tmp_path, report):
    path = tmp_path / "report.png"
    write_report_plot(report, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
