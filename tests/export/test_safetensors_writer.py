"""SafetensorsWriter: tensors whose strides torch calls contiguous but are not the row-major ones (a size-1 dimension
with any stride) are written as their values, read back by safe_open."""

from __future__ import annotations

import torch
from safetensors import safe_open

from edge_sdk.export.safetensors_writer import SafetensorsWriter, TensorSpec


def test_a_transposed_column_is_written_as_its_values(tmp_path):
    """A rank-1 SVD factor a [D, 1] comes from a transpose, stride (1, D): export --rank 1 died in view(uint8)."""
    tensors = {
        "column_f32": torch.arange(7, dtype=torch.float32).reshape(1, 7).T,  # [7, 1], stride (1, 7)
        "column_f16": torch.arange(5, dtype=torch.float16).reshape(1, 5).T,
        "column_bf16": torch.arange(3, dtype=torch.bfloat16).reshape(1, 3).T,
        "row": torch.arange(4, dtype=torch.int32).reshape(4, 1).T,  # [1, 4], stride (1, 1)
    }
    assert tensors["column_f32"].is_contiguous() and tensors["column_f32"].stride() == (1, 7)
    path = tmp_path / "t.safetensors"
    writer = SafetensorsWriter(path, [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()])
    for spec in writer.order:
        writer.write(spec.name, tensors[spec.name])
    writer.close()
    with safe_open(str(path), "pt") as stored:
        for name, tensor in tensors.items():
            assert torch.equal(stored.get_tensor(name), tensor), name
