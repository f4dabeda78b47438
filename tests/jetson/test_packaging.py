"""The Debian packages of the C runtime (packaging/build_deb.sh): extracted into a temporary root, the amd64 package
builds the example through pkg-config and runs it; the arm64 package runs under qemu. Both give the Python CPU
backend's greedy ids, on every build of the kernels they hold (one per instruction set, chosen at run time)."""

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
    # the packaged example without LD_LIBRARY_PATH: its run path finds the library beside it wherever the tree is
    # unpacked (it failed to start, "libedge_sdk.so.0.1: cannot open shared object file")
    for program, env in ((binary, run_env), (root / "usr" / "bin" / "edge_generate", os.environ)):
        result = run([program, bundles["svd-fp32"], PROMPT, *command], env=env)
        assert result.returncode == 0, result.stderr
        assert [int(token) for token in result.stdout.split()] == python_greedy_ids["svd-fp32"]
    assert f"=> {libdir}/libedge_sdk.so." in run(["ldd", binary], env=run_env, check=True).stdout
    # the package runs on any x86-64: its baseline build of the kernels gives the same tokens
    result = run([binary, bundles["svd-fp32"], PROMPT, *command], env=run_env | {"EDGE_SDK_CPU_ISA": "portable"})
    assert result.returncode == 0, result.stderr
    assert [int(token) for token in result.stdout.split()] == python_greedy_ids["svd-fp32"]
    refused = run([binary, bundles["svd-fp32"], PROMPT, *command], env=run_env | {"EDGE_SDK_CPU_ISA": "sse9"})
    assert refused.returncode != 0 and refused.stdout == ""
    assert "EDGE_SDK_CPU_ISA=sse9: not an instruction set" in refused.stderr and "avx2 portable" in refused.stderr


def test_arm64_package_runs_under_qemu(tmp_path, bundles, python_greedy_ids):
    require_tools(
        ("cmake", "cmake"),
        ("dpkg-deb", "dpkg"),
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
        ("qemu-aarch64", "qemu-user"),
    )
    root = build_and_extract("arm64", tmp_path)
    libdir = root / "usr" / "lib" / "aarch64-linux-gnu"
    library = libdir / "libedge_sdk.so.0.1.0"
    assert "AArch64" in run(["readelf", "-h", library], check=True).stdout
    code = run(["aarch64-linux-gnu-objdump", "-d", library], check=True).stdout
    assert "sdot\tv" in code and "smull\tv" in code  # the kernels with and without the dot product (an Orin has it)
    for cpu in ("max", "cortex-a72"):  # qemu's max has the dot product, its Cortex-A72 (Armv8.0) does not
        command = qemu_command(root / "usr" / "bin" / "edge_generate", library_path=libdir, cpu=cpu)
        arguments = [bundles["signbit-fp32"], PROMPT, "-n", str(STEPS), "--threads", "1", "--ids"]
        result = run([*command, *arguments], timeout=300)
        assert result.returncode == 0, result.stderr
        assert [int(token) for token in result.stdout.split()] == python_greedy_ids["signbit-fp32"]
