"""The bundle format (DESIGN.md 3.4) and its reader.

A bundle is a directory:
  manifest.json          format version, model config, sparsity config, tensors, every file's size + sha256
  weights.safetensors    model + predictor tensors, once (W_down stored neuron-major as *.down_proj.weight_t)
  prefill.onnx           dense prefill graph (standard ops)
  decode.onnx            decode graph (predictor + SparseFFN custom ops with reference functions)
  tokenizer.json, tokenizer_config.json, and report.json / report.png when predictors were calibrated

Bundles travel between machines: reading never unpickles (safetensors, JSON and ONNX only), and a
manifest path or an ONNX external-data location that is absolute or leaves the bundle directory is
rejected before anything is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import safe_open

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.checkpoint import read_safetensors_header
from edge_sdk.model.config import ModelConfig

FORMAT = "edge-sdk-bundle"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "weights.safetensors"
PREFILL_GRAPH = "prefill.onnx"
DECODE_GRAPH = "decode.onnx"
HASH_CHUNK_BYTES = 16 << 20
MANIFEST_DIGEST_FIELD = "manifest_sha256"


class BundleError(EdgeSdkError):
    """A bundle is missing, corrupt, from a newer format, or inconsistent with its manifest."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own digest field: a changed manifest is detected
    like any other changed file, while re-indenting it is not a change."""
    content = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST_FIELD}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def safe_relative_path(root: Path, name: str, where: str) -> Path:
    """root/name, refusing absolute names and names that leave root (checked before any read)."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or Path(name).is_absolute() or ".." in pure.parts or "\\" in name:
        raise BundleError(f"{where}: path {name!r} must be relative and inside the bundle directory")
    resolved = (root / name).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise BundleError(f"{where}: path {name!r} points outside the bundle directory")
    return root / name


@dataclass(frozen=True)
class SparsityConfig:
    """The bundle's predictor: kind, calibrated levels, default level and per-layer settings."""

    predictor: str
    levels: tuple[float, ...]
    default_level: float | None
    layers: tuple[dict[str, Any], ...]
    core_alpha: float = 0.4
    core_beta: float = 0.2

    def level_index(self, level: float | None) -> int:
        """Index of a calibrated level in the weights' stacked biases/thresholds."""
        if level is None:
            level = self.default_level
        for index, known in enumerate(self.levels):
            if abs(known - level) < 1e-9:
                return index
        known_levels = ", ".join(f"{lv:g}" for lv in self.levels) or "none (this predictor has no levels)"
        raise BundleError(f"sparsity level {level:g} was not calibrated; calibrated levels: {known_levels}")


class Bundle:
    """A validated bundle directory. `Bundle.open` checks sizes, checksums, shapes and graph references."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest
        self.config = ModelConfig.from_dict(manifest["model"])
        sparsity = manifest["sparsity"]
        self.sparsity = SparsityConfig(
            predictor=sparsity["predictor"],
            levels=tuple(sparsity["levels"]),
            default_level=sparsity["default_level"],
            layers=tuple(sparsity["layers"]),
            core_alpha=sparsity.get("core_alpha", 0.4),
            core_beta=sparsity.get("core_beta", 0.2),
        )
        self._weights = None

    @classmethod
    def open(cls, path: str | Path, verify_checksums: bool = True, check_graphs: bool = True) -> Bundle:
        root = Path(path)
        if not root.is_dir():
            raise BundleError(f"{root}: bundle directory not found")
        manifest_path = root / MANIFEST_FILE
        if not manifest_path.is_file():
            raise BundleError(f"{manifest_path}: manifest.json is missing (is {root} an edge-sdk bundle?)")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BundleError(f"{manifest_path}: not valid JSON ({error})") from None
        _check_manifest_fields(manifest, manifest_path)
        files = manifest["files"]
        for name, entry in files.items():
            file = safe_relative_path(root, name, f"{manifest_path}: files")
            if not file.is_file():
                raise BundleError(f"{file}: file listed in manifest.json is missing")
            size = file.stat().st_size
            if size != entry["size"]:
                raise BundleError(f"{file}: size is {size} bytes, manifest.json says {entry['size']}")
        if verify_checksums:
            for name, entry in files.items():
                digest = sha256_file(root / name)
                if digest != entry["sha256"]:
                    raise BundleError(
                        f"{root / name}: sha256 is {digest}, manifest.json says {entry['sha256']} (the file changed)"
                    )
        bundle = cls(root, manifest)
        bundle._check_tensors()
        if check_graphs:
            for graph in manifest["graphs"].values():
                bundle._check_graph_references(graph)
        return bundle

    def _check_tensors(self) -> None:
        weights_path = self.root / WEIGHTS_FILE
        try:
            entries, _, _ = read_safetensors_header(weights_path)
        except EdgeSdkError as error:
            raise BundleError(str(error)) from None
        for name, declared in self.manifest["tensors"].items():
            entry = entries.get(name)
            if entry is None:
                raise BundleError(f"{weights_path}: tensor '{name}' listed in manifest.json is missing")
            if entry.dtype != declared["dtype"] or list(entry.shape) != declared["shape"]:
                raise BundleError(
                    f"{weights_path}: tensor '{name}' is {entry.dtype} {list(entry.shape)}, manifest.json says "
                    f"{declared['dtype']} {declared['shape']}"
                )
        self._entries = entries

    def _check_graph_references(self, graph_name: str) -> None:
        import onnx

        graph_path = safe_relative_path(self.root, graph_name, f"{self.root / MANIFEST_FILE}: graphs")
        try:
            model = onnx.load(str(graph_path), load_external_data=False)
        except Exception as error:  # onnx raises DecodeError and others from protobuf
            raise BundleError(f"{graph_path}: not a valid ONNX model ({error})") from None
        data_start = read_safetensors_header(self.root / WEIGHTS_FILE)[2]
        for tensor in model.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            location = info.get("location", "")
            safe_relative_path(self.root, location, f"{graph_path}: initializer '{tensor.name}' external data")
            if location != WEIGHTS_FILE:
                raise BundleError(
                    f"{graph_path}: initializer '{tensor.name}' refers to {location!r}, not {WEIGHTS_FILE}"
                )
            entry = self._entries.get(tensor.name)
            offset, length = int(info.get("offset", -1)), int(info.get("length", -1))
            if entry is None or offset != data_start + entry.begin or length != entry.end - entry.begin:
                raise BundleError(
                    f"{graph_path}: initializer '{tensor.name}' points at bytes {offset}..{offset + length} of "
                    f"{WEIGHTS_FILE}, which do not hold that tensor"
                )

    @property
    def path(self) -> Path:
        return self.root

    def graph_path(self, which: str) -> Path:
        return safe_relative_path(self.root, self.manifest["graphs"][which], f"{self.root / MANIFEST_FILE}: graphs")

    def tensor(self, name: str) -> torch.Tensor:
        """A tensor of weights.safetensors, memory-mapped (no copy)."""
        if self._weights is None:
            self._weights = safe_open(str(self.root / WEIGHTS_FILE), framework="pt")
        if name not in self.manifest["tensors"]:
            raise BundleError(f"{self.root / WEIGHTS_FILE}: no tensor named '{name}'")
        return self._weights.get_tensor(name)

    def has_tensor(self, name: str) -> bool:
        return name in self.manifest["tensors"]


def _check_manifest_fields(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: field 'format' must be {FORMAT!r}, found {manifest.get('format')!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise BundleError(f"{path}: field 'format_version' must be an integer, found {version!r}")
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{path}: bundle format version {version} is newer than this edge-sdk supports ({FORMAT_VERSION}); "
            f"upgrade edge-sdk or re-export the bundle"
        )
    recorded = manifest.get(MANIFEST_DIGEST_FIELD)
    if recorded != manifest_digest(manifest):
        raise BundleError(
            f"{path}: field '{MANIFEST_DIGEST_FIELD}' does not match the manifest's content (the manifest changed)"
        )
    for field, kind in (("model", dict), ("sparsity", dict), ("files", dict), ("tensors", dict), ("graphs", dict)):
        if not isinstance(manifest.get(field), kind):
            raise BundleError(f"{path}: field '{field}' is missing or not a JSON object")
    for name, entry in manifest["files"].items():
        if not (
            isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        ):
            raise BundleError(f"{path}: files['{name}'] needs an integer 'size' and a string 'sha256'")
