"""SVDP Algorithm 2: neuron importance and the greedy per-neuron bias calibration."""

import heapq
import itertools
import math

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import dense_ffn, ffn_intermediates
from edge_sdk.sparsity.svd import fit_svd_predictor, input_gram
from edge_sdk.sparsity.svd_bias import calibrate_biases, neuron_importance, predicted_inactive_fraction

LEVELS = [0.0, 0.1, 0.35, 0.5, 0.77, 0.9, 1.0]


def greedy_reference(scores, importance, levels, eta):
    """Algorithm 2 written plainly: a heap keyed by (next step cost, neuron), one step at a time.

    Returns {level: [tau_i or None]} where None means nothing of neuron i is predicted inactive.
    """
    n_tokens, n_neurons = scores.shape
    neurons = []
    for i in range(n_neurons):
        pairs = sorted(zip(scores[:, i].tolist(), importance[:, i].tolist(), strict=True))
        s, w = [p[0] for p in pairs], [p[1] for p in pairs]

        def end_of_tie_run(k, s=s):
            while 0 < k < n_tokens and s[k - 1] == s[k]:
                k += 1
            return k

        first = next((t for t in range(n_tokens) if w[t] > 0), None)
        free = n_tokens if first is None else s.index(s[first])  # start of the first positive token's tie run
        cuts = [free] + [end_of_tie_run(min(free + j * eta, n_tokens)) for j in range(1, math.ceil(n_tokens / eta) + 1)]
        neurons.append((s, w, cuts))

    steps = [0] * n_neurons

    def next_cost(i):
        _, w, cuts = neurons[i]
        return None if cuts[steps[i]] >= n_tokens else sum(w[cuts[steps[i]] : cuts[steps[i] + 1]])

    inactive = sum(cuts[0] for _, _, cuts in neurons)
    heap = [(next_cost(i), i) for i in range(n_neurons) if next_cost(i) is not None]
    heapq.heapify(heap)
    result = {}
    for level in sorted(levels):
        while inactive / (n_tokens * n_neurons) < level:
            _, i = heapq.heappop(heap)
            cuts = neurons[i][2]
            inactive += cuts[steps[i] + 1] - cuts[steps[i]]
            steps[i] += 1
            if next_cost(i) is not None:
                heapq.heappush(heap, (next_cost(i), i))
        result[level] = [
            neurons[i][0][cut - 1] if (cut := neurons[i][2][steps[i]]) > 0 else None for i in range(n_neurons)
        ]
    return result


def llm_like_layer(tokens=600, d=32, n_neurons=96, rank=6, seed=0):
    """A small ReLU FFN with anisotropic inputs and down-projection rows of very different norms."""
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=generator)).Q
    x = (torch.randn(tokens, d, generator=generator) * torch.logspace(0, -1.5, d)) @ basis
    w_gate = torch.randn(n_neurons, d, generator=generator) / d**0.5 - 0.05
    w_up = torch.randn(n_neurons, d, generator=generator) / d**0.5
    w_down_t = torch.randn(n_neurons, d, generator=generator) * torch.logspace(-1, 1, n_neurons)[:, None]
    relu = Activation("relu")
    predictor = fit_svd_predictor(w_gate, rank, gram=input_gram([x])[0])
    return predictor.scores(x), neuron_importance(x, w_gate, w_up, w_down_t, relu), (x, w_gate, w_up, w_down_t, relu)


def test_neuron_importance_is_squared_output_contribution():
    _, importance, (x, w_gate, w_up, w_down_t, relu) = llm_like_layer(tokens=40)
    gate_act, up_act = ffn_intermediates(x, w_gate, w_up, relu)
    contributions = (gate_act * up_act)[:, :, None] * w_down_t  # [T, D, d]: neuron i's share of y
    assert torch.allclose(contributions.sum(dim=1), dense_ffn(x, w_gate, w_up, w_down_t, relu), atol=1e-4)
    expected = contributions.square().sum(dim=2)
    assert importance.shape == (40, 96) and importance.dtype == torch.float32
    assert torch.allclose(importance, expected, rtol=1e-5, atol=1e-9)
    assert (importance == 0).float().mean() > 0.3  # relu: inactive neurons cost nothing
    with pytest.raises(CalibrationError, match="w_up"):
        neuron_importance(x, w_gate, w_up[:, :8], w_down_t, relu)


@pytest.mark.parametrize("tied", [False, True], ids=["distinct", "tied"])
def test_matches_plain_greedy_reference(tied):
    generator = torch.Generator().manual_seed(4)
    for _ in range(25):
        n_tokens = int(torch.randint(1, 30, (), generator=generator))
        n_neurons = int(torch.randint(1, 6, (), generator=generator))
        eta = int(torch.randint(1, 5, (), generator=generator))
        if tied:
            scores = torch.randint(-4, 5, (n_tokens, n_neurons), generator=generator).float()
        else:
            scores = torch.randn(n_tokens, n_neurons, generator=generator)
        importance = torch.randint(0, 4, (n_tokens, n_neurons), generator=generator).float()
        importance *= torch.rand(n_tokens, n_neurons, generator=generator) < 0.6  # many zero-cost steps
        biases = calibrate_biases(scores, importance, LEVELS, eta=eta)
        expected = greedy_reference(scores, importance, LEVELS, eta)
        for level in LEVELS:
            for i, tau in enumerate(expected[level]):
                if tau is None:
                    assert (scores[:, i] + biases[level][i] > 0).all()
                else:
                    assert -biases[level][i].item() == tau


def test_tiny_problem_by_hand():
    # Neuron 0: scores 1..4, costs 0, 5, 1, 1 -> free prefix 1 token, then steps costing 5, 1, 1.
    # Neuron 1: scores 1..4, costs 2, 2, 2, 2 -> no free prefix, steps cost 2 each.
    scores = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    importance = torch.tensor([[0.0, 2.0], [5.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    biases = calibrate_biases(scores, importance, [0.1, 0.25, 0.5, 0.75, 0.8], eta=1)
    assert biases[0.1].tolist() == [-1.0, pytest.approx(-(1.0 - 3e-3))]  # free prefix alone: 1/8 >= 0.1
    assert biases[0.25].tolist() == [-1.0, -1.0]  # cheapest step: neuron 1 (2 < 5)
    assert biases[0.5].tolist() == [-1.0, -3.0]  # neuron 1 twice more (2, 2 < 5)
    assert biases[0.75].tolist() == [-2.0, -4.0]  # neuron 1's last step (2), then neuron 0 must pay 5
    assert biases[0.8].tolist() == [-3.0, -4.0]  # neuron 0's cheap next step (1)


def test_achieved_fraction_is_first_greedy_value_at_or_above_level():
    generator = torch.Generator().manual_seed(5)
    scores = torch.randn(500, 64, generator=generator)
    importance = torch.rand(500, 64, generator=generator) + 0.01  # no free prefix anywhere
    eta = 7
    levels = [0.3, 0.45, 0.6, 0.75, 0.9]
    biases = calibrate_biases(scores, importance, levels, eta=eta)
    for level in levels:
        achieved = predicted_inactive_fraction(scores, biases[level])
        assert level <= achieved <= level + eta / scores.numel()
    # Raising the level only raises thresholds: tau is nondecreasing per neuron, so bias is nonincreasing.
    for low, high in itertools.pairwise(levels):
        assert (biases[high] <= biases[low]).all()
        assert (biases[high] < biases[low]).any()


def test_default_eta_and_unsorted_duplicate_levels():
    scores, importance, _ = llm_like_layer(tokens=1024)
    levels = [0.8, 0.5, 0.8, 0.65]
    biases = calibrate_biases(scores, importance, levels)
    assert list(biases) == [0.8, 0.5, 0.65]
    assert all(b.shape == (96,) and b.dtype == torch.float32 for b in biases.values())
    assert torch.equal(biases[0.5], calibrate_biases(scores, importance, [0.5], eta=1024 // 256)[0.5])
    assert not torch.equal(biases[0.5], calibrate_biases(scores, importance, [0.5], eta=1)[0.5])
    for level in (0.5, 0.65, 0.8):
        assert level <= predicted_inactive_fraction(scores, biases[level]) <= level + 4 / scores.numel()


def weighted_recall(scores, importance, bias):
    """Share of the total importance that the biased predictor keeps active."""
    return (importance * (scores + bias > 0)).sum().item() / importance.sum().item()


@pytest.mark.parametrize("level", [0.5, 0.7, 0.85])
def test_calibrated_bias_beats_uniform_threshold_in_weighted_recall(level):
    scores, importance, _ = llm_like_layer()
    bias = calibrate_biases(scores, importance, [level])[level]
    achieved = predicted_inactive_fraction(scores, bias)
    uniform = -torch.quantile(scores.flatten(), achieved).expand(96)  # one global threshold, same sparsity
    assert predicted_inactive_fraction(scores, uniform) == pytest.approx(achieved, abs=1e-3)
    calibrated_recall, uniform_recall = (
        weighted_recall(scores, importance, bias),
        weighted_recall(scores, importance, uniform),
    )
    assert calibrated_recall > uniform_recall + 0.1 * (1 - uniform_recall)  # at least 10% fewer lost importance
    assert calibrated_recall > 0.9


def test_free_prefix_is_taken_before_any_greedy_step():
    scores = torch.arange(10.0)[:, None].repeat(1, 3)  # [10, 3], scores 0..9 for every neuron
    importance = torch.ones(10, 3)
    importance[:4, 0] = 0.0  # neuron 0: the 4 lowest tokens cost nothing
    importance[:, 1] = 0.0  # neuron 1: never matters, all of it is free
    importance[3, 2] = 0.0  # neuron 2: its lowest token matters, so nothing is free
    biases = calibrate_biases(scores, importance, [0.0, 14 / 30], eta=1)
    assert biases[0.0][0] == -3.0  # tau = score of the last free token
    assert biases[0.0][1] == -9.0  # everything predicted inactive
    assert (scores[:, 2] + biases[0.0][2] > 0).all()  # nothing inactive
    assert predicted_inactive_fraction(scores, biases[0.0]) == 14 / 30
    assert torch.equal(biases[14 / 30], biases[0.0])  # a level the free prefixes already meet


def test_ties_are_never_split():
    # Neuron 0's tokens all score 1.0 except one; the first positive-importance token ties with free ones.
    scores = torch.tensor([[1.0], [1.0], [1.0], [1.0], [2.0], [0.5]])
    importance = torch.tensor([[0.0], [3.0], [0.0], [1.0], [1.0], [0.0]])
    biases = calibrate_biases(scores, importance, [0.0, 0.3, 0.9], eta=1)
    assert biases[0.0].item() == -0.5  # the tie run at 1.0 holds a costly token: free prefix stops before it
    assert biases[0.3].item() == -1.0  # one step of eta = 1 snaps to the end of the tie run: 5 of 6 inactive
    assert predicted_inactive_fraction(scores, biases[0.3]) == 5 / 6
    assert biases[0.9].item() == -2.0


def test_all_inactive_and_nothing_inactive_extremes():
    scores, importance, _ = llm_like_layer(tokens=200)
    biases = calibrate_biases(scores, importance, [1.0])
    assert predicted_inactive_fraction(scores, biases[1.0]) == 1.0
    assert torch.equal(biases[1.0], -scores.max(dim=0).values)


@pytest.mark.parametrize("level", [1.5, -0.1, float("nan"), "0.5"])
def test_invalid_level_is_rejected(level):
    scores = torch.linspace(-2, 2, 30).reshape(10, 3)
    with pytest.raises(CalibrationError, match=f"levels.*{level!r}".replace("(", r"\(").replace(")", r"\)")):
        calibrate_biases(scores, scores.abs(), [0.5, level])


def test_invalid_inputs_are_rejected():
    scores = torch.linspace(-2, 2, 30).reshape(10, 3)
    with pytest.raises(CalibrationError, match=r"importance: expected shape \[10, 3\]"):
        calibrate_biases(scores, torch.ones(10, 4), [0.5])
    with pytest.raises(CalibrationError, match="importance"):
        calibrate_biases(scores, -scores.abs() - 1, [0.5])
    with pytest.raises(CalibrationError, match="scores"):
        calibrate_biases(torch.where(scores > 1, float("nan"), scores), scores.abs(), [0.5])
    for bad in (float("inf"), -float("inf")):
        with pytest.raises(CalibrationError, match="scores"):
            calibrate_biases(torch.where(scores > 1, bad, scores), scores.abs(), [0.5])
    first_token_minus_inf = scores.clone()
    first_token_minus_inf[0, 0] = -float("inf")
    with pytest.raises(CalibrationError, match="scores"):
        calibrate_biases(first_token_minus_inf, scores.abs(), [0.5])
    with pytest.raises(CalibrationError, match="eta"):
        calibrate_biases(scores, scores.abs(), [0.5], eta=0)
    with pytest.raises(CalibrationError, match="bias"):
        predicted_inactive_fraction(scores, torch.zeros(4))
