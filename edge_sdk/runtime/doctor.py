"""What `edge-sdk doctor` reports: versions, native libraries, backend availability."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from edge_sdk.native import NativeLibraryError, find_library, load_cpu_kernels

PACKAGES = ("torch", "numpy", "safetensors", "tokenizers", "onnx", "onnxruntime", "click")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def native_libraries() -> dict[str, Any]:
    path = find_library()
    if path is None:
        return {"cpu_kernels": {"built": False, "reason": "libedge_cpu_kernels.so not found; reinstall with pip"}}
    try:
        library = load_cpu_kernels()
    except (NativeLibraryError, OSError) as error:
        return {"cpu_kernels": {"built": True, "path": str(path), "loads": False, "reason": str(error)}}
    return {
        "cpu_kernels": {
            "built": True,
            "path": str(path),
            "loads": True,
            "version": library.edge_cpu_version().decode(),
            "threads": library.edge_cpu_max_threads(),
        }
    }


def backend_status() -> dict[str, dict[str, Any]]:
    """Each backend's probe, in the order auto selection tries them."""
    from edge_sdk.runtime.backends import probe_all

    return {name: {"available": available, "reason": reason} for name, (available, reason) in probe_all().items()}


def diagnose() -> dict[str, Any]:
    return {"versions": package_versions(), "native": native_libraries(), "backends": backend_status()}
