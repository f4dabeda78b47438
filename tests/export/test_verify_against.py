"""`verify --against MODEL_DIR`: transformers runs MODEL_DIR's config.json on the bundle's weights, and the bundle's
dense logits must match it; a config.json read otherwise, or another model, fails with one line naming both."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from edge_sdk.cli import main
from edge_sdk.export.against import AgainstError, compare_with_transformers
from edge_sdk.export.verify import DEFAULT_DECODE_STEPS, DEFAULT_PROMPT

from ..conftest import TINY_MODEL


@pytest.mark.parametrize("name", ["svd-fp32", "svd-int4", "tied-svd-int4"])
def test_bundles_of_each_weight_format_compute_what_transformers_computes(bundle_matrix, name):
    bundle = bundle_matrix[name]
    source = bundle_matrix.tied_model() if name.startswith("tied-") else TINY_MODEL
    result = compare_with_transformers(bundle, source, DEFAULT_PROMPT, DEFAULT_DECODE_STEPS)
    assert result["against_positions"] > DEFAULT_DECODE_STEPS
    # float32 on both sides, the same weights: summation order alone (about 1e-5 of logits near 15)
    assert result["against_max_abs_logit_diff"] < 1e-4 <= result["against_tolerance"]


def edited_model(tmp_path, **fields):
    directory = tmp_path / "model"
    shutil.copytree(TINY_MODEL, directory, ignore=shutil.ignore_patterns("*.txt"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | fields))
    return directory


@pytest.mark.parametrize(
    "fields",
    [
        {"rope_theta": 500000.0},  # a RoPE setting read otherwise
        # a window longer than the prompt and its greedy steps (19 tokens): it shows only when the sequence is continued
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 24},
    ],
    ids=["rope-theta", "sliding-window"],
)
def test_a_configuration_read_otherwise_fails_verify(bundle_matrix, tmp_path, fields):
    bundle = bundle_matrix["svd-fp32"]
    result = CliRunner().invoke(
        main, ["verify", str(bundle.path), "--files-only", "--against", str(edited_model(tmp_path, **fields))]
    )
    assert result.exit_code != 0
    message = result.output.strip().splitlines()[-1]
    assert f"{bundle.path}: transformers " in message and " otherwise than the bundle, on the same weights" in message
    assert "Traceback" not in result.output


def test_another_model_is_named_as_such(bundle_matrix, tmp_path):
    bundle = bundle_matrix["svd-fp32"]
    shapes = r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[1536, 192\] in transformers' model, \[768, 192\]"
    with pytest.raises(AgainstError, match=shapes + " in the bundle: the bundle was not exported from this model"):
        compare_with_transformers(bundle, edited_model(tmp_path, intermediate_size=1536), DEFAULT_PROMPT, 1)


def test_a_path_that_is_no_checkpoint_directory_is_refused(bundle_matrix, tmp_path):
    bundle = bundle_matrix["svd-fp32"]
    result = CliRunner().invoke(main, ["verify", str(bundle.path), "--files-only", "--against", str(tmp_path)])
    assert result.exit_code != 0
    assert f"{tmp_path}: expected the Hugging Face checkpoint directory the bundle was exported from" in result.output
    result = CliRunner().invoke(main, ["verify", str(bundle.path), "--files-only", "--against", str(tmp_path / "no")])
    assert result.exit_code != 0
    assert f"{tmp_path / 'no'}: no such directory" in result.output
