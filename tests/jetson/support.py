"""Helpers of the C runtime tests: building jetson/ and running what it builds.

A build whose tools are missing skips its tests with the apt package to install; CI installs them all:
cmake gcc pkg-config libcjson-dev gcc-aarch64-linux-gnu libcjson-dev:arm64 qemu-user (after
`dpkg --add-architecture arm64`), and dpkg-deb (dpkg) for the package tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_sdk.bundle import manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD

REPO = Path(__file__).resolve().parents[2]
JETSON = REPO / "jetson"
AARCH64_TOOLCHAIN = JETSON / "cmake" / "aarch64-linux-gnu.cmake"
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"
PROMPT = "class Namespace(object):\n    def __init__(self"
STEPS = 24
# names in tests/conftest.py's BUNDLE_MATRIX, INT8_HEAD_BUNDLES and ASYMMETRIC_BUNDLES: every predictor kind, fp32,
# fp16, int8 and int4 weights, an int4 bundle of a tied model (its quantized embedding is also the LM head), one whose
# tied matrix is int8 (export --head-dtype int8: int8 lookup and head among int4 layers) and an asymmetric int4 one
# (every matrix with group minimums, the lookup too)
BUNDLE_KINDS = (
    "svd-fp32",
    "svd-fp16",
    "signbit-fp32",
    "core-fp16",
    "threshold-fp32",
    "svd-int8",
    "svd-int4",
    "tied-svd-int4",
    "tied-svd-int4-head-int8",
    "tied-svd-int4-asym",
)
BUILD_TIMEOUT_S = 600


@dataclass(frozen=True)
class Build:
    """A configured and built jetson/ tree: its directory and the build log (compiler output)."""

    directory: Path
    log: str

    def binary(self, name: str) -> Path:
        return self.directory / name


def run(command: list[str | Path], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)


def c_verdicts(build: Build, paths: list[Path], env: dict | None = None) -> list[str | None]:
    """The C library's verdict on each bundle (jetson/tests/edge_check_bundle.c): None when it opens, else the
    refusal. The paths are split across one edge_check_bundle process per CPU, run at once (each path's verdict is
    its own: the library keeps no state between bundles); any sanitizer report fails."""
    processes = max(1, min(len(os.sched_getaffinity(0)), len(paths)))
    slices = [paths[index::processes] for index in range(processes)]
    checkers = [
        subprocess.Popen(
            [str(build.binary("edge_check_bundle")), *map(str, part)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for part in slices
    ]
    verdicts: list[str | None] = [None] * len(paths)
    try:
        for index, (part, checker) in enumerate(zip(slices, checkers, strict=True)):
            stdout, stderr = checker.communicate(timeout=600)
            assert checker.returncode == 0, stdout[-3000:] + stderr[-3000:]
            assert "Sanitizer" not in stderr and "runtime error" not in stderr, stderr[-3000:]
            lines = stdout.splitlines()
            assert len(lines) == len(part), stdout[-3000:]
            verdicts[index::processes] = [None if line == "ok" else line.removeprefix("refused: ") for line in lines]
    finally:
        for checker in checkers:
            if checker.poll() is None:
                checker.kill()
                checker.wait()
    return verdicts


def build_jetson(directory: Path, *cmake_args: str) -> Build:
    """cmake -S jetson -B directory + build; skips when cJSON is missing, fails on any other build error."""
    configure = run(["cmake", "-S", JETSON, "-B", directory, *cmake_args], timeout=BUILD_TIMEOUT_S)
    if configure.returncode != 0:
        if "cJSON not found" in configure.stdout + configure.stderr:
            arm = any("aarch64" in arg for arg in cmake_args)
            package = "libcjson-dev:arm64 (after dpkg --add-architecture arm64)" if arm else "libcjson-dev"
            pytest.skip(f"cJSON headers/library not found for this build: apt-get install {package}")
        pytest.fail(f"cmake configure failed:\n{configure.stdout}\n{configure.stderr}")
    build = run(["cmake", "--build", directory, "-j", "2"], timeout=BUILD_TIMEOUT_S)
    if build.returncode != 0:
        pytest.fail(f"build failed:\n{build.stdout}\n{build.stderr}")
    return Build(directory, build.stdout + build.stderr)


def require_tools(*tools: tuple[str, str]) -> None:
    """Skip unless every (executable, apt package) is on PATH."""
    for tool, package in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: apt-get install {package}")


def qemu_command(binary: Path, library_path: Path | None = None, cpu: str = "max") -> list[str | Path]:
    """How to run an aarch64 binary here (a build's libedge_sdk is found through the binary's RPATH, an installed
    one through library_path), on qemu's model of `cpu` ("max": every extension qemu has, the dot product included;
    "cortex-a72": Armv8.0, without it).

    libcjson-dev:arm64 pulls in the multiarch libc6:arm64, whose libc.so.6 the cross loader of
    /usr/aarch64-linux-gnu would otherwise pick up; the two glibc builds hang together in pthread_create, so
    LD_LIBRARY_PATH puts the cross toolchain's own libc (and libgomp) first."""
    paths = ":".join(str(path) for path in (library_path, f"{AARCH64_SYSROOT}/lib") if path is not None)
    return ["qemu-aarch64", "-cpu", cpu, "-L", AARCH64_SYSROOT, "-E", f"LD_LIBRARY_PATH={paths}", binary]


def generate_command(binary_prefix: list[str | Path], bundle: Path, *extra: str) -> list[str | Path]:
    return [*binary_prefix, bundle, PROMPT, "-n", str(STEPS), "--threads", "1", *extra]


def sanitizer_env() -> dict[str, str]:
    return os.environ | {
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
    }


@contextlib.contextmanager
def python_cpu_engine():
    """The CPU backend's torch engine: the comparisons here need the Python implementation, not the C runtime
    that the backend otherwise runs."""
    from edge_sdk.backends.cpu.backend import ENGINE_ENV

    previous = os.environ.get(ENGINE_ENV)
    os.environ[ENGINE_ENV] = "torch"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[ENGINE_ENV]
        else:
            os.environ[ENGINE_ENV] = previous


def with_tokenizer_files(bundle: Path, directory: Path, tokenizer_change=None, config_change=None) -> Path:
    """A copy of bundle (directory/bundle) whose tokenizer.json and tokenizer_config.json the two functions changed in
    place (None: left as they are), the manifest's sizes and digests re-stamped, as whoever rewrites a bundle can."""
    copy = directory / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for name, change in (("tokenizer.json", tokenizer_change), ("tokenizer_config.json", config_change)):
        if change is None:
            continue
        content = json.loads((copy / name).read_text(encoding="utf-8"))
        change(content)
        data = json.dumps(content).encode("utf-8")
        (copy / name).write_bytes(data)
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy
