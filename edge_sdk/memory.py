"""How much memory a command will need, checked before it allocates: a model, a sequence length or a token count
that does not fit is refused with the figure, instead of running into the out-of-memory killer half-way."""

from __future__ import annotations

import os

from edge_sdk.errors import EdgeSdkError

GIB = 1 << 30


class InsufficientMemory(EdgeSdkError):
    """The work asked for needs more memory than this machine has available."""


def available_bytes() -> int:
    """Memory the kernel can give without swapping (MemAvailable), or the physical memory where that is unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require(purpose: str, needed: int, parts: str, advice: str) -> None:
    """Raise InsufficientMemory when needed bytes exceed what is available; parts says what the figure is made of,
    advice what to change."""
    available = available_bytes()
    if needed > available:
        raise InsufficientMemory(
            f"{purpose} needs about {needed / GIB:.2f} GiB ({parts}), but this machine has {available / GIB:.2f} GiB "
            f"available; {advice}"
        )
