"""libedge_trt_plugins.so driven through TensorRT's plugin interfaces on the host: no GPU and no libnvinfer needed.

plugin_host_check.cpp is compiled against the TensorRT headers found here ($TENSORRT_INCLUDE_DIR,
$TENSORRT_ROOT/include or the system's) and run on the built plugin library. Skips when the library was not built
(no TensorRT at build time) or no headers or compiler are found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_sdk.native import find_library

HEADER_DIRS = ("/usr/include/aarch64-linux-gnu", "/usr/include/x86_64-linux-gnu", "/usr/include")
CUDA_HEADER_DIRS = ("/usr/local/cuda/include",)


def first_dir_with(header: str, candidates: list[str]) -> Path | None:
    return next((Path(c) for c in candidates if c and (Path(c) / header).is_file()), None)


def tensorrt_headers() -> Path | None:
    candidates = [os.environ.get("TENSORRT_INCLUDE_DIR", "")]
    if os.environ.get("TENSORRT_ROOT"):
        candidates.append(str(Path(os.environ["TENSORRT_ROOT"]) / "include"))
    return first_dir_with("NvInferRuntime.h", [*candidates, *HEADER_DIRS])


def cuda_headers() -> Path | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    return first_dir_with("cuda_runtime_api.h", [str(Path(home) / "include") if home else "", *CUDA_HEADER_DIRS])


def test_plugins_through_tensorrt_interfaces(tmp_path):
    plugins = find_library("libedge_trt_plugins.so", "EDGE_SDK_TRT_PLUGINS")
    kernels = find_library("libedge_cuda_kernels.so", "EDGE_SDK_CUDA_KERNELS")
    trt_include, cuda_include = tensorrt_headers(), cuda_headers()
    compiler = shutil.which("c++") or shutil.which("g++")
    if plugins is None or kernels is None:
        pytest.skip("libedge_trt_plugins.so was not built (TensorRT was not found when the package was built)")
    if trt_include is None or cuda_include is None or compiler is None:
        pytest.skip("TensorRT headers, CUDA headers or a C++ compiler not found (set TENSORRT_INCLUDE_DIR)")
    program = tmp_path / "plugin_host_check"
    source = Path(__file__).with_name("plugin_host_check.cpp")
    includes = ["-isystem", str(trt_include), "-isystem", str(cuda_include)]
    subprocess.run([compiler, "-std=c++17", *includes, str(source), "-ldl", "-o", str(program)], check=True)
    result = subprocess.run([str(program), str(plugins), str(kernels)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "all checks passed"
