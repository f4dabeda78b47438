"""edge_cpu_attention, the decode attention kernel of the C runtime's engine, called directly: its values against
float64 (GQA, a sliding window's first position inside a tile, the key tiles' padding past pos never used), threads,
and the arguments it refuses without writing anything. Its bytes on every instruction set: test_cpu_kernel_builds.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from edge_sdk.native import load_cpu_kernels

FLOATS = np.ctypeslib.ndpointer(dtype=np.float32, flags="C_CONTIGUOUS")


def attention_kernel():
    kernel = load_cpu_kernels().edge_cpu_attention
    kernel.restype = ctypes.c_int
    kernel.argtypes = [FLOATS, ctypes.c_int, ctypes.c_int, ctypes.c_int, FLOATS, ctypes.c_size_t, FLOATS,
                       ctypes.c_int, ctypes.c_int, FLOATS, ctypes.c_size_t, FLOATS, ctypes.c_int]  # fmt: skip
    return kernel


def cache(n_heads: int, n_kv: int, hd: int, pos: int, seed: int) -> dict[str, np.ndarray]:
    """q, the keys [n_kv, hd, positions] (NaN past pos, up to a tile past pos's) and the kernel's tiles of them
    [n_kv, tiles, hd, 16], and position-major values."""
    rng = np.random.default_rng(seed)
    tiles = pos // 16 + 2
    keys = np.full((n_kv, hd, tiles * 16), np.nan, dtype=np.float32)
    keys[:, :, : pos + 1] = rng.standard_normal((n_kv, hd, pos + 1))
    return {
        "q": rng.standard_normal(n_heads * hd).astype(np.float32),
        "keys": keys,
        "key_tiles": np.ascontiguousarray(keys.reshape(n_kv, hd, tiles, 16).transpose(0, 2, 1, 3)),
        "values": rng.standard_normal((pos + 1, n_kv * hd)).astype(np.float32),
    }


def run(data, n_heads, n_kv, hd, first, pos, threads=1, key_tiles=None, score_stride=None) -> tuple[int, np.ndarray]:
    scores = np.zeros((n_heads, pos + 1), dtype=np.float32)
    out = np.full(n_heads * hd, 7.0, dtype=np.float32)
    status = attention_kernel()(
        data["q"], n_heads, n_kv, hd, data["key_tiles"], key_tiles or data["key_tiles"].shape[1], data["values"],
        first, pos, scores, score_stride or pos + 1, out, threads,
    )  # fmt: skip
    return status, out.reshape(n_heads, hd), scores


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "hd", "first", "pos"),
    [
        (8, 2, 64, 0, 130),
        (6, 3, 40, 20, 75),
        (4, 4, 20, 0, 0),
        (9, 3, 64, 0, 15),
        (4, 2, 32, 33, 40),
        (4, 2, 32, 32, 100),
        (8, 4, 64, 20, 150),
    ],
)
def test_attention_against_float64(n_heads, n_kv, hd, first, pos):
    data = cache(n_heads, n_kv, hd, pos, seed=n_heads + pos)
    status, out, scores = run(data, n_heads, n_kv, hd, first, pos)
    assert status == 0
    groups = n_heads // n_kv
    keys = data["keys"][:, :, first : pos + 1].astype(np.float64)
    values = data["values"].reshape(pos + 1, n_kv, hd)[first:].astype(np.float64)
    for h in range(n_heads):
        logits = data["q"].reshape(n_heads, hd)[h].astype(np.float64) @ keys[h // groups] / np.sqrt(hd)
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        assert np.abs(scores[h, first:] - weights).max() <= 1e-6
        reference = weights @ values[:, h // groups]
        assert np.abs(out[h] - reference).max() <= 1e-5 * np.abs(reference).max()


def test_a_window_ignores_the_keys_of_its_first_tile_before_first():
    """The tile of first (position 37) is read whole: its positions 32..36, NaN here, must not reach a result."""
    data = cache(4, 2, 32, 90, seed=5)
    expected = run(data, 4, 2, 32, 37, 90)
    data["key_tiles"][:, 2, :, :5] = np.nan
    found = run(data, 4, 2, 32, 37, 90)
    assert found[0] == 0 and np.array_equal(found[1], expected[1]) and np.array_equal(found[2], expected[2])
    assert not np.isnan(found[1]).any()


def test_attention_is_bit_identical_for_any_thread_count():
    """Enough work (8 heads x 300 positions x 64) for the heads to be split over the threads."""
    data = cache(8, 2, 64, 299, seed=3)
    runs = [run(data, 8, 2, 64, 0, 299, threads=threads) for threads in (1, 2, 3, 0)]
    assert all(np.array_equal(runs[0][1], found[1]) and np.array_equal(runs[0][2], found[2]) for found in runs[1:])


@pytest.mark.parametrize(
    "change",
    [
        {"n_kv": 3},  # 8 query heads do not share 3 KV heads evenly
        {"first": 10, "pos": 9},
        {"key_tiles": 1},  # position 20 is in the second tile of 16
        {"score_stride": 20},  # row h needs positions up to 20
        {"hd": 0},
    ],
)
def test_attention_refuses_bad_arguments_and_writes_nothing(change):
    arguments = {"n_heads": 8, "n_kv": 2, "hd": 16, "first": 0, "pos": 20} | change
    data = cache(8, 2, 16, 20, seed=1)
    status, out, scores = run(data, **arguments)
    assert status == 1 and (out == 7.0).all() and (scores == 0.0).all()
