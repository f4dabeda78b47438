"""The CPU kernels' other builds on this machine: the AVX2 path (x86-64-v3) and the portable C path (baseline
x86-64, what GCC vectorises without intrinsics) each pass the kernel tests against the torch reference. The package
build compiles for the build machine (-march=native), which here takes the AVX-512 path, so without this test the
other two paths would only run on the machines that need them."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_SOURCES = sorted((ROOT / "plugins" / "kernels" / "cpu").glob("*.c"))
KERNEL_TESTS = [
    "tests/backends/test_cpu_kernels.py",
    "tests/backends/test_cpu_matvec.py",
    "tests/backends/test_cpu_quant_kernels.py",
]

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("gcc") is None or shutil.which("objdump") is None,
    reason="builds x86-64 variants of the kernels with gcc (and checks them with objdump)",
)


def build(tmp_path: Path, march: str) -> Path:
    library = tmp_path / f"libedge_cpu_kernels-{march}.so"
    command = ["gcc", "-std=c11", "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-Wall", "-Wextra",
               "-Werror", f"-I{ROOT / 'plugins' / 'kernels' / 'cpu'}", "-o", str(library), *map(str, KERNEL_SOURCES),
               "-lm"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return library


def vector_registers(library: Path) -> set[str]:
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {register for register in ("xmm", "ymm", "zmm") if f"%{register}" in code}


@pytest.mark.parametrize(
    ("march", "registers"),
    [("x86-64-v3", {"xmm", "ymm"}), ("x86-64", {"xmm"})],
    ids=["avx2", "portable"],
)
def test_kernel_build_passes_the_kernel_tests(tmp_path, march, registers):
    library = build(tmp_path, march)
    assert vector_registers(library) == registers  # the build took the intended code path
    env = {**os.environ, "EDGE_SDK_CPU_KERNELS": str(library)}
    found = subprocess.run(
        [sys.executable, "-c", "from edge_sdk.native import find_library; print(find_library())"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(library)  # the kernel tests below load this build
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout
