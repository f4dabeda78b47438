"""The TensorRT backend object and `edge-sdk build` (build_engine): the engine goes where libedge_sdk says, built with
the plugins libedge_sdk registered, and nothing is written when the build is refused. On the fake TensorRT
(fake_engine.py) where a libedge_sdk with TensorRT is needed."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from edge_sdk.backends import tensorrt as backend
from edge_sdk.backends.c_runtime import tensorrt_engine_info
from edge_sdk.backends.tensorrt import availability, builder

from edge_sdk import outputs
from edge_sdk.bundle import LevelChoice
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend

from .fake_engine import fake_tensorrt_package


def test_registered_under_its_name():
    assert get_backend("tensorrt") is backend.BACKEND
    assert backend.BACKEND.name == "tensorrt"


def test_load_refuses_with_the_probe_reason(monkeypatch):
    monkeypatch.setattr(backend, "probe", lambda: (False, "no CUDA device"))
    with pytest.raises(BackendUnavailable, match="backend 'tensorrt' is not available here: no CUDA device"):
        backend.BACKEND.load(object(), EngineOptions(LevelChoice(None, None, False)))


def test_build_needs_tensorrts_python_package(monkeypatch, trt_bundles):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendUnavailable, match=r"needs the tensorrt Python package.*python3-libnvinfer"):
        backend.build_engine(trt_bundles["svd"])


def test_build_without_tensorrt_in_libedge_sdk_says_so(monkeypatch, trt_bundles, tmp_path):
    """The package's own libedge_sdk, built here without TensorRT."""
    from edge_sdk.backends.c_runtime import probe_backend

    available, reason = probe_backend("tensorrt")
    if available or "libedge_sdk" not in reason:
        pytest.skip(f"this machine's libedge_sdk is not one without TensorRT ({reason})")
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(BackendUnavailable, match=r"this build of libedge_sdk has no TensorRT engine .*JETSON\.md"):
        backend.build_engine(trt_bundles["svd"], cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_backend_modules_import_neither_torch_nor_tensorrt():
    """Running needs libedge_sdk only; TensorRT's Python package is for `edge-sdk build`, imported by it alone."""
    code = (
        "import sys\n"
        "from edge_sdk.backends.tensorrt import BACKEND, build_engine\n"
        "BACKEND.probe()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'tensorrt' not in sys.modules, 'tensorrt was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


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


def test_build_makes_one_engine_from_decode_onnx_with_a_prefill_and_a_decode_profile(fake_trt, trt_bundles, tmp_path):
    bundle = trt_bundles["core"]
    trt = sys.modules["tensorrt"]
    directory = backend.build_engine(bundle, cache_dir=tmp_path / "cache")
    assert directory.parent == tmp_path / "cache"
    assert sorted(path.name for path in directory.iterdir()) == ["engine.json", "model.engine"]
    record = json.loads((directory / "engine.json").read_text())
    assert record == {
        "cache_layout_version": 2,
        "bundle": str(bundle.path),
        "tensorrt_version": "10.3.0",
        "gpu_name": "Fake Orin",
        "compute_capability": "8.7",
        "bundle_sha256": bundle.manifest.raw["manifest_sha256"],
    }
    ((parsed, profiles, targets),) = trt.builds
    assert parsed == str(bundle.graph_path("decode"))
    # the second profile is asked for no weight memory of its own (the first one's target is ignored)
    assert targets == [0.0, 0.0]
    prefill, decode = profiles  # profile 0, then 1
    max_len = bundle.max_seq_len
    assert prefill["input_ids"] == ((1, 1), (1, min(128, max_len)), (1, max_len))
    assert decode["input_ids"] == ((1, 1),) * 3
    assert [bounds[2] for bounds in prefill["past_key_values.0.key"]] == [0, 0, 0]
    assert [bounds[2] for bounds in decode["past_key_values.0.key"]] == [1, max_len // 2, max_len - 1]
    mask = (1, bundle.config.intermediate_size)
    assert prefill["core_mask.0"] == decode["core_mask.0"] == (mask, mask, mask)


def test_the_engine_is_written_from_tensorrts_memory_after_the_parser_is_gone(
    fake_trt, trt_bundles, tmp_path, monkeypatch
):
    # build_serialized_network's IHostMemory is written through the buffer protocol once the parser (and its host copy
    # of the weights) is released: a bytes() copy while the parser lives would hold the weights three times, on a
    # Jetson in the one memory the GPU shares, where BUILD_WEIGHT_COPIES counts two.
    trt = sys.modules["tensorrt"]
    written = {}
    write_bytes = Path.write_bytes

    def recording_write_bytes(path, data):
        written[path.name] = (type(data).__name__, len(trt.live_parsers))
        return write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", recording_write_bytes)
    directory = backend.build_engine(trt_bundles["core"], cache_dir=tmp_path / "cache")
    assert trt.host_copies == 0
    assert written["model.engine"] == ("memoryview", 0)
    assert (directory / "model.engine").stat().st_size > 0


def test_a_cached_engine_is_reused_unless_forced(fake_trt, trt_bundles):
    bundle = trt_bundles["svd"]
    trt = sys.modules["tensorrt"]
    directory = backend.build_engine(bundle)
    stamp = (directory / "model.engine").stat().st_mtime_ns
    assert backend.build_engine(bundle) == directory
    assert len(trt.builds) == 1 and (directory / "model.engine").stat().st_mtime_ns == stamp
    assert backend.build_engine(bundle, force=True) == directory
    assert len(trt.builds) == 2


def test_an_engine_and_its_record_are_published_together_or_not_at_all(fake_trt, trt_bundles, tmp_path, monkeypatch):
    """Interrupted while writing the record, a build leaves neither an engine without its record nor a staging entry
    nor the cache directory it created; a rebuild forced over a cached engine replaces both files at once."""
    bundle, cache = trt_bundles["svd"], tmp_path / "cache"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(builder.json, "dumps", interrupted)
        with pytest.raises(KeyboardInterrupt):
            backend.build_engine(bundle, cache_dir=cache)
    assert not cache.exists()
    directory = backend.build_engine(bundle, cache_dir=cache)
    before = {path.name: path.stat().st_ino for path in directory.iterdir()}
    assert sorted(before) == sorted(outputs.ENGINE_FILES) == ["engine.json", "model.engine"]
    assert backend.build_engine(bundle, cache_dir=cache, force=True) == directory
    after = {path.name: path.stat().st_ino for path in directory.iterdir()}
    assert sorted(after) == sorted(before) and all(after[name] != before[name] for name in before)
    assert sorted(path.name for path in cache.iterdir()) == [directory.name]  # no staging left beside it


def test_a_build_replaces_an_earlier_failed_builds_leftovers_but_never_a_users_file(fake_trt, trt_bundles, tmp_path):
    bundle = trt_bundles["svd"]
    directory = Path(tensorrt_engine_info(bundle, tmp_path)["directory"])
    directory.mkdir()
    (directory / outputs.OLD_ENGINE_STAGING_FILE).write_bytes(b"half an engine")
    assert backend.build_engine(bundle, cache_dir=tmp_path) == directory
    assert sorted(path.name for path in directory.iterdir()) == ["engine.json", "model.engine"]
    (directory / "notes.txt").write_text("the user's\n")
    with pytest.raises(outputs.OutputError) as refused:
        backend.build_engine(bundle, cache_dir=tmp_path, force=True)
    assert str(refused.value) == (
        f"{directory}: holds 'notes.txt', which edge-sdk did not write there (1 such); --force replaces only an "
        "edge-sdk TensorRT engine"
    )
    assert (directory / "notes.txt").read_text() == "the user's\n" and len(sys.modules["tensorrt"].builds) == 1


def test_build_refuses_with_the_figures_when_memory_is_short(fake_trt, trt_bundles, tmp_path, monkeypatch):
    bundle = trt_bundles["svd"]
    estimate = builder.memory_estimate(bundle)
    monkeypatch.setenv("EDGE_FAKE_CUDA_FREE_BYTES", str(estimate.required - 1))
    cache_dir = tmp_path / "cache"
    with pytest.raises(builder.EngineBuildError) as refused:
        backend.build_engine(bundle, cache_dir=cache_dir)
    message = str(refused.value)
    assert f"building the engine needs about {estimate.build >> 20} MiB" in message
    assert f"running it about {estimate.running >> 20} MiB" in message
    assert f"found {(estimate.required - 1) >> 20} MiB free (cudaMemGetInfo)" in message
    assert not cache_dir.exists()  # refused before anything was written
    monkeypatch.setenv("EDGE_FAKE_CUDA_FREE_BYTES", str(estimate.required))
    assert backend.build_engine(bundle, cache_dir=cache_dir).is_dir()


def test_build_refuses_when_tensorrts_python_package_runs_another_libnvinfer(fake_trt, trt_bundles, monkeypatch,
                                                                            tmp_path):  # fmt: skip
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt_package(fake_trt, plugins_visible=False))
    with pytest.raises(builder.EngineBuildError) as refused:
        backend.build_engine(trt_bundles["svd"], cache_dir=tmp_path / "cache")
    message = str(refused.value)
    assert "the tensorrt Python package (TensorRT 10.3.0.30) does not see the plugins (SvdPredictor" in message
    assert "with its own libnvinfer (TensorRT 10.3.0 on Fake Orin (compute capability 8.7), plugins" in message
    assert not (tmp_path / "cache").exists()


def test_build_refuses_a_bundle_too_short_for_a_decode_step(fake_trt, trt_bundles, tmp_path):
    """The decode profile starts after one prompt token: max_seq_len 1 leaves it empty."""
    bundle = trt_bundles["svd"]
    short = types.SimpleNamespace(
        path=bundle.path, config=bundle.config, sparsity=bundle.sparsity, manifest=bundle.manifest, max_seq_len=1
    )
    with pytest.raises(builder.EngineBuildError, match=r"no TensorRT engine .*max_seq_len: expected >= 2.*found 1"):
        backend.build_engine(short, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name", ["svd-int8", "svd-int4", "svd-int4-asym"])
def test_build_takes_quantized_bundles_to_tensorrt(fake_trt, bundle_matrix, tmp_path, name):
    """int8 / int4 graphs, asymmetric int4 included, keep every rule of the static check since their products with
    quantized matrices go to the quantized plugins (tests/tensorrt/test_compatibility.py): the build hands their
    decode.onnx to TensorRT's parser like any other and caches the engine."""
    bundle = bundle_matrix[name]
    trt = sys.modules["tensorrt"]
    directory = backend.build_engine(bundle, cache_dir=tmp_path / "cache")
    ((parsed, _, _),) = trt.builds
    assert parsed == str(bundle.graph_path("decode"))
    assert sorted(path.name for path in directory.iterdir()) == ["engine.json", "model.engine"]


def test_doctor_says_whether_the_bundles_engine_is_cached(fake_trt, fake_trt_build, trt_bundles):
    from click.testing import CliRunner

    from edge_sdk.cli import main

    bundle = trt_bundles["svd"]

    def tensorrt_line() -> str:
        result = CliRunner().invoke(main, ["doctor", str(bundle.path)])
        assert result.exit_code == 0, result.output
        return next(line.strip() for line in result.output.splitlines() if line.strip().startswith("tensorrt "))

    info = tensorrt_engine_info(bundle)
    assert tensorrt_line() == f"tensorrt  not available: {info['reason']}"
    assert info["reason"].startswith(
        f"no TensorRT engine cached for this bundle on this device: run `edge-sdk build {bundle.path}` first"
    )
    directory = backend.build_engine(bundle)
    assert tensorrt_line() == (
        "tensorrt  available: TensorRT 10.3.0 on Fake Orin (compute capability 8.7), plugins "
        f"{fake_trt_build.plugins}; engine {directory}/model.engine"
    )
