"""The TensorRT backend object and build_engine where TensorRT, a GPU or the plugin library is missing."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from edge_sdk.backends import tensorrt as backend
from edge_sdk.backends.tensorrt import availability, builder, cache, cuda
from edge_sdk.backends.tensorrt.runtime import deserialize

from edge_sdk.bundle import LevelChoice
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend


def test_registered_under_its_name():
    assert get_backend("tensorrt") is backend.BACKEND
    assert backend.BACKEND.name == "tensorrt"


def test_load_refuses_with_the_probe_reason(monkeypatch):
    monkeypatch.setattr(backend, "probe", lambda: (False, "no CUDA device"))
    with pytest.raises(BackendUnavailable, match="backend 'tensorrt' is not available here: no CUDA device"):
        backend.BACKEND.load(object(), EngineOptions(LevelChoice(None, None, False)))


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
    engine = tmp_path / cache.ENGINE_FILE
    engine.write_bytes(b"a plan from another TensorRT")
    refusing_runtime = types.SimpleNamespace(deserialize_cuda_engine=lambda plan: None)
    now = cache.EngineKey("10.7.0", "Orin", "8.7", "cd" * 32)
    with pytest.raises(cache.EngineCacheError, match=r"built for TensorRT 10\.3\.0,.*edge-sdk build /bundles/tiny"):
        deserialize(refusing_runtime, engine, now, Path("/bundles/tiny"))


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


def test_memory_estimate_of_the_one_engine(trt_bundles):
    """Running holds the weights once and the KV cache; the build holds the parser's copy and the engine's."""
    bundle = trt_bundles["svd"]
    weights = (bundle.path / "weights.safetensors").stat().st_size
    config = bundle.config
    # two sets of key and value buffers per layer, [1, kv_heads, max_seq_len, head_dim] float32
    kv_cache = 2 * 2 * config.num_layers * config.num_kv_heads * bundle.max_seq_len * config.head_dim * 4
    estimate = builder.memory_estimate(bundle)
    assert (estimate.weights, estimate.kv_cache) == (weights, kv_cache)
    assert (estimate.running, estimate.build) == (weights + kv_cache, 2 * weights)
    assert estimate.required == max(weights + kv_cache, 2 * weights)


def test_build_refuses_with_the_figures_when_memory_is_short(monkeypatch, trt_bundles, tmp_path):
    """Jetson without cuda-python: /proc/meminfo's MemAvailable is compared with the build's and the run's needs."""
    bundle = trt_bundles["svd"]
    estimate = builder.memory_estimate(bundle)
    _fake_tensorrt_with_plugins(monkeypatch, tmp_path)
    monkeypatch.setattr(cuda, "runtime_module", lambda: None)
    meminfo = tmp_path / "meminfo"
    available_kib = (estimate.required - 1) // 1024  # one KiB short
    meminfo.write_text(f"MemTotal:       8000000 kB\nMemAvailable:   {available_kib} kB\n")
    monkeypatch.setattr(builder, "MEMINFO", meminfo)
    cache_dir = tmp_path / "cache"
    with pytest.raises(builder.EngineBuildError) as refused:
        backend.build_engine(bundle, cache_dir=cache_dir)
    message = str(refused.value)
    assert f"building the engine needs about {estimate.build >> 20} MiB" in message
    assert f"running it about {estimate.running >> 20} MiB" in message
    assert f"found {(available_kib * 1024) >> 20} MiB" in message
    assert str(meminfo) in message and "MemAvailable" in message
    assert not cache_dir.exists()  # refused before anything was written
    assert builder.free_device_memory(meminfo) == (available_kib * 1024, f"{meminfo} MemAvailable")
    meminfo.write_text(f"MemAvailable:   {estimate.required // 1024 + 1} kB\n")
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


class _RecordingBuilder:
    """TensorRT's builder API as build_engine uses it, recording the parsed graph and the profiles."""

    parsed: ClassVar[list[str]] = []
    profiles: ClassVar[list] = []

    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return types.SimpleNamespace()

    def create_builder_config(self):
        added = _RecordingBuilder.profiles
        return types.SimpleNamespace(clear_flag=lambda flag: None, add_optimization_profile=added.append)

    def create_optimization_profile(self):
        shapes: dict = {}
        set_shape = lambda name, *bounds: shapes.__setitem__(name, bounds)  # noqa: E731
        return types.SimpleNamespace(shapes=shapes, set_shape=set_shape, extra_memory_target=1.0)  # TensorRT's default

    def build_serialized_network(self, network, config):
        return b"plan"


def test_build_makes_one_engine_from_decode_onnx_with_a_prefill_and_a_decode_profile(
    monkeypatch, trt_bundles, tmp_path
):
    bundle = trt_bundles["core"]
    _fake_tensorrt_with_plugins(monkeypatch, tmp_path)
    _RecordingBuilder.parsed, _RecordingBuilder.profiles = [], []

    def parser(network, logger):
        return types.SimpleNamespace(parse=lambda model, path: _RecordingBuilder.parsed.append(path) or True)

    trt = sys.modules["tensorrt"]
    trt.Builder, trt.OnnxParser, trt.Logger = _RecordingBuilder, parser, lambda severity: None
    trt.Logger.WARNING = 2
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)
    trt.BuilderFlag = types.SimpleNamespace(TF32=7)
    monkeypatch.setattr(builder, "free_device_memory", lambda meminfo=None: (1 << 40, "test"))
    directory = backend.build_engine(bundle, cache_dir=tmp_path / "cache")
    assert sorted(path.name for path in directory.iterdir()) == ["engine.json", "model.engine"]
    assert (directory / "model.engine").read_bytes() == b"plan"
    assert _RecordingBuilder.parsed == [str(bundle.graph_path("decode"))]
    # the second profile is asked for no weight memory of its own (the first one's target is ignored)
    assert [profile.extra_memory_target for profile in _RecordingBuilder.profiles] == [0.0, 0.0]
    prefill, decode = (profile.shapes for profile in _RecordingBuilder.profiles)  # profile 0, then 1
    max_len = bundle.max_seq_len
    assert prefill["input_ids"] == ((1, 1), (1, min(128, max_len)), (1, max_len))
    assert decode["input_ids"] == ((1, 1),) * 3
    assert [bounds[2] for bounds in prefill["past_key_values.0.key"]] == [0, 0, 0]
    assert [bounds[2] for bounds in decode["past_key_values.0.key"]] == [1, max_len // 2, max_len - 1]
    mask = (1, bundle.config.intermediate_size)
    assert prefill["core_mask.0"] == decode["core_mask.0"] == (mask, mask, mask)


def test_build_refuses_a_bundle_too_short_for_a_decode_step(monkeypatch, trt_bundles, tmp_path):
    """The decode profile starts after one prompt token: max_seq_len 1 leaves it empty."""
    bundle = trt_bundles["svd"]
    _fake_tensorrt_with_plugins(monkeypatch, tmp_path)
    short = types.SimpleNamespace(
        path=bundle.path, config=bundle.config, sparsity=bundle.sparsity, manifest=bundle.manifest, max_seq_len=1
    )
    with pytest.raises(builder.EngineBuildError, match=r"no TensorRT engine .*max_seq_len: expected >= 2.*found 1"):
        backend.build_engine(short, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_build_refuses_quantized_bundles_with_the_reason(monkeypatch, trt_bundles, tmp_path, dtype):
    """int8 / int4 graphs are not TensorRT-ready (tests/tensorrt/test_compatibility.py lists the gaps): the build says
    so before TensorRT's parser would, and writes nothing."""
    bundle = trt_bundles["svd"]
    _fake_tensorrt_with_plugins(monkeypatch, tmp_path)
    manifest = types.SimpleNamespace(dtype=dtype, raw=bundle.manifest.raw)
    quantized = types.SimpleNamespace(
        path=bundle.path, config=bundle.config, sparsity=bundle.sparsity, manifest=manifest, max_seq_len=64
    )
    with pytest.raises(builder.EngineBuildError, match=rf"no TensorRT engine for {dtype} weights yet: .*--dtype fp16"):
        backend.build_engine(quantized, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
