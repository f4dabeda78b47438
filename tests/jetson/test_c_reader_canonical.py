"""The C runtime's canonical JSON (jetson/src/json_canonical.c, the text manifest_sha256 is taken over) against
Python's json.dumps(value, sort_keys=True, separators=(",", ":")): the same bytes for floats from random bits,
powers of two down to the subnormals, integers, escapes and key orders, however the input spells them."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest

from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats import strict_json

from .support import Build, run


def c_canonical(build: Build, documents: list[bytes], tmp_path: Path) -> list[str]:
    """edge_json_check's line per document: "ok CANONICAL" or "refused: MESSAGE"."""
    source = tmp_path / "documents.hex"
    source.write_text("".join(document.hex() + "\n" for document in documents))
    result = run([build.binary("edge_json_check"), source], timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(documents)
    return lines


def python_canonical(document: bytes) -> str:
    """ "ok CANONICAL" as Python writes it, or "refused" when the strict rule refuses the document."""
    try:
        return "ok " + strict_json.canonical(strict_json.parse(document, "doc")).decode("ascii")
    except EdgeSdkError:
        return "refused"


def assert_same(build: Build, documents: list[bytes], tmp_path: Path) -> None:
    lines = [line if line.startswith("ok ") else "refused" for line in c_canonical(build, documents, tmp_path)]
    expected = [python_canonical(document) for document in documents]
    wrong = [
        (document[:80], line[:120], want[:120])
        for document, line, want in zip(documents, lines, expected, strict=True)
        if line != want
    ]
    assert not wrong, f"{len(wrong)} of {len(documents)} differ, e.g. {wrong[:5]}"
    assert sum(want.startswith("ok ") for want in expected) >= 0.9 * len(documents)  # the canonical form compared


def random_doubles(generator: random.Random, count: int) -> list[float]:
    values = []
    while len(values) < count:
        (value,) = struct.unpack("<d", struct.pack("<Q", generator.getrandbits(64)))
        if math.isfinite(value):
            values.append(value)
    return values


def test_floats_from_random_bits(x86_build: Build, tmp_path):
    values = random_doubles(random.Random(7), 20000)
    assert_same(x86_build, [repr(value).encode() for value in values], tmp_path)


def test_powers_of_two_and_subnormals(x86_build: Build, tmp_path):
    values = [sign * 2.0**exponent for exponent in range(-1074, 1024) for sign in (1, -1)]
    values += [sign * mantissa * 2.0**-1074 for mantissa in range(1, 200) for sign in (1, -1)]  # subnormals
    values += [math.nextafter(2.0**exponent, 0) for exponent in range(-1070, 1024, 7)]
    values += [math.nextafter(2.0**exponent, math.inf) for exponent in range(-1070, 1023, 7)]
    assert_same(x86_build, [repr(value).encode() for value in values], tmp_path)


def test_repr_formats_and_halfway_digits(x86_build: Build, tmp_path):
    values = [0.0, -0.0, 1e-5, 1e-4, 0.0001, 0.00012, 1e16, 1e15, 9999999999999998.0, 1e22, 1e23, 100000.0, 0.1, 0.3]
    values += [5e-324, 1.7976931348623157e308, 2.2250738585072014e-308, 123456789012345678.0, 1 / 3, 2 / 3]
    # x = M / 4 in [2^50, 2^51): 17 digits fall exactly halfway between two candidates (round half to even)
    values += [(2**50 + odd) / 4 for odd in range(1, 4000, 2)]
    values += [float(n) for n in range(-1000, 1000)] + [float(2**53 - n) for n in range(100)]
    generator = random.Random(3)
    values += [float(f"{generator.randrange(1, 10**17)}e{generator.randrange(-340, 300)}") for _ in range(5000)]
    values += [generator.randrange(1, 10**6) / 10 ** generator.randrange(0, 30) for _ in range(3000)]
    assert_same(x86_build, [repr(value).encode() for value in values if math.isfinite(value)], tmp_path)


def test_other_spellings_of_the_same_numbers(x86_build: Build, tmp_path):
    """A tool that writes 1.0e-5 or 1E+4 or 25 digits: Python reads the same float, so the digest is the same."""
    values = [*random_doubles(random.Random(11), 3000), 1e-5, 1e16, 0.5, 100.0]
    documents = []
    for value in values:
        respelled = f"{value:.17g}".replace("e+", "E+0").replace("e-", "E-0")
        documents += [f"{value:.25e}".encode(), f"{value:.17E}".encode(), respelled.encode()]
    documents += [
        b"-0",
        b"0",
        b"-0.0",
        b"0e0",
        b"-0e-5",
        b"1E2",
        b"1e+2",
        b"10.000",
        b"9007199254740992",
        b"-9007199254740992",
    ]
    documents += [b"1" + b"0" * 400 + b".0", b"0." + b"0" * 400 + b"1", b"123456789012345678901234567890e-30"]
    assert_same(x86_build, documents, tmp_path)


def test_strings_escapes_and_key_order(x86_build: Build, tmp_path):
    characters = [chr(code) for code in [*range(0, 0x80), 0x80, 0xA0, 0xE9, 0x7FF, 0x800, 0x2028, 0xFFFD, 0xFFFF]]
    characters += ["\U00010000", "\U0001f600", "\U0010ffff", "/", "\\", '"']
    generator = random.Random(5)
    documents = [json.dumps(character).encode() for character in characters]
    documents += [json.dumps(character, ensure_ascii=False).encode() for character in characters]
    documents += [b'"\\/\\b\\f\\n\\r\\t\\u00e9\\u00E9\\uD83D\\uDE00"', b'"\xf0\x9f\x98\x80 \xc3\xa9 \x7f"']
    for _ in range(300):
        keys = ["".join(generator.choice(characters) for _ in range(generator.randrange(0, 4))) for _ in range(8)]
        value = {key: [generator.random(), generator.randrange(-(2**53), 2**53), None, True, key] for key in keys}
        documents.append(
            json.dumps(value, ensure_ascii=generator.random() < 0.5, indent=generator.choice([None, 2])).encode()
        )
    documents.append(json.dumps({"b": {"z": 1, "a": [{"y": 2, "x": {}}]}, "a": []}, indent=3).encode())
    assert_same(x86_build, documents, tmp_path)


@pytest.mark.parametrize("name", ["svd-fp16", "signbit-fp32"])
def test_manifest_digest_of_a_real_manifest(x86_build: Build, bundles, tmp_path, name):
    text = (bundles[name] / "manifest.json").read_bytes()
    assert_same(x86_build, [text], tmp_path)
