"""libedge_trt_plugins.so driven through TensorRT's plugin interfaces on the host: no GPU and no libnvinfer needed.

The plugin sources (plugins/tensorrt/*.cpp) are compiled against the TensorRT headers found here ($TENSORRT_INCLUDE_DIR,
$TENSORRT_ROOT/include or the system's) with every warning an error and linked, as the package build links them, to
the CUDA kernel library; plugin_host_check.cpp then drives that library, or the package's own build of it when
TensorRT was found at build time. The plugins call no libnvinfer function, so the headers are all they need (use
TensorRT 10.3's, JetPack 6.1/6.2's, to check the oldest TensorRT the plugins support). Skips when no headers, no
compiler or no CUDA kernel library (nvcc at build time) are found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_sdk.native import find_library

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = ROOT / "plugins" / "tensorrt"
HEADER_DIRS = ("/usr/include/aarch64-linux-gnu", "/usr/include/x86_64-linux-gnu", "/usr/include")
CUDA_HEADER_DIRS = ("/usr/local/cuda/include",)
# The plugin library's only exports (edge_trt_plugins.map).
EXPORTS = {"getCreators", "setLoggerFinder"}
WARNINGS = ("-Wall", "-Wextra", "-Wpedantic", "-Werror")


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


def cuda_runtime_dir(cuda_include: Path) -> Path | None:
    return next((d for d in (cuda_include.parent / "lib64", cuda_include.parent / "lib") if d.is_dir()), None)


def compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


@pytest.fixture(scope="module")
def headers_and_kernels():
    """(TensorRT include dir, CUDA include dir, libedge_cuda_kernels.so, C++ compiler), or a skip naming what is
    missing."""
    trt_include, cuda_include = tensorrt_headers(), cuda_headers()
    kernels = find_library("libedge_cuda_kernels.so", "EDGE_SDK_CUDA_KERNELS")
    cxx = compiler()
    if trt_include is None or cuda_include is None or cxx is None:
        pytest.skip("TensorRT headers, CUDA headers or a C++ compiler not found (set TENSORRT_INCLUDE_DIR)")
    if kernels is None:
        pytest.skip("libedge_cuda_kernels.so was not built (no nvcc when the package was built)")
    return trt_include, cuda_include, kernels, cxx


@pytest.fixture(scope="module")
def plugins_built_from_sources(headers_and_kernels, tmp_path_factory) -> Path:
    """The plugin library compiled here from plugins/tensorrt with WARNINGS, linked with no undefined symbol."""
    trt_include, cuda_include, kernels, cxx = headers_and_kernels
    runtime_dir = cuda_runtime_dir(cuda_include)
    if runtime_dir is None:
        pytest.skip(f"no CUDA runtime library directory next to {cuda_include}")
    output = tmp_path_factory.mktemp("trt-plugins")
    includes = ["-isystem", str(trt_include), "-isystem", str(cuda_include)]
    includes += [f"-I{ROOT / 'plugins' / 'kernels'}", f"-I{ROOT / 'plugins' / 'kernels' / 'cpu'}"]
    objects = []
    for source in sorted(PLUGIN_SOURCES.glob("*.cpp")):
        target = output / f"{source.stem}.o"
        command = [cxx, "-std=c++17", "-fPIC", "-fvisibility=hidden", *WARNINGS, *includes, "-c", str(source)]
        result = subprocess.run([*command, "-o", str(target)], capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name} does not compile warning-free:\n{result.stderr}"
        objects.append(str(target))
    library = output / "libedge_trt_plugins.so"
    version_script = PLUGIN_SOURCES / "edge_trt_plugins.map"
    link = [cxx, "-shared", "-o", str(library), *objects, f"-Wl,--version-script={version_script}"]
    link += ["-Wl,--no-undefined", str(kernels), f"-L{runtime_dir}", "-lcudart"]
    result = subprocess.run(link, capture_output=True, text=True)
    assert result.returncode == 0, f"the plugin library does not link:\n{result.stderr}"
    return library


def test_plugin_sources_compile_warning_free_and_export_only_the_entry_points(plugins_built_from_sources):
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(plugins_built_from_sources)], check=True, capture_output=True, text=True
    ).stdout
    assert {line.split()[-1] for line in listing.splitlines() if line.strip()} == EXPORTS


@pytest.mark.parametrize("build", ["package", "sources"])
def test_plugins_through_tensorrt_interfaces(build, headers_and_kernels, request, tmp_path):
    trt_include, cuda_include, kernels, cxx = headers_and_kernels
    if build == "package":
        plugins = find_library("libedge_trt_plugins.so", "EDGE_SDK_TRT_PLUGINS")
        if plugins is None:
            pytest.skip("libedge_trt_plugins.so was not built (TensorRT was not found when the package was built)")
    else:
        plugins = request.getfixturevalue("plugins_built_from_sources")
    program = tmp_path / "plugin_host_check"
    source = Path(__file__).with_name("plugin_host_check.cpp")
    includes = ["-isystem", str(trt_include), "-isystem", str(cuda_include)]
    subprocess.run([cxx, "-std=c++17", *WARNINGS, *includes, str(source), "-ldl", "-o", str(program)], check=True)
    result = subprocess.run([str(program), str(plugins), str(kernels)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "all checks passed"
