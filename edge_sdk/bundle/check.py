"""`edge-sdk verify --files-only`: everything a runtime checks before running a bundle, without running it.

The bundle opens with every checksum (bundle/reader.py) and its tokenizer loads (model/tokenizer.py), exactly what
`edge-sdk run` and the C runtime do first, so a bundle that passes here is refused by neither for its files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_sdk.bundle.reader import Bundle
from edge_sdk.model.tokenizer import Tokenizer


def check_bundle(path: str | Path) -> tuple[Bundle, dict[str, Any]]:
    """The opened bundle and a summary of what was checked; BundleError / CheckpointError name what is wrong."""
    bundle = Bundle.open(path, verify_checksums=True)
    tokenizer = Tokenizer.from_bundle(bundle)
    summary = {
        "bundle": str(bundle.path),
        "format_version": bundle.manifest.format_version,
        "files": len(bundle.manifest.files),
        "bytes": sum(entry.size for entry in bundle.manifest.files.values()),
        "tensors": len(bundle.manifest.tensors),
        "dtype": _dtype_text(bundle.manifest),
        "predictor": bundle.sparsity.predictor,
        "levels": ", ".join(f"{level:g}" for level in bundle.sparsity.levels) or "none",
        "vocabulary": tokenizer.vocab_size,
        "checksums": "match",
    }
    return bundle, summary


def _dtype_text(manifest) -> str:
    """The weights' storage: the dtype, an asymmetric int4's scheme, and an LM head or FFN down projections of their
    own dtype."""
    text = manifest.dtype + (" asymmetric" if manifest.asymmetric else "")
    wider = [f"LM head {manifest.head_dtype}"] if manifest.head_dtype else []
    wider += [f"FFN down {manifest.down_dtype}"] if manifest.down_dtype else []
    return text + (f" ({', '.join(wider)})" if wider else "")
