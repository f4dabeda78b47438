"""The torch commands give freed activations back to the system (edge_sdk.memory.map_large_blocks).

glibc's default raises its mapping threshold to the size of each mapped block freed, so the calibration's many
same-sized temporaries end up in the heap, where they stayed: the export's peak memory grew layer by layer
(benchmarks/README.md section 2 has the figures on the real model)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edge_sdk import memory
from edge_sdk.cli import main

# How many blocks glibc serves by their own mapping while a 3 MiB block is held, the second time one is asked for.
PROBE = """
import ctypes, json, sys
from edge_sdk import memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "mapped":
    assert memory.map_large_blocks()
if sys.argv[1] == "user's threshold":
    assert not memory.map_large_blocks()
size = 3 << 20
libc.free(libc.malloc(size))
before = libc.mallinfo2().hblks
block = libc.malloc(size)
held = libc.mallinfo2().hblks
libc.free(block)
print(json.dumps({"new_mappings": held - before}))
"""


def new_mappings(mode: str, env: dict[str, str] | None = None) -> int:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(result.stdout)["new_mappings"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's mapping threshold is glibc's")
def test_large_blocks_stay_mapped_after_one_is_freed():
    assert new_mappings("default") == 0  # glibc raised its threshold: the block came from the heap
    assert new_mappings("mapped") == 1


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's mapping threshold is glibc's")
def test_users_mapping_threshold_is_left_alone():
    environment = {**os.environ, memory.USER_THRESHOLD_VARIABLE: str(32 << 20)}
    assert new_mappings("user's threshold", environment) == 0


def test_export_command_maps_large_blocks(monkeypatch, tiny_model_dir, tmp_path):
    calls = []
    monkeypatch.setattr(memory, "map_large_blocks", lambda: calls.append(True) or True)
    result = CliRunner().invoke(
        main, ["export", str(tiny_model_dir), "-o", str(tmp_path / "bundle"), "--predictor", "none"]
    )
    assert result.exit_code == 0, result.output
    assert calls == [True]
