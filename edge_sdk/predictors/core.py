"""The core predictor's selection at the end of prefill, in numpy (no torch): the runtimes that get the prompt's
gate activations from the prefill graph (ONNX Runtime, TensorRT) count each layer's token-wise core neurons and pick
the decode's core neurons with it; the torch reference (sparsity/core.py) and the C runtime apply the same rule."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

CHUNK_ELEMENTS = 1 << 22  # tokens are counted in chunks of about this many activations (bounded temporaries)


def core_counts_from_activations(activations: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """[S, D] gate activations of one prompt -> (counts [D] int64, sums [D] float64): per token its
    ceil(alpha * n_pos) largest positive activations (equal values: lower index first), counted per neuron, and
    those activations summed per neuron in float64."""
    n_tokens, n_neurons = activations.shape
    ratio = Fraction(repr(float(alpha)))  # alpha read as the decimal written
    counts = np.zeros(n_neurons, dtype=np.int64)
    sums = np.zeros(n_neurons, dtype=np.float64)
    step = max(1, CHUNK_ELEMENTS // max(1, n_neurons))
    for start in range(0, n_tokens, step):
        acts = np.asarray(activations[start : start + step], dtype=np.float32)  # [t, D]
        n_positive = (acts > 0).sum(axis=1)
        keep = np.array([-(-ratio * int(n) // 1) for n in n_positive], dtype=np.int64)  # [t], ceil; <= n_positive
        order = np.argsort(-acts, axis=1, kind="stable")  # [t, D] descending, equal values: lower index first
        taken = np.arange(n_neurons)[None, :] < keep[:, None]  # [t, D] by rank
        neurons = order[taken]
        values = np.take_along_axis(acts, order, axis=1)[taken].astype(np.float64)
        counts += np.bincount(neurons, minlength=n_neurons)
        sums += np.bincount(neurons, weights=values, minlength=n_neurons)
    return counts, sums


def core_masks_from_activations(activations: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """[B, S, D] gate activations of a prefill -> [B, D] bool decode masks (counts, then core_mask_from_counts)."""
    rows = [core_counts_from_activations(row, alpha) for row in activations]
    counts = np.stack([row_counts for row_counts, _ in rows])
    sums = np.stack([row_sums for _, row_sums in rows])
    return core_mask_from_counts(counts, sums, beta)


def core_mask_from_counts(counts: np.ndarray, sums: np.ndarray, beta: float) -> np.ndarray:
    """[B, D] counts and sums -> [B, D] bool masks: the top ceil(beta*D) neurons by count, then larger sum, then
    lower index; neurons never picked (count 0) are never in the mask."""
    batch, n_neurons = counts.shape
    keep = -(-Fraction(repr(float(beta))) * n_neurons // 1)  # ceil, with beta read as written
    masks = np.zeros((batch, n_neurons), dtype=bool)
    for row in range(batch):
        order = np.lexsort((np.arange(n_neurons), -sums[row], -counts[row]))[: int(keep)]
        chosen = order[counts[row, order] > 0]
        masks[row, chosen] = True
    return masks
