"""Engine cache keys, locations and the message for an engine TensorRT refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from edge_sdk.backends.tensorrt import cache
from edge_sdk.backends.tensorrt.cache import EngineKey

KEY = EngineKey("10.3.0", "Orin", "8.7", "ab" * 32)


@pytest.mark.parametrize("field", [field.name for field in dataclasses.fields(EngineKey)])
def test_every_key_field_changes_the_digest(field):
    assert KEY.digest() == EngineKey(*dataclasses.astuple(KEY)).digest()
    other = dataclasses.replace(KEY, **{field: "something else"})
    assert other.digest() != KEY.digest()
    assert cache.engine_dir(Path("/c"), other) != cache.engine_dir(Path("/c"), KEY)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path / "engines"))
    assert cache.default_cache_dir() == tmp_path / "engines"
    monkeypatch.delenv("EDGE_SDK_ENGINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_cache_dir() == tmp_path / "xdg" / "edge-sdk" / "tensorrt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.default_cache_dir() == Path.home() / ".cache" / "edge-sdk" / "tensorrt"


def test_complete_only_with_the_engine_and_the_same_key(tmp_path):
    directory = cache.engine_dir(tmp_path, KEY)
    directory.mkdir()
    cache.write_metadata(directory, KEY, Path("/bundles/tiny"))
    assert not cache.is_complete(directory, KEY)  # no engine yet
    (directory / "decode.engine").write_bytes(b"plan")  # the two engines of cache layout 1 are not one
    assert not cache.is_complete(directory, KEY)
    (directory / cache.ENGINE_FILE).write_bytes(b"plan")
    assert cache.is_complete(directory, KEY)
    assert not cache.is_complete(directory, dataclasses.replace(KEY, tensorrt_version="10.7.0"))
    (directory / cache.METADATA_FILE).write_text("{not json")
    assert not cache.is_complete(directory, KEY)


def test_unloadable_engine_says_what_built_it_and_how_to_rebuild(tmp_path):
    directory = tmp_path / "entry"
    directory.mkdir()
    cache.write_metadata(directory, KEY, Path("/bundles/tiny"))
    now = dataclasses.replace(KEY, tensorrt_version="10.7.0.23")
    message = cache.unloadable_engine_message(directory / cache.ENGINE_FILE, now, "/bundles/tiny")
    assert "TensorRT could not load this engine" in message
    assert "built for TensorRT 10.3.0, Orin (compute capability 8.7)" in message
    assert "this process has TensorRT 10.7.0.23" in message
    assert message.endswith("rebuild it on this device with `edge-sdk build /bundles/tiny --force`")
    (directory / cache.METADATA_FILE).unlink()
    message = cache.unloadable_engine_message(directory / cache.ENGINE_FILE, now, "/bundles/tiny")
    assert "its engine.json is missing or incomplete" in message and "--force" in message
