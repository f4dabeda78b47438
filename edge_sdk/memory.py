"""How much memory a command will need, checked before it allocates: a model, a sequence length or a token count
that does not fit is refused with the figure, instead of running into the out-of-memory killer half-way; and how
the torch commands have the C library give freed memory back (map_large_blocks)."""

from __future__ import annotations

import ctypes
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


M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
LARGE_BLOCK_BYTES = 2 << 20
USER_THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def map_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """Have glibc serve every allocation of threshold bytes or more by its own mapping, returned to the kernel when
    freed; False where the user set glibc's MALLOC_MMAP_THRESHOLD_ (their choice stands), where the C library has no
    mallopt (not glibc) or where it refuses.

    By default glibc raises its mapping threshold to the size of each mapped block freed, up to 32 MiB, after which
    the calibration's per-layer temporaries (a few [tokens, D] activations of a few MB each, made and freed thousands
    of times) come from the heap, where the small allocations made between them keep the freed space from going back:
    the process grew by about a layer's worth of them per layer with no more live tensors (SmolLM2-135M's export
    peaked at 0.99 GB instead of 0.75 GB; benchmarks/README.md section 2). Large tensors are unaffected: they are
    mapped either way. The cost is the kernel zeroing fresh pages for each temporary: about a third more CPU time
    on a 1.1B model, whose heap growth is small beside its weights; MALLOC_MMAP_THRESHOLD_=33554432 trades the
    memory back for that time."""
    if USER_THRESHOLD_VARIABLE in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def give_back_freed_memory() -> bool:
    """Have glibc return the free pages of its heap to the kernel (malloc_trim); False where the C library has none.

    Loading a tokenizer parses its tokenizer.json twice (the strict JSON check and the tokenizers library): for
    SmolLM2's 1.6 MB file some 30 MB of small objects, freed once loaded but kept by glibc among the live ones that
    followed them. On a 135M model that is 40% of its int4 weights for the rest of the session."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return True
