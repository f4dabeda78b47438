"""The predictor registry: the C runtime's kind table is the registry's (jetson/src/predictor_kinds.{h,c} are exactly
what edge_sdk.predictors.c_table generates), each kind's description agrees with its behaviour, the descriptions load
without torch, and the modules that run predictors ask the kind instead of naming one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.errors import CalibrationError
from edge_sdk.predictors import KINDS, PredictorKind, c_table

REPO = Path(__file__).resolve().parents[2]
JETSON_SRC = REPO / "jetson" / "src"


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
            assert f'{{"{tensor.name}", DTYPE_{tensor.dtype}, {int(tensor.factor)}, {len(tensor.shape)}, ' in source
    assert "[PREDICTOR_SVD]" in source and '{"a", DTYPE_F32, 1, 2, {{DIM_INTERMEDIATE, 0}, {DIM_RANK, 0}}}' in source
    assert '{"alpha", DTYPE_F32, 0, 1, {{DIM_FIXED, 1}}}' in source


def test_no_hand_written_kind_list_is_left_in_the_c_reader():
    for name in ("config.c", "layout.c", "config.h"):
        text = (JETSON_SRC / name).read_text()
        assert '"signbit"' not in text and '"threshold", "none"' not in text, name


def test_the_registry_and_the_calibration_settings_import_no_torch():
    """The device runtime reads the kinds' descriptions: a kind's behaviour imports torch / onnx only when it runs."""
    code = (
        "import sys, edge_sdk.predictors, edge_sdk.sparsity.settings, edge_sdk.cli; "
        "print(sorted(name for name in ('torch', 'onnx', 'onnxruntime') if name in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert found == "[]"


@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_describes_what_its_behaviour_does(name):
    kind = KINDS[name]
    behaviour = {method for method, member in vars(PredictorKind).items() if callable(member)}
    overrides = {method for method in behaviour if getattr(type(kind), method) is not getattr(PredictorKind, method)}
    assert kind.calibrated == ("fit" in overrides) == any(tensor.name == "capacity" for tensor in kind.tensors)
    assert kind.has_levels == any("levels" in tensor.shape for tensor in kind.tensors)
    # a mask fixed at prefill is a decode input of the graphs (the TensorRT profiles bound it by this flag)
    assert kind.fixed_at_prefill == ("prefill_mask" in overrides) == ("decode_inputs" in overrides)
    # a kind predicting before the gate gives every engine its mask: the reference's, the C kernels', the device's
    predicts_first = {"decode_mask", "native_masker", "device_scorer", "emit_step_mask"}
    assert (not kind.gate_first) == (predicts_first <= overrides)


def test_no_module_that_runs_a_predictor_names_a_kind():
    """The engines, the graph builder, the exporter and the calibration loop ask the kind; none branches on its name."""
    modules = (
        "edge_sdk/sparsity/sparse_model.py",
        "edge_sdk/sparsity/pipeline.py",
        "edge_sdk/sparsity/levels.py",
        "edge_sdk/export/graph.py",
        "edge_sdk/export/exporter.py",
        "edge_sdk/export/ort_session.py",
        "backends/cpu/torch_engine.py",
        "backends/cann/gather_ffn.py",
        "backends/tensorrt/profiles.py",
    )
    for module in modules:
        text = (REPO / module).read_text()
        named = [name for name in KINDS if f'"{name}"' in text or f"'{name}'" in text]
        assert not named, f"{module} names the predictor kinds {named}"


@pytest.mark.parametrize("name", [name for name, kind in KINDS.items() if not kind.calibrated])
def test_a_kind_without_calibration_refuses_to_fit(name):
    with pytest.raises(CalibrationError, match=f"predictor '{name}' is not calibrated"):
        KINDS[name].fit(None, None, None, None)


def test_each_knob_is_a_calibration_setting_of_one_kind():
    """A knob's name is a CalibrationSettings field (a misspelt one would turn off the CLI's refusal of an option the
    chosen kind does not read), owned by one kind, and never a field every kind reads."""
    from dataclasses import fields

    from edge_sdk.sparsity.settings import LEVEL_FIELDS, CalibrationSettings, kinds_reading

    names = {field.name for field in fields(CalibrationSettings)}
    owners: dict[str, str] = {}
    for kind in KINDS.values():
        for knob in kind.knobs:
            assert knob in names and knob not in LEVEL_FIELDS and knob not in owners, (kind.name, knob)
            owners[knob] = kind.name
    assert owners["rank"] == "svd" and owners["recall_target"] == "signbit" and owners["core_beta"] == "core"
    assert kinds_reading("rank") == ("svd",) and kinds_reading("levels") == ("svd", "threshold")
    assert kinds_reading("max_tokens") == ("svd", "signbit", "core", "threshold")
