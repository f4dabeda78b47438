"""The custom ops a bundle's graphs use, as runtimes know them: domain, op types and the plugin identity TensorRT's
parser looks creators up by. Their schemas and reference functions are in export/ops/ (which needs onnx)."""

from __future__ import annotations

DOMAIN = "edge_sdk"
OPSET_VERSION = 1
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "edge_sdk"
OP_TYPES = ("SvdPredictor", "SignBitPredictor", "SparseFFN", "QuantizedSparseFFN", "QuantizedMatMul")
