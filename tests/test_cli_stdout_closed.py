"""A reader of edge-sdk's standard output that stops early (`edge-sdk run ... | head -c 20`) is not an error: the
command stops quietly with the status of one killed by SIGPIPE, instead of "edge-sdk: error: edge-sdk: Broken pipe"
and status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def test_a_reader_that_went_away_ends_the_command_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes its first line
    try:
        result = subprocess.run(
            [sys.executable, "-m", "edge_sdk", "doctor"], stdout=write_end, stderr=subprocess.PIPE, timeout=300
        )
    finally:
        os.close(write_end)
    assert result.stderr.decode() == ""
    assert result.returncode == 128 + signal.SIGPIPE
