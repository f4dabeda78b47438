"""Where libedge_sdk keeps a bundle's engine (edge_tensorrt_engine_info, the one place the key is computed): the
directory is named by the key's digest, under the cache the environment chooses; an engine counts as cached only with
its engine.json recording exactly this key. On the fake TensorRT (fake_engine.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from edge_sdk.backends.c_runtime import tensorrt_engine_info


def documented_digest(tensorrt_version: str, gpu_name: str, capability: str, bundle_sha256: str) -> str:
    """The rule of cache layout 2 (jetson/README.md), which engines cached before the key moved to C followed."""
    fields = {
        "tensorrt_version": tensorrt_version,
        "gpu_name": gpu_name,
        "compute_capability": capability,
        "bundle_sha256": bundle_sha256,
        "cache_layout_version": 2,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


@pytest.mark.parametrize("gpu_name", ["Fake Orin", 'Orin "NX" \\ ü €'])
def test_directory_is_the_digest_of_the_key(fake_trt, trt_bundles, monkeypatch, tmp_path, gpu_name):
    monkeypatch.setenv("EDGE_FAKE_CUDA_DEVICE_NAME", gpu_name)
    bundle = trt_bundles["svd"]
    sha = bundle.manifest.raw["manifest_sha256"]
    info = tensorrt_engine_info(bundle, tmp_path)
    assert info["directory"] == str(tmp_path / documented_digest("10.3.0", gpu_name, "8.7", sha))
    assert info["engine_file"] == info["directory"] + "/model.engine"
    assert info["metadata_file"] == info["directory"] + "/engine.json"
    assert (info["tensorrt_version"], info["gpu_name"], info["compute_capability"]) == ("10.3.0", gpu_name, "8.7")
    assert info["description"] == f"TensorRT 10.3.0, {gpu_name} (compute capability 8.7), bundle {sha[:12]}"
    assert info["device_memory_free"] == 8 << 30 and info["device_memory_total"] == 16 << 30


def test_every_key_field_changes_the_directory(fake_trt, trt_bundles, monkeypatch, tmp_path):
    def directory(kind: str = "svd") -> str:
        return tensorrt_engine_info(trt_bundles[kind], tmp_path)["directory"]

    first = directory()
    assert directory("core") != first
    monkeypatch.setenv("EDGE_FAKE_TENSORRT_VERSION", "100301")
    assert directory() not in (first, directory("core"))
    monkeypatch.delenv("EDGE_FAKE_TENSORRT_VERSION")
    monkeypatch.setenv("EDGE_FAKE_CUDA_DEVICE_NAME", "Thor")
    assert directory() != first
    monkeypatch.delenv("EDGE_FAKE_CUDA_DEVICE_NAME")
    assert directory() == first


def test_cache_directory_choice(fake_trt, trt_bundles, monkeypatch, tmp_path):
    bundle = trt_bundles["svd"]

    def cache() -> Path:
        return Path(tensorrt_engine_info(bundle)["directory"]).parent

    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path / "engines"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache() == tmp_path / "engines"
    assert Path(tensorrt_engine_info(bundle, tmp_path / "chosen")["directory"]).parent == tmp_path / "chosen"
    monkeypatch.delenv("EDGE_SDK_ENGINE_CACHE")
    assert cache() == tmp_path / "xdg" / "edge-sdk" / "tensorrt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache() == tmp_path / "home" / ".cache" / "edge-sdk" / "tensorrt"


def test_cached_only_with_the_engine_and_the_same_key(fake_trt, trt_bundles, tmp_path):
    bundle = trt_bundles["svd"]
    info = tensorrt_engine_info(bundle, tmp_path)
    assert not info["cached"] and info["reason"].startswith("no TensorRT engine cached for this bundle on this device")
    assert f"(looked in {info['directory']}, for {info['description']})" in info["reason"]
    directory = Path(info["directory"])
    directory.mkdir()
    (directory / "engine.json").write_text(json.dumps(info["metadata"]))
    assert not tensorrt_engine_info(bundle, tmp_path)["cached"]  # no engine yet
    (directory / "decode.engine").write_bytes(b"plan")  # the two engines of cache layout 1 are not one
    assert not tensorrt_engine_info(bundle, tmp_path)["cached"]
    (directory / "model.engine").write_bytes(b"plan")
    cached = tensorrt_engine_info(bundle, tmp_path)
    assert cached["cached"] and cached["reason"] is None
    (directory / "engine.json").write_text(json.dumps(info["metadata"] | {"gpu_name": "Thor"}))
    reason = tensorrt_engine_info(bundle, tmp_path)["reason"]
    assert f"engine.json records another GPU or bundle than {info['description']}" in reason
    assert reason.endswith(f"rebuild with `edge-sdk build {bundle.path} --force`")
    (directory / "engine.json").write_text("{not json")
    assert not tensorrt_engine_info(bundle, tmp_path)["cached"]


def test_an_engine_of_another_tensorrt_is_named(fake_trt, trt_bundles, monkeypatch, tmp_path):
    """Another TensorRT keys another directory; the engine of this bundle and GPU found there is worth naming."""
    bundle = trt_bundles["svd"]
    older = tensorrt_engine_info(bundle, tmp_path)
    Path(older["directory"]).mkdir()
    Path(older["metadata_file"]).write_text(json.dumps(older["metadata"]))
    Path(older["engine_file"]).write_bytes(b"plan")
    monkeypatch.setenv("EDGE_FAKE_TENSORRT_VERSION", "101303")
    newer = tensorrt_engine_info(bundle, tmp_path)
    assert not newer["cached"]
    assert newer["reason"] == (
        f"engine built by TensorRT 10.3.0, this is 10.13.3: rebuild with `edge-sdk build {bundle.path} --force` "
        f"(engine in {older['directory']})"
    )
