"""Typed reads of a GGUF file's metadata (llama.cpp's key/value header), through the `gguf` package.

Every failure is a CheckpointError naming the file, the key, what it must be and what was found, so a GGUF with a
missing or mistyped key is refused in one line before any tensor is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

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


def open_reader(path: Path) -> gguf.GGUFReader:
    """The parsed header of a GGUF file; a file that is not one is a CheckpointError naming it."""
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as error:
        # the gguf package reports a bad magic, version, type or a truncated header this way
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

    def _scalar(self, key: str, types: frozenset, expected: str, default: Any) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise self._fail(key, expected)
            return default
        if len(field.types) != 1 or field.types[0] not in types:
            raise self._fail(key, expected, f"a value of type {'/'.join(kind.name for kind in field.types)}")
        return field.contents()

    def integer(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._scalar(key, INTEGER_TYPES, "an integer", default)

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
        return field.contents()

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
