"""`edge-sdk verify`: a bundle's files, checksums and shapes, then ONNX Runtime against the torch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.bundle import Bundle
from edge_sdk.export.exporter import load_reference_decoder
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer

DEFAULT_PROMPT = "def main(argv=None):\n    "
LOGITS_TOLERANCE = 1e-4  # both sides compute in fp32 on the same stored weights


class VerificationError(EdgeSdkError):
    """The bundle's graphs disagree with its torch reference."""


def verify_bundle(path: str | Path, prompt: str = DEFAULT_PROMPT, decode_steps: int = 8) -> dict[str, Any]:
    """Open the bundle with full checks, run prefill + greedy decode steps in ONNX Runtime and in the
    torch reference, and compare logits and tokens. Raises VerificationError on a mismatch."""
    bundle = Bundle.open(path, verify_checksums=True)
    tokenizer = Tokenizer.from_dir(bundle.path, bundle.config.eos_token_ids)
    ids = tokenizer.encode(prompt)[: bundle.manifest["max_seq_len"] - decode_steps]
    reference = load_reference_decoder(bundle)
    session = OrtBundleSession(bundle)
    expected = reference.prefill(torch.tensor([ids]))[0, -1]
    found = torch.from_numpy(session.prefill(np.array([ids]))[0, -1])
    max_diff = (expected - found).abs().max().item()
    reference_tokens, ort_tokens = [], []
    next_reference, next_ort = int(expected.argmax()), int(found.argmax())
    for _ in range(decode_steps):
        reference_tokens.append(next_reference)
        ort_tokens.append(next_ort)
        expected = reference.decode(torch.tensor([[next_reference]]))[0, -1]
        found = torch.from_numpy(session.decode(np.array([[next_reference]]))[0, -1])
        max_diff = max(max_diff, (expected - found).abs().max().item())
        next_reference, next_ort = int(expected.argmax()), int(found.argmax())
    result = {
        "bundle": str(bundle.path),
        "files": len(bundle.manifest["files"]),
        "tensors": len(bundle.manifest["tensors"]),
        "predictor": bundle.sparsity.predictor,
        "prompt_tokens": len(ids),
        "decode_steps": decode_steps,
        "max_abs_logit_diff": max_diff,
        "tolerance": LOGITS_TOLERANCE,
        "greedy_tokens_match": reference_tokens == ort_tokens,
        "text": tokenizer.decode(reference_tokens),
    }
    if max_diff > LOGITS_TOLERANCE or reference_tokens != ort_tokens:
        raise VerificationError(
            f"{bundle.path}: ONNX Runtime disagrees with the torch reference (max logit diff {max_diff:.3g}, "
            f"tolerance {LOGITS_TOLERANCE:g}; greedy tokens {'match' if result['greedy_tokens_match'] else 'differ'})"
        )
    return result
