"""Backend registry, probing and selection (DESIGN.md 3.5).

Each backend is a module edge_sdk.backends.<name> exposing BACKEND, an object with a `name`,
`probe() -> (available, reason)` and `load(bundle, options) -> Engine`; one that can run some bundles and not others
here also has `probe_bundle(bundle) -> (available, reason)` (TensorRT: is the bundle's engine cached), and one that
runs on CPU threads sets `runs_on_cpu_threads` and takes `probe(threads)`, naming the threads a run uses. Auto selection
tries them in BACKEND_ORDER and reports why each earlier one was skipped; a backend the user named that is not
available is an error, never a silent fallback.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from edge_sdk.errors import EdgeSdkError
from edge_sdk.runtime.engine import Engine

if TYPE_CHECKING:
    from edge_sdk.bundle import Bundle, LevelChoice

BACKEND_ORDER = ("tensorrt", "cann", "cpu")
BACKEND_ENV = "EDGE_SDK_BACKEND"


class BackendUnavailable(EdgeSdkError):
    """The requested backend cannot run on this machine."""


MAX_THREADS = 4096  # the C runtime's bound too


@dataclass(frozen=True)
class EngineOptions:
    """How an engine runs a bundle: its operating point and the CPU threads.

    The operating point is resolved against the bundle once, where the options are made (EngineOptions.of, the one
    place a requested level becomes a row of the bundle's level tensors); engines read level.index and level.dense,
    and a runtime with its own level API (the C runtime) is handed the resolved level, never the request."""

    level: LevelChoice  # SparsityConfig.resolve's operating point
    threads: int = 0  # 0: every core

    def __post_init__(self) -> None:
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or not 0 <= self.threads <= MAX_THREADS:
            raise EdgeSdkError(f"threads: expected 0 (every core) to {MAX_THREADS}, found {self.threads!r}")

    @classmethod
    def of(cls, bundle: Bundle, sparsity: float | None = None, dense: bool = False, threads: int = 0) -> EngineOptions:
        """sparsity: a calibrated level, None for the bundle's default; dense: the dense model, every FFN neuron
        computed, zeros included (the speedups' baseline). BundleError names the calibrated levels when sparsity is
        not one of them."""
        if sparsity is not None and (
            isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0 <= sparsity <= 1
        ):
            raise EdgeSdkError(f"sparsity: expected a calibrated level in [0, 1] or None, found {sparsity!r}")
        if dense and sparsity is not None:
            raise EdgeSdkError(f"dense and sparsity {sparsity}: the dense model has no sparsity level; give either")
        return cls(bundle.sparsity.resolve(sparsity, dense), threads)

    @property
    def sparsity(self) -> float | None:
        """The resolved level: a calibrated level, or None (no levels, or a bundle whose default is dense)."""
        return self.level.level

    @property
    def dense(self) -> bool:
        return self.level.dense


class Backend(Protocol):
    name: str

    def probe(self) -> tuple[bool, str]: ...

    def load(self, bundle, options: EngineOptions) -> Engine: ...


def unknown_backend(name: object) -> EdgeSdkError:
    """The error for a backend name that is not auto nor one of BACKEND_ORDER."""
    return EdgeSdkError(f"unknown backend {name!r}; expected one of auto, {', '.join(BACKEND_ORDER)}")


def get_backend(name: str) -> Backend:
    if name not in BACKEND_ORDER:
        raise unknown_backend(name)
    return importlib.import_module(f"edge_sdk.backends.{name}").BACKEND


@dataclass
class Selection:
    backend: Backend
    reason: str
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> list[str]:
        """The lines the runtime prints: each skipped backend with its reason, then the choice."""
        lines = [f"backend {name}: skipped ({reason})" for name, reason in self.skipped]
        lines.append(f"backend {self.backend.name}: selected ({self.reason})")
        return lines


def _usable(backend: Backend, bundle, threads: int = 0) -> tuple[bool, str]:
    """probe() (a backend on CPU threads: probe(threads), whose reason names the threads the run will use), then,
    given a bundle, the backend's probe_bundle when it has one."""
    available, reason = backend.probe(threads) if getattr(backend, "runs_on_cpu_threads", False) else backend.probe()
    probe_bundle = getattr(backend, "probe_bundle", None)
    if not available or bundle is None or probe_bundle is None:
        return available, reason
    ready, detail = probe_bundle(bundle)
    return (True, f"{reason}; {detail}") if ready else (False, detail)


def select_backend(requested: str | None = None, bundle=None, threads: int = 0) -> Selection:
    """`requested` (or $EDGE_SDK_BACKEND) names a backend, or is "auto"/None for the first available; with the opened
    bundle given, for the first that can run it. threads: what the run will ask for (EngineOptions.threads), so that
    a CPU backend's reason names the threads it uses."""
    choice = requested or os.environ.get(BACKEND_ENV) or "auto"
    if choice != "auto":
        backend = get_backend(choice)
        available, reason = _usable(backend, bundle, threads)
        if not available:
            source = "--backend" if requested else f"${BACKEND_ENV}"
            raise BackendUnavailable(f"backend '{choice}' ({source}) is not available here: {reason}")
        return Selection(backend, f"requested; {reason}")
    skipped = []
    for name in BACKEND_ORDER:
        backend = get_backend(name)
        available, reason = _usable(backend, bundle, threads)
        if available:
            return Selection(backend, reason, skipped)
        skipped.append((name, reason))
    details = "; ".join(f"{name}: {reason}" for name, reason in skipped)
    raise BackendUnavailable(f"no backend is available: {details}")


def probe_all(bundle=None) -> dict[str, tuple[bool, str]]:
    """Each backend's (available, reason); with an opened bundle, whether it can run that one."""
    return {name: _usable(get_backend(name), bundle) for name in BACKEND_ORDER}
