"""Sentence-level core neurons: token-wise top-alpha, counting, top-beta mask and its tie rules."""

import math

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.predictors import core as host_core
from edge_sdk.sparsity.core import core_mask_from_counts, core_neuron_counts, core_neuron_mask

# Token-wise core neurons at alpha = 0.5:
#   token 0: 3 positives -> top 2 of [3, 1, 0, 2, -1]: neurons 0 (3) and 3 (2)
#   token 1: 3 positives, all equal -> the 2 lowest indices: neurons 0 and 1
#   token 2: 2 positives -> top 1 of [0, 5, 0, 0, 4]: neuron 1
# counts [2, 2, 0, 1, 0]; activation sums [4, 6, 0, 2, 0]
PROMPT = torch.tensor(
    [
        [3.0, 1.0, 0.0, 2.0, -1.0],
        [1.0, 1.0, 1.0, -2.0, 0.0],
        [0.0, 5.0, 0.0, 0.0, 4.0],
    ]
)


def test_counts_of_hand_example():
    counts, sums = core_neuron_counts(PROMPT, alpha=0.5)
    assert counts.tolist() == [2, 2, 0, 1, 0]
    assert sums.tolist() == [4.0, 6.0, 0.0, 2.0, 0.0]


@pytest.mark.parametrize(
    ("beta", "expected"),
    [
        (0.2, [1]),  # neurons 0 and 1 tie on count 2; neuron 1 has the larger sum
        (0.4, [0, 1]),
        (0.6, [0, 1, 3]),
        (1.0, [0, 1, 3]),  # neurons 2 and 4 have count 0 and never enter the mask
    ],
)
def test_mask_of_hand_example(beta, expected):
    mask = core_neuron_mask(PROMPT, alpha=0.5, beta=beta)
    assert mask.dtype == torch.bool and mask.shape == (5,)
    assert torch.nonzero(mask).flatten().tolist() == expected


def test_full_tie_goes_to_the_lower_index():
    # token 0 picks neuron 0 over the equal neuron 2; token 1 picks neuron 2: same count, same sum.
    prompt = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert core_neuron_counts(prompt, alpha=0.5)[0].tolist() == [1, 0, 1]
    assert core_neuron_mask(prompt, alpha=0.5, beta=0.3).tolist() == [True, False, False]


def test_mask_from_counts_orders_by_count_then_sum_then_index():
    counts = torch.tensor([3, 5, 5, 5, 0, 1])
    sums = torch.tensor([9.0, 2.0, 4.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    # order: 2 (5, 4.0), 1 (5, 2.0, lower index), 3, 0, 5; neuron 4 never
    assert torch.nonzero(core_mask_from_counts(counts, sums, beta=0.5)).flatten().tolist() == [1, 2, 3]
    assert torch.nonzero(core_mask_from_counts(counts, sums, beta=0.3)).flatten().tolist() == [1, 2]
    assert torch.nonzero(core_mask_from_counts(counts, sums, beta=1.0)).flatten().tolist() == [0, 1, 2, 3, 5]


def test_alpha_is_read_as_a_decimal():
    prompt = torch.arange(1.0, 11.0).unsqueeze(0)  # 10 positive activations; float 0.7 * 10 = 7.000000000000001
    counts, _ = core_neuron_counts(prompt, alpha=0.7)
    assert counts.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]


def naive_counts(acts: torch.Tensor, alpha: float) -> list[int]:
    counts = [0] * acts.shape[1]
    for row in acts.tolist():
        positive = [(-value, i) for i, value in enumerate(row) if value > 0]
        for _, i in sorted(positive)[: math.ceil(round(alpha * len(positive), 9))]:
            counts[i] += 1
    return counts


def test_counts_match_naive_on_tied_random_data(monkeypatch):
    monkeypatch.setattr("edge_sdk.sparsity.core._CHUNK_ELEMENTS", 64)  # several token chunks
    generator = torch.Generator().manual_seed(0)
    acts = torch.randint(-3, 4, (40, 23), generator=generator).to(torch.float32)  # many ties, zeros, negatives
    counts, sums = core_neuron_counts(acts, alpha=0.4)
    assert counts.tolist() == naive_counts(acts, 0.4)
    head, tail = core_neuron_counts(acts[:17], 0.4), core_neuron_counts(acts[17:], 0.4)
    assert torch.equal(counts, head[0] + tail[0]) and torch.equal(sums, head[1] + tail[1])


def test_mask_size_is_ceil_beta_d_when_enough_neurons_count():
    generator = torch.Generator().manual_seed(1)
    acts = torch.relu(torch.randn(64, 101, generator=generator))
    assert int(core_neuron_mask(acts, alpha=0.4, beta=0.2).sum()) == math.ceil(0.2 * 101)


@pytest.mark.parametrize(
    ("alpha", "beta", "field"),
    [
        (0.0, 0.2, "alpha"),
        (1.5, 0.2, "alpha"),
        (math.nan, 0.2, "alpha"),
        (0.4, 0.0, "beta"),
        (0.4, -1.0, "beta"),
        (0.4, "0.2x", "beta"),
    ],
)
def test_ratios_are_validated(alpha, beta, field):
    with pytest.raises(CalibrationError, match=field):
        core_neuron_mask(PROMPT, alpha=alpha, beta=beta)


def test_bad_activations_are_reported():
    with pytest.raises(CalibrationError, match="gate_activations"):
        core_neuron_mask(PROMPT[0], alpha=0.4, beta=0.2)
    with pytest.raises(CalibrationError, match="gate_activations"):
        core_neuron_mask(torch.tensor([[1.0, math.nan]]), alpha=0.4, beta=0.2)


@pytest.mark.parametrize("alpha", [0.4, 0.15, 1.0])
def test_host_counts_equal_the_torch_rule_with_ties_and_chunks(alpha, monkeypatch):
    """predictors/core.py (numpy, what ONNX Runtime and TensorRT runtimes use after prefill) against the torch rule,
    on activations with many equal values (ties go to the lower index) and counted in several chunks."""
    generator = torch.Generator().manual_seed(11)
    acts = torch.relu(torch.randn(37, 50, generator=generator)).mul(4).round().div(4)  # quarter steps: many ties
    acts[3] = 0.0  # a token with no positive activation
    monkeypatch.setattr(host_core, "CHUNK_ELEMENTS", 50 * 8)  # 8 tokens per chunk
    counts, sums = host_core.core_counts_from_activations(acts.numpy(), alpha)
    expected_counts, expected_sums = core_neuron_counts(acts, alpha)
    assert counts.tolist() == expected_counts.tolist()
    assert sums.tolist() == expected_sums.tolist()
    assert counts.sum() == sum(math.ceil(alpha * int(n)) for n in (acts > 0).sum(1))
    masks = host_core.core_masks_from_activations(acts.numpy()[None], alpha, 0.2)
    assert masks[0].tolist() == core_mask_from_counts(expected_counts, expected_sums, 0.2).tolist()
