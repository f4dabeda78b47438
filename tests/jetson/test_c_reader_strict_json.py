"""The C runtime's strict JSON rule (jetson/src/json_strict.c) against edge_sdk/formats/strict_json.py: one verdict
for every document (and, when accepted, one canonical form), on hand-picked edge cases of each part of the rule and
on thousands of random byte edits of real JSON, in both modes (any numbers; integers only, for safetensors)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats import strict_json

from .support import Build, run

EDGE_CASES = [
    # UTF-8: overlong forms, encoded surrogates, beyond U+10FFFF, truncated sequences, a byte order mark
    b'"\xc0\xaf"',
    b'"\xe0\x80\xaf"',
    b'"\xf0\x80\x80\xaf"',
    b'"\xed\xa0\x80"',
    b'"\xed\xbf\xbf"',
    b'"\xf4\x90\x80\x80"',
    b'"\xf5\x80\x80\x80"',
    b'"\xe2\x82"',
    b'"\xc3"',
    b'"\x80"',
    b'"\xff"',
    b'"\xef\xbf\xbf"',
    b'"\xf4\x8f\xbf\xbf"',
    b"\xef\xbb\xbf{}",
    b" \xef\xbb\xbf{}",
    b"{}\xc3",
    b"\xc3{}",
    # grammar
    b"",
    b" ",
    b"{",
    b"}",
    b"[",
    b"[1,]",
    b"{,}",
    b'{"a":1,}',
    b'{"a" 1}',
    b"{'a':1}",
    b"[1 2]",
    b"01",
    b"-01",
    b"1.",
    b".5",
    b"-",
    b"--1",
    b"+1",
    b"1e",
    b"1e+",
    b"1.e5",
    b"0x10",
    b"1_000",
    b"tru",
    b"truee",
    b"nul",
    b"True",
    b"None",
    b"[]",
    b"{}",
    b"[[]]",
    b'{"":0}',
    b"0",
    b"-0",
    b"-0.0",
    b"1E5",
    b"1e-5",
    b"0.5e+3",
    b'"a"',
    b"null",
    b"true",
    b"1 2",
    b"{}{}",
    b"[] x",
    b"//c\n1",
    b"/*c*/1",
    b"[1]//",
    # whitespace: only space, tab, LF, CR
    b" \t\r\n[1]\n\t ",
    b"\x0b[1]",
    b"\x0c[1]",
    b"[1]\x00",
    b"\xc2\xa0[1]",
    b"[\xe2\x80\xa81]",
    # numbers: NaN, Infinity, beyond float64, beyond 2^53
    b"NaN",
    b"-NaN",
    b"Infinity",
    b"-Infinity",
    b"[NaN]",
    b"1e308",
    b"1.8e308",
    b"-1.8e308",
    b"1e400",
    b"1e-400",
    b"4.9e-324",
    b"2e-324",
    b"9007199254740992",
    b"-9007199254740992",
    b"9007199254740993",
    b"-9007199254740993",
    b"99999999999999999",
    b"100000000000000000000",
    b"9007199254740993.0",
    b"1" * 5000,
    b"0." + b"1" * 5000,
    # strings: controls, escapes, surrogates
    b'"\x00"',
    b'"\x1f"',
    b'"\x7f"',
    b'"\t"',
    b'"\\t"',
    b'"\\x41"',
    b'"\\u00"',
    b'"\\u00g0"',
    b'"\\U0041"',
    b'"\\',
    b'"abc',
    b'"\\ud800"',
    b'"\\udc00"',
    b'"\\ud800\\udc00"',
    b'"\\uDBFF\\uDFFF"',
    b'"\\ud800\\ud800\\udc00"',
    b'"\\ud800x"',
    b'"\\ud800\\u0041"',
    b'"\\udc00\\ud800"',
    b'"\\ud800\\"',
    b'"\\u0000"',
    b'{"\\ud800":1}',
    b'"\\ud83d\\ude00"',
    b'"\\/"',
    b'"/"',
    # duplicate keys, compared decoded
    b'{"a":1,"a":1}',
    b'{"a":1,"b":{"a":2}}',
    b'{"a":1,"\\u0061":2}',
    b'{"\\u00e9":1,"\xc3\xa9":2}',
    b'{"a\\u0000":1,"a":2}',
    b'{"a\\u0000b":1,"a\\u0000c":2}',
    b'{"a\\u0000b":1,"a\\u0000b":2}',
    b'[{"a":1},{"a":1}]',
    # depth: 64 levels of arrays and objects, not 65
    b"[" * 64 + b"]" * 64,
    b"[" * 65 + b"]" * 65,
    b'{"a":' * 64 + b"0" + b"}" * 64,
    b'{"a":' * 65 + b"0" + b"}" * 65,
    b"[" * 100000 + b"]" * 100000,
    b'["[[[["]',
    b"[" * 63 + b'{"a":1}' + b"]" * 63,
    b"[" * 64 + b'{"a":1}' + b"]" * 64,
]


def c_lines(build: Build, documents: list[bytes], tmp_path: Path, integers_only: bool = False) -> list[str]:
    source = tmp_path / "documents.hex"
    source.write_text("".join(document.hex() + "\n" for document in documents))
    command = [build.binary("edge_json_check"), *(["--integers-only"] if integers_only else []), source]
    result = run(command, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(documents)
    return lines


def python_line(document: bytes, integers_only: bool) -> str:
    try:
        value = strict_json.parse(document, "doc", integers_only=integers_only)
    except EdgeSdkError as error:
        return f"refused: {error}"
    return "ok " + strict_json.canonical(value).decode("ascii")


def assert_same_verdicts(build: Build, documents: list[bytes], tmp_path: Path, integers_only: bool = False) -> int:
    """Every document gets the same verdict (and canonical form); the number refused."""
    wrong, refused = [], 0
    for document, line in zip(documents, c_lines(build, documents, tmp_path, integers_only), strict=True):
        expected = python_line(document, integers_only)
        refused += expected.startswith("refused")
        if expected.startswith("ok ") != line.startswith("ok ") or (expected.startswith("ok ") and line != expected):
            wrong.append(f"{document[:60]!r}: C {line[:100]!r}, Python {expected[:100]!r}")
        elif line.startswith("refused"):
            assert line.startswith("refused: doc: not valid JSON: "), line
    assert not wrong, "\n".join(wrong[:20])
    return refused


def test_edge_cases_of_every_rule(x86_build: Build, tmp_path):
    refused = assert_same_verdicts(x86_build, EDGE_CASES, tmp_path)
    assert 0.5 * len(EDGE_CASES) < refused < len(EDGE_CASES)


def test_edge_cases_in_integers_only_mode(x86_build: Build, tmp_path):
    documents = [*EDGE_CASES, b'{"a":[0,1,2]}', b'{"a":[0,1.0]}', b'{"a":1e2}', b'{"a":-0}', b'{"a":0.0}', b"[1E0]"]
    assert_same_verdicts(x86_build, documents, tmp_path, integers_only=True)


def mutations(seed_documents: list[bytes], count: int, seed: int) -> list[bytes]:
    generator = random.Random(seed)
    pieces = [
        b"{",
        b"}",
        b"[",
        b"]",
        b'"',
        b",",
        b":",
        b"\\",
        b"\\u",
        b"d800",
        b"0",
        b"-",
        b"e",
        b".",
        b" ",
        b"\n",
        b"\x00",
        b"\x1f",
        b"\xc3",
        b"\xa9",
        b"\xed\xa0\x80",
        b"\xf0\x9f\x98\x80",
        b"NaN",
        b"1e999",
        b"true",
    ]
    made = []
    while len(made) < count:
        data = bytearray(generator.choice(seed_documents))
        for _ in range(generator.randrange(1, 4)):
            at = generator.randrange(len(data) + 1)
            choice = generator.randrange(4)
            if choice == 0 and data:
                del data[at : at + generator.randrange(1, 8)]
            elif choice == 1:
                data[at:at] = generator.choice(pieces)
            elif choice == 2 and at < len(data):
                data[at] = generator.randrange(256)
            else:
                data[at:at] = data[max(0, at - 8) : at]  # repeat a few bytes (duplicate keys, nesting)
        made.append(bytes(data))
    return made


@pytest.fixture(scope="module")
def seed_documents(bundles) -> list[bytes]:
    manifest = json.loads((bundles["svd-fp16"] / "manifest.json").read_text())
    small = [
        json.dumps({"model": manifest["model"], "files": dict(list(manifest["files"].items())[:2])}, indent=1).encode(),
        json.dumps(manifest["sparsity"], ensure_ascii=False).encode(),
        b'{"a":[1,2.5,-0,1e-5,"\\u00e9\\ud83d\\ude00",null,true,{"b":[[[]]]}],"c":"x\\ny","d":9007199254740992}',
        '{"é":"\U0001f600","k":{"k":{"k":{}}},"n":[0,-1,1.5E+3]}'.encode(),
    ]
    return small


def test_random_edits_of_real_json(x86_build: Build, seed_documents, tmp_path):
    documents = mutations(seed_documents, 4000, seed=1)
    refused = assert_same_verdicts(x86_build, documents, tmp_path)
    assert 0.3 * len(documents) < refused < len(documents)  # both verdicts are exercised


def test_random_edits_in_integers_only_mode(x86_build: Build, tmp_path):
    header = json.dumps(
        {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    ).encode()
    documents = mutations([header], 2000, seed=2)
    refused = assert_same_verdicts(x86_build, documents, tmp_path, integers_only=True)
    assert 0.3 * len(documents) < refused < len(documents)


@pytest.fixture(scope="module")
def comma_locale(tmp_path_factory) -> Path:
    """LOCPATH holding de_DE.UTF-8 (decimal point ','), compiled by localedef from the system's locale sources."""
    locales = tmp_path_factory.mktemp("locales")
    try:
        made = run(["localedef", "-i", "de_DE", "-f", "UTF-8", locales / "de_DE.UTF-8"], timeout=120)
    except OSError:
        pytest.skip("no localedef here (Debian: libc-bin)")
    if made.returncode != 0:
        pytest.skip(f"localedef cannot make de_DE.UTF-8 here (Debian: locales): {made.stderr.strip()[:200]}")
    return locales


def test_numbers_read_alike_on_threads_of_other_locales(x86_build: Build, comma_locale):
    """A thread whose locale writes ',' for the decimal point, parsing beside one in the C locale: the reader asked
    localeconv() for the point, whose one struct every thread's call rewrites, so a thread could take the other's."""
    command = [x86_build.binary("edge_json_check"), "--locale-race", "de_DE.UTF-8"]
    result = run(command, env={"LOCPATH": str(comma_locale), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "misread 0\n"
