"""Run a bundle's engine: the Engine protocol (prefill, decode, reset) on TensorRT with cuda-python buffers.

One engine, built from decode.onnx with a prefill and a decode optimization profile (profiles.py), holds the weights
once. It has one execution context per profile, created once (switching a context's profile makes TensorRT update
its layers on the next enqueue, NvInferRuntime.h 10.3 setOptimizationProfileAsync), and both contexts share one block
of activation memory (ExecutionContextAllocationStrategy::kUSER_MANAGED): they run one after the other on one stream.

The graph takes the KV cache as inputs past_key_values.{i}.{key,value} [1, kv_heads, past, head_dim] and return
it grown by the new tokens as present.{i}.{key,value}. Each of those tensors has two device buffers of the full
capacity [1, kv_heads, max_seq_len, head_dim], allocated once: a step reads the cache from one and writes the
grown cache into the other, and the next step swaps them. Nothing is allocated per token; per step only the
token ids go to the device and the last position's logits come back.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from edge_sdk.errors import EdgeSdkError
from edge_sdk.predictors.core import core_masks_from_activations
from edge_sdk.runtime.backends import EngineOptions

from . import cuda
from .availability import import_tensorrt
from .builder import build_engine, current_key, load_plugin_library
from .cache import ENGINE_FILE, EngineCacheError, unloadable_engine_message
from .profiles import PROFILES, kv_buffer_bytes


class EngineRunError(EdgeSdkError):
    """TensorRT refused an input shape or failed to run a step."""


def deserialize(runtime, path: Path, key, bundle_path: Path):
    """The ICudaEngine in path; EngineCacheError naming what built it when TensorRT refuses it.

    The plan is mapped, not read: its pages are the file's, which the kernel can drop again, so loading holds the
    weights once in the engine and not a second time in a copy of the plan (on Orin both share one memory)."""
    engine = None
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as plan:
            engine = runtime.deserialize_cuda_engine(plan)  # takes any buffer (pybind11 py::buffer)
    if engine is None:
        raise EngineCacheError(unloadable_engine_message(path, key, bundle_path))
    return engine


class _Profiles:
    """One execution context per optimization profile of the engine, over one shared block of activation memory."""

    def __init__(self, trt, engine, stream: cuda.Stream, allocate):
        self.engine = engine
        self.names = [engine.get_tensor_name(index) for index in range(engine.num_io_tensors)]
        size = max(engine.get_device_memory_size_for_profile_v2(index) for index in range(len(PROFILES)))
        self.activations = allocate(size)
        self.contexts = {}
        for index, profile in enumerate(PROFILES):
            context = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            context.set_device_memory(self.activations.address, size)
            if not context.set_optimization_profile_async(index, stream.handle):
                raise EngineRunError(f"TensorRT refused optimization profile {index} ({profile}): rebuild the engine")
            self.contexts[profile] = context
        stream.synchronize()

    def run(
        self, profile: str, shapes: dict[str, tuple[int, ...]], addresses: dict[str, int], stream: cuda.Stream
    ) -> None:
        """shapes: every dynamic input; addresses: at least every input and output of the engine."""
        missing = [name for name in self.names if name not in addresses]
        if missing:
            raise EngineRunError(f"no device buffer for the engine's tensors {', '.join(missing)}")
        context = self.contexts[profile]
        for name, shape in shapes.items():
            if not context.set_input_shape(name, shape):
                raise EngineRunError(
                    f"TensorRT refused shape {shape} for input '{name}' (outside the engine's {profile} profile)"
                )
        for name in self.names:
            context.set_tensor_address(name, addresses[name])
        if not context.execute_async_v3(stream.handle):
            raise EngineRunError("TensorRT failed to run the engine (see the TensorRT log above)")
        stream.synchronize()


class TensorRTEngine:
    """One sequence of a bundle on TensorRT. Not thread-safe."""

    def __init__(self, bundle, options: EngineOptions):
        trt = import_tensorrt()
        self.config = bundle.config
        self.vocab_size = self.config.vocab_size
        self.max_seq_len = bundle.max_seq_len
        self.layers = self.config.num_layers
        self.sparsity = bundle.sparsity
        directory = build_engine(bundle)
        load_plugin_library(trt)
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))  # kept alive with the engines it made
        key = current_key(trt, bundle)
        engine = deserialize(self.runtime, directory / ENGINE_FILE, key, bundle.path)
        self.stream = cuda.Stream()
        self._buffers: list[cuda.DeviceBuffer] = []
        self.profiles = _Profiles(trt, engine, self.stream, self._buffer)
        self._allocate(options)
        self.reset()

    def _buffer(self, nbytes: int) -> cuda.DeviceBuffer:
        buffer = cuda.DeviceBuffer(nbytes)
        self._buffers.append(buffer)
        return buffer

    def _allocate(self, options: EngineOptions) -> None:
        max_len = self.max_seq_len
        cache_bytes = kv_buffer_bytes(self.config, max_len)  # [1, kv_heads, max_seq_len, head_dim] float32
        names = [f"{layer}.{part}" for layer in range(self.layers) for part in ("key", "value")]
        self.kv = {name: (self._buffer(cache_bytes), self._buffer(cache_bytes)) for name in names}
        self.ids = self._buffer(max_len * 8)  # input_ids [1, seq] int64
        self.positions = self._buffer(max_len * 8)  # position_ids [1, seq] int64
        self.logits = self._buffer(self.vocab_size * 4)  # [1, seq, vocab] float32, grown for longer prompts
        # Both profiles bind every tensor of the graph; each reads only its own (the other branch has zero rows).
        # The decode scalars: the calibrated level's index and the dense switch
        choice = self.sparsity.resolve(options.sparsity, options.dense)
        self.level = self._buffer(8)
        self.level.upload(np.array(choice.index or 0, dtype=np.int64))
        self.dense = self._buffer(1)
        self.dense.upload(np.array(choice.dense, dtype=np.bool_))
        n_neurons = self.config.intermediate_size
        self.core = self.sparsity.predictor == "core"
        # decode's core masks [1, D] int32 (1 = core neuron): OPS.md, no BOOL tensor at a plugin
        self.core_masks = [self._buffer(n_neurons * 4) for _ in range(self.layers)] if self.core else []
        # prefill's gate activations [1, seq, D] float32 per layer, for the host's core selection
        activation_bytes = max_len * n_neurons * 4
        self.core_activations = [self._buffer(activation_bytes) for _ in range(self.layers)] if self.core else []

    def reset(self) -> None:
        self.length = 0
        self.current = 0  # which buffer of each KV pair holds the cache

    def _kv_bindings(self, past: int) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
        kv_heads, head_dim = self.config.num_kv_heads, self.config.head_dim
        shapes, addresses = {}, {}
        for name, pair in self.kv.items():
            shapes[f"past_key_values.{name}"] = (1, kv_heads, past, head_dim)
            addresses[f"past_key_values.{name}"] = pair[self.current].address
            addresses[f"present.{name}"] = pair[1 - self.current].address
        return shapes, addresses

    def _core_bindings(self) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
        """The scalars and the core bundles' masks and activations, bound in both profiles."""
        shapes = {}
        addresses = {"sparsity_level": self.level.address, "dense": self.dense.address}
        for layer in range(len(self.core_masks)):
            shapes[f"core_mask.{layer}"] = (1, self.config.intermediate_size)
            addresses[f"core_mask.{layer}"] = self.core_masks[layer].address
            addresses[f"core_activations.{layer}"] = self.core_activations[layer].address
        return shapes, addresses

    def _step(self, profile: str, ids: list[int]) -> np.ndarray:
        """Runs ids after the current cache in `profile`; returns the last position's logits [vocab]."""
        seq = len(ids)
        if self.length + seq > self.max_seq_len:
            raise EngineRunError(
                f"sequence of {self.length + seq} tokens exceeds the bundle's max_seq_len {self.max_seq_len}"
            )
        self.ids.upload(np.array([ids], dtype=np.int64))
        self.positions.upload(np.arange(self.length, self.length + seq, dtype=np.int64)[None, :])
        if seq * self.vocab_size * 4 > self.logits.nbytes:
            self.logits.free()
            self._buffers.remove(self.logits)
            self.logits = self._buffer(seq * self.vocab_size * 4)
        shapes, addresses = self._kv_bindings(self.length)
        core_shapes, core_addresses = self._core_bindings()
        shapes |= {"input_ids": (1, seq), "position_ids": (1, seq)} | core_shapes
        addresses |= {"input_ids": self.ids.address, "position_ids": self.positions.address}
        addresses |= {"logits": self.logits.address} | core_addresses
        self.profiles.run(profile, shapes, addresses, self.stream)
        self.current = 1 - self.current
        self.length += seq
        return self.logits.download((seq, self.vocab_size), np.float32)[-1]

    def prefill(self, ids: list[int]) -> np.ndarray:
        if not ids:
            raise EngineRunError("prefill needs at least one token")
        self.reset()
        logits = self._step("prefill", ids)
        if self.core:
            self._choose_core_neurons(len(ids))
        return logits

    def _choose_core_neurons(self, seq: int) -> None:
        """The decode's fixed core masks from the prompt's gate activations (sparsity/core.py's rule, on the host)."""
        n_neurons = self.config.intermediate_size
        for layer in range(self.layers):
            activations = self.core_activations[layer].download((1, seq, n_neurons), np.float32)
            mask = core_masks_from_activations(activations, self.sparsity.core_alpha, self.sparsity.core_beta)
            self.core_masks[layer].upload(mask.astype(np.int32))

    def decode(self, token: int) -> np.ndarray:
        if self.length == 0:
            raise EngineRunError("decode called before prefill")
        return self._step("decode", [int(token)])

    def close(self) -> None:
        """Frees the device buffers and the stream; the engine cannot run afterwards."""
        for buffer in self._buffers:
            buffer.free()
        self._buffers.clear()
        self.stream.destroy()
