"""jetson/README.md's build commands work as written, run from the repository root: the cross-build's
`-DCMAKE_TOOLCHAIN_FILE=jetson/cmake/...` was a relative path, which CMake looks for beside the build directory, so
the command stopped at "Could not find toolchain file"."""

from __future__ import annotations

import re
import subprocess

from .support import JETSON, REPO, require_tools


def test_the_readmes_cmake_configure_commands_run_from_the_repository_root(tmp_path):
    require_tools(("cmake", "cmake"), ("cc", "gcc"), ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"))
    commands = re.findall(r"^cmake -S jetson -B \S+.*$", (JETSON / "README.md").read_text(), re.MULTILINE)
    assert len(commands) == 2, commands  # the native and the aarch64 configure steps
    for command in commands:
        # the README's build directory, moved into tmp_path (written as the README writes it, relative to the root)
        command = re.sub(r"-B \S+", f"-B {tmp_path / command.split('-B ')[1].split()[0]}", command)
        command = command.split("#")[0]
        result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stderr}"
