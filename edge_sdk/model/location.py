"""What a model path names, checked without torch: a GGUF file the reader accepts, or a Hugging Face checkpoint
directory whose config.json describes a supported model. The command line checks a model path with check_model_path
before it imports the pipeline, so that a mistyped path, an unsupported model or a file the GGUF reader refuses is
refused at once; open_checkpoint gives the same verdicts, as it calls the same functions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edge_sdk.errors import CheckpointError
from edge_sdk.model.config import load_config

if TYPE_CHECKING:
    from edge_sdk.model.gguf_checkpoint import GgufCheckpoint

GGUF_SUFFIX = ".gguf"


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a model path names: a .gguf file, or a directory without config.json holding exactly one;
    None for anything else (a Hugging Face checkpoint directory)."""
    path = Path(path)
    if path.suffix == GGUF_SUFFIX and not path.is_dir():
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(child for child in path.iterdir() if child.suffix == GGUF_SUFFIX)
    if len(found) > 1:
        names = ", ".join(child.name for child in found[:3])
        raise CheckpointError(
            f"{path}: holds {len(found)} GGUF files ({names}{', ...' if len(found) > 3 else ''}); name the one to read"
        )
    return found[0] if found else None


def check_model_path(path: str | Path) -> GgufCheckpoint | None:
    """Raise CheckpointError where open_checkpoint would for the path itself, a checkpoint's config.json or a GGUF
    file's contents. A GGUF file is opened here, which takes seconds for a real model's metadata: the checkpoint is
    returned for the caller to use instead of opening the file again; None for a Hugging Face checkpoint directory,
    whose weights' headers open_checkpoint alone reads."""
    found = gguf_file(path)
    if found is None:
        load_config(path)
        return None
    # imported here: a refusal of a Hugging Face checkpoint directory needs none of gguf, numpy and tokenizers
    from edge_sdk.model.gguf_checkpoint import GgufCheckpoint

    return GgufCheckpoint(found)
