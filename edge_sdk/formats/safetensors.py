"""The safetensors header, read and validated without torch (checkpoints and bundles alike).

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the data section. The rules
are the ones the safetensors library enforces when it opens a file, so a header passing here also opens there,
plus the strict JSON rule (formats/strict_json.py) that the C runtime applies too:
- N at most MAX_HEADER_BYTES and inside the file; the header a JSON object of integer literals only;
- `__metadata__`, when present, an object of strings;
- every other entry a tensor: a known dtype, a shape of at most MAX_RANK dimensions in [0, MAX_DIMENSION], and
  data_offsets [begin, end] whose span is exactly the shape's bytes;
- the tensors, ordered by offset, tile the data section exactly: the first starts at 0, each starts where the one
  before ended, the last ends at the end of the file (no gap, no overlap, no trailing bytes).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import open_regular

MAX_HEADER_BYTES = 100 << 20  # the limit the safetensors library applies
MAX_RANK = 8
MAX_DIMENSION = 1 << 40
MAX_ELEMENTS = 1 << 60
# element sizes of the safetensors dtypes (the C runtime's table in jetson/src/bundle.c is the same)
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, dtype, shape and byte range [begin, end) inside the data section."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def element_size(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int  # byte offset of the data section in the file
    file_size: int


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_entry(path: Path, name: str, info: object, data_size: int, error: type[EdgeSdkError]) -> TensorEntry:
    where = f"{path}: tensor {name[:200]!r}"
    if not isinstance(info, dict):
        raise error(f"{where}: expected an object with 'dtype', 'shape' and 'data_offsets'")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
        raise error(f"{where}: expected an object with a string 'dtype', a list 'shape' and two 'data_offsets'")
    if dtype not in DTYPE_SIZES:
        raise error(f"{where}: unknown dtype {dtype[:32]!r}; known: {', '.join(DTYPE_SIZES)}")
    if len(shape) > MAX_RANK:
        raise error(f"{where}: {len(shape)} dimensions, at most {MAX_RANK} are supported")
    elements = 1
    for size in shape:
        if not _is_integer(size) or not 0 <= size <= MAX_DIMENSION:
            raise error(f"{where}: shape {shape} has an entry that is not an integer in [0, 2^40]")
        elements *= size
        if elements > MAX_ELEMENTS:
            raise error(f"{where}: more than 2^60 elements")
    begin, end = offsets
    if not (_is_integer(begin) and _is_integer(end) and 0 <= begin <= end):
        raise error(f"{where}: data_offsets {offsets} must be two integers 0 <= begin <= end")
    if end > data_size:
        raise error(f"{path}: truncated: tensor {name[:200]!r} ends at data byte {end}, the file holds {data_size}")
    expected = elements * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise error(f"{where}: spans {end - begin} bytes, its dtype {dtype} and shape {shape} need {expected}")
    return TensorEntry(path, dtype, tuple(shape), begin, end)


def read_header(
    path: str | Path, *, follow_symlinks: bool = True, error: type[EdgeSdkError] = EdgeSdkError
) -> SafetensorsHeader:
    """Parse and validate the header of the safetensors file at path (see the module docstring)."""
    path = Path(path)
    descriptor = open_regular(path, follow_symlinks=follow_symlinks, error=error)
    with open(descriptor, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise error(f"{path}: {file_size} bytes, too short for a safetensors header (at least 8)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > min(MAX_HEADER_BYTES, file_size - 8):
            raise error(f"{path}: header length {header_size} does not fit the {file_size}-byte file")
        raw = handle.read(header_size)
    header = strict_json.parse_object(raw, f"{path}: header", integers_only=True, error=error)
    data_start = 8 + header_size
    data_size = file_size - data_start
    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise error(f"{path}: header field {METADATA_KEY!r} must be an object of strings")
    tensors = {name: _tensor_entry(path, name, info, data_size, error) for name, info in header.items()}
    position = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position:
            problem = "overlaps the tensor before it" if entry.begin < position else "leaves a gap before it"
            raise error(
                f"{path}: tensor {name[:200]!r} starts at data byte {entry.begin} and {problem} (ends at "
                f"{position}); the tensors must tile the data section"
            )
        position = entry.end
    if position != data_size:
        raise error(f"{path}: the tensors cover {position} of the {data_size} data bytes; the rest belongs to none")
    return SafetensorsHeader(path, tensors, metadata, data_start, file_size)
