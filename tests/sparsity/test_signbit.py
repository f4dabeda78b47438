"""Sign-bit predictor: packing, XOR/popcount counts, the alpha rule and exact alpha calibration."""

import math

import numpy as np
import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.sparsity.signbit import calibrate_alpha, negative_product_counts, pack_sign_bits, signbit_mask


def naive_pack(row: list[float]) -> list[int]:
    """Bit j of word k set when row[32k + j] < 0, as signed int32 values, one Python bit at a time."""
    words = []
    for k in range(0, len(row), 32):
        value = 0
        for j, element in enumerate(row[k : k + 32]):
            if element < 0:
                value |= 1 << j
        words.append(value - (1 << 32) if value >= 1 << 31 else value)
    return words


def naive_negative_counts(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[T, D]: per token and row, how many positions have exactly one negative operand."""
    return ((x[:, None, :] < 0) != (w[None, :, :] < 0)).sum(-1)


def random_with_zeros(shape, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator)
    values[torch.rand(shape, generator=generator) < 0.1] = 0.0
    values[torch.rand(shape, generator=generator) < 0.05] = -0.0
    return values


@pytest.mark.parametrize("d", [45, 97, 64])
def test_pack_matches_naive_bit_loop(d):
    w = random_with_zeros((9, d), seed=d)
    packed = pack_sign_bits(w)
    assert packed.dtype == torch.int32
    assert packed.shape == (9, math.ceil(d / 32))
    assert packed.tolist() == [naive_pack(row) for row in w.tolist()]


def test_pack_sign_conventions():
    w = torch.zeros(1, 40)
    w[0, 31] = -1.0  # bit 31 of word 0: a negative int32
    w[0, 0] = -0.0  # -0.0 is not negative
    w[0, 33] = -2.5  # bit 1 of word 1
    w[0, 34] = 0.0
    assert pack_sign_bits(w).tolist() == [[-(1 << 31), 2]]


@pytest.mark.parametrize("tokens", [3, 40])  # XOR + popcount path and the matmul path
@pytest.mark.parametrize("d", [45, 97])
def test_negative_counts_match_naive(tokens, d):
    w = random_with_zeros((33, d), seed=1)
    x = random_with_zeros((tokens, d), seed=2)
    counts = negative_product_counts(pack_sign_bits(w), pack_sign_bits(x), d)
    assert counts.dtype == torch.int32
    np.testing.assert_array_equal(counts.numpy(), naive_negative_counts(w.numpy(), x.numpy()))


def test_negative_counts_are_negative_products_without_zeros():
    generator = torch.Generator().manual_seed(3)
    w, x = torch.randn(20, 70, generator=generator), torch.randn(5, 70, generator=generator)
    counts = negative_product_counts(pack_sign_bits(w), pack_sign_bits(x), 70)
    assert torch.equal(counts, (x[:, None, :] * w[None] < 0).sum(-1).to(torch.int32))


def test_mask_at_alpha_one_is_not_more_negative_than_positive():
    w, x = random_with_zeros((50, 97), seed=4), random_with_zeros((30, 97), seed=5)
    n_neg = naive_negative_counts(w.numpy(), x.numpy())
    mask = signbit_mask(pack_sign_bits(w), x, alpha=1.0)
    np.testing.assert_array_equal(mask.numpy(), n_neg <= 97 - n_neg)


def test_tie_counts_as_active_and_alpha_direction():
    w = torch.tensor([[1.0, 1.0, -1.0, -1.0]])  # 2 negative and 2 positive products with x > 0
    packed, x = pack_sign_bits(w), torch.ones(4)
    assert signbit_mask(packed, x, alpha=1.0).tolist() == [True]
    assert signbit_mask(packed, x, alpha=0.99).tolist() == [False]


def test_larger_alpha_is_more_conservative():
    w, x = random_with_zeros((64, 97), seed=6), random_with_zeros((40, 97), seed=7)
    packed = pack_sign_bits(w)
    aggressive, neutral, conservative = (signbit_mask(packed, x, a) for a in (0.9, 1.0, 1.1))
    assert bool((aggressive <= neutral).all()) and bool((neutral <= conservative).all())
    assert int(aggressive.sum()) < int(neutral.sum()) < int(conservative.sum())


def test_mask_accepts_one_token():
    w, x = random_with_zeros((10, 45), seed=8), random_with_zeros((45,), seed=9)
    packed = pack_sign_bits(w)
    assert torch.equal(signbit_mask(packed, x, 1.02), signbit_mask(packed, x.unsqueeze(0), 1.02)[0])


def calibration_layer(seed: int):
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 97, generator=generator)
    x = torch.randn(300, 97, generator=generator) + 0.3
    return pack_sign_bits(w), x, x @ w.T > 0


def recall(packed, x, truly_active, alpha) -> float:
    return float((signbit_mask(packed, x, alpha) & truly_active).sum() / truly_active.sum())


@pytest.mark.parametrize("target", [0.9, 0.99])
def test_calibrated_alpha_is_the_most_aggressive_reaching_the_target(target):
    packed, x, truly_active = calibration_layer(seed=10)
    alpha = calibrate_alpha(packed, x, truly_active, target, alpha_range=(0.0, 10.0))
    assert recall(packed, x, truly_active, alpha) >= target
    # the most aggressive among float32 alphas, the values a bundle can store
    assert recall(packed, x, truly_active, float(np.nextafter(np.float32(alpha), np.float32(0)))) < target
    assert recall(packed, x, truly_active, 1.0) < 0.99 < recall(packed, x, truly_active, 10.0)


@pytest.mark.parametrize("seed", [10, 11, 12])
@pytest.mark.parametrize("target", [0.9, 0.95, 0.99])
def test_calibrated_alpha_holds_its_recall_as_the_float32_every_runtime_reads(seed, target):
    # signbit.alpha is F32 in the bundle, a float in the C / CUDA kernels and a float attribute in ONNX: a float64
    # alpha that float32 rounds below a critical ratio N_neg / N_pos turns every pair at that ratio inactive
    packed, x, truly_active = calibration_layer(seed=seed)
    alpha = calibrate_alpha(packed, x, truly_active, target, alpha_range=(0.0, 10.0))
    assert recall(packed, x, truly_active, float(torch.tensor([alpha], dtype=torch.float32)[0])) >= target
    assert float(np.float32(alpha)) == alpha


def test_calibrated_alpha_is_clipped_to_the_range():
    packed, x, truly_active = calibration_layer(seed=11)
    unclipped = calibrate_alpha(packed, x, truly_active, 0.99, alpha_range=(0.0, 10.0))
    assert calibrate_alpha(packed, x, truly_active, 0.99, alpha_range=(0.5, unclipped / 2)) == unclipped / 2
    assert calibrate_alpha(packed, x, truly_active, 0.99, alpha_range=(unclipped * 2, 20.0)) == unclipped * 2
    none_active = torch.zeros_like(truly_active)
    assert calibrate_alpha(packed, x, none_active, 0.99, alpha_range=(0.7, 2.0)) == 0.7


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"recall_target": 0.0}, "recall_target"),
        ({"recall_target": 1.5}, "recall_target"),
        ({"recall_target": 0.99, "alpha_range": (2.0, 1.0)}, "alpha_range"),
    ],
)
def test_calibrate_rejects_bad_settings(kwargs, field):
    packed, x, truly_active = calibration_layer(seed=12)
    with pytest.raises(CalibrationError, match=field):
        calibrate_alpha(packed, x, truly_active, **kwargs)


def test_shape_mismatches_are_reported():
    packed, x, truly_active = calibration_layer(seed=13)
    with pytest.raises(CalibrationError, match="truly_active"):
        calibrate_alpha(packed, x, truly_active[:, :10], 0.99)
    with pytest.raises(CalibrationError, match="packed_w"):
        signbit_mask(packed, x[:, :60], 1.0)
