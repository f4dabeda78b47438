"""The CPU kernels' other builds on this machine: the AVX2 path (x86-64-v3) and the portable C path (baseline
x86-64, what GCC vectorises without intrinsics) each pass the kernel tests against the torch reference. The package
build compiles for the build machine (-march=native), which here takes the AVX-512 path, so without this test the
other two paths would only run on the machines that need them. The quantized kernels' NEON paths (with and without
the dot-product extension) are cross-built for aarch64 and run under qemu through a small C harness
(quant_kernels_check.c), their outputs checked here. The integer dot products are exact in their integer part and
perform the same float operations on every target, so every build of the harness -- x86-64 portable, AVX2, AVX2 with
AVX-VNNI, AVX-512 with and without VNNI, aarch64 NEON with and without dotprod -- must write the same bytes. The
harness also runs the fp16 kernels (NEON's own rows), checked against the reference under qemu."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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
    "tests/backends/test_cpu_attention.py",
    "tests/backends/test_cpu_kernels.py",
    "tests/backends/test_cpu_matvec.py",
    "tests/backends/test_cpu_quant_kernels.py",
    "tests/backends/test_cpu_token_blocks.py",
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


def compile_objects(compiler: str, options: list[str], sources: list[Path], prefix: Path) -> list[Path]:
    """The sources' objects (prefix-<stem>.o), each compiled with options side by side (the kernels take 5 to 13 s of
    compiler time per build)."""
    objects = [prefix.parent / f"{prefix.name}-{source.stem}.o" for source in sources]
    compiles = [
        subprocess.Popen([compiler, *options, "-c", str(source), "-o", str(target)], stderr=subprocess.PIPE)
        for source, target in zip(sources, objects, strict=True)
    ]
    errors = [process.communicate()[1].decode() for process in compiles]
    assert all(process.returncode == 0 for process in compiles), "".join(errors)
    return objects


def link(compiler: str, objects: list[Path], output: Path, options: list[str]) -> Path:
    result = subprocess.run([compiler, *options, "-o", str(output), *map(str, objects), "-lm"], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return output


class KernelBuilds:
    """The kernel sources compiled once per compiler and flags, position-independent as a shared library needs, and
    linked from those objects: the kernel library the kernel tests load (gcc) and quant_kernels_check.c's harness.
    Made on first use and shared by the module's tests: several run the same harness, and a library and a harness of
    the same flags link the same objects, so each build of the kernels (5 to 13 s of compiler time) is compiled once."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.objects: dict[tuple[str, tuple[str, ...]], list[Path]] = {}
        self.binaries: dict[tuple[str, tuple[str, ...]], Path] = {}

    def options(self, flags: list[str]) -> list[str]:
        return ["-std=c11", "-O3", *flags, "-fopenmp", "-fPIC", "-Wall", "-Wextra", "-Werror",
                f"-I{ROOT / 'kernels' / 'cpu'}"]  # fmt: skip

    def kernel_objects(self, compiler: str, flags: list[str]) -> list[Path]:
        key = (compiler, tuple(flags))
        if key not in self.objects:
            prefix = self.directory / f"kernels-{len(self.objects)}"
            self.objects[key] = compile_objects(compiler, self.options(flags), KERNEL_SOURCES, prefix)
        return self.objects[key]

    def library(self, march: str) -> Path:
        objects = self.kernel_objects("gcc", [f"-march={march}"])
        return link("gcc", objects, self.directory / f"libedge_cpu_kernels-{march}.so", ["-fopenmp", "-shared"])

    def harness(self, compiler: str, flags: list[str], name: str) -> Path:
        key = (compiler, tuple(flags))
        if key not in self.binaries:
            binary = self.directory / f"quant_kernels_check-{name}-{len(self.binaries)}"
            check = compile_objects(compiler, self.options(flags), [QUANT_CHECK], binary)
            self.binaries[key] = link(compiler, check + self.kernel_objects(compiler, flags), binary, ["-fopenmp"])
        return self.binaries[key]


@pytest.fixture(scope="module")
def kernel_builds(tmp_path_factory) -> KernelBuilds:
    return KernelBuilds(tmp_path_factory.mktemp("kernel-builds"))


def vector_registers(library: Path) -> set[str]:
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {register for register in ("xmm", "ymm", "zmm") if f"%{register}" in code}


@x86_64_gcc
@pytest.mark.parametrize(
    ("march", "registers"),
    [("x86-64-v3", {"xmm", "ymm"}), ("x86-64", {"xmm"})],
    ids=["avx2", "portable"],
)
def test_kernel_build_passes_the_kernel_tests(march, registers, kernel_builds):
    library = kernel_builds.library(march)
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


@dataclass(frozen=True)
class HarnessCase:
    d: int
    format: str
    group_size: int
    activation: Activation
    asymmetric: bool = False  # int4 with group minimums (weights offset from zero, so the minimums matter)
    down_format: str | None = None  # the down rows' format: format's, or "int8" under int4 (a bundle's down_dtype)

    @property
    def down(self) -> str:
        return self.down_format or self.format

    def seed(self, index: int) -> int:
        """The case's data seed: its index, moved for the asymmetric cases to data clear of decision boundaries."""
        return index + 1000 * self.asymmetric


@dataclass(frozen=True)
class HarnessData:
    x: np.ndarray
    matrices: list[quant.QuantizedMatrix]  # gate, up, down_t
    mask: np.ndarray  # uint8 [D]

    def reference_inputs(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """x, the dequantized weights and the mask, for the reference."""
        dequantized = [torch.from_numpy(quant.dequantize(m)) for m in self.matrices]
        return torch.from_numpy(self.x), dequantized, torch.from_numpy(self.mask).bool()


def harness_case(path: Path, case: HarnessCase, n_neurons: int, seed: int) -> HarnessData:
    """Writes one input of quant_kernels_check.c; returns its data."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(case.d).astype(np.float32)
    offset = 0.02 if case.asymmetric else 0.0
    matrices = [
        quant.quantize(
            rng.standard_normal((n_neurons, case.d)) / case.d**0.5 + offset,
            format,
            case.group_size,
            asymmetric=case.asymmetric and format == "int4",
        )
        for format in (case.format, case.format, case.down)
    ]
    mask = (rng.random(n_neurons) < 0.6).astype(np.uint8)
    codes = {"int8": 2, "int4": 3}
    kinds = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
    header = [case.d, n_neurons, codes[case.format], case.group_size, kinds[case.activation.kind], int(case.asymmetric),
              codes[case.down]]  # fmt: skip
    with path.open("wb") as file:
        file.write(np.array(header, dtype="<i4").tobytes())
        file.write(np.array([case.activation.threshold], dtype="<f4").tobytes() + x.tobytes())
        for matrix in matrices:
            file.write(matrix.data.tobytes() + matrix.scales.tobytes())
            if matrix.mins is not None:
                file.write(matrix.mins.tobytes())
        file.write(mask.tobytes())
    return HarnessData(x, matrices, mask)


# The harness's cases: the integer path's rows end in a partial unit (INT8 units are 2 blocks of 32 values, INT4
# units 4): d = 416 in half an INT8 unit and 1 block of an INT4 one, 448 in 2 blocks (at group size 64, a group of its
# own), 480 in 3. Past 16 blocks (AVX-512 takes 16 at a time, then the rest under masks): d = 576 (SmolLM2's) ends in
# 2 blocks of an INT4 unit, 608 in one and a half INT8 units.
# Asymmetric int4 (group minimums) adds a correction per block to each dot product and to each down column; at group
# size 32 with 16 blocks or more (d = 576) the NEON build adds 16 blocks' corrections a vector at a time, then the rest.
# Int8 down rows under int4 gate and up (symmetric or asymmetric; a bundle's down_dtype int8): the int8 down rows'
# columns with the int4 rows' dot products.
HARNESS_CASES = [
    HarnessCase(416, "int8", 32, Activation("relu")),
    HarnessCase(448, "int4", 64, Activation("fatrelu", 0.05)),
    HarnessCase(384, "int4", 128, Activation("silu")),
    HarnessCase(416, "int4", 32, Activation("relu")),
    HarnessCase(480, "int4", 32, Activation("drelu")),
    HarnessCase(576, "int4", 64, Activation("silu")),
    HarnessCase(608, "int8", 32, Activation("relu")),
    HarnessCase(416, "int4", 32, Activation("relu"), asymmetric=True),
    HarnessCase(576, "int4", 64, Activation("silu"), asymmetric=True),
    HarnessCase(384, "int4", 128, Activation("drelu"), asymmetric=True),
    HarnessCase(576, "int4", 32, Activation("relu"), asymmetric=True),
    HarnessCase(576, "int4", 32, Activation("silu"), down_format="int8"),
    HarnessCase(384, "int4", 128, Activation("relu"), asymmetric=True, down_format="int8"),
    HarnessCase(448, "int4", 64, Activation("drelu"), asymmetric=True, down_format="int8"),
    HarnessCase(448, "int8", 64, Activation("silu")),
    HarnessCase(384, "int8", 128, Activation("relu")),
]
HARNESS_NEURONS = 301
TOKEN_BLOCK = 5  # quant_kernels_check.c's: AVX-512 dots a row with 4 tokens at once, NEON with 2
AARCH64_TOOLS = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None
    or shutil.which("qemu-aarch64") is None
    or not (AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists(),
    reason="needs gcc-aarch64-linux-gnu, libc6-arm64-cross and qemu-user",
)
# the cross toolchain's own libc and libgomp first (see tests/jetson/support.py qemu_command); -cpu max has dotprod
QEMU_SYSROOT = ["-L", str(AARCH64_SYSROOT), "-E", f"LD_LIBRARY_PATH={AARCH64_SYSROOT / 'lib'}"]
QEMU = ["qemu-aarch64", "-cpu", "max", *QEMU_SYSROOT]


def run_harness(
    tmp_path: Path,
    command: list[str],
    env: dict[str, str] | None = None,
    isa: str | None = None,
    cases: Sequence[int] = range(len(HARNESS_CASES)),
) -> list[bytes]:
    """The harness's output for each of HARNESS_CASES, or those numbered in cases (written once per test directory);
    with isa, each run must say it ran that instruction set's kernels."""
    outputs = []
    for index in cases:
        path, output = tmp_path / f"case{index}.bin", tmp_path / f"out{index}.bin"
        if not path.exists():
            harness_case(path, HARNESS_CASES[index], HARNESS_NEURONS, seed=HARNESS_CASES[index].seed(index))
        run = subprocess.run([*command, str(path), str(output)], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **(env or {})})  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert isa is None or run.stdout.strip() == isa
        outputs.append(output.read_bytes())
    return outputs


def check_harness_outputs(tmp_path: Path, outputs: list[bytes], integer: bool) -> None:
    """Each case's outputs against the reference on the dequantized weights and the x the kernels compute with."""
    for index, (case, raw) in enumerate(zip(HARNESS_CASES, outputs, strict=True)):
        d, activation = case.d, case.activation
        data = harness_case(tmp_path / f"check{index}.bin", case, HARNESS_NEURONS, seed=case.seed(index))
        x, dequantized, mask = data.reference_inputs()
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
        matvecs = raw[3 * ffn_bytes : 3 * ffn_bytes + 2 * n_neurons * 4]
        assert len(matvecs) == 2 * n_neurons * 4 and matvecs[: n_neurons * 4] == matvecs[n_neurons * 4 :]
        gate_x = torch.from_numpy(np.frombuffer(matvecs[: n_neurons * 4], dtype="<f4").copy()).double()
        expected = dequantized[0].double() @ x.double()
        assert (gate_x - expected).abs().max() <= KERNEL_RTOL * expected.abs().max()
        # a block of tokens (edge_cpu_ffn_tokens, edge_cpu_matmuls) gives each token the one-token kernels' bytes
        block = raw[3 * ffn_bytes + 2 * n_neurons * 4 :]
        ffn_block, matmul_block = TOKEN_BLOCK * d * 4, TOKEN_BLOCK * n_neurons * 4
        assert len(block) == 2 * ffn_block + 2 * matmul_block
        assert block[:ffn_block] == block[ffn_block : 2 * ffn_block]
        matmuls = block[2 * ffn_block :]
        assert matmuls[:matmul_block] == matmuls[matmul_block:]
        first_token = np.frombuffer(matmuls[: n_neurons * 4], dtype="<f4")
        assert first_token.tobytes() == gate_x.numpy().astype("<f4").tobytes()  # token 0 is x itself


def run_attention(
    tmp_path: Path, command: list[str], env: dict[str, str] | None = None, isa: str | None = None
) -> bytes:
    """The harness's edge_cpu_attention cases (quant_kernels_check.c, --attention): inputs and outputs."""
    output = tmp_path / "attention.bin"
    run = subprocess.run([*command, "--attention", str(output)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert isa is None or run.stdout.strip() == isa
    return output.read_bytes()


def check_attention_output(raw: bytes) -> None:
    """Each attention case against the float64 reference on its inputs (GQA, scale 1 / sqrt(head_dim), causal over
    [first, pos]); threads 1 and 4 bit-identical; the keys' NaN padding past pos never reaches a result."""
    offset = 0

    def take(count: int, dtype: str) -> np.ndarray:
        nonlocal offset
        values = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
        offset += values.nbytes
        return values

    cases = 0
    while offset < len(raw):
        n_heads, n_kv, hd, first, pos, key_tiles = (int(v) for v in take(6, "<i4"))
        positions, groups = pos + 1, n_heads // n_kv
        q = take(n_heads * hd, "<f4").reshape(n_heads, hd).astype(np.float64)
        tiles = take(n_kv * key_tiles * hd * 16, "<f4").reshape(n_kv, key_tiles, hd, 16)
        keys = tiles.transpose(0, 2, 1, 3).reshape(n_kv, hd, key_tiles * 16)[:, :, first:positions]
        values = take(positions * n_kv * hd, "<f4").reshape(positions, n_kv, hd)[first:].astype(np.float64)
        runs = [(take(n_heads * hd, "<f4"), take(n_heads * (positions - first), "<f4")) for _ in range(2)]
        assert runs[0][0].tobytes() == runs[1][0].tobytes() and runs[0][1].tobytes() == runs[1][1].tobytes()
        out, weights = runs[0][0].reshape(n_heads, hd), runs[0][1].reshape(n_heads, positions - first)
        for h in range(n_heads):
            scores = q[h] @ keys[h // groups].astype(np.float64) / np.sqrt(hd)
            expected = np.exp(scores - scores.max())
            expected /= expected.sum()
            assert np.abs(weights[h] - expected).max() <= 1e-6
            reference = expected @ values[:, h // groups]
            assert np.abs(out[h] - reference).max() <= 1e-5 * np.abs(reference).max()
        cases += 1
    assert cases == 3


@AARCH64_TOOLS
@pytest.mark.parametrize(("march", "instruction"), [("armv8-a", "smull"), ("armv8.2-a+dotprod", "sdot")])
def test_quantized_kernels_aarch64_under_qemu(tmp_path, march, instruction, kernel_builds):
    binary = kernel_builds.harness("aarch64-linux-gnu-gcc", [f"-march={march}"], march)
    code = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(binary)], capture_output=True, text=True).stdout
    assert f"{instruction}\tv" in code  # the integer products of that path, not a scalar loop
    assert ("sdot\tv" in code) == (instruction == "sdot")
    assert "sxtl" in code and "scvtf\tv" in code  # the fp32 path's NEON widening of the codes (the down rows)
    check_harness_outputs(tmp_path, run_harness(tmp_path, [*QEMU, str(binary)]), integer=True)
    fp32_outputs = run_harness(tmp_path, [*QEMU, str(binary)], {"EDGE_SDK_QUANT_ACTIVATIONS": "fp32"})
    check_harness_outputs(tmp_path, fp32_outputs, integer=False)


# fp16 rows (edge_cpu_sparse_ffn, edge_cpu_matvec), whose NEON loops take 32 values per dot step, then 4, then a
# ragged end, and 16 columns per down step, then single columns: d = 602 has all of them, 416 no ragged end.
FP16_HARNESS_CASES = [(602, Activation("silu")), (416, Activation("relu"))]


def fp16_harness_case(path: Path, d: int, activation: Activation, seed: int) -> tuple[torch.Tensor, list, torch.Tensor]:
    """Writes one fp16 input of quant_kernels_check.c; returns x, the three matrices (as fp32) and the mask."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(d).astype(np.float32)
    matrices = [(rng.standard_normal((HARNESS_NEURONS, d)) / d**0.5).astype(np.float16) for _ in range(3)]
    mask = (rng.random(HARNESS_NEURONS) < 0.6).astype(np.uint8)
    kinds = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
    header = [d, HARNESS_NEURONS, 1, 0, kinds[activation.kind], 0, 1]  # format 1: EDGE_F16
    with path.open("wb") as file:
        file.write(np.array(header, dtype="<i4").tobytes())
        file.write(np.array([activation.threshold], dtype="<f4").tobytes() + x.tobytes())
        for matrix in matrices:
            file.write(matrix.astype("<f2").tobytes())
        file.write(mask.tobytes())
    weights = [torch.from_numpy(matrix.astype(np.float32)) for matrix in matrices]
    return torch.from_numpy(x), weights, torch.from_numpy(mask).bool()


SVD_RANK = 37  # quant_kernels_check.c's


def check_fp16_harness(tmp_path: Path, command: list[str]) -> list[bytes]:
    """Every fp16 case through the harness: bit-identical for 1, 2 and 4 threads, and the reference's values.
    Returns each case's SVD predictor output (x B^T and the mask), which every build computes alike."""
    predictor_outputs = []
    for index, (d, activation) in enumerate(FP16_HARNESS_CASES):
        path, output = tmp_path / f"fp16-case{index}.bin", tmp_path / f"fp16-out{index}.bin"
        x, weights, mask = fp16_harness_case(path, d, activation, seed=2000 + index)
        run = subprocess.run([*command, str(path), str(output)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        raw = output.read_bytes()
        ffn_bytes = d * 4 + HARNESS_NEURONS
        runs = [raw[k * ffn_bytes : (k + 1) * ffn_bytes] for k in range(3)]
        assert runs[1] == runs[0] and runs[2] == runs[0]
        y = torch.from_numpy(np.frombuffer(runs[0][: d * 4], dtype="<f4").copy())
        active = torch.from_numpy(np.frombuffer(runs[0][d * 4 :], dtype=np.uint8).copy()).bool()
        reference = sparse_ffn(x, *weights, mask, activation)
        assert torch.equal(active, reference.active)
        assert (y - reference.output).abs().max() <= KERNEL_RTOL * reference.output.abs().max()
        matvecs = raw[3 * ffn_bytes : 3 * ffn_bytes + 2 * HARNESS_NEURONS * 4]
        assert (
            len(matvecs) == 2 * HARNESS_NEURONS * 4 and matvecs[: HARNESS_NEURONS * 4] == matvecs[HARNESS_NEURONS * 4 :]
        )
        gate_x = torch.from_numpy(np.frombuffer(matvecs[: HARNESS_NEURONS * 4], dtype="<f4").copy()).double()
        expected = weights[0].double() @ x.double()
        assert (gate_x - expected).abs().max() <= KERNEL_RTOL * expected.abs().max()
        predictor = raw[3 * ffn_bytes + 2 * HARNESS_NEURONS * 4 :]
        assert len(predictor) == SVD_RANK * 4 + HARNESS_NEURONS
        z = torch.from_numpy(np.frombuffer(predictor[: SVD_RANK * 4], dtype="<f4").copy()).double()
        b = weights[1][:SVD_RANK].double()
        a_t = weights[0].flatten()[: SVD_RANK * HARNESS_NEURONS].reshape(SVD_RANK, HARNESS_NEURONS).double()
        assert (z - b @ x.double()).abs().max() <= KERNEL_RTOL * (b @ x.double()).abs().max()
        scores = z @ a_t
        assert scores.abs().min() > 1e-6 * scores.abs().max(), "a score on the decision boundary: change the seed"
        mask_found = np.frombuffer(predictor[SVD_RANK * 4 :], dtype=np.uint8)
        assert np.array_equal(mask_found, (scores > 0).numpy().astype(np.uint8))
        predictor_outputs.append(predictor)
    return predictor_outputs


@AARCH64_TOOLS
@x86_64_gcc
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_fp16_kernels_aarch64_under_qemu(tmp_path, march, kernel_builds):
    """The NEON fp16 rows (fcvtl widening, eight FMA chains) against the reference, under qemu; and the SVD
    predictor's NEON loops, whose x B^T and mask are the portable x86 build's bytes."""
    binary = kernel_builds.harness("aarch64-linux-gnu-gcc", [f"-march={march}"], march)
    portable = kernel_builds.harness("gcc", ["-march=x86-64"], "portable")
    assert check_fp16_harness(tmp_path, [*QEMU, str(binary)]) == check_fp16_harness(tmp_path, [str(portable)])


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
def test_integer_dot_products_are_bit_identical_on_every_build(tmp_path, kernel_builds):
    """Every build this machine can run writes the same bytes (and aarch64's builds too, under qemu): the integer
    path does not depend on the instruction set. Each build's outputs are also checked against the reference. The
    x86 builds with x in fp32 (EDGE_SDK_QUANT_ACTIVATIONS=fp32) agree with each other as well: each instruction set
    has its own loops there too (AVX2's ymm halves of the 16-lane sums)."""
    runnable = {name: flags for name, (flags, needed) in X86_BUILDS.items() if needed <= cpu_flags()}
    assert "portable" in runnable and len(runnable) >= 2, "nothing to compare on this machine"
    outputs, fp32_outputs, attention = {}, {}, {}
    for name, flags in runnable.items():
        binary = kernel_builds.harness("gcc", flags, name)
        outputs[name] = run_harness(tmp_path, [str(binary)])
        fp32_outputs[name] = run_harness(tmp_path, [str(binary)], {"EDGE_SDK_QUANT_ACTIVATIONS": "fp32"})
        attention[name] = run_attention(tmp_path, [str(binary)])
    check_harness_outputs(tmp_path, outputs["portable"], integer=True)
    check_harness_outputs(tmp_path, fp32_outputs["portable"], integer=False)
    check_attention_output(attention["portable"])
    for name, found in fp32_outputs.items():
        assert found == fp32_outputs["portable"], f"{name} with x in fp32 differs from the portable build"
    aarch64_ready = shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")
    if aarch64_ready and (AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        for march in ("armv8-a", "armv8.2-a+dotprod"):
            binary = kernel_builds.harness("aarch64-linux-gnu-gcc", [f"-march={march}"], march)
            outputs[march] = run_harness(tmp_path, [*QEMU, str(binary)])
            attention[march] = run_attention(tmp_path, [*QEMU, str(binary)])
    for name, found in outputs.items():
        assert found == outputs["portable"], f"{name} differs from the portable build"
    for name, found in attention.items():
        assert found == attention["portable"], f"{name}'s attention differs from the portable build's"


@x86_64_gcc
def test_the_library_python_loads_writes_the_portable_builds_bytes(tmp_path, kernel_builds):
    """The kernel library the package build made (CMake: -march=native, the flags a user's install gets) gives the
    portable harness's bytes for every case: the sparse FFN's output and active set, and the gate matvec. A build
    whose compiler fused a multiply and an add the code keeps apart (GCC's default -ffp-contract=fast in GNU C mode,
    on any FMA target) differs in the last bit and fails here."""
    from edge_sdk.backends.cpu import kernels

    portable = kernel_builds.harness("gcc", ["-march=x86-64"], "portable")
    expected = run_harness(tmp_path, [str(portable)])
    for index, case in enumerate(HARNESS_CASES):
        data = harness_case(tmp_path / f"check{index}.bin", case, HARNESS_NEURONS, seed=case.seed(index))
        weights = [kernels.QuantizedWeight.from_matrix(matrix) for matrix in data.matrices]
        x = torch.from_numpy(data.x)
        y = kernels.SparseFFNKernel(case.d, HARNESS_NEURONS, threads=1).quantized(
            x, *weights, case.activation, mask=torch.from_numpy(data.mask).bool()
        )
        gate_x = kernels.matvec_quantized(x, weights[0], threads=1)
        found = y.numpy().astype("<f4").tobytes()
        ffn_bytes = case.d * 4 + HARNESS_NEURONS
        assert found == expected[index][: case.d * 4], f"case {index} {case}: the FFN's output"
        assert gate_x.numpy().astype("<f4").tobytes() == expected[index][3 * ffn_bytes :][: HARNESS_NEURONS * 4]


# A package's library (CMake with EDGE_SDK_NATIVE_ARCH=OFF, or a cross-build) holds one build of the kernels per
# instruction set and runs the best one the CPU has (kernels/cpu/isa_dispatch.c). The CPU flags (/proc/cpuinfo names)
# each x86-64 build needs, best first: x86-64-v3 (pni is SSE3, abm is LZCNT) and x86-64-v4.
X86_64_V3 = {"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx", "avx2", "bmi1", "bmi2", "f16c",
             "fma", "abm", "movbe"}  # fmt: skip
X86_64_V4 = X86_64_V3 | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}
X86_DISPATCH = {
    "avx512_vnni": X86_64_V4 | {"avx512_vnni"},
    "avx512": X86_64_V4,
    "avx2_vnni": X86_64_V3 | {"avx_vnni"},
    "avx2": X86_64_V3,
    "portable": set(),
}
AARCH64_TOOLCHAIN = ROOT / "jetson" / "cmake" / "aarch64-linux-gnu.cmake"
# the cases the dispatch tests run: int8, symmetric int4 at G 64 and 32, asymmetric int4, int8 down rows under
# asymmetric int4 (every build's own paths)
DISPATCH_CASES = [0, 1, 3, 7, 12]
cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="builds the package's kernel library with cmake")


def build_package_library(tmp_path: Path, toolchain: Path | None = None) -> Path:
    """libedge_cpu_kernels.so as a package builds it: CMake without -march=native (cross-built with toolchain)."""
    build = tmp_path / "build"
    cross = [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"] if toolchain else []
    configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DEDGE_SDK_NATIVE_ARCH=OFF", "-DEDGE_SDK_CUDA=OFF",
                 "-DCMAKE_BUILD_TYPE=Release", *cross]  # fmt: skip
    for command in (configure, ["cmake", "--build", str(build), "--target", "edge_cpu_kernels", "-j", "2"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return build / "libedge_cpu_kernels.so"


def link_harness(tmp_path: Path, compiler: str, library: Path) -> Path:
    """The harness linked against a built kernel library instead of compiled with the kernel sources."""
    binary = tmp_path / f"quant_kernels_check-linked-{compiler}"
    command = [compiler, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'kernels' / 'cpu'}", "-o",
               str(binary), str(QUANT_CHECK), f"-L{library.parent}", "-ledge_cpu_kernels",
               f"-Wl,-rpath,{library.parent}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return binary


def refused(tmp_path: Path, command: list[str], isa: str) -> str:
    """The harness's error when EDGE_SDK_CPU_ISA names isa, which it must refuse before running anything."""
    index = DISPATCH_CASES[0]
    path = tmp_path / f"case{index}.bin"
    run = subprocess.run([*command, str(path), str(tmp_path / "refused.bin")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "EDGE_SDK_CPU_ISA": isa})  # fmt: skip
    assert run.returncode == 4 and run.stdout == "" and not (tmp_path / "refused.bin").exists(), run.stderr
    return run.stderr


@x86_64_gcc
@cmake
def test_a_package_library_holds_every_x86_build_and_runs_the_best_this_cpu_has(tmp_path, kernel_builds):
    """Each build in the library writes the single portable build's bytes, the automatic choice is the best build
    this CPU runs, EDGE_SDK_CPU_ISA picks any other it runs, and naming one it does not run, or no build at all, is
    refused with the reason."""
    library = build_package_library(tmp_path)
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "vpdpbusd" in code and "%zmm" in code and "%ymm" in code  # the VNNI, AVX-512 and AVX2 builds are in it
    kernels = ctypes.CDLL(str(library))
    kernels.edge_cpu_isas.restype = ctypes.c_char_p
    assert kernels.edge_cpu_isas().decode() == " ".join(X86_DISPATCH)
    harness = link_harness(tmp_path, "gcc", library)
    portable = kernel_builds.harness("gcc", ["-march=x86-64"], "portable")
    expected = run_harness(tmp_path, [str(portable)], isa="portable", cases=DISPATCH_CASES)
    runnable = [name for name, needed in X86_DISPATCH.items() if needed <= cpu_flags()]
    assert run_harness(tmp_path, [str(harness)], isa=runnable[0], cases=DISPATCH_CASES) == expected
    expected_attention = run_attention(tmp_path, [str(portable)])
    for name in runnable[1:]:
        found = run_harness(tmp_path, [str(harness)], {"EDGE_SDK_CPU_ISA": name}, isa=name, cases=DISPATCH_CASES)
        assert found == expected, f"the library's {name} build differs from the portable build"
    for name in runnable:
        found = run_attention(tmp_path, [str(harness)], {"EDGE_SDK_CPU_ISA": name}, isa=name)
        assert found == expected_attention, f"the library's {name} attention differs from the portable build's"
    for name in X86_DISPATCH.keys() - set(runnable):
        assert f"EDGE_SDK_CPU_ISA={name}: this CPU lacks" in refused(tmp_path, [str(harness)], name)
    message = refused(tmp_path, [str(harness)], "avx1024")
    assert "not an instruction set of this library's kernels, which hold: " + " ".join(X86_DISPATCH) in message
    single = refused(tmp_path, [str(portable)], "avx2")
    assert "hold: portable" in single and "-DEDGE_SDK_NATIVE_ARCH=OFF" in single


@AARCH64_TOOLS
@x86_64_gcc
@cmake
def test_a_cross_built_aarch64_library_uses_the_dot_product_where_the_cpu_has_it(tmp_path, kernel_builds):
    """The aarch64 library holds NEON with and without the dot-product instructions: qemu's Cortex-A72 (Armv8.0, no
    dotprod) runs the NEON build and its `max` CPU the dotprod one, both writing the portable x86 build's bytes."""
    library = build_package_library(tmp_path, AARCH64_TOOLCHAIN)
    code = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(library)], capture_output=True, text=True).stdout
    assert "sdot\tv" in code and "smull\tv" in code
    harness = link_harness(tmp_path, "aarch64-linux-gnu-gcc", library)
    portable = kernel_builds.harness("gcc", ["-march=x86-64"], "portable")
    expected = run_harness(tmp_path, [str(portable)], cases=DISPATCH_CASES)
    on_a72 = ["qemu-aarch64", "-cpu", "cortex-a72", *QEMU_SYSROOT, str(harness)]
    on_max = [*QEMU, str(harness)]
    assert run_harness(tmp_path, on_a72, isa="neon", cases=DISPATCH_CASES) == expected
    assert run_harness(tmp_path, on_max, isa="neon_dotprod", cases=DISPATCH_CASES) == expected
    assert run_harness(tmp_path, on_max, {"EDGE_SDK_CPU_ISA": "neon"}, isa="neon", cases=DISPATCH_CASES) == expected
    expected_attention = run_attention(tmp_path, [str(portable)])
    assert run_attention(tmp_path, on_a72, isa="neon") == expected_attention
    assert "EDGE_SDK_CPU_ISA=neon_dotprod: this CPU lacks" in refused(tmp_path, on_a72, "neon_dotprod")
