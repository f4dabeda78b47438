"""int8 / int4 bundles on the Ascend backend: which product each chip runs, and the quantized matrices on the device.

A quantized bundle stores every matrix but the embedding as codes plus fp16 scales, one scale per group of G values
along each row (kernels/cpu/QUANT.md). Two ways to multiply by such a matrix W [N, K] on an NPU:

- weight-quant matmul: `torch_npu.npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_group_size=G)`
  computes x @ ((weight + offset) * scale) for weight (K, N) int8, or int4 packed eight to an int32 by
  `torch_npu.npu_convert_weight_to_int4pack`, with per-group scales (ceil(K / G), N): the transposed view of the
  bundle's rows and scales, read by the cube without a dequantized copy in memory. Per-group scales and int4 weights
  are documented for the Atlas A2 / A3 series only (910B, 910_93); the Atlas inference series (310P) takes int8
  weights with per-channel or per-tensor scales and no antiquant_group_size, so this format cannot reach it.
- dequantize: the rows needed are gathered as codes, widened to the compute dtype, multiplied by their scales and
  fed to a plain fp16 matmul. Works on every chip.

What runs where (choose_quant_path, at engine start): gate and up rows and the dense projections go through the
weight-quant matmul where the chip has it; the down rows are always dequantized on gather, because the operator's
groups run along K and W_down_t's groups run along its output dimension (a neuron-major row is grouped along d). On
the dequantize path the dense projections and the LM head are dequantized once at load (fp16 resident): dequantizing
a whole matrix at every token would write and read it again in fp16, 5 bytes per weight moved instead of 2, whereas
the FFN touches only its active rows. int4 codes are widened to int8 at load on the dequantize path: unpacking
nibbles at every token is int32 bitwise work, which the 310P runs on the AI CPU (README.md, "The sign-bit path").
Asymmetric int4 bundles (group minimums: value (code + 8) * scale + min) take the dequantize path on every chip: the
weight-quant matmul's antiquant_offset is added to the code before the scale multiplies it, so a minimum would have to
become min / scale, which a constant group (scale 0) cannot express and fp16 rounds.

The two torch_npu operators are called through one object (TorchNpuWeightQuant) handed to the matrices, so the tests
run the same code with a reference implementation of the documented semantics in its place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from edge_sdk import quant
from edge_sdk.errors import EdgeSdkError

WEIGHT_QUANT_MATMUL = "weight-quant-matmul"
DEQUANTIZE = "dequantize"
QUANT_ENV = "EDGE_SDK_CANN_QUANT"  # auto (the chip decides) | dequantize (A/B runs on an A2)
QUANT_CHOICES = ("auto", DEQUANTIZE)
# Device-name prefixes (torch_npu.npu.get_device_name) of the chips whose npu_weight_quant_batchmatmul takes per-group
# scales and int4 weights: Atlas A2 (Ascend910B1..B4) and A3 (Ascend910_93xx). torch_npu API reference,
# "torch_npu.npu_weight_quant_batchmatmul", table 1 and the weight / antiquant_group_size parameters.
PER_GROUP_CHIPS = ("Ascend910B", "Ascend910_93")
INFERENCE_SERIES_CHIPS = ("Ascend310P",)
# The operator's K and N are each at most 65535 ("约束说明"); a longer N (a vocabulary) is cut into slices.
MAX_MATMUL_DIM = 65535


@dataclass(frozen=True)
class QuantPlan:
    """The product a quantized bundle's gate, up and dense matrices go through on this chip, and why."""

    path: str  # WEIGHT_QUANT_MATMUL or DEQUANTIZE
    reason: str


def choose_quant_path(
    device_name: str, torch_npu, bundle_dtype: str, requested: str = "auto", asymmetric: bool = False
) -> QuantPlan:
    """The plan for a bundle of bundle_dtype (int8 | int4; asymmetric: int4 with group minimums) on the chip
    torch_npu names device_name."""
    if requested not in QUANT_CHOICES:
        raise EdgeSdkError(f"${QUANT_ENV}: expected one of {', '.join(QUANT_CHOICES)}, found {requested!r}")
    if requested == DEQUANTIZE:
        return QuantPlan(DEQUANTIZE, f"${QUANT_ENV}=dequantize: rows dequantized to fp16 on gather")
    if asymmetric:
        return QuantPlan(
            DEQUANTIZE,
            "asymmetric int4: npu_weight_quant_batchmatmul adds its offset to the code before scaling, which cannot "
            "express a group minimum exactly, so the rows are dequantized to fp16 on gather",
        )
    if device_name.startswith(INFERENCE_SERIES_CHIPS):
        return QuantPlan(
            DEQUANTIZE,
            f"{device_name}: the Atlas inference series has no group-wise quantized matmul "
            "(npu_weight_quant_batchmatmul takes int8 with per-channel scales only there, no int4), so the "
            f"{bundle_dtype} rows are dequantized to fp16 on gather and the dense matrices once at load",
        )
    if not device_name.startswith(PER_GROUP_CHIPS):
        return QuantPlan(
            DEQUANTIZE,
            f"{device_name}: npu_weight_quant_batchmatmul's per-group scales are documented for Atlas A2 / A3 "
            "(Ascend910B*, Ascend910_93*) only, so the rows are dequantized to fp16",
        )
    needed = ["npu_weight_quant_batchmatmul"] + (["npu_convert_weight_to_int4pack"] if bundle_dtype == "int4" else [])
    missing = [name for name in needed if not hasattr(torch_npu, name)]
    if missing:
        return QuantPlan(
            DEQUANTIZE,
            f"torch_npu {getattr(torch_npu, '__version__', '?')} lacks {', '.join(missing)}, so the rows are "
            "dequantized to fp16",
        )
    return QuantPlan(
        WEIGHT_QUANT_MATMUL,
        f"{device_name}: gate, up and dense {bundle_dtype} matrices through npu_weight_quant_batchmatmul "
        "(per-group scales), down rows dequantized on gather",
    )


def requested_quant_path() -> str:
    """$EDGE_SDK_CANN_QUANT, auto by default."""
    return os.environ.get(QUANT_ENV, "auto")


class WeightQuantOps(Protocol):
    """The two torch_npu operators of the weight-quant matmul path."""

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
        """x (M, K) @ (weight * scale): weight (K, N) int8, or (K / 8, N) int32 of pack_int4; scale (K / G, N), or
        (1, N) per channel with group_size 0; the result (M, N) in x's dtype."""
        ...

    def pack_int4(self, codes: torch.Tensor) -> torch.Tensor:
        """int32 codes (n, k) in [-8, 7], contiguous, k a multiple of 8 -> int32 (n, k / 8) in the operator's order."""
        ...


class TorchNpuWeightQuant:
    """WeightQuantOps on the NPU: torch_npu's operators as its API reference documents them."""

    def __init__(self, torch_npu):
        self.torch_npu = torch_npu

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
        return self.torch_npu.npu_weight_quant_batchmatmul(x, weight, scale, antiquant_group_size=group_size)

    def pack_int4(self, codes: torch.Tensor) -> torch.Tensor:
        return self.torch_npu.npu_convert_weight_to_int4pack(codes)


def _codes(matrix: quant.QuantizedMatrix) -> np.ndarray:
    """int8 codes [rows, cols] of either format (int4 unpacked, one code per byte)."""
    return matrix.data if matrix.format == "int8" else quant.unpack_int4(matrix.data)


class DequantizingMatrix:
    """A quantized matrix [rows, cols] on the dequantize path: int8 codes (int4 widened at load; asymmetric int4 as
    code + 8, its steps above the minimum) and scales (and minimums) in the compute dtype, on the device; rows are
    dequantized when they are gathered."""

    def __init__(self, matrix: quant.QuantizedMatrix, device: torch.device, dtype: torch.dtype):
        self.group_size = matrix.group_size
        codes = _codes(matrix)
        if matrix.mins is not None:
            codes = codes + np.int8(quant.INT4_MIN_OFFSET)
        self.codes = torch.from_numpy(np.ascontiguousarray(codes)).to(device)  # [rows, cols] int8
        self.scales = torch.from_numpy(matrix.scales).to(device=device, dtype=dtype)  # [rows, cols / G], exact
        self.mins = None if matrix.mins is None else torch.from_numpy(matrix.mins).to(device=device, dtype=dtype)
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def rows(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The rows [k] (None: all) dequantized, [k, cols] in the compute dtype: code * scale, one rounding
        (asymmetric: (code + 8) * scale + min, a rounding each)."""
        codes = self.codes if rows is None else self.codes.index_select(0, rows)
        scales = self.scales if rows is None else self.scales.index_select(0, rows)
        count = codes.shape[0]
        grouped = codes.view(count, -1, self.group_size).to(self.dtype) * scales.unsqueeze(-1)
        if self.mins is not None:
            mins = self.mins if rows is None else self.mins.index_select(0, rows)
            grouped = grouped + mins.unsqueeze(-1)
        return grouped.view(count, -1)

    def product(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, cols] @ W[rows]^T -> [M, k]."""
        return x @ self.rows(rows).T


class WeightQuantMatrix:
    """A quantized matrix [rows, cols] on the weight-quant matmul path: codes in the operator's layout (int8 [rows,
    cols]; int4 as pack_int4's int32 [rows, cols / 8], one row per matrix row, so rows gather as before) and scales in
    the compute dtype, on the device. A product passes the gathered rows' transposed views as the operator's (K, N)
    weight and (K / G, N) scales.

    Every weight handed to the operator is the transpose of a whole tensor of its own: torch_npu's wrapper reads an
    int32 weight as int4 packed along K (K = 8 * size(0)) only when op_plugin::utils::is_transpose_last_two_dims holds,
    which asks for numel equal to the storage's size; the transpose of a row slice of one tensor fails that and is read
    as (K, N / 8), a K mismatch. So a matrix of more than MAX_MATMUL_DIM rows (a vocabulary) is held as blocks of at
    most MAX_MATMUL_DIM rows, each its own tensor, and a gather of more rows than that is copied block by block."""

    def __init__(self, matrix: quant.QuantizedMatrix, device: torch.device, dtype: torch.dtype, ops: WeightQuantOps):
        if matrix.mins is not None:
            raise ValueError("an asymmetric int4 matrix takes the dequantize path (choose_quant_path)")
        self.ops = ops
        cols = matrix.shape[1]
        if matrix.format == "int8":
            codes = torch.from_numpy(np.ascontiguousarray(matrix.data)).to(device)
        else:  # the operator's nibble order is its own: hand it the codes and keep what it packs
            codes = ops.pack_int4(torch.from_numpy(quant.unpack_int4(matrix.data)).to(torch.int32).to(device))
        self.code_blocks = _row_blocks(codes)
        del codes
        scales = torch.from_numpy(matrix.scales).to(device=device, dtype=dtype)  # [rows, cols / G]
        self.scale_blocks = _row_blocks(scales)
        # antiquant_group_size must lie in [32, K - 1]: a row of one group is the per-channel mode, scale (1, N)
        self.group_size = 0 if cols == matrix.group_size else matrix.group_size
        self.cols = cols

    @property
    def shape(self) -> tuple[int, int]:
        return sum(block.shape[0] for block in self.code_blocks), self.cols

    @property
    def codes(self) -> torch.Tensor:
        """All codes as one tensor (a copy when the matrix is held in blocks)."""
        return self.code_blocks[0] if len(self.code_blocks) == 1 else torch.cat(self.code_blocks)

    def product(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, cols] @ W[rows]^T -> [M, k] in x's dtype, N sliced to the operator's limit."""
        if rows is None:
            blocks = zip(self.code_blocks, self.scale_blocks, strict=True)
        else:
            codes, scales = _gather(self.code_blocks, rows), _gather(self.scale_blocks, rows)
            blocks = zip(_row_blocks(codes), _row_blocks(scales), strict=True)
        slices = [self.ops.matmul(x, codes.T, scales.T, self.group_size) for codes, scales in blocks]
        return slices[0] if len(slices) == 1 else torch.cat(slices, dim=1)


def _row_blocks(tensor: torch.Tensor) -> list[torch.Tensor]:
    """tensor [n, ...] as blocks of at most MAX_MATMUL_DIM rows, each a tensor of its own (the tensor itself when it
    fits: no copy)."""
    if tensor.shape[0] <= MAX_MATMUL_DIM:
        return [tensor]
    return [tensor[start : start + MAX_MATMUL_DIM].clone() for start in range(0, tensor.shape[0], MAX_MATMUL_DIM)]


def _gather(blocks: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """The rows [k] of the matrix held as blocks, [k, ...], a new tensor; across blocks without a host
    synchronisation (each block is gathered at the rows clamped into it and kept where the row lies in it)."""
    if len(blocks) == 1:
        return blocks[0].index_select(0, rows)
    gathered, start = None, 0
    for block in blocks:
        local = rows - start
        picked = block.index_select(0, local.clamp(0, block.shape[0] - 1))
        inside = ((local >= 0) & (local < block.shape[0])).view(-1, *([1] * (block.dim() - 1)))
        gathered = picked if gathered is None else torch.where(inside, picked, gathered)
        start += block.shape[0]
    return gathered


def device_matrix(
    matrix: quant.QuantizedMatrix, device: torch.device, dtype: torch.dtype, ops: WeightQuantOps | None
) -> DequantizingMatrix | WeightQuantMatrix:
    """The matrix for products x @ W^T: through the weight-quant matmul when ops are given, else dequantizing."""
    if ops is None:
        return DequantizingMatrix(matrix, device, dtype)
    return WeightQuantMatrix(matrix, device, dtype, ops)


@dataclass
class QuantizedFFN:
    """One layer's FFN matrices: gate and up rows for products (either path), down rows dequantized on gather."""

    gate: DequantizingMatrix | WeightQuantMatrix
    up: DequantizingMatrix | WeightQuantMatrix
    down: DequantizingMatrix


class QuantizedLinear(torch.nn.Module):
    """A projection y = x W^T (+ bias) through the weight-quant matmul, for any number of tokens."""

    def __init__(self, weight: WeightQuantMatrix, bias: torch.Tensor | None):
        super().__init__()
        self.weight_q = weight
        self.bias = bias  # [out] in the compute dtype, or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]; the operator takes 2-D x
        y = self.weight_q.product(x.reshape(-1, x.shape[-1]))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], y.shape[-1])
