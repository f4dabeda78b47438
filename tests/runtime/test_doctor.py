"""`edge-sdk doctor`: versions, native libraries and every backend's probe answer."""

from __future__ import annotations

import json
import platform

from click.testing import CliRunner

import edge_sdk
from edge_sdk.cli import main


def test_doctor_reports_versions_libraries_and_backends():
    result = CliRunner().invoke(main, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["versions"]["python"] == platform.python_version()
    assert report["versions"]["torch"].startswith("2.")
    cpu = report["native"]["cpu_kernels"]
    assert cpu["built"] and cpu["loads"] and cpu["version"] == edge_sdk.__version__ and cpu["threads"] >= 1
    assert set(report["native"]) == {"cpu_kernels", "c_runtime", "cuda_kernels", "tensorrt_plugins"}
    for library in ("c_runtime", "cuda_kernels", "tensorrt_plugins"):
        entry = report["native"][library]
        assert (
            entry["path"].endswith(".so")
            if entry["built"]
            else "was not found when edge-sdk was built" in entry["reason"]
        )
    assert list(report["backends"]) == ["tensorrt", "cann", "cpu"]
    assert report["backends"]["cpu"]["available"] is True
    for name in ("tensorrt", "cann"):
        backend = report["backends"][name]
        assert backend["available"] or backend["reason"]


def test_doctor_table_names_each_backend_with_its_reason():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    backend_lines = lines[lines.index("backends:") + 1 :]
    assert [line.split()[0] for line in backend_lines] == ["tensorrt", "cann", "cpu"]
    assert backend_lines[2].split(None, 1)[1].startswith("available: native kernels")
