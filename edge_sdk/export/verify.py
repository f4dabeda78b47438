"""`edge-sdk verify`'s numeric check: the bundle's graphs in ONNX Runtime against the torch reference.

Every calibrated level is checked (and dense decoding): prefill plus greedy decode steps, logits within
LOGITS_TOLERANCE and the same greedy tokens. The files were checked first (bundle/check.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder

DEFAULT_PROMPT = "def main(argv=None):\n    "
LOGITS_TOLERANCE = 1e-4  # both sides compute in fp32 on the same stored weights


class VerificationError(EdgeSdkError):
    """The bundle's graphs disagree with its torch reference."""


def _compare(bundle: Bundle, ids: list[int], level: float | None, dense: bool, steps: int) -> tuple[float, list, list]:
    """(max logit difference, reference greedy tokens, ONNX Runtime greedy tokens) at one operating point; the
    ONNX Runtime side is fed the reference's tokens, so a difference shows at its step and does not compound."""
    reference = load_reference_decoder(bundle)
    configure(reference, bundle.sparsity.resolve(level, dense))
    session = OrtBundleSession(bundle, level=level, dense=dense)
    expected = reference.prefill(torch.tensor([ids]))[0, -1]
    found = torch.from_numpy(session.prefill(np.array([ids]))[0, -1])
    max_diff = (expected - found).abs().max().item()
    reference_tokens, ort_tokens = [], []
    for _ in range(steps):
        token = int(expected.argmax())
        reference_tokens.append(token)
        ort_tokens.append(int(found.argmax()))
        expected = reference.decode(torch.tensor([[token]]))[0, -1]
        found = torch.from_numpy(session.decode(np.array([[token]]))[0, -1])
        max_diff = max(max_diff, (expected - found).abs().max().item())
    return max_diff, reference_tokens, ort_tokens


def verify_graphs(bundle: Bundle, prompt: str = DEFAULT_PROMPT, decode_steps: int = 8) -> dict[str, Any]:
    """Prefill + greedy decode steps in ONNX Runtime and in the torch reference on an opened bundle, dense and at
    every calibrated level (the predictor's one setting when it has no levels); raises VerificationError naming the
    operating point where logits or greedy tokens differ."""
    tokenizer = Tokenizer.from_bundle(bundle)
    ids = tokenizer.encode(prompt)[: bundle.max_seq_len - decode_steps]
    points: list[tuple[str, float | None, bool]] = [("dense", None, True)]
    points += [(f"level {level:g}", level, False) for level in bundle.sparsity.levels] or [("sparse", None, False)]
    worst, text = 0.0, ""
    for name, level, dense in points:
        max_diff, reference_tokens, ort_tokens = _compare(bundle, ids, level, dense, decode_steps)
        if max_diff > LOGITS_TOLERANCE or reference_tokens != ort_tokens:
            raise VerificationError(
                f"{bundle.path}: ONNX Runtime disagrees with the torch reference at {name} (max logit diff "
                f"{max_diff:.3g}, tolerance {LOGITS_TOLERANCE:g}; greedy tokens "
                f"{'match' if reference_tokens == ort_tokens else 'differ'})"
            )
        worst = max(worst, max_diff)
        if not dense and not text:
            text = tokenizer.decode(reference_tokens)
    return {
        "prompt_tokens": len(ids),
        "decode_steps": decode_steps,
        "operating_points": ", ".join(name for name, _, _ in points),
        "max_abs_logit_diff": worst,
        "tolerance": LOGITS_TOLERANCE,
        "greedy_tokens_match": True,
        "text": text,
    }
