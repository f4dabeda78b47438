"""The kernels of a block of tokens (a prompt), edge_cpu_matmuls and edge_cpu_ffn_tokens, against the one-token
kernels: every token's values are those of edge_cpu_matvecs / edge_cpu_sparse_ffn(_q) with mask NULL, bit for bit,
for every storage type (fp32, fp16, int8, int4, asymmetric int4; the FFN also with int8 down rows under int4 gate and
up), with x quantized for the integer dot products and in fp32, runs of rows cut anywhere, any thread count; and the
arguments they refuse without writing."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from edge_sdk import quant
from edge_sdk.model.activation import Activation
from edge_sdk.native import NativeLibraryError, load_cpu_kernels

try:
    load_cpu_kernels()
except (NativeLibraryError, OSError) as error:  # the package build must have compiled it; say why if not
    pytest.skip(f"CPU kernel library not loadable: {error}", allow_module_level=True)

from edge_sdk.backends.cpu import kernels
from edge_sdk.backends.cpu.kernels import QuantizedWeight, SparseFFNKernel

from edge_sdk.native import ACTIVATIONS_ENV

_ptr, _int = ctypes.c_void_p, ctypes.c_int
STORAGES = ["fp32", "fp16", "int8", "int4", "int4-asymmetric"]
ACTIVATION_CODES = {"relu": 0, "fatrelu": 1, "drelu": 2, "silu": 3}
DTYPE_CODES = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "int4-asymmetric": 3}
# the FFN's storages: each of STORAGES for all three matrices, and int4 gate and up (symmetric or asymmetric) over
# int8 down rows (a bundle's down_dtype int8), which must not take the prompt's shared INT4 down rows path
INT8_DOWN = "-down8"
FFN_STORAGES = [*STORAGES, "int4" + INT8_DOWN, "int4-asymmetric" + INT8_DOWN]


def library():
    lib = load_cpu_kernels()
    lib.edge_cpu_matmuls.argtypes = [_ptr, _int, _int, ctypes.POINTER(kernels._Matrix), _int, _int]
    lib.edge_cpu_matmuls.restype = _int
    lib.edge_cpu_ffn_tokens_workspace_size.argtypes = [_int, _int, _int]
    lib.edge_cpu_ffn_tokens_workspace_size.restype = ctypes.c_size_t
    # x, tokens, d, D, the three matrices' codes, scales and mins, weight_dtype, down_format, group_size, activation,
    # act_threshold, y, workspace, threads
    lib.edge_cpu_ffn_tokens.argtypes = [_ptr, _int, _int, _int] + [_ptr] * 9 + [_int] * 4 + [ctypes.c_float, _ptr,
                                                                                              _ptr, _int]  # fmt: skip
    lib.edge_cpu_ffn_tokens.restype = _int
    return lib


@pytest.fixture(params=["integer", "fp32"])
def activations_setting(request, monkeypatch):
    """Each way of dotting quantized rows with x (fp rows: the same either way)."""
    if request.param == "fp32":
        monkeypatch.setenv(ACTIVATIONS_ENV, "fp32")
    else:
        monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    return request.param


def weight_of(storage: str, rows: int, cols: int, seed: int, group_size: int = 32):
    """A [rows, cols] matrix in `storage`: a torch tensor (fp) or a QuantizedWeight."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((rows, cols)) * cols**-0.5).astype(np.float32)
    if storage == "int4-asymmetric":
        values += np.repeat(rng.uniform(0.05, 0.2, (rows, cols // group_size)), group_size, axis=1).astype(np.float32)
        return QuantizedWeight.from_matrix(quant.quantize(values, "int4", group_size, asymmetric=True))
    if storage in ("int8", "int4"):
        return QuantizedWeight.from_matrix(quant.quantize(values, storage, group_size))
    return torch.from_numpy(values).to(torch.float16 if storage == "fp16" else torch.float32)


def pointers(weight) -> tuple[int, int | None, int | None]:
    if isinstance(weight, QuantizedWeight):
        mins = None if weight.mins is None else weight.mins.data_ptr()
        return weight.data.data_ptr(), weight.scales.data_ptr(), mins
    return weight.data_ptr(), None, None


def matmuls(x: torch.Tensor, weights, biases, threads: int) -> tuple[int, list[torch.Tensor]]:
    """edge_cpu_matmuls over x [tokens, in]: its status and each matrix's y [tokens, rows]."""
    tokens, n_in = x.shape
    matrices, outputs = (kernels._Matrix * len(weights))(), []
    for i, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
        data, scales, mins = pointers(weight)
        rows = weight.data.shape[0] if isinstance(weight, QuantizedWeight) else weight.shape[0]
        dtype, group_size = kernels._storage(weight)
        out = torch.full((tokens, rows), 7.0)
        matrices[i] = kernels._Matrix(data, scales, mins, dtype, group_size, rows,
                                      None if bias is None else bias.data_ptr(), out.data_ptr())  # fmt: skip
        outputs.append(out)
    status = library().edge_cpu_matmuls(x.data_ptr(), tokens, n_in, matrices, len(weights), threads)
    return status, outputs


@pytest.mark.parametrize("storage", STORAGES)
def test_matmuls_give_each_token_its_matvecs_bits(storage, activations_setting):
    """q, k and v shapes of 96 values (int4: a partial unit; int8: a half unit) at group size 32 and 576 (SmolLM2's)
    at 64, 1, 2 and 5 tokens (AVX-512 dots a row with 4 tokens at once, then one by one), 1 to 3 threads: each token's
    rows equal edge_cpu_matvecs on that token alone, runs of rows ending inside each matrix (fp32 rows of 576 values:
    14 to a run, so 300 rows make 22 runs)."""
    for n_in, row_counts, group_size in ((96, (40, 8, 8), 32), (576, (300, 64, 64), 64)):
        weights = [weight_of(storage, rows, n_in, rows + n_in + i, group_size) for i, rows in enumerate(row_counts)]
        biases = [torch.randn(row_counts[0], generator=torch.Generator().manual_seed(1)), None, None]
        for tokens in (1, 2, 5):
            x = torch.randn(tokens, n_in, generator=torch.Generator().manual_seed(tokens))
            expected = [kernels.matvecs(x[t], weights, biases, threads=1) for t in range(tokens)]
            assert expected[0][0].abs().max() > 0.1
            for threads in (1, 2, 3):
                status, found = matmuls(x, weights, biases, threads)
                assert status == 0
                for t in range(tokens):
                    for i in range(len(weights)):
                        assert torch.equal(found[i][t], expected[t][i]), (n_in, tokens, threads, t, i)


def ffn_weights(storage: str, rows: int, cols: int, seed: int, group_size: int = 32):
    """gate, up and down_t [rows, cols] of an FFN storage (FFN_STORAGES): the down rows int8 for "...-down8"."""
    base = storage.removesuffix(INT8_DOWN)
    gate, up = (weight_of(base, rows, cols, seed + k, group_size) for k in range(2))
    return gate, up, weight_of("int8" if storage.endswith(INT8_DOWN) else base, rows, cols, seed + 2, group_size)


def ffn_tokens(x: torch.Tensor, storage: str, gate, up, down, activation: Activation, threads: int):
    tokens, d = x.shape
    base = storage.removesuffix(INT8_DOWN)
    down_code = DTYPE_CODES["int8" if storage.endswith(INT8_DOWN) else base]
    n_neurons = gate.data.shape[0] if isinstance(gate, QuantizedWeight) else gate.shape[0]
    lib = library()
    workspace = torch.empty(lib.edge_cpu_ffn_tokens_workspace_size(d, n_neurons, tokens), dtype=torch.uint8)
    y = torch.full((tokens, d), 7.0)
    weights = [pointer for weight in (gate, up, down) for pointer in pointers(weight)]
    group_size = gate.group_size if isinstance(gate, QuantizedWeight) else 0
    status = lib.edge_cpu_ffn_tokens(
        x.data_ptr(), tokens, d, n_neurons, *weights, DTYPE_CODES[base], down_code, group_size,
        ACTIVATION_CODES[activation.kind], activation.threshold, y.data_ptr(), workspace.data_ptr(), threads,
    )  # fmt: skip
    return status, y


def one_token_ffn(x: torch.Tensor, gate, up, down, activation: Activation) -> torch.Tensor:
    kernel = SparseFFNKernel(x.shape[0], gate.data.shape[0] if isinstance(gate, QuantizedWeight) else gate.shape[0], 1)
    if isinstance(gate, QuantizedWeight):
        return kernel.quantized(x, gate, up, down, activation)
    return kernel(x, gate, up, down, activation)


@pytest.mark.parametrize("storage", FFN_STORAGES)
@pytest.mark.parametrize(
    "activation", [Activation("relu"), Activation("fatrelu", 0.05), Activation("drelu"), Activation("silu")]
)
@pytest.mark.parametrize("group_size", [32, 128])
def test_ffn_tokens_give_each_token_the_one_token_ffn_bits(storage, activation, group_size, activations_setting):
    """d 256 with 700 neurons (several runs of gate and up rows: 32 fp32 rows to a run, 256 short int4 ones) and
    several down column blocks; 1, 3 and 6 tokens on 1 to 3 threads: each token's y is edge_cpu_sparse_ffn(_q) with
    mask NULL on that token, bit for bit."""
    d, n_neurons = 256, 700
    gate, up, down = ffn_weights(storage, n_neurons, d, 40, group_size)
    for tokens in (1, 3, 6):
        x = torch.randn(tokens, d, generator=torch.Generator().manual_seed(50 + tokens))
        expected = torch.stack([one_token_ffn(x[t], gate, up, down, activation) for t in range(tokens)])
        assert expected.abs().max() > 0.01
        for threads in (1, 2, 3):
            status, y = ffn_tokens(x, storage, gate, up, down, activation, threads)
            assert status == 0
            assert torch.equal(y, expected), (tokens, threads, (y - expected).abs().max())


@pytest.mark.parametrize(
    "storage", ["int4", "int4-asymmetric", "int8", "int4" + INT8_DOWN, "int4-asymmetric" + INT8_DOWN]
)
def test_ffn_tokens_on_long_rows_give_each_token_the_one_token_ffn_bits(storage, activations_setting):
    """d 2112 at group size 32 (66 groups: the down rows' factors in pieces of 32, 32 and 2 groups on one thread) with
    a SiLU gate (every neuron fires: int4 down rows are shared across the tokens; int8 ones under int4 gate and up must
    not be), 5 tokens, 1 and 2 threads: each token's y is the one-token FFN's, bit for bit."""
    d, n_neurons = 2112, 40
    gate, up, down = ffn_weights(storage, n_neurons, d, 80)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(81))
    silu = Activation("silu")
    expected = torch.stack([one_token_ffn(x[t], gate, up, down, silu) for t in range(5)])
    assert expected.abs().max() > 0.01
    for threads in (1, 2):
        status, y = ffn_tokens(x, storage, gate, up, down, silu, threads)
        assert status == 0
        assert torch.equal(y, expected), (threads, (y - expected).abs().max())


def test_ffn_tokens_of_a_relu_model_skip_the_rows_of_neurons_at_zero():
    """Gate rows that give every token a negative value: those neurons' up and down rows are never read (set to NaN,
    they would turn y into NaN), as in the one-token FFN."""
    d, n_neurons = 128, 96
    gate, up, down = (weight_of("fp32", n_neurons, d, seed=60 + k) for k in range(3))
    x = torch.rand(4, d, generator=torch.Generator().manual_seed(3)) + 0.5  # positive x
    gate[::2] = -gate[::2].abs()  # every other neuron: negative gate for positive x
    up[::2] = float("nan")
    down[::2] = float("nan")
    status, y = ffn_tokens(x, "fp32", gate, up, down, Activation("relu"), 2)
    assert status == 0
    assert torch.isfinite(y).all() and y.abs().max() > 0.01
    assert torch.equal(y, torch.stack([one_token_ffn(x[t], gate, up, down, Activation("relu")) for t in range(4)]))


def test_token_block_kernels_refuse_bad_arguments_without_writing():
    d, n_neurons = 64, 32
    gate, up, down = (weight_of("int8", n_neurons, d, seed=70 + k) for k in range(3))
    x = torch.randn(2, d)
    lib = library()
    assert lib.edge_cpu_ffn_tokens_workspace_size(d, n_neurons, 0) == 0
    assert lib.edge_cpu_ffn_tokens_workspace_size(d, n_neurons, 2) > 0
    relu = Activation("relu")
    status, y = ffn_tokens(x[:0], "int8", gate, up, down, relu, 1)  # no tokens
    assert status == 1 and (y == 7.0).all()
    # fp rows with scales, and quantized rows with a group size that does not divide d
    weights = [pointer for weight in (gate, up, down) for pointer in pointers(weight)]
    workspace = torch.empty(lib.edge_cpu_ffn_tokens_workspace_size(d, n_neurons, 2), dtype=torch.uint8)
    for dtype, down_format, group_size in ((0, 0, 0), (2, 2, 48)):
        y = torch.full((2, d), 7.0)
        status = lib.edge_cpu_ffn_tokens(x.data_ptr(), 2, d, n_neurons, *weights, dtype, down_format, group_size, 0,
                                         0.0, y.data_ptr(), workspace.data_ptr(), 1)  # fmt: skip
        assert status == 1 and (y == 7.0).all(), (dtype, group_size)
    # down_format: weight_dtype's, or int8 under int4 gate and up; never int4 under int8, nor fp down under quantized
    # rows or another fp dtype
    fp_gate, fp_up, fp_down = ffn_weights("fp32", n_neurons, d, 90)
    fp_weights = [pointer for weight in (fp_gate, fp_up, fp_down) for pointer in pointers(weight)]
    int4_gate, int4_up, int8_down = ffn_weights("int4-asymmetric" + INT8_DOWN, n_neurons, d, 93)
    int4_down = weight_of("int4-asymmetric", n_neurons, d, 96)
    mixed = [pointer for weight in (int4_gate, int4_up, int8_down) for pointer in pointers(weight)]
    down_mins = [*mixed[:8], int4_down.mins.data_ptr()]
    int4_under_int8 = [*weights[:6], *pointers(weight_of("int4", n_neurons, d, 97))]
    calls = {
        "fp32 rows, fp16 down": (fp_weights, 0, 1),
        "fp32 rows, int8 down": (fp_weights, 0, 2),
        "int8 rows, int4 down": (int4_under_int8, 2, 3),
        "int4 rows, fp32 down": (mixed, 3, 0),
        "int4 rows, an unknown down format": (mixed, 3, 5),
        "int8 down rows with minimums": (down_mins, 3, 2),
        "int8 down rows, up without minimums": ([*mixed[:5], None, *mixed[6:]], 3, 2),
    }
    for name, (arguments, dtype, down_format) in calls.items():
        y = torch.full((2, d), 7.0)
        status = lib.edge_cpu_ffn_tokens(x.data_ptr(), 2, d, n_neurons, *arguments, dtype, down_format, 32, 0, 0.0,
                                         y.data_ptr(), workspace.data_ptr(), 1)  # fmt: skip
        assert status == 1 and (y == 7.0).all(), name
    y = torch.full((2, d), 7.0)
    status = lib.edge_cpu_ffn_tokens(x.data_ptr(), 2, d, n_neurons, *mixed, 3, 2, 32, 0, 0.0, y.data_ptr(),
                                     workspace.data_ptr(), 1)  # fmt: skip
    assert status == 0 and not (y == 7.0).all()
    status, outputs = matmuls(x[:0], [gate], [None], 1)
    assert status == 1
    status, outputs = matmuls(x, [gate, weight_of("int4", 8, d, seed=1)], [None, None], 1)  # two storage types
    assert status == 1 and all((out == 7.0).all() for out in outputs)
