"""Write a safetensors file one tensor at a time.

safetensors' own save_file needs every tensor in memory at once; the exporter streams a model layer by
layer instead, so it declares all names, dtypes and shapes first, writes the header, then appends each
tensor's bytes in the declared order. The file is standard safetensors (read back with safe_open).
Tensors are laid out widest dtype first, so every tensor starts at a multiple of its element size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

TORCH_TO_SAFETENSORS = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.int8: "I8",
    torch.uint8: "U8",
}
ALIGNMENT = 8


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * self.dtype.itemsize


class SafetensorsWriter:
    """Declare every tensor up front, then `write` each one in `order`."""

    def __init__(self, path: str | Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None):
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError("tensor names must be unique")
        # widest element first keeps every tensor aligned to its element size (the data section is 8-aligned)
        self.order = sorted(specs, key=lambda spec: -spec.dtype.itemsize)
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        self.offsets: dict[str, tuple[int, int]] = {}
        position = 0
        for spec in self.order:
            header[spec.name] = {
                "dtype": TORCH_TO_SAFETENSORS[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [position, position + spec.nbytes],
            }
            self.offsets[spec.name] = (position, spec.nbytes)
            position += spec.nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % ALIGNMENT)
        self.data_start = 8 + len(encoded)
        self.path = Path(path)
        self._file = self.path.open("wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self._next = 0

    def absolute_offset(self, name: str) -> tuple[int, int]:
        """(byte offset from the start of the file, byte length) of a declared tensor."""
        begin, length = self.offsets[name]
        return self.data_start + begin, length

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor; it must be the one `order` names next, with the declared dtype and shape."""
        if self._next >= len(self.order):
            raise ValueError(f"unexpected tensor '{name}': every declared tensor was already written")
        spec = self.order[self._next]
        if name != spec.name:
            raise ValueError(f"expected tensor '{spec.name}' next, got '{name}'")
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"tensor '{name}': declared {spec.dtype} {list(spec.shape)}, got {tensor.dtype} {list(tensor.shape)}"
            )
        # flattened: torch calls a tensor with a size-1 dimension contiguous whatever that dimension's stride (a
        # rank-1 SVD factor a [D, 1], made by a transpose, keeps stride (1, D)), and view(uint8) needs stride 1
        data = tensor.detach().cpu().contiguous().reshape(-1)
        self._file.write(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
        self._next += 1

    def close(self) -> None:
        self._file.close()
        if self._next != len(self.order):
            missing = [spec.name for spec in self.order[self._next :]]
            raise ValueError(f"{self.path}: {len(missing)} declared tensors were not written, first '{missing[0]}'")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is None:
            self.close()
        else:
            self._file.close()
