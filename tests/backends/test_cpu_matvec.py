"""edge_cpu_matvec, the dense single-token projection of the CPU backend: determinism, out=, errors (its values
against float64: the MatVec cases of tests/ops)."""

from __future__ import annotations

import pytest
import torch
from edge_sdk.backends.cpu import kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("n_in", "n_out"), [(192, 40), (512, 17), (45, 7), (513, 16)])
def test_matvec_row_does_not_depend_on_the_other_rows(dtype, n_in, n_out):
    """Each output is its own row's dot product, bit for bit, whether computed alone, among all rows or in
    reverse order (the AVX-512 build dots short fp16 rows sixteen at a time, padding the last group)."""
    generator = torch.Generator().manual_seed(n_in + n_out)
    weight = torch.randn(n_out, n_in, generator=generator).to(dtype)
    x = torch.randn(n_in, generator=generator)
    together = kernels.matvec(x, weight)
    assert torch.equal(kernels.matvec(x, weight.flip(0).contiguous()), together.flip(0))
    for row in range(n_out):
        assert torch.equal(kernels.matvec(x, weight[row : row + 1]), together[row : row + 1])


@pytest.mark.parametrize(("n_out", "n_in"), [(513, 1000), (301, 192)])  # one-row and sixteen-row fp16 paths
def test_matvec_is_bit_identical_across_threads_and_calls(n_out, n_in):
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(n_out, n_in, generator=generator).half()
    x = torch.randn(n_in, generator=generator)
    runs = [kernels.matvec(x, weight, threads=threads) for threads in (1, 2, 0, 2)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])


def test_matvec_writes_into_out():
    weight, x = torch.eye(3), torch.tensor([1.0, 2.0, 3.0])
    out = torch.full((3,), float("nan"))
    assert kernels.matvec(x, weight, torch.tensor([0.5, 0.0, -1.0]), out=out) is out
    assert out.tolist() == [1.5, 2.0, 2.0]


@pytest.mark.parametrize(
    ("weight", "x", "message"),
    [
        (torch.zeros(4, 3), torch.zeros(5), "weight"),
        (torch.zeros(4, 3, dtype=torch.bfloat16), torch.zeros(3), "weight"),
        (torch.zeros(4, 3), torch.zeros(3, dtype=torch.float64), "x"),
        (torch.zeros(3, 4).T, torch.zeros(3), "weight"),
    ],
)
def test_matvec_rejects_bad_arguments(weight, x, message):
    with pytest.raises(ValueError, match=message):
        kernels.matvec(x, weight)
