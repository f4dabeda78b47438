"""Weight files that disagree with config.json, an index that disagrees with its shards, and the size estimate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from edge_sdk.errors import CheckpointError
from edge_sdk.model import checkpoint as checkpoint_module
from edge_sdk.model.checkpoint import Checkpoint, open_checkpoint
from edge_sdk.model.config import hf_tensor_shapes, parse_config
from edge_sdk.model.summary import describe_checkpoint

from .hf_models import SMALL_CONFIG

CONFIG = SMALL_CONFIG | {"num_hidden_layers": 2}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


def model_tensors(dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = hf_tensor_shapes(parse_config(CONFIG, Path("config.json")))
    return {name: torch.randn(shape, generator=generator).to(dtype) for name, shape in shapes.items()}


def write_single(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def write_sharded(directory: Path, shards: tuple[dict, dict], weight_map: dict | None = None) -> Path:
    """Two shards and an index mapping each tensor to its shard (or the weight_map given)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    for name, tensors in zip(SHARDS, shards, strict=True):
        save_file(tensors, str(directory / name))
    if weight_map is None:
        weight_map = {tensor: name for name, tensors in zip(SHARDS, shards, strict=True) for tensor in tensors}
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return directory


def split(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Layer 0 and the embeddings in the first shard, the rest in the second."""
    first = {name: t for name, t in tensors.items() if "layers.1." not in name and name != "lm_head.weight"}
    return first, {name: t for name, t in tensors.items() if name not in first}


def refusal(model_dir: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        Checkpoint(model_dir)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_weight_bytes_is_the_sum_of_the_model_tensors_as_stored(tmp_path):
    tensors = model_tensors(torch.float16)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float()  # mixed dtypes: counted per tensor
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # in old files, unused: not counted
    checkpoint = Checkpoint(write_single(tmp_path / "m", tensors))
    parameters = checkpoint.config.parameter_count()
    assert checkpoint.weight_bytes == (parameters - 32) * 2 + 32 * 4
    assert describe_checkpoint(open_checkpoint(tmp_path / "m"))["weight_bytes"] == checkpoint.weight_bytes


def test_weight_bytes_of_a_sharded_checkpoint(tmp_path):
    checkpoint = Checkpoint(write_sharded(tmp_path, split(model_tensors(torch.bfloat16))))
    assert checkpoint.weight_bytes == checkpoint.config.parameter_count() * 2
    assert {entry.file.name for entry in checkpoint.entries.values()} == set(SHARDS)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.float64, torch.float8_e4m3fn])
def test_model_tensors_must_be_float32_float16_or_bfloat16(tmp_path, dtype):
    tensors = model_tensors()
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name].to(dtype)
    write_single(tmp_path, tensors)
    found = {torch.int8: "I8", torch.uint8: "U8", torch.int32: "I32", torch.float64: "F64"}.get(dtype, "F8_E4M3")
    assert (
        refusal(tmp_path)
        == f"{tmp_path / 'model.safetensors'}: tensor '{name}' must be one of F32, F16, BF16, found {found}"
    )


def test_a_valid_sharded_checkpoint_reads_every_tensor_from_its_shard(tmp_path):
    tensors = model_tensors()
    checkpoint = Checkpoint(write_sharded(tmp_path, split(tensors)))
    assert checkpoint.entries["lm_head.weight"].file == tmp_path / SHARDS[1]
    assert checkpoint.entries["model.embed_tokens.weight"].file == tmp_path / SHARDS[0]
    for name in ("lm_head.weight", "model.layers.0.mlp.down_proj.weight"):
        assert torch.equal(checkpoint.tensor(name), tensors[name])


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    first, second = split(model_tensors())
    second["model.norm.weight"] = first["model.norm.weight"] * 2  # which one would win was up to dict order
    weight_map = {name: SHARDS[0] for name in first} | {name: SHARDS[1] for name in second if name not in first}
    write_sharded(tmp_path, (first, second), weight_map)
    assert refusal(tmp_path) == (
        f"{tmp_path / INDEX}: tensor 'model.norm.weight' is stored in 2 shards ({SHARDS[0]}, {SHARDS[1]}); "
        f"each tensor must be in exactly one"
    )


def test_a_tensor_the_index_puts_in_the_wrong_shard_is_refused(tmp_path):
    first, second = split(model_tensors())
    weight_map = {name: SHARDS[0] for name in first} | {name: SHARDS[1] for name in second}
    weight_map["model.norm.weight"] = SHARDS[1]
    write_sharded(tmp_path, (first, second), weight_map)
    assert refusal(tmp_path) == (
        f"{tmp_path / INDEX}: tensor 'model.norm.weight' is in shard '{SHARDS[0]}', but 'weight_map' maps it to "
        f"'{SHARDS[1]}'"
    )


def test_the_index_and_the_shards_must_list_the_same_tensors(tmp_path):
    first, second = split(model_tensors())
    weight_map = {name: SHARDS[0] for name in first} | {name: SHARDS[1] for name in second}
    del weight_map["lm_head.weight"]
    write_sharded(tmp_path / "unlisted", (first, second), weight_map)
    assert refusal(tmp_path / "unlisted") == (
        f"{tmp_path / 'unlisted' / INDEX}: tensor 'lm_head.weight' is in shard '{SHARDS[1]}', but 'weight_map' does "
        f"not list it"
    )
    weight_map = {name: SHARDS[0] for name in first} | {name: SHARDS[1] for name in second}
    weight_map["model.layers.2.mlp.up_proj.weight"] = SHARDS[1]
    write_sharded(tmp_path / "phantom", (first, second), weight_map)
    assert refusal(tmp_path / "phantom") == (
        f"{tmp_path / 'phantom' / INDEX}: 'weight_map' maps tensor 'model.layers.2.mlp.up_proj.weight' to "
        f"'{SHARDS[1]}', which does not hold it"
    )


def test_a_missing_shard_names_the_index_entry(tmp_path):
    write_sharded(tmp_path, split(model_tensors()))
    (tmp_path / SHARDS[1]).unlink()
    assert refusal(tmp_path) == (
        f"{tmp_path / SHARDS[1]}: file not found; {tmp_path / INDEX} maps tensor 'lm_head.weight' to it"
    )


@pytest.mark.parametrize(
    "shard",
    [
        "/etc/passwd",
        "../model.safetensors",
        "sub/../../x.safetensors",
        "a\\b.safetensors",
        "",
        ".",
        "./x",
        "a//b",
        "a\0b",
    ],
)
def test_shard_names_must_stay_inside_the_model_directory(tmp_path, shard):
    first, second = split(model_tensors())
    weight_map = {name: SHARDS[0] for name in first} | {name: shard for name in second}
    write_sharded(tmp_path / "m", (first, second), weight_map)
    save_file(second, str(tmp_path / "model.safetensors"))  # what "../model.safetensors" would read
    assert refusal(tmp_path / "m") == (
        f"{tmp_path / 'm' / INDEX}: shard {shard!r} must be a relative path inside the model directory "
        f"('/'-separated names, none empty, '.' or '..', no backslash)"
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"weight_map": {"a": "x", "a": "y"}}', "not valid JSON: key 'a' appears twice in one object"),
        ('{"metadata": {"total_size": NaN}, "weight_map": {}}', "not valid JSON: NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested deeper than 64 levels"),
        (b"\xff\xfe{}", "not valid JSON: not UTF-8 text (byte 0xff at offset 0)"),
        ("[]", "expected a JSON object, found a list"),
        (
            '{"metadata": {}}',
            "field 'weight_map' must be a non-empty object of tensor name -> shard file name, found nothing",
        ),
        (
            '{"weight_map": ["x"]}',
            "field 'weight_map' must be a non-empty object of tensor name -> shard file name, found a list",
        ),
        (
            '{"weight_map": {}}',
            "field 'weight_map' must be a non-empty object of tensor name -> shard file name, found an empty object",
        ),
        (
            '{"weight_map": null}',
            "field 'weight_map' must be a non-empty object of tensor name -> shard file name, found null",
        ),
        (
            '{"weight_map": {"lm_head.weight": 5}}',
            "field 'weight_map' must map tensor names to shard file names, found a number for tensor 'lm_head.weight'",
        ),
    ],
    ids=["duplicate", "nan", "deep", "binary", "list", "no-map", "map-list", "map-empty", "map-null", "map-number"],
)
def test_a_malformed_index_is_one_line(tmp_path, content, reason):
    write_sharded(tmp_path, split(model_tensors()))
    (tmp_path / INDEX).write_bytes(content.encode() if isinstance(content, str) else content)
    assert refusal(tmp_path) == f"{tmp_path / INDEX}: {reason}"


def test_an_index_or_a_shard_that_is_not_a_regular_file(tmp_path):
    write_sharded(tmp_path, split(model_tensors()))
    with (tmp_path / INDEX).open("r+b") as handle:
        handle.truncate(checkpoint_module.MAX_INDEX_BYTES + 1)
    assert refusal(tmp_path) == f"{tmp_path / INDEX}: 16777217 bytes, more than the 16777216 this reader accepts"
    write_sharded(tmp_path, split(model_tensors()))
    (tmp_path / SHARDS[0]).unlink()
    (tmp_path / SHARDS[0]).mkdir()
    assert refusal(tmp_path) == f"{tmp_path / SHARDS[0]}: is a directory; expected a regular file"


def test_a_hugging_face_cache_snapshot_of_links_into_blobs(tmp_path):
    """snapshots/REV/* are links to ../../blobs/HASH: followed, while an index naming ../../blobs is refused."""
    source = write_sharded(tmp_path / "source", split(model_tensors()))
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for number, path in enumerate(sorted(source.iterdir())):
        shutil.copy(path, blobs / f"blob{number}")
        (snapshot / path.name).symlink_to(f"../../blobs/blob{number}")
    checkpoint = Checkpoint(snapshot)
    assert all(os.path.islink(entry.file) for entry in checkpoint.entries.values())
    assert torch.equal(checkpoint.tensor("lm_head.weight"), model_tensors()["lm_head.weight"])

    index = json.loads((snapshot / INDEX).read_text())
    blob = os.readlink(snapshot / SHARDS[1])
    index["weight_map"] = {name: blob if shard == SHARDS[1] else shard for name, shard in index["weight_map"].items()}
    (snapshot / INDEX).unlink()
    (snapshot / INDEX).write_text(json.dumps(index))
    assert refusal(snapshot).startswith(f"{snapshot / INDEX}: shard '../../blobs/blob")


def run_info(model_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_sdk", "info", str(model_dir)], capture_output=True, text=True, check=False
    )


def test_a_real_process_reports_one_line_and_exit_status_2(tmp_path):
    tensors = model_tensors()
    cases = {}
    cases["rope"] = write_single(tmp_path / "rope", tensors)
    (cases["rope"] / "config.json").write_text(json.dumps(CONFIG | {"rope_scaling": "linear"}))
    cases["deep"] = write_single(tmp_path / "deep", tensors)
    (cases["deep"] / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    cases["binary"] = write_single(tmp_path / "binary", tensors)
    (cases["binary"] / "config.json").write_bytes(b"\x00\xff" * 100)
    first, second = split(tensors)
    second["model.norm.weight"] = first["model.norm.weight"]
    cases["two-shards"] = write_sharded(tmp_path / "two-shards", (first, second))
    int8 = tensors | {"lm_head.weight": tensors["lm_head.weight"].to(torch.int8)}
    cases["int8"] = write_single(tmp_path / "int8", int8)
    expected = {
        "rope": "config.json: field 'rope_scaling' must be a JSON object, found \"linear\"",
        "deep": "config.json: not valid JSON: nested deeper than 64 levels",
        "binary": "config.json: not valid JSON: not UTF-8 text (byte 0xff at offset 1)",
        "two-shards": f"{INDEX}: tensor 'model.norm.weight' is stored in 2 shards",
        "int8": "model.safetensors: tensor 'lm_head.weight' must be one of F32, F16, BF16, found I8",
    }
    for case, model_dir in cases.items():
        result = run_info(model_dir)
        assert result.returncode == 2, (case, result.stderr)
        assert result.stdout == "" and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"edge-sdk: error: {model_dir}/")
        assert expected[case] in result.stderr, (case, result.stderr)


def test_a_real_process_reports_the_size(tmp_path):
    model_dir = write_sharded(tmp_path, split(model_tensors(torch.float16)))
    result = subprocess.run(
        [sys.executable, "-m", "edge_sdk", "info", str(model_dir), "--json"], capture_output=True, text=True, check=True
    )
    summary = json.loads(result.stdout)
    assert summary["weight_bytes"] == summary["parameters"] * 2 and summary["weight_files"] == 2


FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny-relu-llama"
POISONED = "model.layers.1.mlp.up_proj.weight"


def fixture_holding(value: float, directory: Path) -> Path:
    """The fixture in float32 with one weight of POISONED set to value."""
    from safetensors.torch import load_file

    directory.mkdir()
    for path in FIXTURE.glob("*.json"):
        shutil.copy(path, directory)
    tensors = {name: tensor.float() for name, tensor in load_file(FIXTURE / "model.safetensors").items()}
    tensors[POISONED][5, 7] = value
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.mark.slow
@pytest.mark.parametrize(
    ("value", "dtype", "message"),
    [
        (float("nan"), "fp16", "holds NaN or infinite values; a model's weights must all be finite"),
        (float("-inf"), "int4", "holds NaN or infinite values; a model's weights must all be finite"),
        (1e30, "fp16", "holds values beyond float16's range (max |w| = 1e+30); export --dtype fp32 or bf16 keeps them"),
        (1e30, "int8", "cannot be stored as int8: a group's scale exceeds fp16's range (65504.0)"),
        (1e30, "int4", "cannot be stored as int4: a group's scale exceeds fp16's range (65504.0)"),
    ],
    ids=["nan-fp16", "inf-int4", "huge-fp16", "huge-int8", "huge-int4"],
)
def test_a_weight_the_bundle_cannot_hold_is_refused_naming_its_tensor(value, dtype, message, tmp_path):
    """A NaN or an infinity (a corrupted checkpoint), or a finite float32 weight beyond what the bundle's dtype holds
    (fp16's 65504, or the fp16 scales of int8 / int4 groups): one line naming the tensor, exit 2, nothing written,
    where the fp16 export stored infinities and the quantized ones ended in a traceback."""
    model = fixture_holding(value, tmp_path / "model")
    out = tmp_path / "bundle"
    result = subprocess.run(export_command(model, out, dtype), capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge-sdk: error: "), result.stderr
    assert f"tensor '{POISONED}'" in lines[0] and message in lines[0], lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow
def test_bf16_keeps_a_weight_beyond_fp16s_range(tmp_path):
    """What the refusals above advise: bf16 stores the 1e30 weight that fp16 cannot."""
    out = tmp_path / "bundle"
    result = subprocess.run(
        export_command(fixture_holding(1e30, tmp_path / "model"), out, "bf16"), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    from safetensors import safe_open

    with safe_open(str(out / "weights.safetensors"), framework="pt") as weights:
        assert weights.get_tensor("layers.1.mlp.up_proj.weight")[5, 7].item() == pytest.approx(1e30, rel=1e-2)


def export_command(model: Path, out: Path, dtype: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "edge_sdk",
        "export",
        str(model),
        "-o",
        str(out),
        "--predictor",
        "none",
        "--dtype",
        dtype,
    ]
