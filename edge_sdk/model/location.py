"""What a model path names, checked without torch: a GGUF file, or a Hugging Face checkpoint directory whose
config.json describes a supported model. The command line checks a model path with check_model_path before it imports
the pipeline, so that a mistyped path or an unsupported model is refused at once; open_checkpoint gives the same
verdicts, as it calls the same functions."""

from __future__ import annotations

from pathlib import Path

from edge_sdk.errors import CheckpointError
from edge_sdk.model.config import load_config

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


def check_model_path(path: str | Path) -> None:
    """Raise CheckpointError where open_checkpoint would for the path itself or a checkpoint's config.json (a GGUF
    file's contents are read by open_checkpoint alone)."""
    if gguf_file(path) is None:
        load_config(path)
