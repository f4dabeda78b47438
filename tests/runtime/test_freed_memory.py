"""A session gives the memory its tokenizer's parses freed back to the system (edge_sdk.memory.give_back_freed_memory).

glibc keeps freed heap pages among the live blocks that followed them: after SmolLM2's tokenizer.json (parsed by the
strict JSON check and by the tokenizers library) some 30 MB stayed in `edge-sdk run`'s process for the whole session,
40% of that model's int4 weights (benchmarks/README.md section 5 has the figures). A session on libedge_sdk now
tokenizes in C (test_runtime_tokenizer.py); the tokenizers library's files still take this path."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from edge_sdk.backends.c_runtime import RuntimeEngine

import edge_sdk
from edge_sdk import memory
from edge_sdk.model.tokenizer import Tokenizer

# 60 MB of 1000-byte blocks (malloc's, not pymalloc's) with every hundredth kept: freeing the rest leaves the heap's
# pages resident around the kept ones until they are given back.
PROBE = """
import json, sys
from edge_sdk import memory

def resident():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096

before = resident()
blocks = [bytes([i % 251]) * 1000 for i in range(60_000)]
kept = blocks[::100]
grown = resident() - before
del blocks
if sys.argv[1] == "give back":
    assert memory.give_back_freed_memory()
print(json.dumps({"grown": grown, "held": resident() - before, "kept": len(kept)}))
"""


def held_after_free(mode: str) -> tuple[int, int]:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    figures = json.loads(result.stdout)
    return figures["grown"], figures["held"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system():
    grown, held = held_after_free("keep")
    assert grown > 50 << 20 and held > 0.75 * grown  # freed, yet resident
    grown, held = held_after_free("give back")
    assert held < 0.25 * grown


def test_a_session_gives_back_what_loading_its_tokenizer_freed(bundle_matrix, monkeypatch):
    """The pages go back after the tokenizer is loaded (here the tokenizers library's, as for a file the C runtime's
    tokenizer does not take) and before the first token reads the weights in."""
    events = []
    loaded = Tokenizer.from_bundle
    monkeypatch.setattr(RuntimeEngine, "tokenizer", lambda engine, bundle: events.append("engine's") and None)
    monkeypatch.setattr(Tokenizer, "from_bundle", lambda bundle: events.append("tokenizer") or loaded(bundle))
    monkeypatch.setattr(memory, "give_back_freed_memory", lambda: events.append("given back") or True)
    session = edge_sdk.load(bundle_matrix.path("svd-fp32"), backend="cpu")
    assert events == ["engine's", "tokenizer", "given back"]
    assert "".join(session.generate("def", max_new_tokens=2))
