"""Build the bundle's engine on this device, with the edge-sdk plugins, into the engine cache: one engine from
decode.onnx with a prefill and a decode optimization profile, holding the weights once (profiles.py).

The build uses TensorRT's Python API (its ONNX parser and builder); where the engine goes, and the plugins it is
built with, come from libedge_sdk, whose TensorRT engine runs it (c_runtime.tensorrt_engine_info): the cache key and
the plugin lookup exist only there."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from edge_sdk import outputs
from edge_sdk.bundle import Bundle
from edge_sdk.bundle.format import WEIGHTS_FILE
from edge_sdk.bundle.graph_ops import DOMAIN, OP_TYPES, PLUGIN_NAMESPACE, PLUGIN_VERSION
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats.onnx_wire import graph_op_types

from ..c_runtime import tensorrt_engine_info
from .availability import import_tensorrt
from .graphs import tensorrt_model
from .profiles import ENGINE_GRAPH, PROFILES, kv_buffer_bytes, profile_shapes

# The build's peak holds the weights twice: the ONNX parser's host copy of the initializers, which the network refers
# to until the build returns, and the engine the builder makes (JETSON.md section 4).
BUILD_WEIGHT_COPIES = 2


class EngineBuildError(EdgeSdkError):
    """TensorRT could not parse a graph or build an engine from it, or this device cannot build it."""


def check_plugins_visible(trt: ModuleType, backend: str) -> None:
    """libedge_sdk registered the plugins with its libnvinfer when it probed the backend (`backend` is what the probe
    said); TensorRT's Python package must see them in its own registry, i.e. run the same libnvinfer, or its parser
    cannot map our ops (and a second registration would be refused: IPluginRegistry::loadLibrary fails for plugins
    already registered)."""
    registry = trt.get_plugin_registry()
    missing = [op for op in OP_TYPES if registry.get_creator(op, PLUGIN_VERSION, PLUGIN_NAMESPACE) is None]
    if missing:
        raise EngineBuildError(
            f"the tensorrt Python package (TensorRT {trt.__version__}) does not see the plugins ({', '.join(missing)}) "
            f"that libedge_sdk registered with its own libnvinfer ({backend}): the two load different copies of "
            "libnvinfer; build with the TensorRT libedge_sdk was built against (plugins/tensorrt/JETSON.md, section 2)"
        )


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
    kv_buffers = 2 * 2 * config.num_layers  # {key, value} per layer, two sets (trt_engine.cpp's ping-pong)
    weights = (bundle.path / WEIGHTS_FILE).stat().st_size
    return MemoryEstimate(weights, kv_buffers * kv_buffer_bytes(config, bundle.max_seq_len))


def check_device_memory(bundle: Bundle, free: int) -> None:
    """EngineBuildError, with the figures, when `free` bytes of device memory cannot build and then run the engine."""
    estimate = memory_estimate(bundle)
    if free < estimate.required:
        raise EngineBuildError(
            f"{bundle.path}: building the engine needs about {estimate.build >> 20} MiB "
            f"({BUILD_WEIGHT_COPIES} x {WEIGHTS_FILE}'s {estimate.weights >> 20} MiB: the parser's copy and the "
            f"engine's), running it about {estimate.running >> 20} MiB (the weights once and a "
            f"{estimate.kv_cache >> 20} MiB KV cache), found {free >> 20} MiB free (cudaMemGetInfo); free memory, "
            "export a smaller dtype or a shorter max_seq_len"
        )


# Why an asymmetric int4 bundle whose decode graph has no QuantizedSparseFFN gets no engine: exported before the
# quantized ops took group minimums, it dequantizes every matrix to float32 in standard ops, which TensorRT would fold
# into float32 weights, 8 times the int4 bytes (OPS.md, "Quantized matrices"). compatibility.py reports the same.
DEQUANTIZING_GRAPH_REASON = (
    f"its {ENGINE_GRAPH}.onnx dequantizes the asymmetric int4 matrices to float32 (exported by an edge-sdk whose "
    "quantized ops took no group minimums); export it again with this edge-sdk"
)


def dequantizes_asymmetric_matrices(bundle: Bundle) -> bool:
    """Whether the bundle is asymmetric int4 and its decode graph has no QuantizedSparseFFN
    (DEQUANTIZING_GRAPH_REASON); the graph's op types read from the wire format (a device has no onnx package)."""
    if not bundle.manifest.asymmetric:
        return False  # the graph is read for asymmetric bundles only
    return (DOMAIN, "QuantizedSparseFFN") not in graph_op_types(bundle.graph_path(ENGINE_GRAPH).read_bytes())


def check_quantized_ops(bundle: Bundle) -> None:
    """EngineBuildError for an asymmetric int4 bundle whose decode graph dequantizes its matrices."""
    if dequantizes_asymmetric_matrices(bundle):
        raise EngineBuildError(f"{bundle.path}: no TensorRT engine for this bundle: {DEQUANTIZING_GRAPH_REASON}")


def _build(trt: ModuleType, logger, path: Path, profiles: list[dict]):
    """The serialized engine of the graph at path (TensorRT's IHostMemory), with one optimization profile per entry of
    `profiles` (input name -> ShapeRange), added in order so that profile index i covers profiles[i]. The parser, the
    network and the builder (and with them the parser's host copy of the weights) are released when this returns, and
    the IHostMemory is written through the buffer protocol, never copied into a bytes object: on a Jetson, host and
    device share one memory, and a copy would be a third copy of the weights (BUILD_WEIGHT_COPIES counts two)."""
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
    return serialized


def build_engine(
    bundle: Bundle,
    cache_dir: str | Path | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The engine directory of an opened bundle for this TensorRT and GPU, building it when absent (or when force).

    Returns the directory libedge_sdk names for the bundle (<cache>/<key digest>), holding model.engine and
    engine.json; cache_dir None is the cache backend "tensorrt" reads. Raises BackendUnavailable when the tensorrt
    Python package is missing or libedge_sdk's TensorRT backend is not available here (no TensorRT in the build, no
    GPU, no plugin library), EngineBuildError when TensorRT fails on the bundle's graph or the device lacks the memory.
    """
    bundle_path = bundle.path
    check_quantized_ops(bundle)
    # first: libedge_sdk, loaded next, then links the libnvinfer the tensorrt package loaded (one soname, one copy)
    trt = import_tensorrt()
    info = tensorrt_engine_info(bundle, cache_dir)
    directory = Path(info["directory"])
    if not force and info["cached"]:
        return directory
    try:
        profiles = [
            profile_shapes(bundle.config, bundle.max_seq_len, profile, bundle.sparsity.predictor)
            for profile in PROFILES
        ]
    except ValueError as error:
        raise EngineBuildError(f"{bundle_path}: no TensorRT engine for this bundle: {error}") from None
    check_plugins_visible(trt, info["backend"])
    check_device_memory(bundle, int(info["device_memory_free"]))
    # an engine not cached for this key is rebuilt, so what is there may be replaced, but only edge-sdk's engine files
    target = outputs.check_target(directory, outputs.ENGINE, replace=True)
    logger = trt.Logger(trt.Logger.WARNING)
    if log is not None:
        log(f"building the engine of {bundle_path} (profiles {', '.join(PROFILES)}) for {info['description']}")
    serialized = _build(trt, logger, bundle.graph_path(ENGINE_GRAPH), profiles)
    # the engine and its record are published together (libedge_sdk runs an engine only beside a record of its key)
    with outputs.staged_output(target) as staging:
        (staging / Path(info["engine_file"]).name).write_bytes(memoryview(serialized))
        (staging / Path(info["metadata_file"]).name).write_text(json.dumps(info["metadata"], indent=2) + "\n")
    return directory
