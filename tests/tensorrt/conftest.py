"""Small bundles of the committed tiny model for the TensorRT backend tests (fp16 weights, max_seq_len 64)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.sparsity.settings import CalibrationSettings

BUNDLE_KINDS = ("svd", "core")


@pytest.fixture(scope="session")
def trt_bundles(tiny_model_dir, tmp_path_factory):
    """{predictor kind: opened bundle} for an SVD bundle and a core bundle."""
    root = tmp_path_factory.mktemp("trt-bundles")
    # the default level is given: chosen on validation, this small calibration would make the default dense
    calibration = CalibrationSettings(rank=16, max_tokens=2048, levels=(0.5, 0.8), sparsity=0.5)
    paths = {}
    for kind in BUNDLE_KINDS:
        settings = ExportSettings(dtype="fp16", max_seq_len=64, calibration=replace(calibration, predictor=kind))
        paths[kind] = export_bundle(tiny_model_dir, root / kind, settings, [tiny_model_dir / "calibration.txt"])
    return paths


@pytest.fixture(scope="session")
def fake_trt_build(tmp_path_factory):
    """libedge_sdk with its TensorRT engine, built against the fake TensorRT and CUDA runtime (fake_engine.py)."""
    from .fake_engine import build_fake_tensorrt

    return build_fake_tensorrt(tmp_path_factory.mktemp("fake-tensorrt"))


@pytest.fixture(scope="session")
def fake_trt_library(fake_trt_build):
    from .fake_engine import FakeTensorRT

    return FakeTensorRT(fake_trt_build)


@pytest.fixture
def fake_trt(fake_trt_build, fake_trt_library, monkeypatch, tmp_path):
    """This process runs the TensorRT backend on the fake: libedge_sdk is the fake build, TensorRT's Python package
    the fake one, the engine cache under tmp_path/engines. Yields the FakeTensorRT."""
    from edge_sdk.native import load_runtime

    from .fake_engine import fake_tensorrt_package

    monkeypatch.setenv("EDGE_SDK_RUNTIME_LIBRARY", str(fake_trt_build.runtime))
    monkeypatch.setenv("EDGE_SDK_ENGINE_CACHE", str(tmp_path / "engines"))
    for name in ("EDGE_FAKE_TENSORRT_VERSION", "EDGE_FAKE_CUDA_DEVICES", "EDGE_FAKE_CUDA_DEVICE_NAME",
                 "EDGE_FAKE_CUDA_FREE_BYTES", "EDGE_SDK_TRT_PLUGINS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt_package(fake_trt_library))
    load_runtime.cache_clear()
    fake_trt_library.failures.clear()
    yield fake_trt_library
    load_runtime.cache_clear()
    assert fake_trt_library.failures == []
