"""Typed reads of a GGUF file's metadata (llama.cpp's key/value header), through the `gguf` package.

Every failure is a CheckpointError naming the file, the key, what it must be and what was found, so a GGUF with a
missing, mistyped or out-of-range key is refused in one line before any tensor is read.

The file itself is parsed by gguf.GGUFReader, which reads past the end of a truncated or corrupt file without noticing
and then fails inside numpy ("index 0 is out of bounds", "cannot reshape array"). open_reader checks what the reader
reads against the file instead (_CheckedReader): a file cut short is "truncated at byte N (the SECTION needs at least
M bytes)"; a header count, string or array length no real file has that runs past the end is "corrupt"; a tensor
whose data lies past the end is named with its offset and size; unknown value or tensor types, more than 4 tensor
dimensions and deeply nested arrays are refused naming where they are.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from edge_sdk.errors import CheckpointError

INTEGER_TYPES = frozenset(
    {
        gguf.GGUFValueType.UINT8,
        gguf.GGUFValueType.INT8,
        gguf.GGUFValueType.UINT16,
        gguf.GGUFValueType.INT16,
        gguf.GGUFValueType.UINT32,
        gguf.GGUFValueType.INT32,
        gguf.GGUFValueType.UINT64,
        gguf.GGUFValueType.INT64,
    }
)
FLOAT_TYPES = frozenset({gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64})
_REQUIRED = object()  # default of the reads: the key must be present


# GGUF's layout (ggml/docs/gguf.md): a 24-byte header (magic, version, tensor count, key/value count), the key/values
# (each at least a key length, a value type and a 1-byte value), the tensor infos (each at least a name length, n_dims,
# a type and an offset), then the tensor data. What the header declares is checked against these minimums first.
MIN_KEY_VALUE_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# A count or length that runs past the end of the file is reported as corrupt when above this, as a truncated file
# otherwise: no real file has so many tensors (about ten per layer), keys, vocabulary entries or bytes in one string.
MAX_PLAUSIBLE_COUNT = 1 << 24
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more
# llama.cpp reads no arrays of arrays; the bound keeps a hostile file's nesting off Python's recursion limit
MAX_ARRAY_NESTING = 8
# Namespaces of GGUF metadata keys (besides the architecture's own, "llama." ...); no tensor name starts with one, so a
# tensor info named so is a key/value read as a tensor info: the header's key/value count is short
KEY_NAMESPACES = ("general.", "tokenizer.", "split.", "quantize.", "adapter.")
# How llama.cpp's tensor names end (blk.0.attn_q.weight, token_embd.weight, ...); no metadata key ends so
TENSOR_NAME_ENDINGS = (".weight", ".bias")
_VALUE_TYPES = frozenset(int(kind) for kind in gguf.GGUFValueType)
_ARRAY = int(gguf.GGUFValueType.ARRAY)
_STRING = int(gguf.GGUFValueType.STRING)
_ITEM_BYTES = {int(kind): np.dtype(scalar).itemsize for kind, scalar in gguf.GGUFReader.gguf_scalar_to_np.items()}
_ITEM_BYTES |= {_STRING: 8, _ARRAY: 4 + 8}  # the least an element takes: a length; an element type and count
_TENSOR_TYPES = {int(kind): kind for kind in gguf.GGMLQuantizationType if kind in gguf.GGML_QUANT_SIZES}


class _CheckedReader(gguf.GGUFReader):
    """gguf.GGUFReader with what it reads checked against the file: a truncated file, or a count, length or offset
    running past its end, is a CheckpointError naming the file, the section and the bytes it needs, where the package
    itself reads past the end silently and fails later inside numpy. The package still does all the parsing: these
    overrides of its read steps only check what it is about to read (gguf 0.19's GGUFReader layout)."""

    _section = "header"
    _array_depth = 0

    def __init__(self, path: Path):
        self._path = path
        self._size = path.stat().st_size
        try:
            super().__init__(path)
        except UnicodeDecodeError as error:  # the package decodes key and tensor names as it reads them
            raise self._corrupt(f"a key or tensor name is not UTF-8 ({error.reason})") from None
        except CheckpointError:
            # a key/value count higher than the file's reads its first tensor info as a key/value, and what follows
            # it is garbage wherever it fails: the count is the cause to name
            misread = next((field for field in getattr(self, "fields", {}).values() if _tensor_like(field.name)), None)
            if misread is None:
                raise
            kv_count = int(self.fields["GGUF.kv_count"].parts[0][0])
            raise CheckpointError(
                f"{path}: corrupt key/value section: the key/value at byte {misread.offset} is named "
                f"{misread.name[:80]!r}, a tensor's name: the header's key/value count ({kv_count}, header byte 16) is "
                f"higher than the number of key/values the file holds"
            ) from None

    def _truncated(self, end: int) -> CheckpointError:
        return CheckpointError(
            f"{self._path}: truncated at byte {self._size} (the {self._section} needs at least {end} bytes)"
        )

    def _corrupt(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self._path}: corrupt {self._section}: {problem}")

    def _get(self, offset, dtype, count=1, override_order=None):
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        if offset + itemsize * count > self._size:
            if count > MAX_PLAUSIBLE_COUNT:
                # the only long counted reads of bytes are strings, whose length comes from the file
                what = f"a string of {count} bytes" if itemsize == 1 else f"{count} values of {itemsize} bytes"
                raise self._corrupt(f"{what} at byte {offset} runs past the end of the file ({self._size} bytes)")
            raise self._truncated(offset + itemsize * count)
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        raw_type = int(raw_type)
        if raw_type != _ARRAY:
            if raw_type not in _VALUE_TYPES:
                # an array's element type is checked below, so this is a key/value's type, just before its value
                raise self._corrupt(f"value type {raw_type} at byte {orig_offs - 4} is not a GGUF value type")
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = int(self._get(orig_offs, np.uint32)[0])
        count = int(self._get(orig_offs + 4, np.uint64)[0])
        if item_type not in _VALUE_TYPES:
            raise self._corrupt(f"array element type {item_type} at byte {orig_offs} is not a GGUF value type")
        if item_type == _ARRAY and self._array_depth >= MAX_ARRAY_NESTING:
            raise CheckpointError(
                f"{self._path}: the array at byte {orig_offs} of the {self._section} nests arrays more than "
                f"{MAX_ARRAY_NESTING} deep (llama.cpp reads no arrays of arrays)"
            )
        # checked before the package loops over the elements: a corrupt count would otherwise run to the file's end
        end = orig_offs + 12 + count * _ITEM_BYTES[item_type]
        if end > self._size and count > MAX_PLAUSIBLE_COUNT:
            raise self._corrupt(
                f"the array at byte {orig_offs} declares {count} elements of at least {_ITEM_BYTES[item_type]} bytes, "
                f"past the end of the file ({self._size} bytes)"
            )
        if end > self._size:
            raise self._truncated(end)
        self._array_depth += 1
        try:
            return super()._get_field_parts(orig_offs, raw_type)
        finally:
            self._array_depth -= 1

    def _build_fields(self, offs, count):
        tensor_count = int(self.fields["GGUF.tensor_count"].parts[0][0])
        kv_count = int(count)
        needed = offs + tensor_count * MIN_TENSOR_INFO_BYTES + kv_count * MIN_KEY_VALUE_BYTES
        if needed > self._size:
            # a count no real file has is corrupt; sensible counts in too short a file mean a truncated one
            for name, value, least, byte in (
                ("tensor count", tensor_count, MIN_TENSOR_INFO_BYTES, 8),
                ("key/value count", kv_count, MIN_KEY_VALUE_BYTES, 16),
            ):
                if value > MAX_PLAUSIBLE_COUNT:
                    raise CheckpointError(
                        f"{self._path}: {name} {value} (header byte {byte}) exceeds what a file of {self._size} "
                        f"bytes can hold (each takes at least {least} bytes)"
                    )
            raise CheckpointError(
                f"{self._path}: truncated at byte {self._size} (the {kv_count} key/values and {tensor_count} tensor "
                f"infos the header declares need at least {needed} bytes)"
            )
        self._section = "key/value section"
        return super()._build_fields(offs, count)

    def _get_tensor_info_field(self, orig_offs):
        self._section = "tensor-info section"
        name_length = int(self._get(orig_offs, np.uint64)[0])
        name = bytes(self._get(orig_offs + 8, np.uint8, name_length)).decode("utf-8", "replace")
        if name.startswith(self._key_namespaces()):
            kv_count = int(self.fields["GGUF.kv_count"].parts[0][0])
            raise self._corrupt(
                f"the tensor info at byte {orig_offs} is named {name[:80]!r}, a metadata key: the header's key/value "
                f"count ({kv_count}, header byte 16) is lower than the number of key/values the file holds"
            )
        n_dims = int(self._get(orig_offs + 8 + name_length, np.uint32)[0])
        if n_dims > MAX_TENSOR_DIMS:
            raise self._corrupt(
                f"tensor {name[:80]!r} (tensor info at byte {orig_offs}) has {n_dims} dimensions, expected at most "
                f"{MAX_TENSOR_DIMS}"
            )
        return super()._get_tensor_info_field(orig_offs)

    def _key_namespaces(self) -> tuple[str, ...]:
        """KEY_NAMESPACES and the architecture's own ("llama." for general.architecture "llama"), where the key/values
        read so far name one."""
        field = self.fields.get("general.architecture")
        if field is None or field.types != [gguf.GGUFValueType.STRING]:
            return KEY_NAMESPACES
        return (*KEY_NAMESPACES, bytes(field.parts[field.data[0]]).decode("utf-8", "replace") + ".")

    def _build_tensors(self, start_offs, fields):
        self._section = "tensor data"
        for field in fields:
            _, name_data, _, dims, raw_type, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")[:80]
            kind = _TENSOR_TYPES.get(int(raw_type[0]))
            if kind is None:
                raise CheckpointError(
                    f"{self._path}: tensor {name!r} has type {int(raw_type[0])}, which is not a GGML tensor type"
                )
            block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
            shape = [int(size) for size in dims] or [1]  # no dimensions: a scalar
            if shape[0] % block_size:
                raise CheckpointError(
                    f"{self._path}: tensor {name!r} has rows of {shape[0]} values, which must be a multiple of "
                    f"{kind.name}'s block of {block_size}"
                )
            begin, size = start_offs + int(offset[0]), math.prod(shape) * type_size // block_size
            if begin + size > self._size:
                raise CheckpointError(
                    f"{self._path}: tensor {name!r} data at offset {begin} + {size} bytes lies past the end of the "
                    f"file ({self._size} bytes)"
                )
        return super()._build_tensors(start_offs, fields)


def _tensor_like(key: str) -> bool:
    """Whether a key/value's key is named as a tensor, outside every metadata namespace."""
    return key.endswith(TENSOR_NAME_ENDINGS) and not key.startswith(("GGUF.", *KEY_NAMESPACES))


# The package's read steps _CheckedReader overrides, with their parameters (gguf 0.17-0.19). Another package version
# whose steps differ is read by the plain gguf.GGUFReader instead (tests/model/test_gguf.py asserts this one matches).
_READ_STEPS = {
    "_get": ("offset", "dtype", "count", "override_order"),
    "_get_field_parts": ("orig_offs", "raw_type"),
    "_build_fields": ("offs", "count"),
    "_get_tensor_info_field": ("orig_offs",),
    "_build_tensors": ("start_offs", "fields"),
}


def _read_steps_match() -> bool:
    for name, parameters in _READ_STEPS.items():
        step = getattr(gguf.GGUFReader, name, None)
        if step is None or tuple(inspect.signature(step).parameters)[1:] != parameters:
            return False
    return True


CHECKED_READS = _read_steps_match()


def open_reader(path: Path) -> gguf.GGUFReader:
    """The parsed header of a GGUF file; a file that is not one, or a truncated or corrupt one, is a CheckpointError
    naming it and what is wrong."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise CheckpointError(f"{path}: the file is empty (expected a GGUF file)")
        if CHECKED_READS:
            try:
                return _CheckedReader(path)
            except CheckpointError:
                raise
            except Exception:  # a read step this package version does differently: read the file plainly
                pass
        return gguf.GGUFReader(path)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as error:
        # the gguf package reports a bad magic, version, value type, alignment or a duplicate key or tensor this way
        raise CheckpointError(f"{path}: not a readable GGUF file ({error})") from None


class GgufMetadata:
    """The key/value metadata of one GGUF file."""

    def __init__(self, reader: gguf.GGUFReader, path: Path):
        self.fields = reader.fields
        self.path = path

    def has(self, key: str) -> bool:
        return key in self.fields

    def _fail(self, key: str, expected: str, found: str | None = None) -> CheckpointError:
        if found is None:
            return CheckpointError(f"{self.path}: metadata key '{key}' is missing; it must be {expected}")
        return CheckpointError(f"{self.path}: metadata key '{key}' must be {expected}, found {found}")

    def _contents(self, key: str, field: Any, expected: str) -> Any:
        try:
            return field.contents()
        except UnicodeDecodeError as error:
            raise self._fail(key, f"{expected} in UTF-8", f"bytes that are not UTF-8 ({error.reason})") from None

    def _scalar(self, key: str, types: frozenset, expected: str, default: Any) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise self._fail(key, expected)
            return default
        if len(field.types) != 1 or field.types[0] not in types:
            raise self._fail(key, expected, f"a value of type {'/'.join(kind.name for kind in field.types)}")
        return self._contents(key, field, expected)

    def integer(self, key: str, default: Any = _REQUIRED, low: int | None = None, high: int | None = None) -> Any:
        """An integer key's value, which must lie in [low, high] where they are given (a default is not checked)."""
        bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
        bounds = bounds or (f" >= {low}" if low is not None else f" <= {high}" if high is not None else "")
        value = self._scalar(key, INTEGER_TYPES, "an integer" + bounds, default)
        if key in self.fields and ((low is not None and value < low) or (high is not None and value > high)):
            raise self._fail(key, "an integer" + bounds, str(value))
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._scalar(key, FLOAT_TYPES | INTEGER_TYPES, "a number", default)

    def boolean(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._scalar(key, frozenset({gguf.GGUFValueType.BOOL}), "true or false", default)

    def string(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._scalar(key, frozenset({gguf.GGUFValueType.STRING}), "a string", default)

    def array(self, key: str, element_types: frozenset, expected: str, default: Any = _REQUIRED) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise self._fail(key, f"an array of {expected}")
            return default
        if field.types[0] != gguf.GGUFValueType.ARRAY or (field.data and field.types[-1] not in element_types):
            found = "an array of " + field.types[-1].name if field.types[0] == gguf.GGUFValueType.ARRAY else None
            raise self._fail(key, f"an array of {expected}", found or f"a value of type {field.types[0].name}")
        return self._contents(key, field, f"an array of {expected}")

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.array(key, frozenset({gguf.GGUFValueType.STRING}), "strings", default)

    def integers(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.array(key, INTEGER_TYPES, "integers", default)

    def numbers(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.array(key, FLOAT_TYPES | INTEGER_TYPES, "numbers", default)

    def token_id(self, key: str, vocab_size: int) -> int | None:
        """An optional token id key, which must index the vocabulary when present."""
        token = self.integer(key, default=None)
        if token is not None and not 0 <= token < vocab_size:
            raise self._fail(key, f"a token id in [0, {vocab_size - 1}]", str(token))
        return token
