"""Locates and loads the native libraries that the package build compiled (CMakeLists.txt)."""

from __future__ import annotations

import ctypes
import functools
import importlib.resources
import os
from pathlib import Path

from edge_sdk.errors import EdgeSdkError

CPU_KERNELS_LIBRARY = "libedge_cpu_kernels.so"
CPU_KERNELS_ENV = "EDGE_SDK_CPU_KERNELS"
# How the quantized kernels dot rows with x (kernels/cpu/QUANT.md; the kernels read it): unset, x is quantized per
# token to two int8 planes for integer dot products; "fp32" keeps x in fp32.
ACTIVATIONS_ENV = "EDGE_SDK_QUANT_ACTIVATIONS"


class NativeLibraryError(EdgeSdkError):
    """A native library was not built or does not load."""


OPENMP_WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
OPENMP_SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
OPENMP_DEFAULT_SPIN_COUNT = "3000"


@functools.cache
def openmp_waiting() -> dict[str, str]:
    """Bound how long OpenMP threads spin at a barrier, unless the user chose, before libgomp loads with our first
    library.

    Why: libgomp's default spins up to 300,000 times at every barrier, and a decode step crosses hundreds of them;
    when other processes hold the cores, the spinning threads starve the one doing the work and 2-thread decode of
    SmolLM2 fell from 9 to 0.7 tokens/s. A passive wait fixes that but cost 43% on an idle machine (40 against 70
    tokens/s); 3,000 spins kept the idle speed (69) and the busy one (8.3) (benchmarks/README.md, section 5).
    libgomp reads the variables once, when it is loaded, so they are set here and not later; a libgomp that another
    library loaded earlier keeps what the environment said then.
    """
    already_loaded = _libgomp_loaded()
    chosen = {name: os.environ.get(name) for name in (OPENMP_WAIT_POLICY_ENV, OPENMP_SPIN_COUNT_ENV)}
    users_choice = any(value is not None for value in chosen.values())
    if not users_choice and not already_loaded:
        os.environ[OPENMP_SPIN_COUNT_ENV] = OPENMP_DEFAULT_SPIN_COUNT
    if already_loaded:
        source = "libgomp was loaded before edge-sdk's libraries: its setting then"
    elif users_choice:
        source = " and ".join(f"${name}" for name, value in chosen.items() if value is not None)
    else:
        source = f"edge-sdk's default (set {OPENMP_SPIN_COUNT_ENV} or {OPENMP_WAIT_POLICY_ENV} to override)"
    return {
        "wait_policy": os.environ.get(OPENMP_WAIT_POLICY_ENV, "libgomp's default"),
        "spin_count": os.environ.get(OPENMP_SPIN_COUNT_ENV, "libgomp's default"),
        "source": source,
    }


def _libgomp_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return any("/libgomp.so" in line for line in maps)
    except OSError:  # not Linux: nothing to learn from, and no libgomp either
        return False


def _candidate_paths(library: str, env_var: str) -> list[Path]:
    candidates = []
    if os.environ.get(env_var):
        candidates.append(Path(os.environ[env_var]))
    # A regular install puts the library in edge_sdk/_native; an editable install keeps the package
    # sources in place and the built files in site-packages, which importlib.resources resolves.
    candidates.append(Path(__file__).parent / "_native" / library)
    native_dir = importlib.resources.files("edge_sdk").joinpath("_native")
    if isinstance(native_dir, Path):
        candidates.append(native_dir / library)
    return candidates


def find_library(library: str = CPU_KERNELS_LIBRARY, env_var: str = CPU_KERNELS_ENV) -> Path | None:
    """Path of a built native library, or None when the package build did not produce it. A path env_var names
    must be a file: NativeLibraryError otherwise (an override that silently fell back to the packaged library, or
    to a slower engine, would measure or run something else than asked)."""
    override = os.environ.get(env_var)
    if override and not Path(override).is_file():
        found = "is a directory" if Path(override).is_dir() else "does not exist"
        raise NativeLibraryError(f"${env_var}={override}: {found}; expected the path of {library}, or unset it")
    return next((path for path in _candidate_paths(library, env_var) if path.is_file()), None)


@functools.cache
def load_cpu_kernels() -> ctypes.CDLL:
    """The CPU kernel library, loaded once per process."""
    path = find_library()
    if path is None:
        searched = ", ".join(str(p) for p in _candidate_paths(CPU_KERNELS_LIBRARY, CPU_KERNELS_ENV))
        raise NativeLibraryError(
            f"the CPU kernel library {CPU_KERNELS_LIBRARY} was not found (searched: {searched}); "
            f"reinstall edge-sdk with `pip install .` so the package build compiles it, or set {CPU_KERNELS_ENV}"
        )
    openmp_waiting()
    library = ctypes.CDLL(str(path))
    library.edge_cpu_version.restype = ctypes.c_char_p
    library.edge_cpu_version.argtypes = []
    library.edge_cpu_max_threads.restype = ctypes.c_int
    library.edge_cpu_max_threads.argtypes = []
    for name in ("edge_cpu_isa", "edge_cpu_isas", "edge_cpu_isa_error"):
        getattr(library, name).restype = ctypes.c_char_p
        getattr(library, name).argtypes = []
    problem = library.edge_cpu_isa_error()
    if problem is not None:  # the kernels would run another instruction set than the one asked for
        raise NativeLibraryError(problem.decode())
    return library


RUNTIME_LIBRARY = "libedge_sdk.so"
RUNTIME_ENV = "EDGE_SDK_RUNTIME_LIBRARY"


@functools.cache
def load_runtime() -> ctypes.CDLL:
    """The C runtime libedge_sdk (jetson/), loaded once per process; its prototypes are set by the caller."""
    path = find_library(RUNTIME_LIBRARY, RUNTIME_ENV)
    if path is None:
        searched = ", ".join(str(p) for p in _candidate_paths(RUNTIME_LIBRARY, RUNTIME_ENV))
        raise NativeLibraryError(
            f"the C runtime library {RUNTIME_LIBRARY} was not found (searched: {searched}); the package build "
            f"makes it when cJSON is installed (Debian/Ubuntu: libcjson-dev): reinstall edge-sdk, or set {RUNTIME_ENV}"
        )
    openmp_waiting()
    return ctypes.CDLL(str(path))
