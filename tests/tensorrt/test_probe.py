"""The TensorRT backend's probe: the first missing piece is the reason, and it never raises."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from edge_sdk.backends.tensorrt import availability, cuda

REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture
def everything_present(monkeypatch):
    """tensorrt 10.3, cuda-python, a GPU and the plugin library, all faked."""
    monkeypatch.setattr(
        availability.importlib.util, "find_spec", lambda name: object() if name == "tensorrt" else REAL_FIND_SPEC(name)
    )
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.3.0.30"))
    monkeypatch.setattr(cuda, "runtime_module", lambda: types.ModuleType("cudart"))
    monkeypatch.setattr(cuda, "device_description", lambda: ("Orin", "8.7"))
    monkeypatch.setattr(availability, "find_plugin_library", lambda: Path("/opt/edge/libedge_trt_plugins.so"))
    return monkeypatch


def test_available_when_everything_is_there(everything_present):
    available, reason = availability.probe()
    assert available
    assert reason == "TensorRT 10.3.0.30 on Orin (compute capability 8.7), plugins /opt/edge/libedge_trt_plugins.so"


def test_missing_tensorrt(everything_present):
    everything_present.setattr(availability.importlib.util, "find_spec", lambda name: None)
    assert availability.probe() == (False, availability.NO_TENSORRT)


def test_missing_cuda_python(everything_present):
    everything_present.setattr(cuda, "runtime_module", lambda: None)
    assert availability.probe() == (False, availability.NO_CUDA_PYTHON)


def test_missing_plugin_library_says_how_to_build_it(everything_present):
    everything_present.setattr(availability, "find_plugin_library", lambda: None)
    available, reason = availability.probe()
    assert not available
    assert "libedge_trt_plugins.so was not found" in reason
    assert "pip install -e ." in reason and "EDGE_SDK_TRT_PLUGINS" in reason and "JETSON.md" in reason


def test_no_cuda_device(everything_present):
    def no_device():
        raise cuda.CudaError("cudaGetDeviceCount failed: no CUDA-capable device is detected")

    everything_present.setattr(cuda, "device_description", no_device)
    assert availability.probe() == (False, "CudaError: cudaGetDeviceCount failed: no CUDA-capable device is detected")


def test_tensorrt_8_6_is_too_old(everything_present):
    everything_present.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.6.2.3"))
    available, reason = availability.probe()
    assert not available
    assert reason.startswith("TensorRT 8.6.2.3 is too old") and "10.3 or later" in reason and "IPluginV3" in reason


def test_probe_never_raises(everything_present):
    def broken():
        raise RuntimeError("driver exploded")

    everything_present.setattr(availability, "find_plugin_library", broken)
    assert availability.probe() == (False, "RuntimeError: driver exploded")


def test_probe_does_not_import_tensorrt_before_the_cheap_checks_pass(everything_present):
    everything_present.delitem(sys.modules, "tensorrt")
    everything_present.setattr(availability, "find_plugin_library", lambda: None)
    availability.probe()
    assert "tensorrt" not in sys.modules


@pytest.mark.parametrize(
    "version, expected", [("10.3.0.30", (10, 3, 0, 30)), ("10.15.1", (10, 15, 1)), ("10.7.0.post1", (10, 7, 0))]
)
def test_version_tuple(version, expected):
    assert availability.version_tuple(version) == expected
    assert availability.too_old(version) is None
