"""The TensorRT backend's probe is libedge_sdk's (edge_backend_probe): the first missing piece is the reason, and it
never raises. On the fake TensorRT (fake_engine.py), whose version and devices the environment sets; what needs a
process whose libedge_sdk has not registered the plugins yet runs in a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from edge_sdk.backends.tensorrt import availability

from edge_sdk import native


def test_available_on_a_device_with_tensorrt_and_the_plugins(fake_trt, fake_trt_build):
    assert availability.probe() == (
        True,
        f"TensorRT 10.3.0 on Fake Orin (compute capability 8.7), plugins {fake_trt_build.plugins}",
    )
    assert fake_trt.report()["plugin_libraries"] == [str(fake_trt_build.plugins)]  # registered once, from there


def test_tensorrt_8_6_is_too_old(fake_trt, monkeypatch):
    monkeypatch.setenv("EDGE_FAKE_TENSORRT_VERSION", "80602")
    available, reason = availability.probe()
    assert not available
    assert reason.startswith("TensorRT 8.6.2 is too old") and "10.3 or later" in reason and "IPluginV3" in reason


@pytest.mark.parametrize(
    ("devices", "why"),
    [("0", "cudaGetDeviceCount found 0 devices"), ("-1", "cudaGetDeviceCount failed: no CUDA-capable device")],
)
def test_no_cuda_device(fake_trt, monkeypatch, devices, why):
    monkeypatch.setenv("EDGE_FAKE_CUDA_DEVICES", devices)
    available, reason = availability.probe()
    assert not available and reason.startswith(f"no CUDA device: {why}")


def test_libedge_sdk_without_tensorrt(monkeypatch):
    """The package's own libedge_sdk, built here without TensorRT."""
    native.load_runtime.cache_clear()
    try:
        available, reason = availability.probe()
        if available or "TensorRT not found at build time" not in reason:
            pytest.skip(f"this machine's libedge_sdk is not one without TensorRT ({reason})")
        assert reason.startswith("this build of libedge_sdk has no TensorRT engine (TensorRT not found at build time)")
        assert "rebuild it where TensorRT 10.3 or later" in reason and "JETSON.md" in reason
    finally:
        native.load_runtime.cache_clear()


def test_no_libedge_sdk(monkeypatch):
    monkeypatch.setattr(native, "find_library", lambda library, env_var: None)
    native.load_runtime.cache_clear()
    try:
        available, reason = availability.probe()
    finally:
        native.load_runtime.cache_clear()
    assert not available
    assert reason.startswith("backend 'tensorrt' runs in the C runtime, and the C runtime library libedge_sdk.so was")


PROBE = "from edge_sdk.backends.tensorrt import availability; print(availability.probe())"


def probe_in_a_new_process(runtime, env) -> str:
    env = {"EDGE_SDK_RUNTIME_LIBRARY": str(runtime), "PATH": "/usr/bin:/bin", **env}
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_plugin_library_named_by_the_environment_must_exist(fake_trt_build, tmp_path):
    missing = tmp_path / "libedge_trt_plugins.so"
    reason = probe_in_a_new_process(fake_trt_build.runtime, {"EDGE_SDK_TRT_PLUGINS": str(missing)})
    assert reason == repr((False, f"$EDGE_SDK_TRT_PLUGINS = {missing} is not a file"))


def test_plugin_library_not_found_says_where_to_put_it(fake_trt_build, tmp_path):
    """A libedge_sdk with no plugin library beside it, none configured: the loader's search finds none either. No
    TensorRT runtime exists yet to take TensorRT's own message, which goes to stderr."""
    runtime = tmp_path / "libedge_sdk.so"
    shutil.copy(fake_trt_build.runtime, runtime)  # finds the fake through its RUNPATH
    reason = probe_in_a_new_process(runtime, {})
    assert reason.startswith(
        "(False, 'TensorRT could not load the plugin library libedge_trt_plugins.so (see the TensorRT log on stderr)"
    )
    assert "build libedge_trt_plugins.so on this device (plugins/tensorrt/JETSON.md)" in reason
    assert f"set $EDGE_SDK_TRT_PLUGINS to its path or put it in {tmp_path}" in reason


def test_plugin_library_next_to_libedge_sdk_is_found(fake_trt_build, tmp_path):
    runtime = tmp_path / "libedge_sdk.so"
    shutil.copy(fake_trt_build.runtime, runtime)
    (tmp_path / "libedge_trt_plugins.so").write_bytes(b"")
    reason = probe_in_a_new_process(runtime, {})
    assert reason == repr((True, f"TensorRT 10.3.0 on Fake Orin (compute capability 8.7), plugins {tmp_path}/"
                                 "libedge_trt_plugins.so"))  # fmt: skip
