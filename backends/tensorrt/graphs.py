"""The bundle's graphs as TensorRT parses them, and the manifest fields the backend needs, without torch.

TensorRT's ONNX parser maps our custom nodes (domain edge_sdk) to the plugins by op type, plugin_version and
plugin_namespace. The bundle also carries a model-local reference function per custom op, which ONNX Runtime
runs; whether the parser prefers the plugin or the function differs between TensorRT 10.3, 10.7 and 10.15, so
the functions are removed first (ops.strip_reference_functions). Initializers stay external: the parser reads
them from weights.safetensors next to the graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from edge_sdk.errors import EdgeSdkError
from edge_sdk.export import ops

MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT = "edge-sdk-bundle"
MANIFEST_FIELDS = ("model", "max_seq_len", "sparsity", "graphs", "manifest_sha256")


class BundleManifestError(EdgeSdkError):
    """The bundle's manifest.json lacks what the TensorRT backend needs."""


def read_manifest(bundle_path: Path) -> dict[str, Any]:
    """manifest.json of a bundle directory, with the fields the backend reads checked to be present.

    Sizes and checksums are not verified here: Bundle.open does that where the bundle is run.
    """
    path = Path(bundle_path) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BundleManifestError(f"{path}: manifest.json is missing (is {bundle_path} an edge-sdk bundle?)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BundleManifestError(f"{path}: not a readable JSON manifest ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleManifestError(f"{path}: field 'format' must be {BUNDLE_FORMAT!r}")
    for field in MANIFEST_FIELDS:
        if field not in manifest:
            raise BundleManifestError(f"{path}: field {field!r} is missing (re-export the bundle with this edge-sdk)")
    return manifest


def graph_path(bundle_path: Path, manifest: dict[str, Any], phase: str) -> Path:
    name = manifest["graphs"].get(phase)
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        manifest_path = Path(bundle_path) / MANIFEST_FILE
        raise BundleManifestError(f"{manifest_path}: graphs[{phase!r}] must name a file inside the bundle")
    return Path(bundle_path) / name


def tensorrt_model(path: Path) -> onnx.ModelProto:
    """The graph at path without our ops' reference functions; external initializers are not loaded."""
    return ops.strip_reference_functions(onnx.load(str(path), load_external_data=False))
