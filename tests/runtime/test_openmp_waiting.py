"""OpenMP's barrier wait: 3,000 spins unless the user chose a spin count or a wait policy, and libgomp really runs
with it.

libgomp prints its settings at load time under OMP_DISPLAY_ENV=VERBOSE, which shows what it read, not what the
environment says afterwards: setting the variable after the library loaded would pass an os.environ check and
fail this one.
"""

import os
import subprocess
import sys

import pytest

from edge_sdk.native import OPENMP_DEFAULT_SPIN_COUNT, find_library

pytestmark = pytest.mark.skipif(find_library() is None, reason="the CPU kernel library was not built")

LOAD = (
    "from edge_sdk.native import load_cpu_kernels, openmp_waiting; load_cpu_kernels(); "
    "print(openmp_waiting()['spin_count'], openmp_waiting()['source'], sep='|')"
)


def _load(**settings: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", **settings}
    loaded = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True)
    if "OPENMP DISPLAY ENVIRONMENT" not in loaded.stderr:
        pytest.skip("the kernels were built without OpenMP")
    return loaded


def test_a_bounded_spin_by_default_and_libgomp_reads_it():
    loaded = _load()
    assert f"GOMP_SPINCOUNT = '{OPENMP_DEFAULT_SPIN_COUNT}'" in loaded.stderr
    assert loaded.stdout.strip().startswith(f"{OPENMP_DEFAULT_SPIN_COUNT}|edge-sdk's default")


def test_the_users_spin_count_wins():
    loaded = _load(GOMP_SPINCOUNT="50000")
    assert "GOMP_SPINCOUNT = '50000'" in loaded.stderr
    assert loaded.stdout.strip() == "50000|$GOMP_SPINCOUNT"


def test_a_users_wait_policy_is_left_alone():
    """OMP_WAIT_POLICY=active means spin without bound: edge-sdk must not add a spin count that changes it."""
    loaded = _load(OMP_WAIT_POLICY="active")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in loaded.stderr
    assert loaded.stdout.strip() == "libgomp's default|$OMP_WAIT_POLICY"
