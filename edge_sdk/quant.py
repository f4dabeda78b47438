"""Group-wise weight-only INT8 / INT4 quantization of weight rows (kernels/cpu/QUANT.md), in numpy only.

The format the CPU kernels read (edge_cpu_sparse_ffn_q, edge_cpu_matvec_q): each row of a [rows, cols] matrix is
cut into groups of `group_size` consecutive values, each group with one fp16 scale; a value is its integer code
times its group's scale. Asymmetric int4 (llama.cpp's Q4_1 grid) adds one fp16 minimum per group: a value is
(code + 8) * scale + minimum, the codes' bytes unchanged. Torch-free, so that the exporter and the device install
can both use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMATS = ("int8", "int4")
# how int4 codes map to values: "symmetric", code * scale (llama.cpp's Q4_0 grid), or "asymmetric",
# (code + 8) * scale + min (Q4_1's grid)
INT4_SCHEMES = ("symmetric", "asymmetric")
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 32  # chosen on held-out perplexity against bytes per weight (QUANT.md, "Quality")
# Values per int4 block: 16 bytes hold values k (low nibble of byte k) and k + 16 (high nibble), k < 16, each nibble
# the 4-bit two's complement of its code q in [-8, 7] (q & 0xF): ONNX's INT4, TensorRT's signed INT4.
INT4_BLOCK = 32
INT4_MIN, INT4_MAX = -8, 7
# Codes the extreme value of a group maps to: +-127 for int8; -8 for int4, whose scale carries the sign of
# -max so that the whole range [-8, 7] is used (llama.cpp's Q4_0 choice, see QUANT.md).
_INT8_LIMIT = 127
_INT4_EXTREME = -8
# asymmetric int4: code + INT4_MIN_OFFSET in [0, 15] counts steps of the group's scale up from its minimum
INT4_MIN_OFFSET = 8
_INT4_STEPS = 15
_FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class QuantizedMatrix:
    """A [rows, cols] matrix in the kernels' format."""

    format: str  # "int8" or "int4"
    group_size: int  # values per scale: 32, 64 or 128
    data: np.ndarray  # int8 [rows, cols] (int8), or uint8 [rows, cols // 2] (int4, packed, see pack_int4)
    scales: np.ndarray  # float16 [rows, cols // group_size]
    # float16 [rows, cols // group_size]: asymmetric int4's group minimums, None for the symmetric formats
    mins: np.ndarray | None = None

    @property
    def asymmetric(self) -> bool:
        return self.mins is not None

    @property
    def shape(self) -> tuple[int, int]:
        rows, width = self.data.shape
        return rows, width * (2 if self.format == "int4" else 1)

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads for the whole matrix: codes plus scales (plus minimums)."""
        return self.data.nbytes + self.scales.nbytes + (0 if self.mins is None else self.mins.nbytes)


def _check_layout(format: str, group_size: int, shape: tuple[int, ...]) -> None:
    if format not in FORMATS:
        raise ValueError(f"format: expected one of {', '.join(FORMATS)}, found {format!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES}, found {group_size}")
    if len(shape) != 2 or 0 in shape:
        raise ValueError(f"weight: expected a non-empty 2-D [rows, cols] matrix, found shape {list(shape)}")
    if shape[1] % group_size != 0:
        raise ValueError(f"weight: cols must be a multiple of group_size {group_size}, found {shape[1]}")


def _scales_away_from_zero(ideal: np.ndarray) -> np.ndarray:
    """ideal rounded to fp16 away from zero, so that |extreme / scale| <= |code of the extreme| and no code clamps
    (round-to-nearest could make the extreme round past the code range; in the subnormal range, by a lot)."""
    scales = ideal.astype(np.float16)
    short = np.abs(scales.astype(np.float64)) < np.abs(ideal)
    scales[short] = np.nextafter(scales[short], np.copysign(np.inf, ideal[short]).astype(np.float16))
    return scales


def quantize(weight: np.ndarray, format: str, group_size: int, asymmetric: bool = False) -> QuantizedMatrix:
    """Round-to-nearest (ties to even) codes of `weight` [rows, cols], any float dtype, per group of group_size.

    int8: scale = max|w| / 127, codes in [-127, 127]. int4: scale = -m / 8 for m the group's value of largest
    magnitude, codes in [-8, 7]. Scales are rounded to fp16 away from zero before the codes are computed from
    them; an all-zero group gets scale 0 and codes 0. asymmetric (int4 only): see _quantize_asymmetric.
    ValueError for non-finite weights or a scale beyond fp16.
    """
    weight = np.asarray(weight)
    _check_layout(format, group_size, weight.shape)
    if asymmetric and format != "int4":
        raise ValueError(f"asymmetric: only int4 has group minimums, found format {format!r}")
    if not np.isfinite(weight).all():
        raise ValueError("weight: expected finite values, found inf or NaN")
    rows, cols = weight.shape
    groups = weight.astype(np.float64).reshape(rows, cols // group_size, group_size)
    if asymmetric:
        return _quantize_asymmetric(groups, group_size)
    if format == "int8":
        ideal = np.abs(groups).max(axis=2) / _INT8_LIMIT
        low, high = -_INT8_LIMIT, _INT8_LIMIT
    else:
        extreme = np.take_along_axis(groups, np.abs(groups).argmax(axis=2)[..., None], axis=2)[..., 0]
        ideal = extreme / _INT4_EXTREME
        low, high = _INT4_EXTREME, -_INT4_EXTREME - 1
    if np.abs(ideal).max() > _FP16_MAX:
        raise ValueError(
            f"weight: a group's scale exceeds fp16's range ({_FP16_MAX}); max |w| = {np.abs(weight).max()}"
        )
    scales = _scales_away_from_zero(ideal)
    divisor = scales.astype(np.float64)[..., None]
    codes = np.divide(groups, divisor, out=np.zeros_like(groups), where=divisor != 0)
    codes = np.clip(np.rint(codes), low, high).astype(np.int8).reshape(rows, cols)
    data = codes if format == "int8" else pack_int4(codes)
    return QuantizedMatrix(format, group_size, data, scales)


def _quantize_asymmetric(groups: np.ndarray, group_size: int) -> QuantizedMatrix:
    """Asymmetric int4 of float64 groups [rows, n_groups, group_size], Q4_1's rule: minimum = the group's smallest
    value and scale = (largest - minimum) / 15, both rounded to the nearest fp16, steps = round((w - minimum) /
    scale) clamped to [0, 15], code = steps - 8. A group that llama.cpp's Q4_1 quantized comes back with its own
    minimum, scale and codes, so its values are reproduced exactly. A constant group gets scale 0 and steps 0."""
    low, high = groups.min(axis=2), groups.max(axis=2)
    ideal = (high - low) / _INT4_STEPS
    if max(np.abs(low).max(), np.abs(high).max(), ideal.max()) > _FP16_MAX:
        raise ValueError(f"weight: a group's minimum or scale exceeds fp16's range ({_FP16_MAX})")
    mins, scales = low.astype(np.float16), ideal.astype(np.float16)
    divisor = scales.astype(np.float64)[..., None]
    steps = np.divide(
        groups - mins.astype(np.float64)[..., None], divisor, out=np.zeros_like(groups), where=divisor != 0
    )
    codes = (np.clip(np.rint(steps), 0, _INT4_STEPS) - INT4_MIN_OFFSET).astype(np.int8)
    rows = groups.shape[0]
    return QuantizedMatrix("int4", group_size, pack_int4(codes.reshape(rows, -1)), scales, mins)


def dequantize(matrix: QuantizedMatrix) -> np.ndarray:
    """float32 [rows, cols]: code * scale, each product exact in float32 (an 8-bit code times an fp16 scale); for
    asymmetric int4 (code + 8) * scale + minimum, the product exact and the sum rounded once, as llama.cpp
    dequantizes Q4_1."""
    _check_layout(matrix.format, matrix.group_size, matrix.shape)
    codes = matrix.data if matrix.format == "int8" else unpack_int4(matrix.data)
    rows, cols = codes.shape
    groups = codes.astype(np.float32).reshape(rows, cols // matrix.group_size, matrix.group_size)
    if matrix.mins is None:
        return (groups * matrix.scales.astype(np.float32)[..., None]).reshape(rows, cols)
    steps = groups + np.float32(INT4_MIN_OFFSET)
    values = steps * matrix.scales.astype(np.float32)[..., None] + matrix.mins.astype(np.float32)[..., None]
    return values.reshape(rows, cols)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """int8 codes [rows, cols] in [-8, 7], cols a multiple of 32 -> uint8 [rows, cols // 2].

    Per block of 32 values, byte k holds code k in its low nibble and code k + 16 in its high nibble, each as its
    4-bit two's complement (code & 0xF), so one 16-byte load unpacks into 16 consecutive codes each (QUANT.md)."""
    rows, cols = codes.shape
    if cols % INT4_BLOCK != 0:
        raise ValueError(f"codes: cols must be a multiple of {INT4_BLOCK}, found {cols}")
    if codes.min(initial=0) < INT4_MIN or codes.max(initial=0) > INT4_MAX:
        raise ValueError(f"codes: expected values in [{INT4_MIN}, {INT4_MAX}], found [{codes.min()}, {codes.max()}]")
    nibbles = (codes.astype(np.int8).view(np.uint8) & 0x0F).reshape(rows, cols // INT4_BLOCK, 2, 16)
    return (nibbles[:, :, 0, :] | (nibbles[:, :, 1, :] << 4)).reshape(rows, cols // 2)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """uint8 [rows, cols // 2] of pack_int4 -> int8 codes [rows, cols]."""
    rows, width = packed.shape
    blocks = packed.reshape(rows, width // 16, 1, 16).view(np.int8)
    # sign-extended by shifts: the low nibble moved to the top, then both arithmetic-shifted down
    nibbles = np.concatenate([blocks << 4, blocks], axis=2) >> 4
    return nibbles.reshape(rows, width * 2)
