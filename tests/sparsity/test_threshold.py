"""CHESS channel-wise thresholds: exact score quantile, per-channel scaling, dead channels, levels."""

import itertools
import math

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.sparsity.threshold import fit_channel_thresholds, fit_channel_thresholds_levels

LEVELS = [0.0, 0.1, 0.25, 0.5, 0.9, 1.0]
DEAD_CHANNEL = 7


def calibration(n_tokens: int = 300, n_neurons: int = 40, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    gate_act = torch.nn.functional.silu(torch.randn(n_tokens, n_neurons, generator=generator))
    scale = torch.rand(n_neurons, generator=generator) * 3
    up = torch.randn(n_tokens, n_neurons, generator=generator) * scale
    up[:, DEAD_CHANNEL] = 0.0
    return gate_act, up


@pytest.fixture(scope="module")
def fitted():
    gate_act, up = calibration()
    return gate_act, up, fit_channel_thresholds_levels(gate_act, up, LEVELS)


def test_mean_abs_up_per_channel(fitted):
    _, up, levels = fitted
    torch.testing.assert_close(levels[0.5].mean_abs_up, up.abs().mean(0))


@pytest.mark.parametrize("level", [v for v in LEVELS if v > 0])
def test_global_threshold_is_the_exact_score_quantile(fitted, level):
    gate_act, _, levels = fitted
    result = levels[level]
    scores = (result.mean_abs_up * gate_act.abs()).flatten()
    k = math.ceil(level * scores.numel())
    assert result.global_threshold == float(torch.sort(scores).values[k - 1])
    fraction_below = float((scores <= result.global_threshold).double().mean())
    assert 0 <= fraction_below - level < 1 / scores.numel()


@pytest.mark.parametrize("level", [v for v in LEVELS if v > 0])
def test_channel_thresholds_scale_the_global_one(fitted, level):
    _, _, levels = fitted
    result = levels[level]
    live = torch.arange(len(result.thresholds)) != DEAD_CHANNEL
    expected = result.global_threshold / result.mean_abs_up[live]
    torch.testing.assert_close(result.thresholds[live], expected)


def test_active_fraction_matches_the_level(fitted):
    gate_act, _, levels = fitted
    for level in (0.25, 0.5, 0.9):
        inactive = 1 - float(levels[level].active_mask(gate_act).double().mean())
        assert abs(inactive - level) < 2e-3


def test_dead_channel_never_fires(fitted):
    _, _, levels = fitted
    for result in levels.values():
        assert result.thresholds[DEAD_CHANNEL] == math.inf
        huge = torch.full((3, len(result.thresholds)), 1e30)
        assert not bool(result.active_mask(huge)[:, DEAD_CHANNEL].any())


def test_level_zero_keeps_every_live_neuron(fitted):
    gate_act, _, levels = fitted
    result = levels[0.0]
    assert result.global_threshold == -math.inf
    active = result.active_mask(gate_act)
    assert bool(active[:, :DEAD_CHANNEL].all()) and bool(active[:, DEAD_CHANNEL + 1 :].all())


def test_thresholds_grow_with_the_level(fitted):
    _, _, levels = fitted
    ordered = [levels[level] for level in LEVELS]
    for low, high in itertools.pairwise(ordered):
        assert low.global_threshold < high.global_threshold
        assert bool((low.thresholds <= high.thresholds).all())


def test_single_level_equals_the_batch(fitted):
    gate_act, up, levels = fitted
    single = fit_channel_thresholds(gate_act, up, 0.5)
    assert single.global_threshold == levels[0.5].global_threshold
    assert torch.equal(single.thresholds, levels[0.5].thresholds)


def test_exact_with_ties_and_many_chunks(monkeypatch):
    monkeypatch.setattr("edge_sdk.sparsity.threshold._CHUNK_ELEMENTS", 100)
    generator = torch.Generator().manual_seed(1)
    gate_act = torch.randint(-4, 5, (257, 13), generator=generator).to(torch.float16)  # heavy ties, half precision
    up = torch.randint(0, 3, (257, 13), generator=generator).to(torch.float16)
    levels = fit_channel_thresholds_levels(gate_act, up, [0.3, 0.77, 0.999])
    mean_abs_up = up.float().abs().mean(0)
    scores = (mean_abs_up * gate_act.float().abs()).flatten()
    for level, result in levels.items():
        k = math.ceil(level * scores.numel())
        assert result.global_threshold == float(torch.kthvalue(scores, k).values)


@pytest.mark.parametrize("sparsity", [-0.1, 1.5, math.nan])
def test_sparsity_is_validated(sparsity):
    gate_act, up = calibration(10, 9)
    with pytest.raises(CalibrationError, match="sparsity"):
        fit_channel_thresholds(gate_act, up, sparsity)


def test_bad_inputs_are_reported():
    gate_act, up = calibration(10, 9)
    with pytest.raises(CalibrationError, match="up"):
        fit_channel_thresholds(gate_act, up[:, :8], 0.5)
    gate_act[2, 1] = math.inf
    with pytest.raises(CalibrationError, match="gate_act"):
        fit_channel_thresholds(gate_act, up, 0.5)
