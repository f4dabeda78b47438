"""The bundle layer: the format's names, the manifest's rules, the reader and the archive (DESIGN.md 3.4).

The exporter writes bundles and everything else reads them through this package alone; it imports neither torch
nor onnx, so a device install runs bundles without them.
"""

from edge_sdk.bundle.manifest import BundleError, LevelChoice, SparsityConfig, manifest_digest, operating_point_text
from edge_sdk.bundle.reader import Bundle

__all__ = ["Bundle", "BundleError", "LevelChoice", "SparsityConfig", "manifest_digest", "operating_point_text"]
