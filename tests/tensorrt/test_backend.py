"""The TensorRT backend object and build_engine where TensorRT, a GPU or the plugin library is missing."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from edge_sdk.backends import tensorrt as backend
from edge_sdk.backends.tensorrt import availability, builder, cache, cuda
from edge_sdk.backends.tensorrt.runtime import _Graph

from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend


def test_registered_under_its_name():
    assert get_backend("tensorrt") is backend.BACKEND
    assert backend.BACKEND.name == "tensorrt"


def test_load_refuses_with_the_probe_reason(monkeypatch):
    monkeypatch.setattr(backend, "probe", lambda: (False, "no CUDA device"))
    with pytest.raises(BackendUnavailable, match="backend 'tensorrt' is not available here: no CUDA device"):
        backend.BACKEND.load(object(), EngineOptions())


def test_build_engine_without_tensorrt(monkeypatch, trt_bundles):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendUnavailable, match="tensorrt Python package is not installed"):
        backend.build_engine(trt_bundles["svd"])


def test_build_engine_without_the_plugin_library(monkeypatch, trt_bundles, tmp_path):
    fake_trt = types.SimpleNamespace(__version__="10.3.0.30")
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)
    monkeypatch.setattr(cuda, "device_description", lambda: ("Orin", "8.7"))
    monkeypatch.setattr(builder, "find_plugin_library", lambda: None)
    with pytest.raises(BackendUnavailable, match=r"libedge_trt_plugins.so was not found .*`pip install -e \."):
        backend.build_engine(trt_bundles["svd"], cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-built was left behind


def test_engine_from_another_tensorrt_is_a_clear_error(tmp_path):
    built = cache.EngineKey("10.3.0", "Orin", "8.7", "cd" * 32)
    cache.write_metadata(tmp_path, built, Path("/bundles/tiny"))
    engine = tmp_path / "decode.engine"
    engine.write_bytes(b"a plan from another TensorRT")
    refusing_runtime = types.SimpleNamespace(deserialize_cuda_engine=lambda data: None)
    now = cache.EngineKey("10.7.0", "Orin", "8.7", "cd" * 32)
    with pytest.raises(cache.EngineCacheError, match=r"built for TensorRT 10\.3\.0,.*edge-sdk build /bundles/tiny"):
        _Graph(refusing_runtime, engine, now, Path("/bundles/tiny"))


def test_backend_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "from edge_sdk.backends.tensorrt import BACKEND, build_engine\n"
        "import edge_sdk.backends.tensorrt.runtime\n"
        "BACKEND.probe()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
