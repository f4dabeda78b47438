"""The CPU kernels' other builds on this machine: the AVX2 path (x86-64-v3) and the portable C path (baseline
x86-64, what GCC vectorises without intrinsics) each pass the kernel tests against the torch reference. The package
build compiles for the build machine (-march=native), which here takes the AVX-512 path, so without this test the
other two paths would only run on the machines that need them. The quantized kernels' NEON paths (with and without
the dot-product extension) are cross-built for aarch64 and run under qemu through a small C harness
(quant_kernels_check.c), their outputs checked here. The integer dot products are exact in their integer part and
perform the same float operations on every target, so every build of the harness -- x86-64 portable, AVX2, AVX2 with
AVX-VNNI, AVX-512 with and without VNNI, aarch64 NEON with and without dotprod -- must write the same bytes."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_sdk.backends.cpu.kernels import quantized_activations

from edge_sdk import quant
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.ffn import sparse_ffn

ROOT = Path(__file__).resolve().parents[2]
KERNEL_SOURCES = sorted((ROOT / "kernels" / "cpu").glob("*.c"))
KERNEL_TESTS = [
    "tests/backends/test_cpu_kernels.py",
    "tests/backends/test_cpu_matvec.py",
    "tests/backends/test_cpu_quant_kernels.py",
]

AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
QUANT_CHECK = ROOT / "tests" / "backends" / "quant_kernels_check.c"
# As test_cpu_quant_kernels.py: the same real numbers as the reference on the dequantized weights, in another fp32
# order; relative to max |y|.
KERNEL_RTOL = 1e-5
x86_64_gcc = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("gcc") is None or shutil.which("objdump") is None,
    reason="builds x86-64 variants of the kernels with gcc (and checks them with objdump)",
)


def build(tmp_path: Path, march: str) -> Path:
    library = tmp_path / f"libedge_cpu_kernels-{march}.so"
    command = ["gcc", "-std=c11", "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-Wall", "-Wextra",
               "-Werror", f"-I{ROOT / 'kernels' / 'cpu'}", "-o", str(library), *map(str, KERNEL_SOURCES),
               "-lm"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return library


def vector_registers(library: Path) -> set[str]:
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {register for register in ("xmm", "ymm", "zmm") if f"%{register}" in code}


@x86_64_gcc
@pytest.mark.parametrize(
    ("march", "registers"),
    [("x86-64-v3", {"xmm", "ymm"}), ("x86-64", {"xmm"})],
    ids=["avx2", "portable"],
)
def test_kernel_build_passes_the_kernel_tests(tmp_path, march, registers):
    library = build(tmp_path, march)
    assert vector_registers(library) == registers  # the build took the intended code path
    env = {**os.environ, "EDGE_SDK_CPU_KERNELS": str(library)}
    found = subprocess.run(
        [sys.executable, "-c", "from edge_sdk.native import find_library; print(find_library())"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(library)  # the kernel tests below load this build
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout


def harness_case(path: Path, d: int, n_neurons: int, format: str, group_size: int, activation: Activation, seed: int):
    """Writes one input of quant_kernels_check.c; returns x, the dequantized weights and the mask for the reference."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(d).astype(np.float32)
    matrices = [quant.quantize(rng.standard_normal((n_neurons, d)) / d**0.5, format, group_size) for _ in range(3)]
    mask = (rng.random(n_neurons) < 0.6).astype(np.uint8)
    codes = {"int8": 2, "int4": 3}[format]
    kinds = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
    with path.open("wb") as file:
        file.write(np.array([d, n_neurons, codes, group_size, kinds[activation.kind]], dtype="<i4").tobytes())
        file.write(np.array([activation.threshold], dtype="<f4").tobytes() + x.tobytes())
        for matrix in matrices:
            file.write(matrix.data.tobytes() + matrix.scales.tobytes())
        file.write(mask.tobytes())
    return torch.from_numpy(x), [torch.from_numpy(quant.dequantize(m)) for m in matrices], torch.from_numpy(mask).bool()


# The harness's cases: the integer path's rows end in a partial unit (INT8 units are 2 blocks of 32 values, INT4
# units 4): d = 416 in half an INT8 unit and 1 block of an INT4 one, 448 in 2 blocks (at group size 64, a group of its
# own), 480 in 3. Past 16 blocks (AVX-512 takes 16 at a time, then the rest under masks): d = 576 (SmolLM2's) ends in
# 2 blocks of an INT4 unit, 608 in one and a half INT8 units.
HARNESS_CASES = [
    (416, "int8", 32, Activation("relu")),
    (448, "int4", 64, Activation("fatrelu", 0.05)),
    (384, "int4", 128, Activation("silu")),
    (416, "int4", 32, Activation("relu")),
    (480, "int4", 32, Activation("drelu")),
    (576, "int4", 64, Activation("silu")),
    (608, "int8", 32, Activation("relu")),
]
HARNESS_NEURONS = 301
AARCH64_TOOLS = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None
    or shutil.which("qemu-aarch64") is None
    or not (AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists(),
    reason="needs gcc-aarch64-linux-gnu, libc6-arm64-cross and qemu-user",
)
# the cross toolchain's own libc and libgomp first (see tests/jetson/support.py qemu_command); -cpu max has dotprod
QEMU = ["qemu-aarch64", "-cpu", "max", "-L", str(AARCH64_SYSROOT), "-E", f"LD_LIBRARY_PATH={AARCH64_SYSROOT / 'lib'}"]


def build_harness(tmp_path: Path, compiler: str, flags: list[str], name: str) -> Path:
    binary = tmp_path / f"quant_kernels_check-{name}"
    command = [compiler, "-std=c11", "-O3", *flags, "-fopenmp", "-Wall", "-Wextra", "-Werror",
               f"-I{ROOT / 'kernels' / 'cpu'}", "-o", str(binary), str(QUANT_CHECK),
               *map(str, KERNEL_SOURCES), "-lm"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return binary


def run_harness(tmp_path: Path, command: list[str], env: dict[str, str] | None = None) -> list[bytes]:
    """The harness's output for each of HARNESS_CASES (written once per test directory)."""
    outputs = []
    for index, (d, format, group_size, activation) in enumerate(HARNESS_CASES):
        case, output = tmp_path / f"case{index}.bin", tmp_path / f"out{index}.bin"
        if not case.exists():
            harness_case(case, d, HARNESS_NEURONS, format, group_size, activation, seed=index)
        run = subprocess.run([*command, str(case), str(output)], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **(env or {})})  # fmt: skip
        assert run.returncode == 0, run.stderr
        outputs.append(output.read_bytes())
    return outputs


def check_harness_outputs(tmp_path: Path, outputs: list[bytes], integer: bool) -> None:
    """Each case's outputs against the reference on the dequantized weights and the x the kernels compute with."""
    for index, ((d, format, group_size, activation), raw) in enumerate(zip(HARNESS_CASES, outputs, strict=True)):
        x, dequantized, mask = harness_case(tmp_path / f"check{index}.bin", d, HARNESS_NEURONS, format, group_size,
                                            activation, seed=index)  # fmt: skip
        x = quantized_activations(x) if integer else x
        n_neurons = HARNESS_NEURONS
        ffn_bytes = d * 4 + n_neurons
        runs = [raw[k * ffn_bytes : (k + 1) * ffn_bytes] for k in range(3)]
        assert runs[1] == runs[0] and runs[2] == runs[0]  # threads 1, 2, 4: bit-identical
        y = torch.from_numpy(np.frombuffer(runs[0][: d * 4], dtype="<f4").copy())
        active = torch.from_numpy(np.frombuffer(runs[0][d * 4 :], dtype=np.uint8).copy()).bool()
        gate = dequantized[0].double() @ x.double() - activation.threshold
        assert gate[mask].abs().min() > 1e-4, "test data on a decision boundary: change the seed"
        reference = sparse_ffn(x, *dequantized, mask, activation)
        assert torch.equal(active, reference.active)
        assert (y - reference.output).abs().max() <= KERNEL_RTOL * reference.output.abs().max()
        matvecs = raw[3 * ffn_bytes :]
        assert len(matvecs) == 2 * n_neurons * 4 and matvecs[: n_neurons * 4] == matvecs[n_neurons * 4 :]
        gate_x = torch.from_numpy(np.frombuffer(matvecs[: n_neurons * 4], dtype="<f4").copy()).double()
        expected = dequantized[0].double() @ x.double()
        assert (gate_x - expected).abs().max() <= KERNEL_RTOL * expected.abs().max()


@AARCH64_TOOLS
@pytest.mark.parametrize(("march", "instruction"), [("armv8-a", "smull"), ("armv8.2-a+dotprod", "sdot")])
def test_quantized_kernels_aarch64_under_qemu(tmp_path, march, instruction):
    binary = build_harness(tmp_path, "aarch64-linux-gnu-gcc", [f"-march={march}"], march)
    code = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(binary)], capture_output=True, text=True).stdout
    assert f"{instruction}\tv" in code  # the integer products of that path, not a scalar loop
    assert ("sdot\tv" in code) == (instruction == "sdot")
    assert "sxtl" in code and "scvtf\tv" in code  # the fp32 path's NEON widening of the codes (the down rows)
    check_harness_outputs(tmp_path, run_harness(tmp_path, [*QEMU, str(binary)]), integer=True)
    fp32_outputs = run_harness(tmp_path, [*QEMU, str(binary)], {"EDGE_SDK_QUANT_ACTIVATIONS": "fp32"})
    check_harness_outputs(tmp_path, fp32_outputs, integer=False)


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


# x86-64 builds of the harness: the -march flags, and the CPU flags this machine needs to run them.
X86_BUILDS = {
    "portable": (["-march=x86-64"], set()),
    "avx2": (["-march=x86-64-v3"], {"avx2", "fma", "f16c"}),
    "avx2-vnni": (["-march=x86-64-v3", "-mavxvnni"], {"avx2", "fma", "f16c", "avx_vnni"}),
    "avx512": (["-march=skylake-avx512"], {"avx512f", "avx512bw", "avx512vl"}),
    "avx512-vnni": (["-march=cascadelake"], {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
}


@x86_64_gcc
def test_integer_dot_products_are_bit_identical_on_every_build(tmp_path):
    """Every build this machine can run writes the same bytes (and aarch64's builds too, under qemu): the integer
    path does not depend on the instruction set. Each build's outputs are also checked against the reference."""
    runnable = {name: flags for name, (flags, needed) in X86_BUILDS.items() if needed <= cpu_flags()}
    assert "portable" in runnable and len(runnable) >= 2, "nothing to compare on this machine"
    outputs = {}
    for name, flags in runnable.items():
        binary = build_harness(tmp_path, "gcc", flags, name)
        outputs[name] = run_harness(tmp_path, [str(binary)])
    check_harness_outputs(tmp_path, outputs["portable"], integer=True)
    aarch64_ready = shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")
    if aarch64_ready and (AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        for march in ("armv8-a", "armv8.2-a+dotprod"):
            binary = build_harness(tmp_path, "aarch64-linux-gnu-gcc", [f"-march={march}"], march)
            outputs[march] = run_harness(tmp_path, [*QEMU, str(binary)])
    for name, found in outputs.items():
        assert found == outputs["portable"], f"{name} differs from the portable build"
