"""`edge-sdk verify --against MODEL_DIR`: the bundle's dense logits against transformers' reading of MODEL_DIR.

verify's numeric check compares the bundle's implementations with each other (ONNX Runtime against the torch
reference); both read the architecture from the manifest that export wrote from config.json, so a setting export read
differently from transformers (a default, a RoPE key's precedence, a sliding window) passes it unseen. Here
transformers builds the model from MODEL_DIR's own config.json and runs it on the bundle's weights, dequantized to
float32, so both sides hold the same numbers whatever the bundle's dtype: a difference beyond float32 rounding is a
difference in what is computed. AWQ scales are folded into the weights, which keeps the function. What the weights
lost to fp16 / int8 / int4 is not measured here but by `edge-sdk eval` (perplexity).

The sequence is the prompt and greedy tokens after it; where either side has a sliding window shorter than the
bundle's max_seq_len, it is continued past the window (the prompt's ids repeated), since a window only shows there.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import bundle_decoder, bundle_tensor

# Relative to the largest logit: both sides compute in float32 on the same weights, in different summation orders
# (differences of about 1e-6 of it on the models compared); a setting read differently moves logits by far more.
RELATIVE_TOLERANCE = 1e-4
WINDOW_OVERRUN = 16  # positions compared past a sliding window


class AgainstError(EdgeSdkError):
    """transformers computes MODEL_DIR differently from the bundle, or cannot run it."""


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise EdgeSdkError(
            "verify --against runs the model in transformers, which is not installed: pip install transformers"
        ) from None
    return transformers


def _no_init_weights() -> contextlib.AbstractContextManager:
    """transformers' context that skips the random initialization the bundle's weights then replace (its place moved
    in transformers 5); none where this transformers has neither."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def _transformers_config(transformers: Any, source: Path) -> Any:
    """MODEL_DIR's config.json as transformers reads it."""
    if not (source / "config.json").is_file():
        raise EdgeSdkError(
            f"{source}: expected the Hugging Face checkpoint directory the bundle was exported from, with its "
            "config.json (a GGUF file's reference is llama.cpp, which verify does not run)"
        )
    try:
        return transformers.AutoConfig.from_pretrained(source)
    except Exception as error:  # transformers raises ValueError, OSError, KeyError, ... for a config it cannot read
        raise AgainstError(f"{source}: transformers cannot read this config.json: {error}") from None


def _transformers_model(transformers: Any, config: Any, source: Path, decoder: torch.nn.Module) -> Any:
    """transformers' model of config, holding the decoder's tensors (shared, not copied)."""
    try:
        with _no_init_weights():
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    except Exception as error:  # an architecture or setting this transformers does not implement
        raise AgainstError(f"{source}: transformers cannot build this model: {error}") from None
    tied = bool(getattr(config, "tie_word_embeddings", False))
    theirs = model.state_dict()
    ours = {}
    for name, tensor in decoder.state_dict().items():
        key = name if name == "lm_head.weight" else "model." + name
        if key not in theirs:
            if key == "lm_head.weight" and tied:
                continue  # transformers keeps a tied head as the embedding alone
            raise AgainstError(
                f"{source}: transformers' {type(model).__name__} has no tensor '{key}', which the bundle holds: the "
                "bundle was not exported from this model"
            )
        if theirs[key].shape != tensor.shape:
            raise AgainstError(
                f"{source}: tensor '{key}' has shape {list(theirs[key].shape)} in transformers' model, "
                f"{list(tensor.shape)} in the bundle: the bundle was not exported from this model"
            )
        ours[key] = tensor
    missing = sorted(set(theirs) - set(ours))
    if missing:
        raise AgainstError(
            f"{source}: transformers' {type(model).__name__} has tensors the bundle lacks ({', '.join(missing)}): the "
            "bundle was not exported from this model"
        )
    model.load_state_dict(ours, strict=False, assign=True)
    if "lm_head.weight" not in ours:
        model.tie_weights()
    return model.float().eval()


def compare_with_transformers(bundle: Bundle, source: str | Path, prompt: str, steps: int) -> dict[str, Any]:
    """Dense logits at every position of the prompt and `steps` greedy tokens after it, the bundle's (its torch
    reference, which verify compares with ONNX Runtime) against transformers' on the same float32 weights; raises
    AgainstError beyond RELATIVE_TOLERANCE of the largest logit."""
    transformers = _transformers()
    source = Path(source)
    if not source.exists():
        raise EdgeSdkError(f"{source}: no such directory (expected the checkpoint the bundle was exported from)")
    config = _transformers_config(transformers, source)
    decoder = bundle_decoder(bundle)
    decoder.max_seq_len = bundle.max_seq_len
    # the bundle's RoPE tables, which every backend reads: transformers computes its own from the configuration
    decoder.rope_cos, decoder.rope_sin = bundle_tensor(bundle, "rope.cos"), bundle_tensor(bundle, "rope.sin")
    model = _transformers_model(transformers, config, source, decoder)
    ids = Tokenizer.from_bundle(bundle).encode(prompt)[: max(1, bundle.max_seq_len - steps)]
    with torch.inference_mode():
        while len(ids) < bundle.max_seq_len and steps > 0:
            ids.append(int(decoder(torch.tensor([ids]))[0, -1].argmax()))
            steps -= 1
        windows = [w for w in (bundle.config.sliding_window, getattr(config, "sliding_window", None)) if w]
        if windows and min(windows) < bundle.max_seq_len:
            length = min(bundle.max_seq_len, min(windows) + WINDOW_OVERRUN)
            ids = (ids * (length // len(ids) + 1))[: max(length, len(ids))]
        batch = torch.tensor([ids])
        expected = model(batch).logits[0].float()
        found = decoder(batch)[0]
    differences = (found - expected).abs().max(dim=-1).values
    worst = int(differences.argmax())
    max_diff = differences[worst].item()
    tolerance = RELATIVE_TOLERANCE * max(1.0, expected.abs().max().item())
    if not max_diff <= tolerance:
        raise AgainstError(
            f"{bundle.path}: transformers {transformers.__version__} computes {source} otherwise than the bundle, on "
            f"the same weights: max logit diff {max_diff:.3g} at position {worst} of {len(ids)} (tolerance "
            f"{tolerance:.3g}); export read the model's configuration otherwise than transformers does, or the bundle "
            "was not exported from this model"
        )
    return {
        "against": f"transformers {transformers.__version__}: {source} on the bundle's weights, dense",
        "against_positions": len(ids),
        "against_max_abs_logit_diff": max_diff,
        "against_tolerance": tolerance,
    }
