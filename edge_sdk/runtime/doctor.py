"""What `edge-sdk doctor` reports: versions, native libraries, backend availability."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from edge_sdk.native import NativeLibraryError, find_library, load_cpu_kernels, openmp_waiting

PACKAGES = ("torch", "numpy", "safetensors", "tokenizers", "onnx", "onnxruntime", "click")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


# GPU-side libraries: built only where nvcc (CUDA kernels) or TensorRT (plugins) were found at install time.
OPTIONAL_LIBRARIES = {
    "c_runtime": (
        "libedge_sdk.so",
        "EDGE_SDK_RUNTIME_LIBRARY",
        "cJSON (libcjson-dev) was not found when edge-sdk was built",
    ),
    "cuda_kernels": ("libedge_cuda_kernels.so", "EDGE_SDK_CUDA_KERNELS", "nvcc was not found when edge-sdk was built"),
    "tensorrt_plugins": (
        "libedge_trt_plugins.so",
        "EDGE_SDK_TRT_PLUGINS",
        "TensorRT was not found when edge-sdk was built",
    ),
}


def native_libraries() -> dict[str, Any]:
    path = find_library()
    if path is None:
        libraries = {"cpu_kernels": {"built": False, "reason": "libedge_cpu_kernels.so not found; reinstall with pip"}}
    else:
        try:
            library = load_cpu_kernels()
            libraries = {
                "cpu_kernels": {
                    "built": True,
                    "path": str(path),
                    "loads": True,
                    "version": library.edge_cpu_version().decode(),
                    "threads": library.edge_cpu_max_threads(),
                    "isa": library.edge_cpu_isa().decode(),
                    "isas": library.edge_cpu_isas().decode().split(),
                    "openmp": openmp_waiting(),
                }
            }
        except (NativeLibraryError, OSError) as error:
            libraries = {"cpu_kernels": {"built": True, "path": str(path), "loads": False, "reason": str(error)}}
    for key, (name, env_var, reason) in OPTIONAL_LIBRARIES.items():
        found = find_library(name, env_var)
        libraries[key] = {"built": True, "path": str(found)} if found else {"built": False, "reason": reason}
    return libraries


def backend_status(bundle=None) -> dict[str, dict[str, Any]]:
    """Each backend's probe, in the order auto selection tries them; with an opened bundle, whether it runs that."""
    from edge_sdk.runtime.backends import probe_all

    probes = probe_all(bundle)
    return {name: {"available": available, "reason": reason} for name, (available, reason) in probes.items()}


def diagnose(bundle_path: str | None = None) -> dict[str, Any]:
    """The report; bundle_path: also say which backends run that bundle here (TensorRT: is its engine cached)."""
    report: dict[str, Any] = {"versions": package_versions(), "native": native_libraries()}
    bundle = None
    if bundle_path is not None:
        from edge_sdk.bundle import Bundle

        bundle = Bundle.open(bundle_path, verify_checksums=False)  # sizes and the manifest digest; no hashing
        report["bundle"] = str(bundle.path)
        sparsity = bundle.sparsity
        report["bundle_contents"] = {
            "dtype": bundle.dtype,
            "predictor": sparsity.predictor,
            "levels": list(sparsity.levels),
            "default_level": sparsity.default_level,
        }
    report["backends"] = backend_status(bundle)
    return report
