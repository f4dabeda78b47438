"""One call of each quantized CUDA kernel path at LLaMA-2-7B shapes, for a profiler to look at kernel by kernel.

The int4 QuantizedMatMul at one token (4096 x 4096), then the int8 and int4 SparseFFN (d 4096, D 11008, groups of 32)
dense and at 90% sparsity, then the same QuantizedMatMul and SparseFFN for asymmetric int4 (group minimums), then the
int8 and int4 QuantizedMatMul of a 128-token prompt (the integer GEMM): one launch sequence each, nothing timed here.
benchmarks/README.md section 8 quotes what Nsight Compute said of them:

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy -o report .venv/bin/python benchmarks/cuda_kernel_calls.py

(`--clock-control none` leaves the GPU's clocks as they are.) Needs an NVIDIA GPU and the kernel library built.
"""

from __future__ import annotations

import sys

import torch
from cuda_ffn import load_harness

from edge_sdk import quant

D_MODEL, NEURONS, GROUP_SIZE = 4096, 11008, 32
PROMPT_TOKENS = 128


def main() -> int:
    harness = load_harness()
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(
            f"benchmarks/cuda_kernel_calls.py needs an NVIDIA GPU and the CUDA kernel library: {reason}",
            file=sys.stderr,
        )
        return 2
    device = harness.Device()
    try:
        kernels = harness.Kernels(device)
        generator = torch.Generator().manual_seed(0)
        x = device.upload(torch.rand(1, D_MODEL, generator=generator) + 0.1)  # positive: every masked neuron fires
        y = device.empty((1, D_MODEL), torch.float32)
        workspace = device.allocate(kernels.workspace_size(D_MODEL, NEURONS, 1))
        projection = (torch.rand(D_MODEL, D_MODEL, generator=generator) / D_MODEL).numpy()

        def sparse_ffn_calls(fmt: str, asymmetric: bool) -> None:
            rows = [(torch.rand(NEURONS, D_MODEL, generator=generator) / D_MODEL).numpy() for _ in range(3)]
            matrices = (quant.quantize(w, fmt, GROUP_SIZE, asymmetric) for w in rows)
            weights = tuple(harness.upload_quantized(device, m) for m in matrices)
            for sparsity in (0.0, 0.9):
                mask = torch.zeros(1, NEURONS, dtype=torch.int32)
                mask[0, torch.randperm(NEURONS, generator=generator)[: round((1 - sparsity) * NEURONS)]] = 1
                kernels.sparse_ffn_q(x, weights, device.upload(mask), None, "relu", 0.0, y, workspace)

        kernels.matvec_q(x, harness.upload_quantized(device, quant.quantize(projection, "int4", GROUP_SIZE)), None, y)
        for fmt in quant.FORMATS:
            sparse_ffn_calls(fmt, asymmetric=False)
        # asymmetric int4 last, so that the symmetric calls' launches keep their places in a profile
        asymmetric = quant.quantize(projection, "int4", GROUP_SIZE, asymmetric=True)
        kernels.matvec_q(x, harness.upload_quantized(device, asymmetric), None, y)
        sparse_ffn_calls("int4", asymmetric=True)
        # a prompt's QuantizedMatMul (the integer GEMM on the matrix units), last for the same reason
        prompt = device.upload(torch.rand(PROMPT_TOKENS, D_MODEL, generator=generator) - 0.5)
        prompt_y = device.empty((PROMPT_TOKENS, D_MODEL), torch.float32)
        for fmt in quant.FORMATS:
            kernels.matvec_q(
                prompt, harness.upload_quantized(device, quant.quantize(projection, fmt, GROUP_SIZE)), None, prompt_y
            )
        device.synchronize()
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
