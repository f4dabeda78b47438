"""The Debian packages of the C runtime (packaging/build_deb.sh): extracted into a temporary root, the amd64 package
builds the example through pkg-config and runs it; the arm64 package runs under qemu. Both give the Python CPU
backend's greedy ids."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from .support import PROMPT, REPO, STEPS, qemu_command, require_tools, run

BUILD_DEB = REPO / "packaging" / "build_deb.sh"


def build_and_extract(arch: str, tmp_path: Path) -> Path:
    """Builds the package for arch, checks its control file, and extracts it; returns the extracted root."""
    result = run(["bash", BUILD_DEB, arch, tmp_path / "dist"], timeout=600)
    if result.returncode != 0 and "cJSON not found" in result.stdout + result.stderr:
        pytest.skip(f"cJSON for {arch} not found: apt-get install libcjson-dev{':arm64' if arch == 'arm64' else ''}")
    assert result.returncode == 0, result.stdout + result.stderr
    deb = Path(result.stdout.strip().splitlines()[-1])
    assert deb.name == f"edge-sdk-runtime_{read_version()}_{arch}.deb"
    control = run(["dpkg-deb", "--field", deb], check=True).stdout
    assert f"Architecture: {arch}" in control and "libcjson1" in control and "libgomp1" in control
    root = tmp_path / "root"
    run(["dpkg-deb", "-x", deb, root], check=True)
    return root


def read_version() -> str:
    for line in (REPO / "edge_sdk" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split('"')[1]
    raise AssertionError("no __version__ in edge_sdk/__init__.py")


def test_amd64_package_builds_the_example_through_pkg_config(tmp_path, bundles, python_greedy_ids):
    require_tools(("cmake", "cmake"), ("cc", "gcc"), ("dpkg-deb", "dpkg"), ("pkg-config", "pkg-config"))
    if platform.machine() != "x86_64":
        pytest.skip("the amd64 package is built natively, on x86-64 only")
    root = build_and_extract("amd64", tmp_path)
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    assert (root / "usr" / "include" / "edge_sdk.h").is_file() and (libdir / "libedge_sdk.a").is_file()
    env = os.environ | {"PKG_CONFIG_PATH": str(libdir / "pkgconfig")}
    flags = run(["pkg-config", "--cflags", "--libs", "edge_sdk"], env=env, check=True).stdout.split()
    assert "-ledge_sdk" in flags
    example = root / "usr" / "share" / "doc" / "edge-sdk-runtime" / "edge_generate.c"
    binary = tmp_path / "edge_generate"
    compile_result = run(["cc", "-std=c11", "-Wall", "-Wextra", example, *flags, "-o", binary])
    assert compile_result.returncode == 0 and "warning" not in compile_result.stderr, compile_result.stderr
    run_env = os.environ | {"LD_LIBRARY_PATH": str(libdir)}
    command = ["-n", str(STEPS), "--threads", "1", "--ids"]
    for program in (binary, root / "usr" / "bin" / "edge_generate"):
        result = run([program, bundles["svd-fp32"], PROMPT, *command], env=run_env)
        assert result.returncode == 0, result.stderr
        assert [int(token) for token in result.stdout.split()] == python_greedy_ids["svd-fp32"]
    assert f"=> {libdir}/libedge_sdk.so." in run(["ldd", binary], env=run_env, check=True).stdout


def test_arm64_package_runs_under_qemu(tmp_path, bundles, python_greedy_ids):
    require_tools(
        ("cmake", "cmake"),
        ("dpkg-deb", "dpkg"),
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
        ("qemu-aarch64", "qemu-user"),
    )
    root = build_and_extract("arm64", tmp_path)
    libdir = root / "usr" / "lib" / "aarch64-linux-gnu"
    assert "AArch64" in run(["readelf", "-h", libdir / "libedge_sdk.so.0.1.0"], check=True).stdout
    command = qemu_command(root / "usr" / "bin" / "edge_generate", library_path=libdir)
    result = run([*command, bundles["signbit-fp32"], PROMPT, "-n", str(STEPS), "--threads", "1", "--ids"], timeout=300)
    assert result.returncode == 0, result.stderr
    assert [int(token) for token in result.stdout.split()] == python_greedy_ids["signbit-fp32"]
