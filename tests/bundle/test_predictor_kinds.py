"""The C runtime's predictor kind table is the registry's: jetson/src/predictor_kinds.{h,c} are exactly what
edge_sdk.predictors.c_table generates, and the C reader derives the same expected predictor tensors as Python."""

from __future__ import annotations

from pathlib import Path

from edge_sdk.predictors import KINDS, c_table

JETSON_SRC = Path(__file__).resolve().parents[2] / "jetson" / "src"


def test_the_committed_c_table_is_the_generated_one():
    stale = [
        name
        for name, text in ((c_table.HEADER_NAME, c_table.header()), (c_table.SOURCE_NAME, c_table.source()))
        if (JETSON_SRC / name).read_text() != text
    ]
    assert not stale, f"regenerate with `python -m edge_sdk.predictors.c_table jetson/src`: stale {stale}"


def test_the_generated_table_lists_every_kind_tensor_and_dimension():
    source = c_table.source()
    for name, kind in KINDS.items():
        entry = f'[PREDICTOR_{name.upper()}] = {{"{name}", {int(kind.has_levels)}, {len(kind.tensors)}'
        assert entry in source
        for tensor in kind.tensors:
            assert f'{{"{tensor.name}", DTYPE_{tensor.dtype}, {len(tensor.shape)}, ' in source
    assert "[PREDICTOR_SVD]" in source and '{"a", DTYPE_F32, 2, {{DIM_INTERMEDIATE, 0}, {DIM_RANK, 0}}}' in source
    assert '{"alpha", DTYPE_F32, 1, {{DIM_FIXED, 1}}}' in source


def test_no_hand_written_kind_list_is_left_in_the_c_reader():
    for name in ("config.c", "layout.c", "config.h"):
        text = (JETSON_SRC / name).read_text()
        assert '"signbit"' not in text and '"threshold", "none"' not in text, name
