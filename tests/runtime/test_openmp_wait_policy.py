"""OpenMP's wait policy: passive unless the user chose one, and libgomp really runs with it.

libgomp prints its settings at load time under OMP_DISPLAY_ENV, which shows what it read, not what the
environment says afterwards: setting the variable after the library loaded would pass an os.environ check and
fail this one.
"""

import os
import subprocess
import sys

import pytest

from edge_sdk.native import find_library

pytestmark = pytest.mark.skipif(find_library() is None, reason="the CPU kernel library was not built")

LOAD = (
    "from edge_sdk.native import load_cpu_kernels, openmp_wait_policy; load_cpu_kernels(); "
    "print(openmp_wait_policy()['wait_policy'], openmp_wait_policy()['source'], sep='|')"
)


def _load(policy: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "TRUE"
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True)


def test_passive_by_default_and_libgomp_reads_it():
    loaded = _load(None)
    if "OPENMP DISPLAY ENVIRONMENT" not in loaded.stderr:
        pytest.skip("the kernels were built without OpenMP")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in loaded.stderr
    assert loaded.stdout.strip().startswith("passive|edge-sdk's default")


def test_the_users_choice_wins():
    loaded = _load("active")
    if "OPENMP DISPLAY ENVIRONMENT" not in loaded.stderr:
        pytest.skip("the kernels were built without OpenMP")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in loaded.stderr
    assert loaded.stdout.strip() == "active|$OMP_WAIT_POLICY"
