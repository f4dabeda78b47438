"""The reference sparse FFN: dense equivalence, hand-computed outputs, false-positive handling, dtypes."""

import pytest
import torch

from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import dense_ffn, ffn_intermediates, sparse_ffn

ACTIVATIONS = [Activation("relu"), Activation("fatrelu", 0.1), Activation("drelu"), Activation("silu")]


def random_ffn(tokens=6, d=16, n_neurons=40, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, generator=generator)
    weights = [torch.randn(n_neurons, d, generator=generator) / d**0.5 for _ in range(3)]
    return x, *weights


# d = 3, D = 4 with integer weights: g = W_gate x = [3, -1, 1, 2], u = W_up x = [1, 2, 2, -2].
X = torch.tensor([1.0, 2.0, -1.0])
W_GATE = torch.tensor([[1.0, 1, 0], [0, 0, 1], [2, 0, 1], [0, 1, 0]])
W_UP = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 2]])
W_DOWN_T = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
# Neuron 1 is a false positive (g < 0), neuron 2 a false negative (g > 0 but not predicted).
MASK = torch.tensor([True, True, False, True])


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a.kind)
@pytest.mark.parametrize("pipeline", ["sequential", "parallel"])
def test_all_ones_mask_reproduces_dense(activation, pipeline):
    x, w_gate, w_up, w_down_t = random_ffn()
    dense = dense_ffn(x, w_gate, w_up, w_down_t, activation)
    result = sparse_ffn(x, w_gate, w_up, w_down_t, torch.ones(40, dtype=torch.bool), activation, pipeline=pipeline)
    assert result.output.dtype == torch.float32
    assert (result.output - dense).abs().max() <= 1e-5
    assert dense.abs().max() > 0.1
    # Cross-check dense_ffn itself against the formula written out per neuron.
    gate_act = activation.gate(x @ w_gate.T)
    expected = sum(torch.outer(gate_act[:, i] * activation.up(x @ w_up[i]), w_down_t[i]) for i in range(40))
    assert (dense - expected).abs().max() <= 1e-5


def test_hand_computed_relu_sequential_and_parallel():
    relu = Activation("relu")
    assert torch.equal(dense_ffn(X, W_GATE, W_UP, W_DOWN_T, relu), torch.tensor([-1.0, -4.0, -2.0]))
    sequential = sparse_ffn(X, W_GATE, W_UP, W_DOWN_T, MASK, relu)
    parallel = sparse_ffn(X, W_GATE, W_UP, W_DOWN_T, MASK, relu, pipeline="parallel")
    # h = a * u = [3, 0, (2, not predicted), -4] -> y = 3 * WdT_0 - 4 * WdT_3
    for result in (sequential, parallel):
        assert torch.equal(result.output, torch.tensor([-1.0, -4.0, -4.0]))
        assert torch.equal(result.computed_gate, MASK)
    assert sequential.active.tolist() == [True, False, False, True]
    assert parallel.active.tolist() == [True, True, False, True]


def test_hand_computed_fatrelu_drelu_and_thresholds():
    fatrelu = sparse_ffn(X, W_GATE, W_UP, W_DOWN_T, torch.ones(4, dtype=torch.bool), Activation("fatrelu", 2.5))
    assert fatrelu.active.tolist() == [True, False, False, False]  # only g = 3 exceeds 2.5
    assert torch.equal(fatrelu.output, torch.tensor([3.0, 0.0, 0.0]))
    # drelu: a = relu(g) = [3, 0, 1, 2], relu(u) = [1, 2, 2, 0] -> h = [3, 0, 2, 0]; neuron 3 still reaches up.
    drelu = sparse_ffn(X, W_GATE, W_UP, W_DOWN_T, torch.ones(4, dtype=torch.bool), Activation("drelu"))
    assert drelu.active.tolist() == [True, False, True, True]
    assert torch.equal(drelu.output, torch.tensor([3.0, 0.0, 2.0]))
    thresholds = torch.tensor([3.0, 0.0, 0.0, 1.5])  # |a| > t: neuron 0 (3 > 3) fails, neuron 3 (2 > 1.5) passes
    for pipeline in ("sequential", "parallel"):
        result = sparse_ffn(
            X, W_GATE, W_UP, W_DOWN_T, MASK, Activation("relu"), pipeline=pipeline, thresholds=thresholds
        )
        assert result.active.tolist() == [False, False, False, True]
        assert torch.equal(result.output, torch.tensor([-4.0, -4.0, -4.0]))


def test_false_positives_dropped_only_in_sequential():
    x, w_gate, w_up, w_down_t = random_ffn()
    relu = Activation("relu")
    mask = torch.rand(6, 40, generator=torch.Generator().manual_seed(1)) < 0.7  # [T, D] per-token mask
    gate_act, _ = ffn_intermediates(x, w_gate, w_up, relu)
    sequential = sparse_ffn(x, w_gate, w_up, w_down_t, mask, relu)
    parallel = sparse_ffn(x, w_gate, w_up, w_down_t, mask, relu, pipeline="parallel")
    assert torch.equal(sequential.active, mask & (gate_act > 0))
    assert torch.equal(parallel.active, mask)
    assert (mask & (gate_act == 0)).sum() > 10  # there are false positives to drop
    assert (sequential.output - parallel.output).abs().max() <= 1e-6
    # The mask really restricts the output: it differs from dense where true positives were masked out.
    assert (sequential.output - dense_ffn(x, w_gate, w_up, w_down_t, relu)).abs().max() > 1e-3


def test_empty_mask_gives_zeros():
    x, w_gate, w_up, w_down_t = random_ffn()
    for pipeline in ("sequential", "parallel"):
        result = sparse_ffn(
            x, w_gate, w_up, w_down_t, torch.zeros(40, dtype=torch.bool), Activation("silu"), pipeline=pipeline
        )
        assert torch.equal(result.output, torch.zeros(6, 16))
        assert not result.active.any() and not result.computed_gate.any()


def test_thresholds_drop_exactly_channels_at_or_below_threshold():
    x, w_gate, w_up, w_down_t = random_ffn(tokens=32)
    silu = Activation("silu")
    gate_act, up_act = ffn_intermediates(x, w_gate, w_up, silu)
    thresholds = gate_act.abs().median(dim=0).values  # [D]; the median token sits exactly at its threshold
    result = sparse_ffn(x, w_gate, w_up, w_down_t, torch.ones(40, dtype=torch.bool), silu, thresholds=thresholds)
    expected_active = gate_act.abs() > thresholds
    assert torch.equal(result.active, expected_active)
    assert (gate_act.abs() == thresholds).sum() == 40  # the boundary case is exercised in every channel
    expected = torch.where(expected_active, gate_act * up_act, 0.0) @ w_down_t
    assert (result.output - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_weights_use_fp32_math_on_rounded_values(dtype):
    x, w_gate, w_up, w_down_t = random_ffn()
    low = [w.to(dtype) for w in (w_gate, w_up, w_down_t)]
    mask = torch.ones(40, dtype=torch.bool)
    result = sparse_ffn(x, *low, mask, Activation("relu"))
    upcast = sparse_ffn(x, *(w.to(torch.float32) for w in low), mask, Activation("relu"))
    assert result.output.dtype == torch.float32
    assert torch.equal(result.output, upcast.output)
    assert not torch.equal(result.output, sparse_ffn(x, w_gate, w_up, w_down_t, mask, Activation("relu")).output)


def test_vector_input_matches_batched_row():
    x, w_gate, w_up, w_down_t = random_ffn()
    mask = torch.arange(40) % 3 != 0
    batched = sparse_ffn(x, w_gate, w_up, w_down_t, mask, Activation("relu"))
    single = sparse_ffn(x[2], w_gate, w_up, w_down_t, mask, Activation("relu"))
    assert single.output.shape == (16,) and single.active.shape == (40,) and single.computed_gate.shape == (40,)
    assert torch.allclose(single.output, batched.output[2], atol=1e-6)
    assert torch.equal(single.active, batched.active[2])
    assert dense_ffn(x[2], w_gate, w_up, w_down_t, Activation("relu")).shape == (16,)


def test_deterministic_and_validates_inputs():
    x, w_gate, w_up, w_down_t = random_ffn()
    mask = torch.ones(40, dtype=torch.bool)
    first = sparse_ffn(x, w_gate, w_up, w_down_t, mask, Activation("relu")).output
    assert torch.equal(first, sparse_ffn(x, w_gate, w_up, w_down_t, mask, Activation("relu")).output)
    with pytest.raises(ValueError, match="pipeline"):
        sparse_ffn(x, w_gate, w_up, w_down_t, mask, Activation("relu"), pipeline="speculative")
    with pytest.raises(ValueError, match="mask"):
        sparse_ffn(x, w_gate, w_up, w_down_t, mask.float(), Activation("relu"))
    with pytest.raises(ValueError, match="mask"):
        sparse_ffn(x, w_gate, w_up, w_down_t, mask[:39], Activation("relu"))
    with pytest.raises(ValueError, match="w_down_t"):
        sparse_ffn(x, w_gate, w_up, w_down_t[:, :8], mask, Activation("relu"))
    with pytest.raises(ValueError, match="x"):
        dense_ffn(x[:, :8], w_gate, w_up, w_down_t, Activation("relu"))
