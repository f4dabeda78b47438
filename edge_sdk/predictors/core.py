"""The core predictor's selection at the end of prefill, in numpy (no torch): the runtimes that get the prefill's
per-neuron counts and sums from a graph (ONNX Runtime, TensorRT) pick the decode's core neurons with it; the torch
reference (sparsity/core.py) applies the same rule."""

from __future__ import annotations

from fractions import Fraction

import numpy as np


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
