"""Fixtures of the C runtime tests: fixture bundles, the Python CPU backend's greedy ids on them, and builds of
jetson/ (x86-64, AddressSanitizer + UBSan, aarch64 cross-build) into session-scoped temporary directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import (
    AARCH64_SYSROOT,
    AARCH64_TOOLCHAIN,
    BUNDLE_KINDS,
    PROMPT,
    STEPS,
    Build,
    build_jetson,
    python_cpu_engine,
    require_tools,
    run,
)


@pytest.fixture(scope="session")
def x86_build(tmp_path_factory) -> Build:
    require_tools(("cmake", "cmake"), ("cc", "gcc"))
    return build_jetson(tmp_path_factory.mktemp("jetson-x86"))


@pytest.fixture(scope="session")
def asan_build(tmp_path_factory) -> Build:
    require_tools(("cmake", "cmake"), ("cc", "gcc"))
    probe_dir = tmp_path_factory.mktemp("asan-probe")
    (probe_dir / "probe.c").write_text("int main(void) { return 0; }\n")
    probe = run(["cc", "-fsanitize=address,undefined", probe_dir / "probe.c", "-o", probe_dir / "probe"])
    if probe.returncode != 0:
        pytest.skip(
            f"the C compiler cannot build with -fsanitize=address,undefined (install gcc's libasan/libubsan): "
            f"{probe.stderr.strip()}"
        )
    return build_jetson(tmp_path_factory.mktemp("jetson-asan"), "-DEDGE_SDK_SANITIZE=ON", "-DCMAKE_BUILD_TYPE=Debug")


@pytest.fixture(scope="session")
def aarch64_build(tmp_path_factory) -> Build:
    require_tools(("cmake", "cmake"), ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"), ("qemu-aarch64", "qemu-user"))
    if not Path(AARCH64_SYSROOT, "lib", "ld-linux-aarch64.so.1").exists():
        pytest.skip(f"{AARCH64_SYSROOT} has no aarch64 C library: apt-get install libc6-arm64-cross")
    return build_jetson(tmp_path_factory.mktemp("jetson-aarch64"), f"-DCMAKE_TOOLCHAIN_FILE={AARCH64_TOOLCHAIN}")


@pytest.fixture(scope="session")
def bundles(bundle_matrix) -> dict[str, Path]:
    """The session's fixture bundles (tests/conftest.py) of every predictor kind, by BUNDLE_KINDS name."""
    return {name: bundle_matrix.path(name) for name in BUNDLE_KINDS}


@pytest.fixture(scope="session")
def python_greedy_ids(bundles) -> dict[str, list[int]]:
    """The Python runtime's greedy ids (CPU backend, edge_sdk.runtime.Generator) for PROMPT on every bundle."""
    import edge_sdk
    from edge_sdk.runtime.generator import SamplingSettings

    ids = {}
    with python_cpu_engine():
        for name, path in bundles.items():
            session = edge_sdk.load(path, backend="cpu", threads=1)
            prompt_ids = session.tokenizer.encode(PROMPT)
            ids[name] = list(session.generator.generate_ids(prompt_ids, SamplingSettings(max_new_tokens=STEPS)))
    return ids
