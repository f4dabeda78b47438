"""CPU backend: the C runtime's decoder (libedge_sdk through ../c_runtime.py) when the package build made it, else the
torch engine (torch_engine.py) with the decode step's matrices in the native C kernels.

$EDGE_SDK_CPU_ENGINE picks one: "runtime", "torch", or "auto" (the default: the runtime when it is built and
runs the bundle -- fp32 and fp16 weights -- else torch, with the reason in the probe message). The torch engine
needs torch (the `export` extra); this module does not import it.
"""

from __future__ import annotations

import os

from edge_sdk.bundle import Bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.native import ACTIVATIONS_ENV, RUNTIME_ENV, NativeLibraryError, load_cpu_kernels
from edge_sdk.runtime.backends import MAX_THREADS, BackendUnavailable, EngineOptions
from edge_sdk.runtime.extras import import_from_extra

from ..c_runtime import RuntimeEngine, RuntimeUnsupported, runtime_version

ENGINE_ENV = "EDGE_SDK_CPU_ENGINE"
ENGINE_CHOICES = ("auto", "runtime", "torch")


def _engine_choice() -> str:
    choice = os.environ.get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if choice not in ENGINE_CHOICES:
        raise EdgeSdkError(f"${ENGINE_ENV}={choice!r}: expected one of {', '.join(ENGINE_CHOICES)}")
    return choice


def _runtime_available() -> tuple[bool, str]:
    try:
        return True, f"C runtime libedge_sdk {runtime_version()}"
    except (NativeLibraryError, OSError) as error:
        return False, str(error)


OPENMP_THREADS_ENV = "OMP_NUM_THREADS"


class CpuBackend:
    name = "cpu"
    runs_on_cpu_threads = True  # select_backend passes probe the threads a run asks for

    def probe(self, threads: int = 0) -> tuple[bool, str]:
        """(available, reason); the reason names the threads a run asking for `threads` uses (0: OpenMP's maximum,
        as the engines take it)."""
        try:
            library = load_cpu_kernels()
        except (NativeLibraryError, OSError) as error:
            return False, str(error)
        activations = os.environ.get(ACTIVATIONS_ENV)
        if activations is not None and activations != "fp32":  # the kernels read it: anything else quantizes x
            return False, (
                f"${ACTIVATIONS_ENV}={activations!r}: expected fp32 (quantized rows dotted with x in fp32), or unset "
                f"(x quantized to int8 for integer dot products, the default)"
            )
        max_threads = library.edge_cpu_max_threads()
        if not 1 <= max_threads <= MAX_THREADS:  # OpenMP's maximum, from $OMP_NUM_THREADS (libgomp wraps huge values)
            return False, (
                f"OpenMP allows {max_threads} threads (${OPENMP_THREADS_ENV}={os.environ.get(OPENMP_THREADS_ENV)!r}); "
                f"expected 1 to {MAX_THREADS}: set {OPENMP_THREADS_ENV} to at most the cores to use, or unset it"
            )
        version, isa = library.edge_cpu_version().decode(), library.edge_cpu_isa().decode()
        used = threads if threads > 0 else max_threads
        kernels_text = f"native kernels {version} ({isa}), {used} thread{'' if used == 1 else 's'}"
        choice = _engine_choice()
        runtime, runtime_text = _runtime_available()
        if choice == "torch":
            return True, f"{kernels_text}; decode in torch + kernels (${ENGINE_ENV}=torch)"
        if runtime:
            return True, f"{kernels_text}; decode in the {runtime_text}"
        if choice == "runtime":
            return False, f"${ENGINE_ENV}=runtime, but {runtime_text}"
        if os.environ.get(RUNTIME_ENV):  # a library named on purpose that does not load is not silently replaced
            return False, f"${RUNTIME_ENV} names the C runtime to use, but {runtime_text}"
        return True, f"{kernels_text}; decode in torch + kernels ({runtime_text})"

    def load(self, bundle: Bundle, options: EngineOptions):
        available, reason = self.probe()
        if not available:
            raise BackendUnavailable(f"backend 'cpu' is not available here: {reason}")
        choice = _engine_choice()
        purpose = "the CPU backend's torch engine"
        if choice != "torch" and _runtime_available()[0]:
            try:
                return RuntimeEngine(bundle, options)
            except RuntimeUnsupported as error:
                if choice == "runtime":
                    raise BackendUnavailable(f"backend 'cpu' (${ENGINE_ENV}=runtime): {error}") from error
                purpose = f"running this bundle on the CPU without the C runtime ({error})"
        torch_engine = import_from_extra("export", "edge_sdk.backends.cpu.torch_engine", purpose)
        return torch_engine.load_torch_cpu_engine(bundle, options)


BACKEND = CpuBackend()
