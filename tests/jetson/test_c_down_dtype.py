"""The C runtime on int4 bundles whose FFN down projections are int8 (export --down-dtype int8, the manifest's
down_dtype, bundle format version 7): it reads them as the Python CPU backend does, greedy id for greedy id, and
refuses every manifest whose down_dtype, format version and down tensors disagree, naming what is wrong. (The
Python readers' verdicts on the same edits belong to test_bundle_verdicts.py's corpus.)"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import edge_sdk
from edge_sdk.bundle import format as bundle_format
from edge_sdk.runtime.generator import SamplingSettings

from ..conftest import INT8_DOWN_BUNDLES
from .support import JETSON, PROMPT, STEPS, Build, c_verdicts, generate_command, python_cpu_engine, run
from .test_bundle_verdicts import DELETE, edit_manifest, setting

DOWN = "layers.0.mlp.down_proj.weight_t"
INT8_DOWN = "svd-int4-down-int8"  # symmetric int4 gate and up, int8 down
ASYMMETRIC_INT8_DOWN = "tied-svd-int4-asym-head-int8-down-int8"  # asymmetric int4, int8 head and down (no mins)
OK = None


def test_the_c_readers_format_versions_are_pythons():
    """jetson/src/manifest.h's BUNDLE_<NAME>FORMAT_VERSION equal edge_sdk/bundle/format.py's <NAME>FORMAT_VERSION, the
    newest (BUNDLE_FORMAT_VERSION) and the one that added down_dtype included."""
    header = (JETSON / "src" / "manifest.h").read_text()
    found = dict(re.findall(r"#define BUNDLE_(\w*FORMAT_VERSION) (\d+)", header))
    assert {"FORMAT_VERSION", "DOWN_DTYPE_FORMAT_VERSION"} <= found.keys()
    assert {name: int(value) for name, value in found.items()} == {
        name: getattr(bundle_format, name, None) for name in found
    }


def greedy_ids(result) -> list[int]:
    assert result.returncode == 0, result.stderr
    return [int(token) for token in result.stdout.split()]


@pytest.mark.parametrize("name", list(INT8_DOWN_BUNDLES))
def test_greedy_ids_equal_python_cpu_backend(x86_build: Build, bundle_matrix, name):
    """Prefill (edge_cpu_ffn_tokens) and decode (edge_cpu_sparse_ffn_q) over int4 gate and up rows with int8 down
    rows: the C runtime's greedy ids are the Python CPU backend's."""
    path = bundle_matrix.path(name)
    with python_cpu_engine():
        session = edge_sdk.load(path, backend="cpu", threads=1)
        prompt_ids = session.tokenizer.encode(PROMPT)
        expected = list(session.generator.generate_ids(prompt_ids, SamplingSettings(max_new_tokens=STEPS)))
    assert len(expected) >= 8  # a real comparison, not an immediate eos
    assert greedy_ids(run(generate_command([x86_build.binary("edge_generate")], path, "--ids"))) == expected


def declare_down_mins(manifest: dict) -> None:
    """An int8 down projection declared with minimums, as an asymmetric int4 one has."""
    scales = manifest["tensors"][DOWN + ".scales"]
    manifest["tensors"][DOWN + ".mins"] = dict(scales)


# (case name, base bundle, manifest change, expected: None (opens) or the texts the refusal must contain)
CASES: list[tuple[str, str, Callable[[dict], object], tuple[str, ...] | None]] = [
    ("as exported", INT8_DOWN, lambda m: None, OK),
    ("asymmetric as exported", ASYMMETRIC_INT8_DOWN, lambda m: None, OK),
    # versions before 7 do not read down_dtype: the I8 down rows are then the wrong dtype
    ("format_version 6", INT8_DOWN, setting("format_version", 6), (f"'{DOWN}' is declared I8", "needs U8")),
    (
        "asymmetric as format_version 6",
        ASYMMETRIC_INT8_DOWN,
        setting("format_version", 6),
        (f"'{DOWN}' is declared I8", "needs U8"),
    ),
    ("down_dtype missing", INT8_DOWN, setting("down_dtype", DELETE), (f"'{DOWN}' is declared I8", "needs U8")),
    ("down_dtype null", INT8_DOWN, setting("down_dtype", None), (f"'{DOWN}' is declared I8", "needs U8")),
    ("down_dtype int4 (not wider)", INT8_DOWN, setting("down_dtype", "int4"), ("down_dtype", "int8")),
    ("down_dtype fp16", INT8_DOWN, setting("down_dtype", "fp16"), ("down_dtype", "int8")),
    ("down_dtype a number", INT8_DOWN, setting("down_dtype", 8), ("down_dtype",)),
    ("int8 down with minimums", ASYMMETRIC_INT8_DOWN, declare_down_mins, (f"'{DOWN}.mins' belongs to no part",)),
    (
        "down_dtype int8 on a plain int4 bundle",
        "svd-int4",
        lambda m: m.update(format_version=7, down_dtype="int8"),
        (f"'{DOWN}' is declared U8", "needs I8"),
    ),
    (
        "down_dtype int8 on an int8 bundle",
        "svd-int8",
        lambda m: m.update(format_version=7, down_dtype="int8"),
        ("down_dtype", "other than int4"),
    ),
    ("int4 format_version 7, down_dtype null", "svd-int4", lambda m: m.update(format_version=7, down_dtype=None), OK),
    (
        "fp32 format_version 6 with a down_dtype it does not read",
        "svd-fp32",
        lambda m: m.update(format_version=6, down_dtype="int8"),
        OK,
    ),
]


def test_the_c_reader_takes_down_dtype_from_format_version_7_on(x86_build: Build, bundle_matrix, tmp_path: Path):
    paths = []
    for index, (_, base, change, _) in enumerate(CASES):
        path = tmp_path / f"case{index}"
        shutil.copytree(bundle_matrix.path(base), path)
        edit_manifest(change)(path)
        paths.append(path)
    verdicts = c_verdicts(x86_build, paths)
    for (name, _, _, expected), verdict in zip(CASES, verdicts, strict=True):
        if expected is OK:
            assert verdict is None, f"{name}: {verdict}"
        else:
            assert verdict is not None, f"{name}: opened"
            assert all(text in verdict for text in expected), f"{name}: {verdict}"
            assert "\n" not in verdict
