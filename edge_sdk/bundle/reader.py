"""Bundle.open: every check a bundle passes before anything runs it (the rules are listed in bundle/README.md).

What the reader guarantees once a bundle opened:
- manifest.json passed the strict JSON rule, its digest, and every field's rule (bundle/manifest.py);
- every file the manifest lists is a regular file of the bundle directory itself (no link, no subdirectory), of
  the listed size and (unless verify_checksums is off) sha256; files it does not list are never read;
- weights.safetensors holds exactly the manifest's tensors, tiling its data section, each aligned to its element
  size, with exactly the shapes and dtypes the model config and predictor need;
- each graph is a well-formed ONNX model whose external data all points at exactly the bytes of the tensor of its
  name in weights.safetensors (formats/onnx_wire.py), and whose inputs and outputs are those the exporter declares
  for its phase, prefill or decode (bundle/graph_io.py).
Readers of the bundle's other files (the tokenizer) go through read_file, which serves listed files only.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk import predictors
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle import graph_io
from edge_sdk.bundle.manifest import BundleError, Manifest, SparsityConfig, validate
from edge_sdk.formats import onnx_wire, safetensors, strict_json
from edge_sdk.formats.files import file_size, open_regular, read_bounded, sha256_of
from edge_sdk.model.config import ModelConfig

MAX_GRAPH_BYTES = 1 << 30  # graphs hold no weights (external data), so real ones are a few MB
_DECIMAL = re.compile(r"[0-9]{1,17}")
# safetensors dtype -> numpy dtype of the same size; BF16 has no numpy type and is served as its raw 16-bit words
NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
    "BOOL": "?",
}


class Bundle:
    """A validated bundle directory (see the module docstring). Construct with Bundle.open."""

    def __init__(self, root: Path, manifest: Manifest, header: safetensors.SafetensorsHeader):
        self.root = root
        self.manifest = manifest
        self.header = header
        self._weights: np.memmap | None = None

    @property
    def path(self) -> Path:
        return self.root

    @property
    def config(self) -> ModelConfig:
        return self.manifest.config

    @property
    def sparsity(self) -> SparsityConfig:
        return self.manifest.sparsity

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def max_seq_len(self) -> int:
        return self.manifest.max_seq_len

    @classmethod
    def open(cls, path: str | Path, verify_checksums: bool = True) -> Bundle:
        root = Path(path)
        if not root.is_dir():
            found = "is a file, not a bundle directory" if root.exists() else "bundle directory not found"
            raise BundleError(f"{root}: {found}")
        manifest_path = root / bundle_format.MANIFEST_FILE
        if not manifest_path.exists() and not manifest_path.is_symlink():
            raise BundleError(f"{manifest_path}: manifest.json is missing (is {root} an edge-sdk bundle?)")
        text = read_bounded(manifest_path, bundle_format.MAX_MANIFEST_BYTES, follow_symlinks=False, error=BundleError)
        manifest = validate(strict_json.parse(text, str(manifest_path), error=BundleError), str(manifest_path))
        _check_files(root, manifest, verify_checksums)
        header = safetensors.read_header(root / bundle_format.WEIGHTS_FILE, follow_symlinks=False, error=BundleError)
        bundle = cls(root, manifest, header)
        bundle._check_weights()
        interfaces = {phase: bundle._check_graph(phase) for phase in bundle_format.GRAPH_PHASES}
        problem = graph_io.prompt_outputs_problem(interfaces["prefill"], interfaces["decode"], manifest.config)
        if problem is not None:
            phase, message = problem
            raise BundleError(f"{root / manifest.graphs[phase]}: {message}")
        return bundle

    def _check_weights(self) -> None:
        path, header = self.root / bundle_format.WEIGHTS_FILE, self.header
        for name, declared in self.manifest.tensors.items():
            entry = header.tensors.get(name)
            if entry is None:
                raise BundleError(f"{path}: tensor '{name}' listed in manifest.json is missing")
            if entry.dtype != declared.dtype or entry.shape != declared.shape:
                raise BundleError(
                    f"{path}: tensor '{name}' is {entry.dtype} {list(entry.shape)}, manifest.json says "
                    f"{declared.dtype} {list(declared.shape)}"
                )
            if (header.data_start + entry.begin) % entry.element_size:
                raise BundleError(f"{path}: tensor '{name}' is not aligned to its {entry.element_size}-byte elements")
        extra = sorted(set(header.tensors) - set(self.manifest.tensors))
        if extra:
            raise BundleError(f"{path}: tensor '{extra[0][:200]}' is not listed in manifest.json ({len(extra)} such)")
        self._check_finite_predictor_tensors(path)

    def _check_finite_predictor_tensors(self, path: Path) -> None:
        """Predictor tensors whose values are rules must be finite (signbit.alpha: the sign-bit rule compares
        alpha * positives with negatives; a NaN or infinite alpha is no rule at all)."""
        kind = predictors.kind(self.sparsity.predictor)
        finite = [tensor.name for tensor in kind.tensors if tensor.finite]
        if not finite:
            return
        descriptor = open_regular(path, follow_symlinks=False, error=BundleError)
        with open(descriptor, "rb") as handle:
            for layer in range(self.config.num_layers):
                for tensor in finite:
                    name = predictors.tensor_name(layer, kind.name, tensor)
                    entry = self.header.tensors[name]  # F32 (the kinds flag F32 tensors only)
                    handle.seek(self.header.data_start + entry.begin)
                    size = entry.end - entry.begin
                    for value in struct.unpack(f"<{size // 4}f", handle.read(size)):
                        if not math.isfinite(value):
                            raise BundleError(f"{path}: tensor '{name}' is {value}, expected a finite number")

    def _check_graph(self, phase: str) -> graph_io.GraphInterface:
        """The graph of `phase` is a well-formed ONNX model with the exporter's inputs and outputs for its phase and
        external data exactly of weights.safetensors; its inputs and outputs."""
        path = self.root / self.manifest.graphs[phase]
        data = read_bounded(path, MAX_GRAPH_BYTES, follow_symlinks=False, error=BundleError)
        try:
            summary = onnx_wire.summarize(data)
        except onnx_wire.WireError as problem:
            raise BundleError(f"{path}: not an ONNX model ({problem})") from None
        if summary.ir_version < 1 or summary.opset_imports < 1 or summary.graphs != 1:
            raise BundleError(
                f"{path}: not an ONNX model (ir_version {summary.ir_version}, {summary.opset_imports} opset imports, "
                f"{summary.graphs} graphs; expected an ir_version >= 1, an opset import and one graph)"
            )
        interface = self._check_interface(path, phase, data)
        for tensor in summary.external_tensors:
            self._check_external(path, tensor)
        return interface

    def _check_interface(self, path: Path, phase: str, data: bytes) -> graph_io.GraphInterface:
        """The graph's inputs and outputs are the exporter's for `phase` (names, element types, ranks and sizes), so
        a runtime never feeds a graph of the other phase, or one that lost an input."""
        try:
            found = graph_io.read_interface(data)
        except onnx_wire.WireError as problem:
            raise BundleError(f"{path}: not an ONNX model ({problem})") from None
        kind_inputs = predictors.kind(self.sparsity.predictor).fixed_at_prefill
        problem = graph_io.interface_problem(found, self.config, phase, kind_inputs)
        if problem is None:
            return found
        other = next(other for other in bundle_format.GRAPH_PHASES if other != phase)
        if graph_io.interface_problem(found, self.config, other, kind_inputs) is None:
            problem += (
                f"; it has the {other} graph's inputs and outputs (are {self.manifest.graphs['prefill']} and "
                f"{self.manifest.graphs['decode']} swapped?)"
            )
        raise BundleError(f"{path}: {problem}")

    def _check_external(self, path: Path, tensor: onnx_wire.ExternalTensor) -> None:
        where = f"{path}: tensor '{tensor.name[:200]}' stored outside the graph"
        if tensor.location != bundle_format.WEIGHTS_FILE:
            raise BundleError(
                f"{where} refers to {tensor.location!r}; a bundle's graphs refer to {bundle_format.WEIGHTS_FILE} only"
            )
        if not (_DECIMAL.fullmatch(tensor.offset or "") and _DECIMAL.fullmatch(tensor.length or "")):
            raise BundleError(
                f"{where} needs decimal 'offset' and 'length', found {tensor.offset!r}, {tensor.length!r}"
            )
        entry = self.header.tensors.get(tensor.name)
        offset, length = int(tensor.offset), int(tensor.length)
        if entry is None or offset != self.header.data_start + entry.begin or length != entry.end - entry.begin:
            raise BundleError(
                f"{where} points at bytes {offset}..{offset + length} of {bundle_format.WEIGHTS_FILE}, which do not "
                f"hold that tensor"
            )
        if not _same_type(tensor, entry):
            raise BundleError(
                f"{where} is declared ONNX type {tensor.data_type} {list(tensor.dims)}, but "
                f"{bundle_format.WEIGHTS_FILE} holds it as {entry.dtype} {list(entry.shape)}"
            )

    def has_file(self, name: str) -> bool:
        return name in self.manifest.files

    def file_path(self, name: str) -> Path:
        """The path of a file the manifest lists (for libraries that open files themselves)."""
        if name not in self.manifest.files:
            raise BundleError(f"{self.root / name}: not in the bundle (manifest.json files does not list it)")
        return self.root / name

    def read_file(self, name: str, max_bytes: int) -> bytes:
        """The bytes of a listed file (a regular file of at most max_bytes bytes, never through a link)."""
        return read_bounded(self.file_path(name), max_bytes, follow_symlinks=False, error=BundleError)

    def read_json(self, name: str, max_bytes: int) -> Any:
        """A listed JSON file, parsed under the strict rule."""
        return strict_json.parse(self.read_file(name, max_bytes), str(self.root / name), error=BundleError)

    def graph_path(self, phase: str) -> Path:
        return self.file_path(self.manifest.graphs[phase])

    def array(self, name: str) -> np.ndarray:
        """A tensor of weights.safetensors as a numpy array over the memory-mapped file (no copy; writes stay in
        this process). BF16 tensors come as their raw uint16 words."""
        entry = self.header.tensors.get(name)
        if entry is None:
            raise BundleError(f"{self.root / bundle_format.WEIGHTS_FILE}: no tensor named '{name}'")
        if self._weights is None:
            self._weights = np.memmap(self.root / bundle_format.WEIGHTS_FILE, dtype=np.uint8, mode="c")
        start = self.header.data_start + entry.begin
        raw = self._weights[start : self.header.data_start + entry.end]
        return raw.view(NUMPY_DTYPES[entry.dtype]).reshape(entry.shape)

    def has_tensor(self, name: str) -> bool:
        return name in self.manifest.tensors


def _same_type(tensor: onnx_wire.ExternalTensor, entry: safetensors.TensorEntry) -> bool:
    """The ONNX type and dims of an external tensor name the safetensors tensor's bytes: the same dtype and shape,
    or (int4 bundles) ONNX INT4 [rows, cols] over U8 [rows, cols / 2], two signed 4-bit values per byte, or (the
    quantized codes of int8 / int4 bundles as their decode graph's custom ops take them) ONNX INT32 [rows, n] over
    I8 / U8 [rows, 4 n], the same bytes as little-endian words."""
    dims = tuple(tensor.dims)
    if tensor.data_type == onnx_wire.ONNX_INT4:
        return entry.dtype == "U8" and len(dims) == 2 and dims[1] % 2 == 0 and (dims[0], dims[1] // 2) == entry.shape
    if tensor.data_type == onnx_wire.ONNX_INT32 and entry.dtype in ("I8", "U8"):
        return len(dims) == 2 and (dims[0], 4 * dims[1]) == entry.shape
    return onnx_wire.ONNX_TO_SAFETENSORS.get(tensor.data_type) == entry.dtype and dims == entry.shape


def _check_files(root: Path, manifest: Manifest, verify_checksums: bool) -> None:
    """Sizes of every listed file first (cheap), then their checksums."""
    for name, entry in manifest.files.items():
        size = file_size(root / name, follow_symlinks=False, error=BundleError)
        if size != entry.size:
            raise BundleError(f"{root / name}: size is {size} bytes, manifest.json says {entry.size}")
    if not verify_checksums:
        return
    for name, entry in manifest.files.items():
        _, digest = sha256_of(root / name, follow_symlinks=False, error=BundleError)
        if digest != entry.sha256:
            raise BundleError(
                f"{root / name}: sha256 is {digest}, manifest.json says {entry.sha256} (the file changed)"
            )
