"""The bundle's graphs as TensorRT parses them.

TensorRT's ONNX parser maps our custom nodes (domain edge_sdk) to the plugins by op type, plugin_version and
plugin_namespace. The bundle also carries a model-local reference function per custom op, which ONNX Runtime
runs; whether the parser prefers the plugin or the function differs between TensorRT 10.3, 10.7 and 10.15, so
the functions are removed first (ops.strip_reference_functions). Initializers stay external: the parser reads
them from weights.safetensors next to the graph.
"""

from __future__ import annotations

from pathlib import Path

from edge_sdk.bundle.graph_ops import DOMAIN, OP_TYPES
from edge_sdk.formats.onnx_wire import without_functions


def tensorrt_model(path: Path) -> bytes:
    """The serialized graph at path without our ops' reference functions (external initializers stay external)."""
    return without_functions(path.read_bytes(), DOMAIN, set(OP_TYPES))
