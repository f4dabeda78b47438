"""The TensorRT engine of the C runtime (jetson/src/trt_engine.cpp) compiles against TensorRT's headers.

TensorRT is never installed by these tests: point $TENSORRT_INCLUDE_DIR at a directory holding NvInfer.h (for example
the include/ folder of github.com/NVIDIA/TensorRT at release/10.3) and have the CUDA headers (cuda_runtime_api.h under
$CUDA_INCLUDE_DIR or /usr/local/cuda*/include). Without them the tests skip. The build without TensorRT, and its
"no TensorRT engine" message for backend "tensorrt", is covered by test_c_runtime.py; the engine's behaviour, on a fake
TensorRT built from headers of our own, by tests/tensorrt/test_engine_buffers.py.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest

from .support import JETSON, build_jetson, run

SOURCE = JETSON / "src" / "trt_engine.cpp"

# Stand-ins for the three libnvinfer functions trt_engine.cpp calls, so the CMake TensorRT path can be configured,
# compiled and linked (-Wl,--no-undefined) on a machine without TensorRT's libraries. Reports TensorRT 10.3.
STUB_NVINFER = """
#include <cstdint>
extern "C" {
int32_t getInferLibVersion() noexcept { return 100300; }
void *createInferRuntime_INTERNAL(void *, int32_t) noexcept { return nullptr; }
void *getPluginRegistry() noexcept { return nullptr; }
}
"""


def tensorrt_include() -> Path:
    value = os.environ.get("TENSORRT_INCLUDE_DIR")
    if not value:
        pytest.skip("TensorRT headers not available: set $TENSORRT_INCLUDE_DIR to a directory holding NvInfer.h")
    path = Path(value)
    if not (path / "NvInfer.h").is_file():
        pytest.skip(f"$TENSORRT_INCLUDE_DIR={value} holds no NvInfer.h")
    return path


def cuda_include() -> Path:
    candidates = [os.environ["CUDA_INCLUDE_DIR"]] if os.environ.get("CUDA_INCLUDE_DIR") else []
    candidates += sorted(glob.glob("/usr/local/cuda*/include"))
    for candidate in candidates:
        if (Path(candidate) / "cuda_runtime_api.h").is_file():
            return Path(candidate)
    pytest.skip("CUDA headers not available: set $CUDA_INCLUDE_DIR to a directory holding cuda_runtime_api.h")


def require_compiler() -> str:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler: apt-get install g++")
    return compiler


def test_trt_engine_compiles_cleanly_against_tensorrt_headers():
    trt, cuda, compiler = tensorrt_include(), cuda_include(), require_compiler()
    command = [
        compiler,
        "-std=c++17",
        "-fsyntax-only",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        JETSON / "include",
        "-I",
        JETSON / "src",
        "-isystem",
        trt,
        "-isystem",
        cuda,
        SOURCE,
    ]
    result = run(command, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr


def test_cmake_builds_the_tensorrt_engine_when_tensorrt_is_found(tmp_path, bundles):
    trt, compiler = tensorrt_include(), require_compiler()
    cuda = cuda_include()
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "nvinfer.cpp").write_text(STUB_NVINFER)
    made = run([compiler, "-shared", "-fPIC", "-o", stub / "libnvinfer.so", stub / "nvinfer.cpp"], timeout=120)
    assert made.returncode == 0, made.stderr
    build = build_jetson(
        tmp_path / "build",
        f"-DTENSORRT_INCLUDE_DIR={trt}",
        f"-DTENSORRT_LIBRARY={stub / 'libnvinfer.so'}",
        f"-DCUDAToolkit_ROOT={cuda.parent}",
    )
    if "trt_engine.cpp" not in build.log:
        pytest.skip("CMake found no CUDA runtime (CUDAToolkit) next to the CUDA headers, so it left the engine out")
    assert "warning" not in build.log.lower(), build.log
    # The stub reports TensorRT 10.3; the engine then asks CUDA for the device and the engine cache, so the error is
    # the engine's own (no CUDA device, or no cached engine), never "this build has no TensorRT engine".
    result = run(
        [build.binary("edge_generate"), bundles["svd-fp32"], "x", "-n", "2", "--backend", "tensorrt"],
        env=os.environ | {"EDGE_SDK_ENGINE_CACHE": str(tmp_path / "cache")},
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "backend 'tensorrt'" in result.stderr
    assert "this build of libedge_sdk has no TensorRT engine" not in result.stderr
    assert "no CUDA device" in result.stderr or "no TensorRT engine cached for this bundle" in result.stderr
