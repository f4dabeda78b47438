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


def _fake_tensorrt_with_plugins(monkeypatch, tmp_path):
    fake_trt = types.SimpleNamespace(__version__="10.3.0.30")
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)
    monkeypatch.setattr(cuda, "device_description", lambda: ("Orin", "8.7"))
    monkeypatch.setattr(builder, "load_plugin_library", lambda trt: tmp_path / "libedge_trt_plugins.so")


def test_build_refuses_with_the_figures_when_memory_is_short(monkeypatch, trt_bundles, tmp_path):
    """Jetson without cuda-python: /proc/meminfo's MemAvailable is compared with twice weights.safetensors."""
    bundle = trt_bundles["svd"]
    weights = (bundle.path / "weights.safetensors").stat().st_size
    _fake_tensorrt_with_plugins(monkeypatch, tmp_path)
    monkeypatch.setattr(cuda, "runtime_module", lambda: None)
    meminfo = tmp_path / "meminfo"
    available_kib = (2 * weights - 1) // 1024  # one KiB short of the two engines' weights
    meminfo.write_text(f"MemTotal:       8000000 kB\nMemAvailable:   {available_kib} kB\n")
    monkeypatch.setattr(builder, "MEMINFO", meminfo)
    cache_dir = tmp_path / "cache"
    with pytest.raises(builder.EngineBuildError) as refused:
        backend.build_engine(bundle, cache_dir=cache_dir)
    message = str(refused.value)
    assert f"need about {(2 * weights) >> 20} MiB" in message and f"found {(available_kib * 1024) >> 20} MiB" in message
    assert str(meminfo) in message and "MemAvailable" in message
    assert not cache_dir.exists()  # refused before anything was written
    assert builder.free_device_memory(meminfo) == (available_kib * 1024, f"{meminfo} MemAvailable")
    meminfo.write_text(f"MemAvailable:   {2 * weights // 1024 + 1} kB\n")
    builder.check_device_memory(bundle, meminfo)  # enough: no error


def test_free_memory_prefers_cuda_python_and_names_a_broken_meminfo(monkeypatch, tmp_path):
    fake_runtime = types.SimpleNamespace()
    monkeypatch.setattr(cuda, "runtime_module", lambda: fake_runtime)
    monkeypatch.setattr(cuda, "call", lambda name, *args: (123 << 20, 999 << 20) if name == "cudaMemGetInfo" else None)
    assert builder.free_device_memory(tmp_path / "absent") == (123 << 20, "cudaMemGetInfo")
    monkeypatch.setattr(cuda, "runtime_module", lambda: None)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\n")
    with pytest.raises(builder.EngineBuildError, match="expected a field MemAvailable, found none"):
        builder.free_device_memory(meminfo)
    meminfo.write_text("MemAvailable: lots\n")
    with pytest.raises(builder.EngineBuildError, match=r"MemAvailable: expected '<n> kB', found 'lots'"):
        builder.free_device_memory(meminfo)
