"""The Python API: `edge_sdk.load(bundle) -> Session`, `Session.generate(prompt) -> text pieces`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edge_sdk import memory
from edge_sdk.bundle import Bundle
from edge_sdk.bundle.format import WEIGHTS_FILE
from edge_sdk.errors import EdgeSdkError
from edge_sdk.memory import GIB
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import BACKEND_ORDER, EngineOptions, Selection, select_backend, unknown_backend
from edge_sdk.runtime.engine import Engine
from edge_sdk.runtime.generator import GenerationStats, Generator, SamplingSettings


def session_memory_bytes(bundle: Bundle) -> tuple[int, str]:
    """What running a bundle keeps in memory: its weights (memory-mapped, every page read at each token) and the
    float32 KV cache of max_seq_len positions; (bytes, the parts in words)."""
    config = bundle.config
    weights = bundle.manifest.files[WEIGHTS_FILE].size
    kv_cache = 2 * config.num_layers * config.num_kv_heads * config.head_dim * bundle.max_seq_len * 4
    parts = f"weights {weights / GIB:.2f} GiB, KV cache of {bundle.max_seq_len} positions {kv_cache / GIB:.2f} GiB"
    return weights + kv_cache, parts


def check_memory(bundle: Bundle) -> None:
    needed, parts = session_memory_bytes(bundle)
    memory.require(
        f"running {bundle.path}",
        needed,
        parts,
        "free memory, or export the model with a smaller --max-seq-len or --dtype",
    )


def _engine_tokenizer(engine: Engine, bundle: Bundle) -> Tokenizer | None:
    """The engine's own tokenizer where it has one for this bundle (libedge_sdk's C tokenizer behind the cpu and
    tensorrt backends: no second vocabulary in the process), else None."""
    tokenizer = getattr(engine, "tokenizer", None)
    return tokenizer(bundle) if tokenizer is not None else None


class Session:
    """A bundle loaded on one backend, ready to generate. One sequence at a time; not thread-safe."""

    def __init__(self, bundle: Bundle, selection: Selection, options: EngineOptions):
        self.bundle = bundle
        self.selection = selection
        self.options = options
        self.engine = selection.backend.load(bundle, options)
        self.tokenizer = _engine_tokenizer(self.engine, bundle) or Tokenizer.from_bundle(bundle)
        memory.give_back_freed_memory()  # the tokenizer files' parses, before the weights' pages come in
        self.generator = Generator(self.engine, self.tokenizer)

    @property
    def info(self) -> dict[str, Any]:
        config, sparsity = self.bundle.config, self.bundle.sparsity
        return {
            "bundle": str(self.bundle.path),
            "backend": self.selection.backend.name,
            "backend_reason": self.selection.reason,
            "predictor": sparsity.predictor,
            "sparsity_level": self.options.level.reported,
            "calibrated_levels": list(sparsity.levels),
            "architecture": config.architecture,
            "layers": config.num_layers,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "vocab_size": config.vocab_size,
            "max_seq_len": self.engine.max_seq_len,
            "dtype": self.bundle.dtype,
        }

    def generate(self, prompt: str, *, chat: bool = False, **sampling: Any) -> Iterator[str]:
        """Stream the generated text (not the prompt). sampling: SamplingSettings fields (max_new_tokens,
        temperature, top_k, top_p, seed, stop, stop_on_eos). chat: wrap the prompt in the chat template."""
        unknown = sorted(set(sampling) - {field.name for field in dataclasses.fields(SamplingSettings)})
        if unknown:
            names = ", ".join(field.name for field in dataclasses.fields(SamplingSettings))
            raise EdgeSdkError(f"{unknown[0]}: not a sampling setting; expected one of {names}")
        if not isinstance(chat, bool):
            raise EdgeSdkError(f"chat: expected True or False, found {chat!r}")
        if chat and not isinstance(prompt, str):
            # the template would render a list of ids or a number as the text of the user's message
            raise EdgeSdkError(
                f"prompt: expected the user's message as a string with chat, found {type(prompt).__name__}"
            )
        settings = SamplingSettings(**sampling)
        if chat:
            from edge_sdk.runtime.chat import chat_prompt_ids  # jinja2 loads only for chat prompts, not every run

            ids = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": prompt}])
            return self.generator.stream(ids, settings)
        return self.generator.stream(prompt, settings)

    @property
    def stats(self) -> GenerationStats | None:
        """Timing and stop reason of the last finished generation."""
        return self.generator.last_stats


def load(
    bundle: str | Path,
    backend: str = "auto",
    *,
    sparsity: float | None = None,
    dense: bool = False,
    threads: int = 0,
    verify_checksums: bool = True,
    log: Callable[[str], None] | None = None,
) -> Session:
    """Open and verify a bundle, pick a backend (auto: tensorrt > cann > cpu) and load it.

    log receives the selection report: why each earlier backend was skipped and which one was chosen."""
    if not isinstance(bundle, (str, os.PathLike)):
        raise EdgeSdkError(f"bundle: expected the path of a bundle directory, found {type(bundle).__name__}")
    if not isinstance(backend, str) or backend not in ("auto", *BACKEND_ORDER):
        # checked here, before the bundle is verified: "" and None would otherwise pass as auto
        raise unknown_backend(backend)
    for name, flag in (("dense", dense), ("verify_checksums", verify_checksums)):
        if not isinstance(flag, bool):
            raise EdgeSdkError(f"{name}: expected True or False, found {flag!r}")
    if log is not None and not callable(log):
        raise EdgeSdkError(f"log: expected a function taking a line of text, or None, found {type(log).__name__}")
    opened = Bundle.open(bundle, verify_checksums=verify_checksums)
    check_memory(opened)
    options = EngineOptions.of(opened, sparsity, dense, threads)  # the level resolved, once, for every backend
    selection = select_backend(None if backend == "auto" else backend, opened, options.threads)
    if log is not None:
        for line in selection.describe():
            log(line)
    return Session(opened, selection, options)
