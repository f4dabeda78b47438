"""The native FFN benchmark's data and bookkeeping (edge_sdk/bench/ffn.py); its timings are not asserted."""

import pytest
import torch

from edge_sdk.bench.ffn import (
    COLUMNS,
    QUANTIZED_COLUMNS,
    bench_ffn,
    bench_quantized_ffn,
    random_active,
    time_interleaved,
    torch_threads,
)


def test_random_active_draws_the_requested_count_reproducibly():
    n_active, active = random_active(1000, 0.83, torch.Generator().manual_seed(4))
    again = random_active(1000, 0.83, torch.Generator().manual_seed(4))[1]
    assert n_active == 170 and int(active.sum()) == 170 and active.dtype == torch.bool
    assert torch.equal(active, again)
    assert not torch.equal(active, random_active(1000, 0.83, torch.Generator().manual_seed(5))[1])


def test_torch_threads_sets_and_restores():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("restored even when the block fails")
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before


def test_time_interleaved_takes_a_variants_own_clock_where_it_has_one():
    calls = []
    own_seconds = iter([0.004, 0.001, 0.002, 0.003, 0.005])  # the warm-up call's, then the four timed ones'
    timings = time_interleaved(
        {"own": lambda: calls.append("own"), "wall": lambda: calls.append("wall")},
        repeats=4,
        warmup=1,
        own_clocks={"own": lambda: next(own_seconds)},
    )
    assert calls == ["own", "wall"] * 5  # interleaved, warm-up included
    assert timings["own"] == pytest.approx(3.0)  # the median (upper middle) of 1, 2, 3, 5 ms: not the wall time
    assert 0 < timings["wall"] < 1.0  # an empty Python call


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_bench_rows_realize_the_requested_sparsity(dtype):
    before = torch.get_num_threads()
    rows = bench_ffn(64, 512, sparsities=(0.5, 0.875), dtype=dtype, threads=1, repeats=1, warmup=0)
    assert torch.get_num_threads() == before
    assert [row["sparsity"] for row in rows] == [0.5, 0.875]
    # the weights are arranged so that exactly the drawn active set fires: 256 and 64 of 512 neurons
    assert [row["realized_sparsity"] for row in rows] == [0.5, 0.875]
    for row in rows:
        assert set(COLUMNS) <= set(row) and row["threads"] == 1 and row["dtype"] == dtype
        assert all(row[column] > 0 for column in COLUMNS if column.endswith("_ms"))


@pytest.mark.parametrize(
    ("dtype", "asymmetric", "row_bytes"),
    [("int8", False, 128 + 4 * 2), ("int4", False, 64 + 4 * 2), ("int4", True, 64 + 4 * 2 + 4 * 2)],
    ids=["int8", "int4", "int4-asymmetric"],
)
def test_quantized_bench_rows_realize_the_sparsity_and_count_the_bytes(dtype, asymmetric, row_bytes):
    rows = bench_quantized_ffn(128, 512, sparsities=(0.5, 0.875), dtype=dtype, group_size=32, threads=1, repeats=1,
                               warmup=0, asymmetric=asymmetric)  # fmt: skip
    # negating quantized gate rows through their scales (and minimums) makes exactly the drawn set fire: 256 and 64
    assert [row["realized_sparsity"] for row in rows] == [0.5, 0.875]
    scheme = ("asymmetric" if asymmetric else "symmetric") if dtype == "int4" else None
    for row, n_active in zip(rows, (256, 64), strict=True):
        assert set(QUANTIZED_COLUMNS) <= set(row) and row["dtype"] == dtype and row["group_size"] == 32
        assert row["int4_scheme"] == scheme and row["down_dtype"] == dtype
        assert row["sparse_mb_read"] == pytest.approx(3 * n_active * row_bytes / 1e6)  # codes, scales (and mins)
        assert row["sparse_ms"] > 0 and row["fp16_sparse_ms"] > 0 and row["fp32_x_sparse_ms"] > 0
        assert row["sparse_call_ms"] > 0
        assert row["read_gb_per_s"] > 0
        assert row["read_fraction"] == pytest.approx(row["sparse_gb_per_s"] / row["read_gb_per_s"])
        assert row["speedup_vs_fp32_x"] == pytest.approx(row["fp32_x_sparse_ms"] / row["sparse_ms"])
    with pytest.raises(ValueError, match="group_size"):
        bench_quantized_ffn(96, 64, dtype=dtype, group_size=64)


@pytest.mark.parametrize("option", [("--int4-scheme", "asymmetric"), ("--down-dtype", "int8")])
@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_bench_ffn_takes_an_int4_scheme_and_a_down_dtype_with_int4_only(dtype, option):
    from click.testing import CliRunner

    from edge_sdk.cli import main

    args = ["bench", "ffn", "--shape", "128x512", "--dtype", dtype, *option, "--repeats", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"{' '.join(option)} needs --dtype int4, found --dtype {dtype}" in result.output


@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "asymmetric"])
def test_quantized_bench_takes_int8_down_rows_under_int4(asymmetric):
    """--down-dtype int8: gate and up int4 (with minimums when asymmetric), down int8 without: their bytes counted
    apart (d 128, groups of 32: int4 64 + 8 (+ 8) bytes a row, int8 128 + 8)."""
    rows = bench_quantized_ffn(128, 512, sparsities=(0.875,), dtype="int4", group_size=32, threads=1, repeats=1,
                               warmup=0, asymmetric=asymmetric, down_dtype="int8")  # fmt: skip
    (row,) = rows
    gate_up_bytes = 64 + 8 + (8 if asymmetric else 0)
    assert row["realized_sparsity"] == 0.875 and row["down_dtype"] == "int8"
    assert row["sparse_mb_read"] == pytest.approx(64 * (2 * gate_up_bytes + 128 + 8) / 1e6)
    with pytest.raises(ValueError, match=r"down_dtype: expected int8 .*, found 'int4' with 'int8'"):
        bench_quantized_ffn(128, 512, dtype="int8", down_dtype="int4")


@pytest.mark.parametrize(
    "options", [["--dtype", "fp32"], ["--dtype", "int4"], ["--backend", "torch-cpu", "--dtype", "fp16"]], ids=str
)
def test_bench_ffn_refuses_a_shape_beyond_the_machines_memory_before_allocating(options):
    from click.testing import CliRunner

    from edge_sdk.cli import main

    result = CliRunner().invoke(main, ["bench", "ffn", "--shape", "1000000x1000000", *options, "--repeats", "1"])
    assert result.exit_code == 2, result.output
    assert "bench ffn at d=1000000, D=1000000 needs about" in result.output
    assert "give a smaller --shape" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--sparsity", "1.5"], "Invalid value for '--sparsity': expected values in [0, 1), found 1.5"),
        (["--sparsity", "1.5", "--dtype", "int8"], "Invalid value for '--sparsity': expected values in [0, 1)"),
        (["--shape", "512"], "Invalid value for '--shape': expected one of llama2-7b, mistral-7b, qwen2-7b or dxD"),
        (["--group-size", "64"], "--group-size: only an int8 or int4 benchmark reads it, found --dtype fp32"),
    ],
)
def test_bench_ffn_names_the_option_it_refuses(options, message):
    """It said "Invalid value: sparsities: ..." and "Invalid value: shape: ...": the library's parameter names, not
    the options the user typed."""
    from click.testing import CliRunner

    from edge_sdk.cli import main

    result = CliRunner().invoke(main, ["bench", "ffn", "--shape", "64x256", *options, "--repeats", "1"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "sparsities" not in result.output
