"""ctypes bindings of the native CPU kernels (kernels/cpu/edge_cpu_kernels.h) on torch tensors.

Tensors are passed by data_ptr(), never copied: the weights are read in place (e.g. from memory-mapped
safetensors). So every tensor must already be on the CPU, contiguous, and of the dtype and shape the kernel
expects; anything else is a ValueError naming the argument, the expected and the found value.
The C calls release the GIL; one SparseFFNKernel must not be called from two threads at once (it owns
one workspace).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from edge_sdk.model.activation import Activation
from edge_sdk.native import load_cpu_kernels
from edge_sdk.quant import FORMATS, GROUP_SIZES, QuantizedMatrix

# enum edge_dtype, enum edge_activation and enum edge_cpu_status of edge_cpu_kernels.h.
WEIGHT_DTYPES = {torch.float32: 0, torch.float16: 1}
ACTIVATIONS = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
# enum edge_quant_format: the formats of edge_sdk.quant.
QUANT_FORMATS = {"int8": 2, "int4": 3}
_STATUS_OUT_OF_MEMORY = 2
ACTIVATION_BLOCK = 32  # values per activation scale

_ptr = ctypes.c_void_p
_int = ctypes.c_int


class _Matrix(ctypes.Structure):
    """edge_cpu_kernels.h's struct edge_cpu_matrix."""

    _fields_ = [
        ("w", _ptr),
        ("scales", _ptr),
        ("mins", _ptr),
        ("dtype", _int),
        ("group_size", _int),
        ("rows", _int),
        ("bias", _ptr),
        ("y", _ptr),
    ]


@functools.cache
def _library() -> ctypes.CDLL:
    """The kernel library with every kernel's signature declared once."""
    library = load_cpu_kernels()
    signatures = {
        # x, d, D, rank, a_t, b, bias, mask, scratch
        "edge_cpu_svd_predictor": [_ptr, _int, _int, _int, _ptr, _ptr, _ptr, _ptr, _ptr],
        "edge_cpu_svd_predictor_f16": [_ptr, _int, _int, _int, _ptr, _ptr, _ptr, _ptr, _ptr],
        # x, d, D, packed, alpha, mask
        "edge_cpu_signbit_predictor": [_ptr, _int, _int, _ptr, ctypes.c_float, _ptr],
        # x, in, out, w, weight_dtype, bias, y, threads
        "edge_cpu_matvec": [_ptr, _int, _int, _ptr, _int, _ptr, _ptr, _int],
        "edge_cpu_sparse_ffn": [
            _ptr,  # x
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
            _int,  # threads
            _ptr,  # active_out
        ],
        # x, d, D, w_gate, w_up, w_down_t, weight_dtype, activation, act_threshold, y, workspace, threads
        "edge_cpu_dense_ffn": [_ptr, _int, _int, _ptr, _ptr, _ptr, _int, _int, ctypes.c_float, _ptr, _ptr, _int],
        # x, in, out, w, scales, mins, quant_format, group_size, bias, y, threads
        "edge_cpu_matvec_q": [_ptr, _int, _int, _ptr, _ptr, _ptr, _int, _int, _ptr, _ptr, _int],
        # x, in, matrices, n, threads
        "edge_cpu_matvecs": [_ptr, _int, ctypes.POINTER(_Matrix), _int, _int],
        "edge_cpu_sparse_ffn_q": [
            _ptr,  # x
            _int,  # d
            _int,  # D
            _ptr,  # w_gate
            _ptr,  # gate_scales
            _ptr,  # gate_mins
            _ptr,  # w_up
            _ptr,  # up_scales
            _ptr,  # up_mins
            _ptr,  # w_down_t
            _ptr,  # down_scales
            _ptr,  # down_mins
            _int,  # quant_format
            _int,  # down_format
            _int,  # group_size
            _ptr,  # mask
            _ptr,  # thresholds
            _int,  # activation
            ctypes.c_float,  # act_threshold
            _ptr,  # y
            _ptr,  # workspace
            _int,  # threads
            _ptr,  # active_out
        ],
    }
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    library.edge_cpu_sparse_ffn_workspace_size.argtypes = [_int, _int, _int]
    library.edge_cpu_sparse_ffn_workspace_size.restype = ctypes.c_size_t
    library.edge_cpu_sparse_ffn_call_ns.argtypes = [_ptr, _int, _int]
    library.edge_cpu_sparse_ffn_call_ns.restype = ctypes.c_int64
    return library


def _check_tensor(name: str, tensor: object, dtypes: tuple[torch.dtype, ...], shape: list[int]) -> torch.Tensor:
    """tensor must be a contiguous CPU torch.Tensor of one of `dtypes` and exactly `shape`."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, found {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, found device {tensor.device}")
    if tensor.dtype not in dtypes:
        expected = " or ".join(str(dtype) for dtype in dtypes)
        raise ValueError(f"{name}: expected dtype {expected}, found {tensor.dtype}")
    if list(tensor.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, found {list(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name}: expected a contiguous tensor (the kernel reads it in place), found strides "
            f"{list(tensor.stride())}"
        )
    return tensor


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized [rows, cols] weight (edge_sdk/quant.py's format) as the tensors the kernels read in place."""

    format: str  # "int8" or "int4"
    group_size: int  # 32, 64 or 128
    data: torch.Tensor  # int8 [rows, cols] (int8) or uint8 [rows, cols // 2] (int4)
    scales: torch.Tensor  # float16 [rows, cols // group_size]
    # float16 [rows, cols // group_size]: asymmetric int4's group minimums (value = (code + 8) * scale + min), or None
    mins: torch.Tensor | None = None

    @property
    def asymmetric(self) -> bool:
        return self.mins is not None

    @classmethod
    def from_matrix(cls, matrix: QuantizedMatrix) -> QuantizedWeight:
        """The tensors over matrix's numpy arrays (shared memory, no copy)."""
        mins = None if matrix.mins is None else torch.from_numpy(matrix.mins)
        return cls(
            matrix.format, matrix.group_size, torch.from_numpy(matrix.data), torch.from_numpy(matrix.scales), mins
        )


def _check_quantized(name: str, weight: object, rows: int, cols: int) -> QuantizedWeight:
    """weight must be a QuantizedWeight of a known format and group size holding a [rows, cols] matrix."""
    if not isinstance(weight, QuantizedWeight):
        raise ValueError(f"{name}: expected a QuantizedWeight, found {type(weight).__name__}")
    if weight.format not in FORMATS:
        raise ValueError(f"{name}.format: expected one of {', '.join(FORMATS)}, found {weight.format!r}")
    if weight.group_size not in GROUP_SIZES or cols % weight.group_size != 0:
        raise ValueError(f"{name}.group_size: expected one of {GROUP_SIZES} dividing {cols}, found {weight.group_size}")
    if weight.format == "int8":
        _check_tensor(f"{name}.data", weight.data, (torch.int8,), [rows, cols])
    else:
        _check_tensor(f"{name}.data", weight.data, (torch.uint8,), [rows, cols // 2])
    _check_tensor(f"{name}.scales", weight.scales, (torch.float16,), [rows, cols // weight.group_size])
    if weight.mins is not None:
        if weight.format != "int4":
            raise ValueError(
                f"{name}.mins: expected None (only int4 has group minimums), found mins for {weight.format}"
            )
        _check_tensor(f"{name}.mins", weight.mins, (torch.float16,), [rows, cols // weight.group_size])
    return weight


def _check_status(function: str, status: int) -> None:
    """The arguments were validated here, so a nonzero status is a bug in this module or an allocation failure."""
    if status == _STATUS_OUT_OF_MEMORY:
        raise MemoryError(f"{function}: out of memory")
    if status != 0:
        raise RuntimeError(f"{function}: returned status {status} for arguments that passed validation")


def _optional_ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _vector_size(name: str, x: object) -> int:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.numel() == 0:
        found = f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected a non-empty 1-D tensor [d], found {found}")
    return x.shape[0]


def max_threads() -> int:
    """Threads a kernel uses when asked for threads <= 0: OpenMP's maximum (1 in a build without OpenMP)."""
    return _library().edge_cpu_max_threads()


def svd_predictor(
    x: torch.Tensor,  # [d] float32
    a_t: torch.Tensor,  # [rank, D] float32 or float16: svd.a transposed (contiguous), made once per layer at load
    b: torch.Tensor,  # [rank, d] the dtype of a_t
    bias: torch.Tensor | None,  # [D] float32, or None for no bias
) -> torch.Tensor:
    """Predicted-active mask [D] bool: (x B^T) A^T + bias > 0 (SvdPredictor.scores plus the calibrated bias), in
    float32; float16 factors (a bundle's F16 factors) are widened in registers (edge_cpu_svd_predictor_f16)."""
    d = _vector_size("x", x)
    _check_tensor("x", x, (torch.float32,), [d])
    if not isinstance(a_t, torch.Tensor) or a_t.dim() != 2 or 0 in a_t.shape:
        raise ValueError(f"a_t: expected a non-empty 2-D tensor [rank, D], found {getattr(a_t, 'shape', type(a_t))}")
    rank, n_neurons = a_t.shape
    _check_tensor("a_t", a_t, (torch.float32, torch.float16), [rank, n_neurons])
    _check_tensor("b", b, (a_t.dtype,), [rank, d])
    if bias is not None:
        _check_tensor("bias", bias, (torch.float32,), [n_neurons])
    mask = torch.empty(n_neurons, dtype=torch.uint8)
    scratch = torch.empty(rank, dtype=torch.float32)
    kernel = "edge_cpu_svd_predictor_f16" if a_t.dtype == torch.float16 else "edge_cpu_svd_predictor"
    status = getattr(_library(), kernel)(
        x.data_ptr(),
        d,
        n_neurons,
        rank,
        a_t.data_ptr(),
        b.data_ptr(),
        _optional_ptr(bias),
        mask.data_ptr(),
        scratch.data_ptr(),
    )
    _check_status(kernel, status)
    return mask.view(torch.bool)


def signbit_predictor(
    x: torch.Tensor,  # [d] float32
    packed: torch.Tensor,  # [D, ceil(d/32)] int32, pack_sign_bits(W_gate)
    alpha: float,
) -> torch.Tensor:
    """Predicted-active mask [D] bool, as signbit.signbit_mask. alpha is rounded to fp32 (as an ONNX attribute is)."""
    d = _vector_size("x", x)
    _check_tensor("x", x, (torch.float32,), [d])
    if not isinstance(packed, torch.Tensor) or packed.dim() != 2 or packed.shape[0] == 0:
        raise ValueError(f"packed: expected a 2-D tensor [D, ceil(d/32)], found {getattr(packed, 'shape', packed)}")
    n_neurons = packed.shape[0]
    _check_tensor("packed", packed, (torch.int32,), [n_neurons, (d + 31) // 32])
    mask = torch.empty(n_neurons, dtype=torch.uint8)
    status = _library().edge_cpu_signbit_predictor(
        x.data_ptr(), d, n_neurons, packed.data_ptr(), float(alpha), mask.data_ptr()
    )
    _check_status("edge_cpu_signbit_predictor", status)
    return mask.view(torch.bool)


def matvec(
    x: torch.Tensor,  # [in] float32
    weight: torch.Tensor,  # [out, in] float32 or float16, read in place
    bias: torch.Tensor | None = None,  # [out] float32
    out: torch.Tensor | None = None,  # [out] float32, receives y
    threads: int = 0,
) -> torch.Tensor:
    """y [out] float32 = weight @ x (+ bias), fp32 accumulation; bit-identical for any thread count."""
    n_in = _vector_size("x", x)
    _check_tensor("x", x, (torch.float32,), [n_in])
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D tensor [out, in], found {getattr(weight, 'shape', type(weight))}")
    n_out = weight.shape[0]
    _check_tensor("weight", weight, tuple(WEIGHT_DTYPES), [n_out, n_in])
    if bias is not None:
        _check_tensor("bias", bias, (torch.float32,), [n_out])
    if out is None:
        out = torch.empty(n_out, dtype=torch.float32)
    else:
        _check_tensor("out", out, (torch.float32,), [n_out])
    status = _library().edge_cpu_matvec(
        x.data_ptr(),
        n_in,
        n_out,
        weight.data_ptr(),
        WEIGHT_DTYPES[weight.dtype],
        _optional_ptr(bias),
        out.data_ptr(),
        threads,
    )
    _check_status("edge_cpu_matvec", status)
    return out


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """The float32 values the integer dot products of the quantized kernels use for x [..., n] (n a multiple of 32).

    Per block of 32 values: scale = max|x| / 127, t = x * (127 / max|x|) (0 for an all-zero block), high =
    round(t), low = clamp(round(256 (t - high)), -127, 127), value = (high + low / 256) * scale, all in float32
    with ties to even, as the kernels compute them; within scale / 512 of x."""
    blocks = x.float().reshape(*x.shape[:-1], -1, ACTIVATION_BLOCK)
    largest = blocks.abs().amax(dim=-1, keepdim=True)
    scale = largest / 127.0
    # a tensor divided by a tensor: torch computes `127.0 / largest` as reciprocal(largest) * 127, two roundings
    # that miss the kernels' one (IEEE division) for about a quarter of all values
    inverse = torch.where(largest > 0, torch.full_like(largest, 127.0) / largest, torch.zeros_like(largest))
    scaled = blocks * inverse
    high = torch.round(scaled)
    low = torch.round((scaled - high) * 256.0).clamp(-127.0, 127.0)
    return ((high + low / 256.0) * scale).reshape(x.shape)


def matvec_quantized(
    x: torch.Tensor,  # [in] float32
    weight: QuantizedWeight,  # [out, in], read in place
    bias: torch.Tensor | None = None,  # [out] float32
    out: torch.Tensor | None = None,  # [out] float32, receives y
    threads: int = 0,
) -> torch.Tensor:
    """y [out] float32 = dequantize(weight) @ x (+ bias), fp32 accumulation; bit-identical for any thread count.

    x enters as quantized_activations(x) unless ACTIVATIONS_ENV is "fp32" (QUANT.md)."""
    n_in = _vector_size("x", x)
    _check_tensor("x", x, (torch.float32,), [n_in])
    if not isinstance(weight, QuantizedWeight):
        raise ValueError(f"weight: expected a QuantizedWeight, found {type(weight).__name__}")
    n_out = weight.data.shape[0] if weight.data.dim() == 2 else 0
    _check_quantized("weight", weight, n_out, n_in)
    if bias is not None:
        _check_tensor("bias", bias, (torch.float32,), [n_out])
    if out is None:
        out = torch.empty(n_out, dtype=torch.float32)
    else:
        _check_tensor("out", out, (torch.float32,), [n_out])
    status = _library().edge_cpu_matvec_q(
        x.data_ptr(),
        n_in,
        n_out,
        weight.data.data_ptr(),
        weight.scales.data_ptr(),
        _optional_ptr(weight.mins),
        QUANT_FORMATS[weight.format],
        weight.group_size,
        _optional_ptr(bias),
        out.data_ptr(),
        threads,
    )
    _check_status("edge_cpu_matvec_q", status)
    return out


def matvecs(
    x: torch.Tensor,  # [in] float32
    weights: list[torch.Tensor | QuantizedWeight],  # each [rows_i, in]: one storage type (and group size) for all
    biases: list[torch.Tensor | None] | None = None,  # each [rows_i] float32 or None
    threads: int = 0,
) -> list[torch.Tensor]:
    """[weights[i] @ x (+ biases[i])] in one kernel call (edge_cpu_matvecs: x quantized once, one parallel region):
    bit for bit what matvec / matvec_quantized give for each matrix alone. Asymmetric and symmetric int4 matrices of
    one group size may share a call (each matrix its own minimums or none)."""
    n_in = _vector_size("x", x)
    _check_tensor("x", x, (torch.float32,), [n_in])
    if not weights:
        raise ValueError("weights: expected at least one matrix, found none")
    biases = [None] * len(weights) if biases is None else biases
    if len(biases) != len(weights):
        raise ValueError(f"biases: expected {len(weights)} (one per weight), found {len(biases)}")
    storage = {_storage(weight) for weight in weights}
    if len(storage) != 1:
        raise ValueError(f"weights: expected one storage type and group size, found {sorted(storage)}")
    matrices, outputs = (_Matrix * len(weights))(), []
    for i, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
        if isinstance(weight, QuantizedWeight):
            n_out = weight.data.shape[0] if weight.data.dim() == 2 else 0
            _check_quantized(f"weights[{i}]", weight, n_out, n_in)
            data, scales, mins = weight.data, weight.scales, weight.mins
        else:
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                found = getattr(weight, "shape", type(weight).__name__)
                raise ValueError(f"weights[{i}]: expected a 2-D tensor or a QuantizedWeight, found {found}")
            n_out = weight.shape[0]
            data = _check_tensor(f"weights[{i}]", weight, tuple(WEIGHT_DTYPES), [n_out, n_in])
            scales, mins = None, None
        if bias is not None:
            _check_tensor(f"biases[{i}]", bias, (torch.float32,), [n_out])
        out = torch.empty(n_out, dtype=torch.float32)
        dtype, group_size = _storage(weight)
        matrices[i] = _Matrix(
            data.data_ptr(),
            _optional_ptr(scales),
            _optional_ptr(mins),
            dtype,
            group_size,
            n_out,
            _optional_ptr(bias),
            out.data_ptr(),
        )
        outputs.append(out)
    status = _library().edge_cpu_matvecs(x.data_ptr(), n_in, matrices, len(weights), threads)
    _check_status("edge_cpu_matvecs", status)
    return outputs


def _storage(weight: object) -> tuple[int, int]:
    """(the kernels' dtype code, group size) of a weight matrix: fp rows have group size 0."""
    if isinstance(weight, QuantizedWeight):
        return QUANT_FORMATS.get(weight.format, -1), weight.group_size
    return WEIGHT_DTYPES.get(getattr(weight, "dtype", None), -1), 0


class SparseFFNKernel:
    """The sequential SparseFFN of sparsity/ffn.py for one token, on d x D weights, with its workspace.

    The workspace (O(D) bytes) is allocated once here and reused by every call, so a call allocates nothing
    but its output (and not even that when `out` is given). threads <= 0 uses every OpenMP thread.
    """

    def __init__(self, d: int, D: int, threads: int = 0) -> None:
        if d < 1 or D < 1:
            raise ValueError(f"d, D: expected sizes >= 1, found d={d}, D={D}")
        self.d = d
        self.n_neurons = D
        self.threads = threads
        size = _library().edge_cpu_sparse_ffn_workspace_size(d, D, threads)
        self._workspace = torch.empty(size, dtype=torch.uint8)

    def last_call_seconds(self) -> float:
        """Seconds the last successful call (of any kind) took inside the library, from its entry to its return:
        the kernel alone, without the cost of reaching it from Python (edge_cpu_sparse_ffn_call_ns)."""
        return _library().edge_cpu_sparse_ffn_call_ns(self._workspace.data_ptr(), self.d, self.n_neurons) * 1e-9

    def _check_ffn_inputs(self, x, w_gate, w_up, w_down_t, activation) -> None:
        d, n_neurons = self.d, self.n_neurons
        if not isinstance(activation, Activation):
            raise ValueError(f"activation: expected an Activation, found {type(activation).__name__}")
        _check_tensor("x", x, (torch.float32,), [d])
        _check_tensor("w_gate", w_gate, tuple(WEIGHT_DTYPES), [n_neurons, d])
        _check_tensor("w_up", w_up, (w_gate.dtype,), [n_neurons, d])
        _check_tensor("w_down_t", w_down_t, (w_gate.dtype,), [n_neurons, d])

    def _output(self, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            return torch.empty(self.d, dtype=torch.float32)
        _check_tensor("out", out, (torch.float32,), [self.d])
        return out

    def _check_sparse_options(
        self, mask: torch.Tensor | None, thresholds: torch.Tensor | None, active_out: torch.Tensor | None
    ) -> None:
        """The optional inputs and output of the sparse kernels, fp and quantized alike."""
        n_neurons = self.n_neurons
        if mask is not None:
            _check_tensor("mask", mask, (torch.bool,), [n_neurons])
        if thresholds is not None:
            _check_tensor("thresholds", thresholds, (torch.float32,), [n_neurons])
        if active_out is not None:
            _check_tensor("active_out", active_out, (torch.bool,), [n_neurons])

    def __call__(
        self,
        x: torch.Tensor,  # [d] float32
        w_gate: torch.Tensor,  # [D, d] float32 or float16
        w_up: torch.Tensor,  # [D, d], same dtype as w_gate
        w_down_t: torch.Tensor,  # [D, d], W_down transposed, same dtype as w_gate
        activation: Activation,
        mask: torch.Tensor | None = None,  # [D] bool, None = every neuron a candidate (zeros still skipped)
        thresholds: torch.Tensor | None = None,  # [D] float32 CHESS thresholds on |act.gate(g)|
        out: torch.Tensor | None = None,  # [d] float32, receives y
        active_out: torch.Tensor | None = None,  # [D] bool, receives the neurons that reached up/down
    ) -> torch.Tensor:
        """y [d] float32 = sparse_ffn(x, w_gate, w_up, w_down_t, mask, activation, thresholds=...).output."""
        d, n_neurons = self.d, self.n_neurons
        self._check_ffn_inputs(x, w_gate, w_up, w_down_t, activation)
        self._check_sparse_options(mask, thresholds, active_out)
        out = self._output(out)
        status = _library().edge_cpu_sparse_ffn(
            x.data_ptr(),
            d,
            n_neurons,
            w_gate.data_ptr(),
            w_up.data_ptr(),
            w_down_t.data_ptr(),
            WEIGHT_DTYPES[w_gate.dtype],
            _optional_ptr(mask),
            _optional_ptr(thresholds),
            ACTIVATIONS[activation.kind],
            activation.threshold,
            out.data_ptr(),
            self._workspace.data_ptr(),
            self.threads,
            _optional_ptr(active_out),
        )
        _check_status("edge_cpu_sparse_ffn", status)
        return out

    def dense(
        self,
        x: torch.Tensor,  # [d] float32
        w_gate: torch.Tensor,  # [D, d] float32 or float16
        w_up: torch.Tensor,  # [D, d], same dtype as w_gate
        w_down_t: torch.Tensor,  # [D, d], W_down transposed, same dtype as w_gate
        activation: Activation,
        out: torch.Tensor | None = None,  # [d] float32, receives y
    ) -> torch.Tensor:
        """y [d] float32 = dense_ffn(x, ...): every neuron's gate, up and down rows, zeros included (the dense
        baseline a runtime without activation sparsity computes)."""
        d, n_neurons = self.d, self.n_neurons
        self._check_ffn_inputs(x, w_gate, w_up, w_down_t, activation)
        out = self._output(out)
        status = _library().edge_cpu_dense_ffn(
            x.data_ptr(),
            d,
            n_neurons,
            w_gate.data_ptr(),
            w_up.data_ptr(),
            w_down_t.data_ptr(),
            WEIGHT_DTYPES[w_gate.dtype],
            ACTIVATIONS[activation.kind],
            activation.threshold,
            out.data_ptr(),
            self._workspace.data_ptr(),
            self.threads,
        )
        _check_status("edge_cpu_dense_ffn", status)
        return out

    def quantized(
        self,
        x: torch.Tensor,  # [d] float32
        w_gate: QuantizedWeight,  # [D, d]
        w_up: QuantizedWeight,  # [D, d], same format and group size as w_gate
        w_down_t: QuantizedWeight,  # [D, d], W_down transposed, w_gate's format (or int8 under int4) and group size
        activation: Activation,
        mask: torch.Tensor | None = None,  # [D] bool, None = every neuron a candidate (zeros still skipped)
        thresholds: torch.Tensor | None = None,  # [D] float32 CHESS thresholds on |act.gate(g)|
        out: torch.Tensor | None = None,  # [d] float32, receives y
        active_out: torch.Tensor | None = None,  # [D] bool, receives the neurons that reached up/down
    ) -> torch.Tensor:
        """As __call__ on the dequantized weights, reading the quantized rows in place (edge_cpu_sparse_ffn_q); the
        gate and up rows are dotted with quantized_activations(x) unless ACTIVATIONS_ENV is "fp32". w_down_t may be
        int8 under int4 gate and up (a bundle's down_dtype int8: the down projection kept wider). Asymmetric int4:
        gate, up and int4 down all with mins, or none of them (int8 rows have none)."""
        d, n_neurons = self.d, self.n_neurons
        if not isinstance(activation, Activation):
            raise ValueError(f"activation: expected an Activation, found {type(activation).__name__}")
        _check_tensor("x", x, (torch.float32,), [d])
        for name, weight in (("w_gate", w_gate), ("w_up", w_up), ("w_down_t", w_down_t)):
            _check_quantized(name, weight, n_neurons, d)
            int8_down = name == "w_down_t" and (w_gate.format, weight.format) == ("int4", "int8")
            if (weight.format, weight.group_size) != (w_gate.format, w_gate.group_size) and not (
                int8_down and weight.group_size == w_gate.group_size
            ):
                wanted = (
                    f"{w_gate.format} (or int8)" if name == "w_down_t" and w_gate.format == "int4" else w_gate.format
                )
                raise ValueError(
                    f"{name}: expected format {wanted} and group_size {w_gate.group_size} as w_gate, found "
                    f"{weight.format} and {weight.group_size}"
                )
            if weight.asymmetric != w_gate.asymmetric and not int8_down:
                kinds = {True: "asymmetric (mins)", False: "symmetric (mins None)"}
                raise ValueError(
                    f"{name}.mins: expected {kinds[w_gate.asymmetric]} as w_gate (gate, up and int4 down all "
                    f"asymmetric or none), found {kinds[weight.asymmetric]}"
                )
        self._check_sparse_options(mask, thresholds, active_out)
        out = self._output(out)
        status = _library().edge_cpu_sparse_ffn_q(
            x.data_ptr(),
            d,
            n_neurons,
            w_gate.data.data_ptr(),
            w_gate.scales.data_ptr(),
            _optional_ptr(w_gate.mins),
            w_up.data.data_ptr(),
            w_up.scales.data_ptr(),
            _optional_ptr(w_up.mins),
            w_down_t.data.data_ptr(),
            w_down_t.scales.data_ptr(),
            _optional_ptr(w_down_t.mins),
            QUANT_FORMATS[w_gate.format],
            QUANT_FORMATS[w_down_t.format],
            w_gate.group_size,
            _optional_ptr(mask),
            _optional_ptr(thresholds),
            ACTIVATIONS[activation.kind],
            activation.threshold,
            out.data_ptr(),
            self._workspace.data_ptr(),
            self.threads,
            _optional_ptr(active_out),
        )
        _check_status("edge_cpu_sparse_ffn_q", status)
        return out
