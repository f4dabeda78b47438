"""Build the bundle's engine on this device, with the edge-sdk plugins, into the engine cache: one engine from
decode.onnx with a prefill and a decode optimization profile, holding the weights once (profiles.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from edge_sdk.bundle import Bundle
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD, WEIGHTS_FILE
from edge_sdk.errors import EdgeSdkError
from edge_sdk.runtime.backends import BackendUnavailable

from . import cuda
from .availability import find_plugin_library, import_tensorrt, plugin_library_missing
from .cache import (
    ENGINE_FILE,
    EngineKey,
    default_cache_dir,
    engine_dir,
    is_complete,
    tensorrt_version_key,
    write_metadata,
)
from .graphs import tensorrt_model
from .profiles import ENGINE_GRAPH, PROFILES, kv_buffer_bytes, profile_shapes

_loaded_plugin_libraries: dict[str, object] = {}
# The build's peak holds the weights twice: the ONNX parser's host copy of the initializers, which the network refers
# to until the build returns, and the engine the builder makes (JETSON.md section 4).
BUILD_WEIGHT_COPIES = 2
MEMINFO = Path("/proc/meminfo")


class EngineBuildError(EdgeSdkError):
    """TensorRT could not parse a graph or build an engine from it."""


def load_plugin_library(trt: ModuleType) -> Path:
    """Registers the plugin creators with TensorRT's plugin registry, once per process."""
    path = find_plugin_library()
    if path is None:
        raise BackendUnavailable(f"backend 'tensorrt' is not available here: {plugin_library_missing()}")
    if str(path) not in _loaded_plugin_libraries:
        handle = trt.get_plugin_registry().load_library(str(path))
        if handle is None:
            raise EngineBuildError(f"{path}: TensorRT could not load the plugin library (see the TensorRT log above)")
        _loaded_plugin_libraries[str(path)] = handle
    return path


@dataclass(frozen=True)
class MemoryEstimate:
    """Device memory of a bundle's engine in bytes, from the bundle's size (JETSON.md section 4). weights is
    weights.safetensors' size, an upper bound of what the engine holds (compatibility.engine_weight_bytes counts it
    from the graph: the weights as stored, once). TensorRT's activation memory comes on top of both figures: the
    engine reports it only once built."""

    weights: int
    kv_cache: int  # the runtime's KV buffers: two sets of [1, kv_heads, max_seq_len, head_dim] float32 per layer

    @property
    def build(self) -> int:
        return BUILD_WEIGHT_COPIES * self.weights

    @property
    def running(self) -> int:
        return self.weights + self.kv_cache

    @property
    def required(self) -> int:
        return max(self.build, self.running)


def memory_estimate(bundle: Bundle) -> MemoryEstimate:
    config = bundle.config
    kv_buffers = 2 * 2 * config.num_layers  # {key, value} per layer, two sets (runtime.py's ping-pong)
    weights = (bundle.path / WEIGHTS_FILE).stat().st_size
    return MemoryEstimate(weights, kv_buffers * kv_buffer_bytes(config, bundle.max_seq_len))


def free_device_memory(meminfo: Path | None = None) -> tuple[int, str]:
    """(free bytes, where the figure comes from): cudaMemGetInfo through cuda-python when it is installed, else
    MemAvailable of /proc/meminfo (Jetson's GPU shares the system memory). CudaError / EngineBuildError when
    neither can tell."""
    if cuda.runtime_module() is not None:
        free, _total = cuda.call("cudaMemGetInfo")
        return int(free), "cudaMemGetInfo"
    meminfo = MEMINFO if meminfo is None else meminfo
    try:
        lines = meminfo.read_text().splitlines()
    except OSError as error:
        raise EngineBuildError(f"{meminfo}: cannot read the free memory ({error}) and cuda-python is absent") from None
    for line in lines:
        field, _, value = line.partition(":")
        if field == "MemAvailable":
            number, _, unit = value.strip().partition(" ")
            if unit != "kB" or not number.isdigit():
                raise EngineBuildError(f"{meminfo}: field MemAvailable: expected '<n> kB', found {value.strip()!r}")
            return int(number) * 1024, f"{meminfo} MemAvailable"
    raise EngineBuildError(f"{meminfo}: expected a field MemAvailable, found none")


def check_device_memory(bundle: Bundle, meminfo: Path | None = None) -> None:
    """EngineBuildError, with the figures, when this device cannot build and then run the bundle's engine."""
    estimate = memory_estimate(bundle)
    free, source = free_device_memory(meminfo)
    if free < estimate.required:
        raise EngineBuildError(
            f"{bundle.path}: building the engine needs about {estimate.build >> 20} MiB "
            f"({BUILD_WEIGHT_COPIES} x {WEIGHTS_FILE}'s {estimate.weights >> 20} MiB: the parser's copy and the "
            f"engine's), running it about {estimate.running >> 20} MiB (the weights once and a "
            f"{estimate.kv_cache >> 20} MiB KV cache), found {free >> 20} MiB free ({source}); free memory, export a "
            "smaller dtype or a shorter max_seq_len"
        )


def current_key(trt: ModuleType, bundle: Bundle) -> EngineKey:
    name, capability = cuda.device_description()
    return EngineKey(
        tensorrt_version_key(trt.__version__), name, capability, bundle.manifest.raw[MANIFEST_DIGEST_FIELD]
    )


def _build(trt: ModuleType, logger, path: Path, profiles: list[dict]) -> bytes:
    """The serialized engine of the graph at path, with one optimization profile per entry of `profiles` (input name
    -> ShapeRange), added in order so that profile index i covers profiles[i]."""
    builder = trt.Builder(logger)
    # Strongly typed: TensorRT keeps the graph's types (fp32 activations, weights as stored) instead of choosing.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    # path lets the parser find the external initializers in weights.safetensors next to the graph
    if not parser.parse(tensorrt_model(path), str(path)):
        errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
        raise EngineBuildError(f"{path}: TensorRT could not parse the graph: {errors}")
    config = builder.create_builder_config()
    # fp32 math stays IEEE fp32 (TF32 would round matmul inputs to 10 mantissa bits): decode is bound by memory,
    # and the engines then match ONNX Runtime on the bundle as closely as the other backends do.
    config.clear_flag(trt.BuilderFlag.TF32)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, shape in shapes.items():
            profile.set_shape(name, shape.min, shape.opt, shape.max)
        # The builder may give a profile after the first weights of its own (reformatted for its kernels) unless told
        # not to: "If target == 0.0, the builder aims to create the new optimization profile without allocating any
        # additional weight memory" (NvInferRuntime.h 10.3, IOptimizationProfile::setExtraMemoryTarget; a hint).
        profile.extra_memory_target = 0.0
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(f"{path}: TensorRT could not build an engine (see the TensorRT log above)")
    return bytes(serialized)


def build_engine(
    bundle: Bundle,
    cache_dir: str | Path | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The engine directory of an opened bundle for this TensorRT and GPU, building it when absent (or when force).

    Returns <cache>/<key digest>, holding model.engine and engine.json. cache_dir defaults to
    default_cache_dir(). Raises BackendUnavailable when TensorRT, cuda-python, a GPU or the plugin library is
    missing, EngineBuildError when TensorRT fails on the bundle's graphs or the device lacks the memory
    (check_device_memory).
    """
    bundle_path = bundle.path
    trt = import_tensorrt()
    key = current_key(trt, bundle)
    directory = engine_dir(Path(cache_dir) if cache_dir is not None else default_cache_dir(), key)
    if not force and is_complete(directory, key):
        return directory
    try:
        profiles = [
            profile_shapes(bundle.config, bundle.max_seq_len, profile, bundle.sparsity.predictor)
            for profile in PROFILES
        ]
    except ValueError as error:
        raise EngineBuildError(f"{bundle_path}: no TensorRT engine for this bundle: {error}") from None
    load_plugin_library(trt)
    check_device_memory(bundle)
    directory.mkdir(parents=True, exist_ok=True)
    logger = trt.Logger(trt.Logger.WARNING)
    if log is not None:
        log(f"building the engine of {bundle_path} (profiles {', '.join(PROFILES)}) for {key.describe()}")
    serialized = _build(trt, logger, bundle.graph_path(ENGINE_GRAPH), profiles)
    target = directory / ENGINE_FILE
    staging = target.with_suffix(".partial")
    staging.write_bytes(serialized)
    os.replace(staging, target)
    write_metadata(directory, key, bundle_path)
    return directory
