"""Backend probing and selection: order, environment variable, explicit requests, reasons."""

from __future__ import annotations

import pytest

import edge_sdk
from edge_sdk.errors import EdgeSdkError
from edge_sdk.native import load_cpu_kernels
from edge_sdk.runtime import backends
from edge_sdk.runtime.backends import BackendUnavailable, select_backend


def test_auto_selection_explains_each_skipped_backend(monkeypatch):
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    selection = select_backend()
    assert selection.backend.name == "cpu"  # no TensorRT or NPU on the machines that run the tests
    lines = selection.describe()
    assert lines[0].startswith("backend tensorrt: skipped (") and "tensorrt" in lines[0]
    assert lines[1].startswith("backend cann: skipped (") and "torch_npu" in lines[1]
    assert lines[2].startswith("backend cpu: selected (native kernels ")


def test_a_named_unavailable_backend_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    reason = backends.get_backend("tensorrt").probe()[1]
    with pytest.raises(BackendUnavailable) as refused:
        select_backend("tensorrt")
    assert str(refused.value) == f"backend 'tensorrt' (--backend) is not available here: {reason}"
    monkeypatch.setenv(backends.BACKEND_ENV, "cann")
    with pytest.raises(BackendUnavailable, match=r"backend 'cann' \(\$EDGE_SDK_BACKEND\) is not available here"):
        select_backend()


def test_environment_variable_names_the_backend(monkeypatch):
    monkeypatch.setenv(backends.BACKEND_ENV, "cpu")
    selection = select_backend()
    assert selection.backend.name == "cpu" and selection.skipped == []
    assert selection.reason.startswith("requested; native kernels")


def test_the_cpu_reason_names_the_threads_the_run_uses(monkeypatch, bundle_matrix):
    """--threads N runs on N threads, whatever OpenMP's maximum; 0 (the default) on OpenMP's maximum."""
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    maximum = load_cpu_kernels().edge_cpu_max_threads()
    assert f", {maximum} thread" in select_backend("cpu").reason
    assert ", 1 thread;" in select_backend("cpu", threads=1).reason
    assert ", 7 threads;" in select_backend(None, threads=7).reason
    lines = []
    edge_sdk.load(bundle_matrix.path("svd-fp32"), threads=1, log=lines.append)
    assert ", 1 thread;" in lines[-1] and lines[-1].startswith("backend cpu: selected (")


def test_unknown_backend_name(monkeypatch):
    with pytest.raises(EdgeSdkError, match="unknown backend 'gpu'; expected one of auto, tensorrt, cann, cpu"):
        select_backend("gpu")


def test_auto_order_prefers_an_available_earlier_backend(monkeypatch):
    class Ready:
        name = "cann"

        def probe(self):
            return True, "pretend NPU"

    real = backends.get_backend
    monkeypatch.setattr(backends, "get_backend", lambda name: Ready() if name == "cann" else real(name))
    selection = select_backend("auto")
    assert selection.backend.name == "cann" and [name for name, _ in selection.skipped] == ["tensorrt"]


def test_nothing_available_lists_every_reason(monkeypatch):
    class Missing:
        def __init__(self, name):
            self.name = name

        def probe(self):
            return False, f"no {self.name} here"

    monkeypatch.setattr(backends, "get_backend", Missing)
    with pytest.raises(BackendUnavailable, match="tensorrt: no tensorrt here; cann: no cann here; cpu: no cpu here"):
        select_backend()


class NeedsItsOwnFile:
    """Available here, but runs only bundles it prepared (as TensorRT runs only bundles with a cached engine)."""

    name = "tensorrt"

    def probe(self):
        return True, "pretend GPU"

    def probe_bundle(self, bundle):
        return (True, "engine found") if bundle == "prepared" else (False, f"no engine for {bundle}: build it")


def test_a_bundle_the_backend_cannot_run_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    real = backends.get_backend
    monkeypatch.setattr(backends, "get_backend", lambda name: NeedsItsOwnFile() if name == "tensorrt" else real(name))
    selection = select_backend(None, "raw")
    assert selection.backend.name == "cpu"
    assert selection.skipped[0] == ("tensorrt", "no engine for raw: build it")
    with pytest.raises(BackendUnavailable, match=r"'tensorrt' \(--backend\) is not available here: no engine for raw"):
        select_backend("tensorrt", "raw")
    selection = select_backend(None, "prepared")
    assert selection.backend.name == "tensorrt" and selection.reason == "pretend GPU; engine found"
    assert select_backend().backend.name == "tensorrt"  # without a bundle: the probe alone
