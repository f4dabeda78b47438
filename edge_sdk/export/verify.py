"""`edge-sdk verify`'s numeric check: the bundle's graphs in ONNX Runtime against the torch reference.

Every calibrated level is checked (and dense decoding): prefill plus greedy decode steps, logits within
LOGITS_TOLERANCE and the same greedy tokens, except at a step where ONNX Runtime rounded a near-tie mask decision
the other way, which the reference then reproduces (see _compare). The files were checked first (bundle/check.py),
the graphs' inputs and outputs included; whatever ONNX Runtime still refuses in a graph is a VerificationError naming
the graph (_in_onnx_runtime), never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from edge_sdk.bundle import Bundle
from edge_sdk.bundle.format import GRAPH_PHASES
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder

DEFAULT_PROMPT = "def main(argv=None):\n    "
DEFAULT_DECODE_STEPS = 8
LOGITS_TOLERANCE = 1e-4  # both sides compute in fp32 on the same stored weights
# A mask decision this close to its boundary, relative to the sum of the absolute terms it is made of, may round
# either way: fp32's unit roundoff is 6e-8, and the flips seen on SmolLM2 at CHESS level 0.5 had margins near
# 6e-8 while no decision above 3e-7 flipped in 24 steps (benchmarks/README.md, section 10).
TIE_TOLERANCE = 1e-6
MAX_TIES_TRIED = 16
MAX_MESSAGE_SHOWN = 400  # characters of ONNX Runtime's message kept (it may list every input of a graph)
Result = TypeVar("Result")


class VerificationError(EdgeSdkError):
    """The bundle's graphs disagree with its torch reference."""


def _compare(bundle: Bundle, ids: list[int], level: float | None, dense: bool, steps: int) -> dict[str, Any]:
    """One operating point: the max logit difference, both sides' greedy tokens and the near-ties that explained a
    difference. The ONNX Runtime side is fed the reference's tokens, so a difference shows at its step and does not
    compound.

    A mask decision within TIE_TOLERANCE of its boundary may round either way in another summation order, and
    a threshold or predictor decision is a jump in the FFN's output (the neuron is worth t, not 0, at a CHESS
    threshold), which the KV cache then carries to every later step. So when a step differs, the reference
    takes it again with one of that step's near-tie decisions inverted, nearest first; if that reproduces ONNX
    Runtime's logits, the step is explained and the reference goes on with that decision, as ONNX Runtime did."""
    reference = load_reference_decoder(bundle)
    configure(reference, bundle.sparsity.resolve(level, dense))
    for ffn in reference.ffns:
        ffn.tie_tolerance = TIE_TOLERANCE
    session = _in_onnx_runtime(bundle, None, OrtBundleSession, bundle, level=level, dense=dense)
    expected = reference.prefill(torch.tensor([ids]))[0, -1]
    found = torch.from_numpy(_in_onnx_runtime(bundle, "prefill", session.prefill, np.array([ids]))[0, -1])
    _check_finite(bundle, "prefill", expected, found)
    max_diff = (expected - found).abs().max().item()
    reference_tokens, ort_tokens, explained = [], [], []
    for step in range(steps):
        token = int(expected.argmax())
        reference_tokens.append(token)
        ort_tokens.append(int(found.argmax()))
        expected = reference.decode(torch.tensor([[token]]))[0, -1]
        found = torch.from_numpy(_in_onnx_runtime(bundle, "decode", session.decode, np.array([[token]]))[0, -1])
        _check_finite(bundle, f"decode step {step}", expected, found)
        diff = (expected - found).abs().max().item()
        if diff > LOGITS_TOLERANCE:
            tie = explain_by_a_near_tie(reference, token, found)
            if tie is not None:
                layer, neuron, margin, diff, expected = tie
                explained.append(f"step {step}: layer {layer} neuron {neuron} (relative margin {margin:.2g})")
        max_diff = max(max_diff, diff)
    return {"max_diff": max_diff, "reference": reference_tokens, "ort": ort_tokens, "near_ties": explained}


def _check_finite(bundle: Bundle, where: str, expected: torch.Tensor, found: torch.Tensor) -> None:
    """Both sides' logits must be finite: a NaN compares false with the tolerance and torch's argmax takes it as
    the largest value, so two NaN logits at the same place would 'agree' (and Python's max() drops a NaN)."""
    for side, logits in (("the torch reference", expected), ("ONNX Runtime", found)):
        bad = (~torch.isfinite(logits)).nonzero().flatten()
        if bad.numel():
            raise VerificationError(
                f"{bundle.path}: {side} computed {bad.numel()} non-finite logits at {where} (first: token "
                f"{int(bad[0])} = {logits[bad[0]].item()}); expected finite logits: a weight, scale or norm of the "
                f"bundle is NaN / Inf or overflows"
            )


def check_rope_tables(bundle: Bundle, tolerance: float = 1e-6) -> None:
    """rope.cos / rope.sin against the tables the manifest's model.rope, head_dim and max_seq_len define (every reader
    uses the stored tables, so a corrupted entry is otherwise read identically by all of them, at positions verify's
    few steps never reach)."""
    from edge_sdk.model.decoder import rope_tables

    config = bundle.config
    tables = rope_tables(config.rope, config.head_dim, bundle.max_seq_len)
    for name, table in zip(("rope.cos", "rope.sin"), tables, strict=True):
        stored = torch.from_numpy(np.asarray(bundle.array(name), dtype=np.float32))
        diff = (stored - table).abs()
        if not bool((diff <= tolerance).all()):  # NaN-safe
            position, column = divmod(int(torch.nan_to_num(diff, nan=float("inf")).argmax()), config.head_dim)
            raise VerificationError(
                f"{bundle.path}: weights.safetensors tensor '{name}' differs from the table of the manifest's "
                f"model.rope at position {position}, column {column} (stored {stored[position, column].item()}, "
                f"expected {table[position, column].item()}); expected the tables edge-sdk export writes"
            )


def _onnxruntime_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises for a graph it cannot load or run: its native errors (the exception classes of
    onnxruntime_pybind11_state, Fail, InvalidArgument, InvalidGraph...) and the ValueError / RuntimeError of its
    Python side (an input the feed lacks, a value of the wrong type)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    native = (value for value in vars(state).values() if isinstance(value, type) and issubclass(value, Exception))
    return (*native, ValueError, RuntimeError)


def _in_onnx_runtime(bundle: Bundle, phase: str | None, call: Callable[..., Result], *args, **kwargs) -> Result:
    """call(*args, **kwargs): ONNX Runtime loading the graphs (phase None) or running the graph of phase, its errors
    raised as a VerificationError naming the graph (on loading: the one its message names, else both)."""
    try:
        return call(*args, **kwargs)
    except _onnxruntime_errors() as problem:
        text = " ".join(str(problem).split())
        phases = [phase] if phase is not None else [p for p in GRAPH_PHASES if str(bundle.graph_path(p)) in text]
        files = " / ".join(str(bundle.graph_path(p)) for p in phases or GRAPH_PHASES)
        if len(text) > MAX_MESSAGE_SHOWN:
            text = text[:MAX_MESSAGE_SHOWN] + "..."
        action = "load" if phase is None else "run"
        raise VerificationError(
            f"{files}: ONNX Runtime could not {action} the graph ({type(problem).__name__}: {text}); expected the "
            f"graph edge-sdk export writes"
        ) from None


def explain_by_a_near_tie(
    reference, token: int, found: torch.Tensor, logits_tolerance: float = LOGITS_TOLERANCE
) -> tuple | None:
    """(layer, neuron, margin, logit difference, the retaken step's logits) of the nearest near-tie decision whose
    inversion makes the reference's last decode step match `found`; the reference is left after that step taken
    with the decision inverted. None, with the reference left as it was, when no single near-tie explains it.
    The reference's SparseFeedForward modules must record near-ties (tie_tolerance set) for the step."""
    ties = sorted(
        ((margin, layer, neuron) for layer, ffn in enumerate(reference.ffns) for neuron, margin in ffn.near_ties),
    )[:MAX_TIES_TRIED]
    recorded = [ffn.near_ties for ffn in reference.ffns]
    for margin, layer, neuron in ties:
        reference.ffns[layer].flipped = frozenset({neuron})
        reference.decoder.position -= 1  # the KV cache is written by index: the step is taken again in place
        retaken = reference.decode(torch.tensor([[token]]))[0, -1]
        diff = (retaken - found).abs().max().item()
        if diff <= logits_tolerance:
            return layer, neuron, margin, diff, retaken
    reference.decoder.position -= 1
    reference.decode(torch.tensor([[token]]))
    for ffn, ties_then in zip(reference.ffns, recorded, strict=True):
        ffn.near_ties = ties_then
    return None


def verify_graphs(bundle: Bundle, prompt: str = DEFAULT_PROMPT, decode_steps: int | None = None) -> dict[str, Any]:
    """Prefill + greedy decode steps in ONNX Runtime and in the torch reference on an opened bundle, dense and at
    every calibrated level (the predictor's one setting when it has no levels); raises VerificationError naming the
    operating point where logits or greedy tokens differ.

    The prompt and the decode steps share the bundle's KV cache: the prompt is cut to the max_seq_len the steps
    leave it. decode_steps None takes DEFAULT_DECODE_STEPS, or as many as fit after a one-token prompt when the
    bundle's max_seq_len is shorter; a number of steps that leaves no room for one prompt token is refused."""
    check_rope_tables(bundle)
    tokenizer = Tokenizer.from_bundle(bundle)
    prompt_ids = tokenizer.encode(prompt)
    most_steps = bundle.max_seq_len - 1
    if decode_steps is None:
        decode_steps = min(DEFAULT_DECODE_STEPS, most_steps)
    elif decode_steps > most_steps:
        raise EdgeSdkError(
            f"{bundle.path}: --steps {decode_steps} leaves no room in the bundle's max_seq_len {bundle.max_seq_len} "
            f"for the {len(prompt_ids)}-token prompt (cut to fit, but at least 1 token): expected --steps at most "
            f"{most_steps}"
        )
    ids = prompt_ids[: bundle.max_seq_len - decode_steps]
    points: list[tuple[str, float | None, bool]] = [("dense", None, True)]
    points += [(f"level {level:g}", level, False) for level in bundle.sparsity.levels] or [("sparse", None, False)]
    worst, text = 0.0, ""
    near_ties = []
    for name, level, dense in points:
        result = _compare(bundle, ids, level, dense, decode_steps)
        max_diff, reference_tokens = result["max_diff"], result["reference"]
        if not max_diff <= LOGITS_TOLERANCE or reference_tokens != result["ort"]:
            raise VerificationError(
                f"{bundle.path}: ONNX Runtime disagrees with the torch reference at {name} (max logit diff "
                f"{max_diff:.3g}, tolerance {LOGITS_TOLERANCE:g}, and no mask decision within {TIE_TOLERANCE:g} "
                f"of its boundary explains it; greedy tokens "
                f"{'match' if reference_tokens == result['ort'] else 'differ'})"
            )
        near_ties += [f"{name} {tie}" for tie in result["near_ties"]]
        worst = max(worst, max_diff)
        if not dense and not text:
            text = tokenizer.decode(reference_tokens)
    return {
        "prompt_tokens": len(ids),
        "decode_steps": decode_steps,
        "operating_points": ", ".join(name for name, _, _ in points),
        "max_abs_logit_diff": worst,
        "tolerance": LOGITS_TOLERANCE,
        "near_ties_rounded_the_other_way": "; ".join(near_ties) or "none",
        "greedy_tokens_match": True,
        "text": text,
    }
