"""Writing a directory all at once: into a temporary sibling, renamed over the target only when complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory next to target; when the block succeeds it replaces target.

    On any exception (an error or an interrupt) the temporary directory is removed and target is left as it
    was, so a failed write never leaves a half-written result. Being a sibling, the rename stays on one
    file system."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
