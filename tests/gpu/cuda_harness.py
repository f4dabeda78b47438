"""ctypes access to the CUDA kernel library (plugins/kernels/edge_cuda_kernels.h) and the CUDA runtime it links.

Used by the GPU tests and by benchmarks/cuda_ffn.py. torch here is a CPU build, so device memory is allocated
with cudaMalloc through ctypes and filled from CPU tensors with cudaMemcpy; the launchers get raw pointers.
The CUDA runtime functions are looked up through the kernel library's handle, i.e. in the libcudart it was
linked against, so the tests and the kernels share one runtime.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from edge_sdk.native import find_library

CUDA_KERNELS_LIBRARY = "libedge_cuda_kernels.so"
CUDA_KERNELS_ENV = "EDGE_SDK_CUDA_KERNELS"
# Every symbol the library exports (edge_cuda_kernels.h), and nothing else.
LAUNCHERS = (
    "edge_svd_predictor",
    "edge_svd_predictor_f16",
    "edge_signbit_predictor",
    "edge_sparse_ffn_workspace_size",
    "edge_sparse_ffn",
    "edge_sparse_ffn_q",
    "edge_matvec_q_workspace_size",
    "edge_matvec_q",
    "edge_matvec_q_t",
)
# enum edge_cuda_dtype, enum edge_quant_format and enum edge_activation.
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
QUANT_FORMATS = {"int8": 2, "int4": 3}
ACTIVATIONS = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
_MEMCPY_HOST_TO_DEVICE = 1
_MEMCPY_DEVICE_TO_HOST = 2
_MEMCPY_DEVICE_TO_DEVICE = 3
_CAPTURE_MODE_GLOBAL = 0

_ptr = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t


class CudaError(RuntimeError):
    """A CUDA runtime call or a launcher returned an error."""


def kernel_library_path() -> Path | None:
    """The built libedge_cuda_kernels.so ($EDGE_SDK_CUDA_KERNELS or edge_sdk/_native), or None."""
    return find_library(CUDA_KERNELS_LIBRARY, CUDA_KERNELS_ENV)


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """The kernel library, with the signatures of its launchers and of the runtime functions used here declared."""
    path = kernel_library_path()
    if path is None:
        raise FileNotFoundError(
            f"{CUDA_KERNELS_LIBRARY} was not built (the package build compiles it when nvcc is found; "
            f"or set {CUDA_KERNELS_ENV})"
        )
    library = ctypes.CDLL(str(path))
    signatures = {
        # stream, x, x_dtype, tokens, d, D, rank, a, b, bias, mask, scratch
        "edge_svd_predictor": [_ptr, _ptr, _int, _int, _int, _int, _int, _ptr, _ptr, _ptr, _ptr, _ptr],
        "edge_svd_predictor_f16": [_ptr, _ptr, _int, _int, _int, _int, _int, _ptr, _ptr, _ptr, _ptr, _ptr],
        # stream, x, x_dtype, tokens, d, D, packed, alpha, mask
        "edge_signbit_predictor": [_ptr, _ptr, _int, _int, _int, _int, _ptr, ctypes.c_float, _ptr],
        "edge_sparse_ffn": [
            _ptr,  # stream
            _ptr,  # x
            _int,  # x_dtype
            _int,  # tokens
            _int,  # d
            _int,  # D
            _ptr,  # w_gate
            _ptr,  # w_up
            _ptr,  # w_down_t
            _int,  # weight_dtype
            _ptr,  # mask
            _ptr,  # thresholds
            _int,  # activation
            ctypes.c_float,  # act_threshold
            _ptr,  # y
            _ptr,  # workspace
            _ptr,  # active_out
        ],
        "edge_sparse_ffn_q": [
            _ptr,  # stream
            _ptr,  # x
            _int,  # x_dtype
            _int,  # tokens
            _int,  # d
            _int,  # D
            _ptr,  # w_gate (codes)
            _ptr,  # gate_scales
            _ptr,  # gate_mins (asymmetric int4; NULL: symmetric)
            _ptr,  # w_up
            _ptr,  # up_scales
            _ptr,  # up_mins
            _ptr,  # w_down_t
            _ptr,  # down_scales
            _ptr,  # down_mins
            _int,  # quant_format (w_gate, w_up)
            _int,  # down_format (w_down_t: quant_format, or int8 under int4)
            _int,  # group_size
            _ptr,  # mask
            _ptr,  # thresholds
            _int,  # activation
            ctypes.c_float,  # act_threshold
            _ptr,  # y
            _ptr,  # workspace
            _ptr,  # active_out
        ],
        # stream, x, x_dtype, tokens, in, out, w, scales, mins, quant_format, group_size, bias, y (, workspace)
        "edge_matvec_q": [_ptr, _ptr, _int, _int, _int, _int, _ptr, _ptr, _ptr, _int, _int, _ptr, _ptr, _ptr],
        "edge_matvec_q_t": [_ptr, _ptr, _int, _int, _int, _int, _ptr, _ptr, _ptr, _int, _int, _ptr, _ptr],
        "cudaGetDeviceCount": [ctypes.POINTER(_int)],
        "cudaMalloc": [ctypes.POINTER(_ptr), _size],
        "cudaFree": [_ptr],
        "cudaMemcpy": [_ptr, _ptr, _size, _int],
        "cudaMemset": [_ptr, _int, _size],
        "cudaStreamCreate": [ctypes.POINTER(_ptr)],
        "cudaStreamDestroy": [_ptr],
        "cudaStreamSynchronize": [_ptr],
        "cudaStreamBeginCapture": [_ptr, _int],
        "cudaStreamEndCapture": [_ptr, ctypes.POINTER(_ptr)],
        "cudaGraphInstantiate": [ctypes.POINTER(_ptr), _ptr, ctypes.c_ulonglong],
        "cudaGraphLaunch": [_ptr, _ptr],
        "cudaGraphExecDestroy": [_ptr],
        "cudaGraphDestroy": [_ptr],
        "cudaEventCreate": [ctypes.POINTER(_ptr)],
        "cudaEventDestroy": [_ptr],
        "cudaEventRecord": [_ptr, _ptr],
        "cudaEventSynchronize": [_ptr],
        "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _ptr, _ptr],
        "cudaMemcpyAsync": [_ptr, _ptr, _size, _int, _ptr],
    }
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = _int
    library.edge_sparse_ffn_workspace_size.argtypes = [_int, _int, _int]
    library.edge_sparse_ffn_workspace_size.restype = _size
    if has_matvec_workspace(library):
        library.edge_matvec_q_workspace_size.argtypes = [_int, _int]
        library.edge_matvec_q_workspace_size.restype = _size
    library.cudaGetErrorString.argtypes = [_int]
    library.cudaGetErrorString.restype = ctypes.c_char_p
    return library


def has_matvec_workspace(library: ctypes.CDLL) -> bool:
    """Whether edge_matvec_q takes a workspace (since 6948183). A library built from an older revision, loaded as the
    baseline of a side-by-side benchmark (scripts/gpu_check.sh GPU_CHECK_BASELINE), has the other launchers alone.
    (A library from before the asymmetric int4 minimums, or from before edge_sparse_ffn_q's down_format, takes its
    quantized launchers' arguments in another order, which no symbol tells: this harness's quantized calls fail on it
    with cudaErrorInvalidValue; an older edge_sparse_ffn_q reads the down format, 2 or 3, as its group size.)"""
    return hasattr(library, "edge_matvec_q_workspace_size")


def gpu_unavailable_reason() -> str | None:
    """Why the GPU tests cannot run here (library not built or not loadable, no CUDA device), or None."""
    try:
        library = load_kernels()
    except (FileNotFoundError, OSError) as error:
        return f"CUDA kernel library unavailable: {error}"
    count = _int(0)
    status = library.cudaGetDeviceCount(ctypes.byref(count))
    if status != CUDA_SUCCESS:
        message = library.cudaGetErrorString(status).decode()
        return f"no usable CUDA device (cudaGetDeviceCount returned {status}: {message})"
    if count.value == 0:
        return "no CUDA device: cudaGetDeviceCount found 0 devices"
    return None


def check(status: int, what: str) -> None:
    if status != CUDA_SUCCESS:
        raise CudaError(
            f"{what} failed with CUDA error {status} ({load_kernels().cudaGetErrorString(status).decode()})"
        )


@dataclass
class DeviceTensor:
    """A device copy of a CPU tensor: its address, shape and dtype. Freed by the Device that made it."""

    pointer: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return torch.empty(self.shape, dtype=self.dtype).nbytes


class Device:
    """Device buffers and one stream; close() frees everything it allocated."""

    def __init__(self):
        self.cuda = load_kernels()
        self._allocations: list[int] = []
        stream = _ptr()
        check(self.cuda.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
        self.stream = stream.value

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> DeviceTensor:
        nbytes = max(1, torch.empty(shape, dtype=dtype).nbytes)
        return DeviceTensor(self.allocate(nbytes), tuple(shape), dtype)

    def allocate(self, nbytes: int) -> int:
        pointer = _ptr()
        check(self.cuda.cudaMalloc(ctypes.byref(pointer), nbytes), f"cudaMalloc({nbytes})")
        self._allocations.append(pointer.value)
        return pointer.value

    def upload(self, tensor: torch.Tensor, byte_offset: int = 0) -> DeviceTensor:
        """A device copy of tensor; byte_offset > 0 places it that far past the (256-byte aligned) allocation."""
        host = tensor.contiguous()
        pointer = self.allocate(host.nbytes + byte_offset) + byte_offset
        check(self.cuda.cudaMemcpy(pointer, host.data_ptr(), host.nbytes, _MEMCPY_HOST_TO_DEVICE), "cudaMemcpy")
        return DeviceTensor(pointer, tuple(host.shape), host.dtype)

    def download(self, device: DeviceTensor) -> torch.Tensor:
        """Waits for the stream, then copies the buffer back into a new CPU tensor."""
        self.synchronize()
        host = torch.empty(device.shape, dtype=device.dtype)
        check(self.cuda.cudaMemcpy(host.data_ptr(), device.pointer, host.nbytes, _MEMCPY_DEVICE_TO_HOST), "cudaMemcpy")
        return host

    def fill_bytes(self, device: DeviceTensor, value: int) -> None:
        check(self.cuda.cudaMemset(device.pointer, value, device.nbytes), "cudaMemset")

    def synchronize(self) -> None:
        check(self.cuda.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def capture(self, enqueue) -> int:
        """A CUDA graph of what enqueue() puts on the stream, instantiated; returns the executable graph."""
        check(self.cuda.cudaStreamBeginCapture(self.stream, _CAPTURE_MODE_GLOBAL), "cudaStreamBeginCapture")
        enqueue()
        graph = _ptr()
        check(self.cuda.cudaStreamEndCapture(self.stream, ctypes.byref(graph)), "cudaStreamEndCapture")
        executable = _ptr()
        check(self.cuda.cudaGraphInstantiate(ctypes.byref(executable), graph, 0), "cudaGraphInstantiate")
        check(self.cuda.cudaGraphDestroy(graph), "cudaGraphDestroy")
        return executable.value

    def elapsed_ms(self, enqueue) -> float:
        """Milliseconds of device time between CUDA events recorded before and after what enqueue() queues."""
        start, stop = _ptr(), _ptr()
        check(self.cuda.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
        check(self.cuda.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
        try:
            check(self.cuda.cudaEventRecord(start, self.stream), "cudaEventRecord")
            enqueue()
            check(self.cuda.cudaEventRecord(stop, self.stream), "cudaEventRecord")
            check(self.cuda.cudaEventSynchronize(stop), "cudaEventSynchronize")
            elapsed = ctypes.c_float()
            check(self.cuda.cudaEventElapsedTime(ctypes.byref(elapsed), start, stop), "cudaEventElapsedTime")
            return elapsed.value
        finally:
            self.cuda.cudaEventDestroy(start)
            self.cuda.cudaEventDestroy(stop)

    def copy_on_device(self, destination: int, source: int, nbytes: int) -> None:
        """Queues a device-to-device copy on the stream."""
        status = self.cuda.cudaMemcpyAsync(destination, source, nbytes, _MEMCPY_DEVICE_TO_DEVICE, self.stream)
        check(status, "cudaMemcpyAsync")

    def launch_graph(self, executable: int) -> None:
        check(self.cuda.cudaGraphLaunch(executable, self.stream), "cudaGraphLaunch")

    def destroy_graph(self, executable: int) -> None:
        check(self.cuda.cudaGraphExecDestroy(executable), "cudaGraphExecDestroy")

    def close(self) -> None:
        for pointer in self._allocations:
            self.cuda.cudaFree(pointer)
        self._allocations.clear()
        self.cuda.cudaStreamDestroy(self.stream)


def _address(tensor: DeviceTensor | None) -> int | None:
    return None if tensor is None else tensor.pointer


@dataclass
class DeviceQuantized:
    """A quantized matrix on the device (edge_sdk.quant.QuantizedMatrix): its codes, fp16 scales and, for asymmetric
    int4, fp16 group minimums."""

    format: str  # int8 | int4
    group_size: int
    codes: DeviceTensor  # int8 [rows, cols] or uint8 [rows, cols / 2]
    scales: DeviceTensor  # float16 [rows, cols / group_size]
    cols: int
    mins: DeviceTensor | None = None  # float16 [rows, cols / group_size]; None: symmetric


def upload_quantized(device: Device, matrix, byte_offset: int = 0) -> DeviceQuantized:
    """A device copy of an edge_sdk.quant.QuantizedMatrix (its minimums too, if any); byte_offset shifts the codes past
    the allocation's start."""
    codes = device.upload(torch.from_numpy(matrix.data), byte_offset=byte_offset)
    scales = device.upload(torch.from_numpy(matrix.scales))
    mins = None if matrix.mins is None else device.upload(torch.from_numpy(matrix.mins))
    return DeviceQuantized(matrix.format, matrix.group_size, codes, scales, matrix.shape[1], mins)


class Kernels:
    """The launchers on DeviceTensors, one call each; shapes are taken from the tensors."""

    def __init__(self, device: Device):
        self.device = device
        self.cuda = device.cuda

    def svd_predictor(
        self,
        x: DeviceTensor,  # [T, d]
        a: DeviceTensor,  # [D, r] fp32, or fp16 (edge_svd_predictor_f16)
        b: DeviceTensor,  # [r, d] a's dtype
        bias: DeviceTensor | None,  # [D] fp32
        mask: DeviceTensor,  # [T, D] int32, written 1 / 0
        scratch: DeviceTensor,  # [T, r] fp32
    ) -> None:
        tokens, d = x.shape
        n_neurons, rank = a.shape
        launcher = "edge_svd_predictor_f16" if a.dtype == torch.float16 else "edge_svd_predictor"
        arguments = (x.pointer, DTYPES[x.dtype], tokens, d, n_neurons, rank, a.pointer, b.pointer, _address(bias))
        check(getattr(self.cuda, launcher)(self.device.stream, *arguments, mask.pointer, scratch.pointer), launcher)

    def signbit_predictor(self, x: DeviceTensor, packed: DeviceTensor, alpha: float, mask: DeviceTensor) -> None:
        tokens, d = x.shape
        arguments = (x.pointer, DTYPES[x.dtype], tokens, d, packed.shape[0], packed.pointer, alpha, mask.pointer)
        check(self.cuda.edge_signbit_predictor(self.device.stream, *arguments), "edge_signbit_predictor")

    def workspace_size(self, d: int, n_neurons: int, tokens: int) -> int:
        return self.cuda.edge_sparse_ffn_workspace_size(d, n_neurons, tokens)

    def sparse_ffn(
        self,
        x: DeviceTensor,  # [T, d]
        weights: tuple[DeviceTensor, DeviceTensor, DeviceTensor],  # w_gate, w_up, w_down_t: [D, d]
        mask: DeviceTensor | None,  # [T, D] int32, nonzero = predicted active
        thresholds: DeviceTensor | None,  # [D] fp32
        activation: str,
        act_threshold: float,
        y: DeviceTensor,  # [T, d] fp32
        workspace: int,
        active_out: DeviceTensor | None = None,  # [T, D] uint8
    ) -> None:
        tokens, d = x.shape
        w_gate, w_up, w_down_t = weights
        shapes = (x.pointer, DTYPES[x.dtype], tokens, d, w_gate.shape[0])
        matrices = (w_gate.pointer, w_up.pointer, w_down_t.pointer, DTYPES[w_gate.dtype])
        rest = (_address(mask), _address(thresholds), ACTIVATIONS[activation], act_threshold, y.pointer, workspace)
        status = self.cuda.edge_sparse_ffn(self.device.stream, *shapes, *matrices, *rest, _address(active_out))
        check(status, "edge_sparse_ffn")

    def sparse_ffn_q(
        self,
        x: DeviceTensor,  # [T, d]
        # w_gate, w_up, w_down_t: [D, d], each with minimums (asymmetric int4) or none; w_down_t int8 under int4 w_gate
        # and w_up (down_format), or all three of one format
        weights: tuple[DeviceQuantized, DeviceQuantized, DeviceQuantized],
        mask: DeviceTensor | None,  # [T, D] int32, nonzero = predicted active
        thresholds: DeviceTensor | None,  # [D] fp32
        activation: str,
        act_threshold: float,
        y: DeviceTensor,  # [T, d] fp32
        workspace: int,  # workspace_size(d, D, T) bytes
        active_out: DeviceTensor | None = None,  # [T, D] uint8
    ) -> None:
        tokens, d = x.shape
        w_gate = weights[0]
        shapes = (x.pointer, DTYPES[x.dtype], tokens, d, w_gate.codes.shape[0])
        matrices = tuple(p for w in weights for p in (w.codes.pointer, w.scales.pointer, _address(w.mins)))
        layout = (QUANT_FORMATS[w_gate.format], QUANT_FORMATS[weights[2].format], w_gate.group_size)
        rest = (_address(mask), _address(thresholds), ACTIVATIONS[activation], act_threshold, y.pointer, workspace)
        stream = self.device.stream
        status = self.cuda.edge_sparse_ffn_q(stream, *shapes, *matrices, *layout, *rest, _address(active_out))
        check(status, "edge_sparse_ffn_q")

    def matvec_q(
        self,
        x: DeviceTensor,  # [T, in]
        w: DeviceQuantized,  # [out, in], or [in, out] when not transposed; its minimums if asymmetric int4
        bias: DeviceTensor | None,  # [out] fp32
        y: DeviceTensor,  # [T, out] fp32
        transposed: bool = True,  # y = x W^T (edge_matvec_q); False: y = x W (edge_matvec_q_t)
        workspace: int | None = None,  # edge_matvec_q's, matvec_workspace_size(in, T) bytes; None: allocated here
    ) -> None:
        tokens, n_in = x.shape
        n_out = w.codes.shape[0] if transposed else w.cols
        arguments = (x.pointer, DTYPES[x.dtype], tokens, n_in, n_out)
        matrix = (w.codes.pointer, w.scales.pointer, _address(w.mins), QUANT_FORMATS[w.format], w.group_size)
        if transposed:
            if workspace is None:
                workspace = self.device.allocate(self.matvec_workspace_size(n_in, tokens))
            status = self.cuda.edge_matvec_q(
                self.device.stream, *arguments, *matrix, _address(bias), y.pointer, workspace
            )
            check(status, "edge_matvec_q")
        else:
            status = self.cuda.edge_matvec_q_t(self.device.stream, *arguments, *matrix, _address(bias), y.pointer)
            check(status, "edge_matvec_q_t")

    def matvec_workspace_size(self, n_in: int, tokens: int) -> int:
        return self.cuda.edge_matvec_q_workspace_size(n_in, tokens)
