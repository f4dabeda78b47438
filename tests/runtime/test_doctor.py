"""`edge-sdk doctor`: versions, native libraries and every backend's probe answer."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from click.testing import CliRunner

import edge_sdk
from edge_sdk.cli import main

ALL_ISAS = {"avx512_vnni", "avx512", "avx2_vnni", "avx2", "neon_dotprod", "neon", "portable"}


def test_doctor_reports_versions_libraries_and_backends():
    result = CliRunner().invoke(main, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["versions"]["python"] == platform.python_version()
    assert report["versions"]["torch"].startswith("2.")
    cpu = report["native"]["cpu_kernels"]
    assert cpu["built"] and cpu["loads"] and cpu["version"] == edge_sdk.__version__ and cpu["threads"] >= 1
    assert cpu["isa"] in cpu["isas"] and set(cpu["isas"]) <= ALL_ISAS
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


def test_doctor_of_a_bundle_names_it_above_its_backends(bundle_matrix):
    """The table looked the same with a bundle as without: the backends' verdicts now say which bundle they are for."""
    bundle = bundle_matrix.path("svd-int4")
    result = CliRunner().invoke(main, ["doctor", str(bundle)])
    assert result.exit_code == 0, result.output
    assert f"backends for {bundle} (int4, predictor svd):" in result.output.splitlines()
    report = json.loads(CliRunner().invoke(main, ["doctor", str(bundle), "--json"]).output)
    assert report["bundle"] == str(bundle)
    contents = {"dtype": "int4", "predictor": "svd", "levels": [0.5, 0.8], "default_level": 0.5}
    assert report["bundle_contents"] == contents


def edge_sdk_command(*arguments: str, cpu_isa: str) -> subprocess.CompletedProcess:
    """edge-sdk in a process of its own: the kernels choose their instruction set once per process."""
    env = os.environ | {"EDGE_SDK_CPU_ISA": cpu_isa}
    command = [sys.executable, "-m", "edge_sdk", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_an_instruction_set_the_kernels_lack_is_reported_and_refused(bundle_matrix):
    """EDGE_SDK_CPU_ISA naming kernels the library does not hold: doctor says so and what the library holds, the CPU
    backend is unavailable for the same reason, and `run` exits with that one line instead of running other code."""
    result = edge_sdk_command("doctor", "--json", cpu_isa="avx1024")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    reason = report["native"]["cpu_kernels"]["reason"]
    assert not report["native"]["cpu_kernels"]["loads"]
    assert reason.startswith("EDGE_SDK_CPU_ISA=avx1024: not an instruction set of this library's kernels, which hold: ")
    assert report["backends"]["cpu"] == {"available": False, "reason": reason}
    result = edge_sdk_command("run", str(bundle_matrix.path("svd-int4")), "--prompt", "def", "--backend", "cpu",
                              "--max-new-tokens", "2", cpu_isa="avx1024")  # fmt: skip
    assert result.returncode != 0 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr == f"edge-sdk: error: backend 'cpu' (--backend) is not available here: {reason}\n"


def test_the_kernels_run_the_instruction_set_asked_for():
    """Naming the instruction set the library already runs is followed (and auto is the automatic choice)."""
    chosen = json.loads(CliRunner().invoke(main, ["doctor", "--json"]).output)["native"]["cpu_kernels"]["isa"]
    for asked in (chosen, "auto"):
        result = edge_sdk_command("doctor", "--json", cpu_isa=asked)
        cpu = json.loads(result.stdout)["native"]["cpu_kernels"]
        assert cpu["loads"] and cpu["isa"] == chosen, result.stdout
