"""What a backend gives the runtime: an Engine that runs one sequence of a bundle (DESIGN.md 3.5)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Engine(Protocol):
    """One sequence at a time: prefill a prompt, then decode one token per call.

    Logits are float32 numpy arrays of shape [vocab] for the last position; ids are plain ints. An engine with a
    tokenizer of its own also has `tokenizer(bundle) -> Tokenizer | None` (None: not for this bundle's files), which
    the session uses instead of loading the tokenizers library's (backends/c_runtime.py).
    """

    vocab_size: int
    max_seq_len: int

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Start a new sequence with the prompt ids; logits of its last token."""
        ...

    def decode(self, token: int) -> np.ndarray:
        """Append one token; logits for the next position."""
        ...

    def reset(self) -> None:
        """Forget the sequence."""
        ...
