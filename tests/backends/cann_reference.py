"""A CPU reference of torch_npu's weight-quant matmul operators, written from their documented semantics, which the
tests hand the CANN engine in place of backends/cann/quantized.TorchNpuWeightQuant.

torch_npu API reference, "torch_npu.npu_weight_quant_batchmatmul": y = x @ ANTIQUANT(weight) + bias with
ANTIQUANT(weight) = (weight + antiquant_offset) * antiquant_scale; x two-dimensional (M, K); weight (K, N), int8 or
int32 carrying eight int4 values each (from npu_convert_weight_to_int4pack), transposed views allowed; per-group scale
(ceil(K / G), N) with antiquant_group_size G a multiple of 32 in [32, K - 1], per-channel scale (1, N) or (N,) with
G = 0; scale dtype equal to x's; K and N at most 65535; no empty tensors; the result in x's dtype.
"torch_npu.npu_convert_weight_to_int4pack": contiguous int32 (n, k) with values in [-8, 7], k a multiple of 8 ->
int32 (n, k / 8).

Where the documentation leaves a choice to the operator, the reference makes one and says so: the order of the eight
nibbles in a packed word ("交叠排放", interleaved, is all the documentation says) is value 8j + i in bits 4i..4i + 3
of word j, which is also what op-plugin's convert_to_int4_pack does on the host (Ascend/op-plugin,
op_plugin/ops/opapi/ConvertWeightToINT4PackKernelNpuOpApi.cpp); only the reference's own matmul reads it, exactly as
the engine treats the NPU's packed words as opaque rows. The NPU takes x in fp16 or bf16; the reference also takes
float32, the compute dtype of the CPU tests, and computes in float64 before rounding to x's dtype (the NPU's
accumulation order and precision are its own, unverified here).

How an int32 weight's K is read is the op-plugin wrapper's (op_plugin/ops/opapi/WeightQuantBatchMatmulV2KernelNpuOpApi
.cpp): K = 8 * weight.size(-2) only when op_plugin::utils::is_transpose_last_two_dims(weight) holds, else
K = weight.size(-2) and N = 8 * weight.size(-1) (int4 packed along N). is_transpose_last_two_dims
(op_plugin/utils/OpUtils.cpp) asks for the transpose of a whole tensor: stride(-2) == 1, stride(-1) == size(-2), the
storage's base sizes the transposed shape and numel equal to the storage's size. The transpose of a row slice of
pack_int4's (N, K / 8) words covers part of its storage, so the wrapper reads it as (K, N / 8) and refuses it: "The k
of x and weight should be equal". The reference reads the layout the same way (_whole_transpose stands in for the
storage checks on the CPU).
"""

from __future__ import annotations

import torch

MAX_DIM = 65535
X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class ReferenceWeightQuant:
    """WeightQuantOps (backends/cann/quantized.py) on the CPU; counts its calls so tests can see the path taken."""

    def __init__(self):
        self.matmul_calls = 0
        self.pack_calls = 0

    def pack_int4(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dtype != torch.int32 or codes.dim() != 2 or not codes.is_contiguous():
            raise ValueError(
                f"pack_int4: expected a contiguous 2-D int32 tensor, found {codes.dtype} {list(codes.shape)}"
            )
        rows, cols = codes.shape
        if cols % 8:
            raise ValueError(f"pack_int4: the last dimension must be a multiple of 8, found {cols}")
        if int(codes.min()) < -8 or int(codes.max()) > 7:
            raise ValueError("pack_int4: values must lie in [-8, 7]")
        self.pack_calls += 1
        nibbles = (codes & 0xF).view(rows, cols // 8, 8).to(torch.int64)
        shifts = torch.arange(0, 32, 4, dtype=torch.int64)
        words = (nibbles << shifts).sum(-1)  # < 2^32
        return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)

    @staticmethod
    def unpack_int4(words: torch.Tensor) -> torch.Tensor:
        """int32 (n, k / 8) of pack_int4 -> int64 codes (n, k)."""
        shifts = torch.arange(0, 32, 4, dtype=torch.int64)
        nibbles = (words.to(torch.int64)[..., None] >> shifts) & 0xF
        return (torch.where(nibbles >= 8, nibbles - 16, nibbles)).reshape(words.shape[0], -1)

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
        if x.dim() != 2 or x.dtype not in X_DTYPES:
            raise ValueError(f"x: expected 2-D (M, K) fp16 / bf16 (fp32 on the CPU), found {x.dtype} {list(x.shape)}")
        if scale.dtype != x.dtype:
            raise ValueError(f"antiquant_scale: dtype must equal x's {x.dtype}, found {scale.dtype}")
        k = x.shape[1]
        if weight.dtype == torch.int8:
            if weight.shape[0] != k:
                raise ValueError(f"weight: expected (K={k}, N), found {list(weight.shape)}")
            codes = weight.to(torch.int64)
        elif weight.dtype == torch.int32:
            if _whole_transpose(weight):  # the transposed view of pack_int4's (N, K / 8): K = 8 * size(0)
                weight_k, codes = weight.shape[0] * 8, lambda: self.unpack_int4(weight.T).T
            else:  # read as (K, N / 8), int4 packed along N, as the wrapper does
                weight_k, codes = weight.shape[0], lambda: self.unpack_int4(weight)
            if weight_k != k:
                raise ValueError(
                    f"The k of x and weight should be equal. but x_k_dim is {k}, weight_k_dim is {weight_k} "
                    f"(int32 weight {list(weight.shape)}, strides {list(weight.stride())}: K = 8 * size(0) only for "
                    "the transpose of a whole contiguous tensor)"
                )
            codes = codes()
        else:
            raise ValueError(f"weight: expected int8 or int32, found {weight.dtype}")
        n = codes.shape[1]
        if not (1 <= k <= MAX_DIM and 1 <= n <= MAX_DIM and x.shape[0] >= 1):
            raise ValueError(f"K = {k} and N = {n} must lie in [1, {MAX_DIM}], M >= 1")
        if group_size:
            if group_size % 32 or not 32 <= group_size <= k - 1:
                raise ValueError(
                    f"antiquant_group_size: expected a multiple of 32 in [32, K - 1 = {k - 1}], found {group_size}"
                )
            groups = -(-k // group_size)
            if tuple(scale.shape) != (groups, n):
                raise ValueError(f"antiquant_scale: per-group shape must be ({groups}, {n}), found {list(scale.shape)}")
            full_scale = scale.to(torch.float64).repeat_interleave(group_size, dim=0)[:k]
        else:
            if tuple(scale.shape) not in ((1, n), (n,)):
                raise ValueError(
                    f"antiquant_scale: per-channel shape must be (1, {n}) or ({n},), found {list(scale.shape)}"
                )
            full_scale = scale.to(torch.float64).reshape(1, n)
        self.matmul_calls += 1
        return (x.to(torch.float64) @ (codes.to(torch.float64) * full_scale)).to(x.dtype)


def _whole_transpose(weight: torch.Tensor) -> bool:
    """op_plugin::utils::is_transpose_last_two_dims on the CPU: weight is the transpose of a whole contiguous 2-D
    tensor (strides (1, size(0)), no storage offset, numel equal to its storage's)."""
    return (
        weight.dim() == 2
        and weight.stride(0) == 1
        and weight.stride(1) == weight.shape[0]
        and weight.storage_offset() == 0
        and weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
    )
