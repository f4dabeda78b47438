"""Broken checkpoints give one clear line naming the file and field, exit status 2, no traceback."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edge_sdk.cli import main

from .hf_models import family_configs, save_hf_model


@pytest.fixture
def checkpoint(tmp_path):
    save_hf_model(family_configs()["llama-relu"], tmp_path / "model")
    return tmp_path / "model"


def run_info(path):
    result = CliRunner().invoke(main, ["info", str(path)])
    return result.exit_code, result.output


def test_info_on_a_valid_checkpoint(checkpoint):
    result = CliRunner().invoke(main, ["info", str(checkpoint), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["architecture"] == "LlamaForCausalLM"
    assert (summary["layers"], summary["hidden_size"], summary["intermediate_size"]) == (2, 64, 160)
    assert summary["activation"] == "relu" and summary["dtype"] == "float32"
    # 2 layers x (attention 4*64*64 + FFN 3*64*160 + 2 norms) + untied embeddings 2*97*64 + final norm
    assert summary["parameters"] == 2 * (4 * 64 * 64 + 3 * 64 * 160 + 128) + 2 * 97 * 64 + 64


def test_missing_config(checkpoint):
    (checkpoint / "config.json").unlink()
    code, output = run_info(checkpoint)
    assert code == 2
    assert "config.json is missing" in output and str(checkpoint) in output


def test_missing_weights(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    code, output = run_info(checkpoint)
    assert code == 2 and "no weights found (expected model.safetensors" in output


def test_truncated_safetensors(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    code, output = run_info(checkpoint)
    assert code == 2
    assert "model.safetensors: truncated: tensor 'model.layers.1.self_attn.v_proj.weight'" in output


def test_corrupt_safetensors_header(checkpoint):
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8 : 8 + 16] = b"#" * 16
    weights.write_bytes(bytes(data))
    code, output = run_info(checkpoint)
    assert code == 2 and "model.safetensors: header: not valid JSON" in output
    weights.write_bytes(struct.pack("<Q", 10**12) + bytes(data[8:]))
    code, output = run_info(checkpoint)
    assert code == 2 and f"header length {10**12} does not fit" in output


def test_shape_disagrees_with_config(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["intermediate_size"] = 128
    (checkpoint / "config.json").write_text(json.dumps(config))
    code, output = run_info(checkpoint)
    assert code == 2
    assert "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [160, 64], expected [128, 64]" in output


def test_weights_of_more_layers_than_the_config_says(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = 1  # the weights hold layers 0 and 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    code, output = run_info(checkpoint)
    assert code == 2
    assert "model.safetensors: tensor 'model.layers.1." in output
    assert "belongs to layer 1, but config.json's num_hidden_layers is 1" in output


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model_type", "falcon", "field 'model_type' must be one of llama, mistral, qwen2 (or 'architectures'"),
        (
            "hidden_act",
            "gelu_new",
            "field 'hidden_act' must be one of relu, fatrelu, drelu, silu, swish, found \"gelu_new\"",
        ),
    ],
)
def test_unknown_model_type_or_activation(checkpoint, field, value, message):
    config = json.loads((checkpoint / "config.json").read_text())
    config[field] = value
    config.pop("architectures", None)
    (checkpoint / "config.json").write_text(json.dumps(config))
    code, output = run_info(checkpoint)
    assert code == 2 and message in output
    assert output.count("\n") == 1


def test_sharded_checkpoint_with_a_missing_shard(tmp_path):
    save_hf_model(family_configs()["llama-relu"], tmp_path, max_shard_size="60KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    code, output = run_info(tmp_path)
    assert code == 2 and f"{shard}: file not found" in output


def test_real_process_prints_no_traceback(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    (broken / "config.json").write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "edge_sdk", "info", str(broken)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr.startswith("edge-sdk: error: ") and "config.json: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
