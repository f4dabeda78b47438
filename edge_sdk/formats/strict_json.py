"""Strict JSON: the one rule every edge-sdk reader applies to JSON it did not write itself.

Bundle manifests, safetensors headers, config.json, tokenizer.json and tokenizer_config.json come from other
machines and other tools, and the Python readers and the C runtime (jetson/src/json_strict.c) must give every such
file the same verdict. Python's json module and cJSON each accept things the other refuses (NaN, duplicate keys,
lone surrogates, 1000-deep nesting, trailing text), so both sides apply this rule first:

- UTF-8 text without a byte order mark, holding one RFC 8259 value with only JSON whitespace around it;
- no NaN or Infinity, every number finite as a float64; an integer literal beyond +-2^53 (not exact in a double)
  is read as the nearest float64, as if written with an exponent (transformers writes model_max_length as
  1000000000000000019884624838656 when a tokenizer sets none);
- no lone UTF-16 surrogate in a \\u escape, no raw control character in a string;
- at most MAX_DEPTH levels of arrays and objects, no key twice in one object;
- where the caller says so (safetensors headers), integer literals only, each within +-2^53.

`canonical` is the form manifest_sha256 is taken over: keys sorted, no whitespace, non-ASCII escaped, numbers as
Python writes them (json.dumps(sort_keys=True, separators=(",", ":"))); the C side writes the same bytes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from edge_sdk.errors import EdgeSdkError

MAX_DEPTH = 64
MAX_SAFE_INTEGER = 2**53
# "digits of a number": 2^53 has 16, so an integer literal longer than this cannot be within range
_MAX_INTEGER_DIGITS = 17
_STRING_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Refused(Exception):
    """Raised from inside json.loads hooks; turned into the caller's error with its `where`."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _is_safe_integer(token: str) -> bool:
    return len(token.lstrip("-")) <= _MAX_INTEGER_DIGITS and abs(int(token)) <= MAX_SAFE_INTEGER


def _integer(token: str) -> int | float:
    return int(token) if _is_safe_integer(token) else _float(token)


def _exact_integer(token: str) -> int:
    if not _is_safe_integer(token):
        raise _Refused(f"integer {token[:24]}{'...' if len(token) > 24 else ''} is outside +-2^53")
    return int(token)


def _float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _Refused(f"number {token[:24]} is not finite as a float64")
    return value


def _integers_only(token: str) -> float:
    raise _Refused(f"number {token[:24]} is not an integer (this file holds integers only)")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"key {key[:64]!r} appears twice in one object")
            seen.add(key)
    return result


def nesting_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in JSON text (an upper bound when the text is not valid JSON)."""
    brackets = re.sub(r"[^\[\]{}]", "", _STRING_TOKEN.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max())


def _check_no_lone_surrogates(value: Any) -> None:
    """Python's json decodes a lone \\ud800 to a str that is not Unicode text; cJSON refuses it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused("a \\u escape is a lone UTF-16 surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_no_lone_surrogates(key)
            _check_no_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _check_no_lone_surrogates(item)


def parse(data: bytes, where: str, *, integers_only: bool = False, error: type[EdgeSdkError] = EdgeSdkError) -> Any:
    """The JSON value in data, or error(f"{where}: not valid JSON: <reason>") when it breaks the rule above."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(
            f"{where}: not valid JSON: not UTF-8 text (byte 0x{data[problem.start]:02x} at offset {problem.start})"
        ) from None
    if text.startswith("\ufeff"):
        raise error(f"{where}: not valid JSON: starts with a byte order mark")
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise error(f"{where}: not valid JSON: nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_refuse_constant,
            parse_int=_exact_integer if integers_only else _integer,
            parse_float=_integers_only if integers_only else _float,
        )
        if _SURROGATE_ESCAPE.search(text):
            _check_no_lone_surrogates(value)
    except json.JSONDecodeError as problem:
        raise error(f"{where}: not valid JSON: {problem.msg} (line {problem.lineno}, column {problem.colno})") from None
    except _Refused as problem:
        raise error(f"{where}: not valid JSON: {problem}") from None
    return value


def parse_object(
    data: bytes, where: str, *, integers_only: bool = False, error: type[EdgeSdkError] = EdgeSdkError
) -> dict[str, Any]:
    """parse(), and the value must be a JSON object."""
    value = parse(data, where, integers_only=integers_only, error=error)
    if not isinstance(value, dict):
        raise error(f"{where}: expected a JSON object, found {json_type(value)}")
    return value


def canonical(value: Any) -> bytes:
    """The canonical bytes of a parsed value (see the module docstring)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
