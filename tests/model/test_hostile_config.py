"""Hostile or malformed config.json: one CheckpointError line naming the file, the field, what it must be and what
was found; never a TypeError, KeyError, RecursionError or UnicodeDecodeError, never a silent acceptance."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from edge_sdk.bundle import manifest
from edge_sdk.errors import CheckpointError, EdgeSdkError
from edge_sdk.formats import files
from edge_sdk.model import config as model_config
from edge_sdk.model.config import load_config, parse_config

from .hf_models import SMALL_CONFIG, family_configs

BASE = SMALL_CONFIG
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
HIDDEN_ACTS = "relu, fatrelu, drelu, silu, swish"
EOS = "a token id in [0, 49] or a list of at most 16 such ids"


def write_config(directory: Path, content: dict | str | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def refusal(model_dir: Path) -> str:
    """The message load_config refuses model_dir with, checked to be one line of a CheckpointError."""
    with pytest.raises(CheckpointError) as caught:
        load_config(model_dir)
    assert isinstance(caught.value, EdgeSdkError)
    message = str(caught.value)
    assert "\n" not in message
    return message


# (config.json fields to set (None: remove), the message after "<path>: ")
FIELD_CASES = [
    # sizes: wrong types, zero, beyond the limits every reader shares
    ({"vocab_size": None}, "field 'vocab_size' is missing; it must be an integer in [1, 16777216]"),
    ({"vocab_size": 0}, "field 'vocab_size' must be an integer in [1, 16777216], found 0"),
    ({"vocab_size": 2**24 + 1}, "field 'vocab_size' must be an integer in [1, 16777216], found 16777217"),
    ({"vocab_size": True}, "field 'vocab_size' must be an integer in [1, 16777216], found true"),
    ({"hidden_size": 2**20 + 2}, "field 'hidden_size' must be an integer in [1, 1048576], found 1048578"),
    ({"hidden_size": 32.5}, "field 'hidden_size' must be an integer in [1, 1048576], found 32.5"),
    ({"intermediate_size": -80}, "field 'intermediate_size' must be an integer in [1, 1048576], found -80"),
    ({"intermediate_size": [80]}, "field 'intermediate_size' must be an integer in [1, 1048576], found [80]"),
    ({"num_hidden_layers": 1025}, "field 'num_hidden_layers' must be an integer in [1, 1024], found 1025"),
    ({"num_attention_heads": 4097}, "field 'num_attention_heads' must be an integer in [1, 4096], found 4097"),
    ({"num_key_value_heads": "2"}, "field 'num_key_value_heads' must be an integer in [1, 4096], found \"2\""),
    ({"num_key_value_heads": 0}, "field 'num_key_value_heads' must be an integer in [1, 4096], found 0"),
    ({"num_key_value_heads": 3}, "field 'num_key_value_heads' must be a divisor of num_attention_heads (4), found 3"),
    ({"num_key_value_heads": 8}, "field 'num_key_value_heads' must be a divisor of num_attention_heads (4), found 8"),
    # head_dim: given, or hidden_size / num_attention_heads exactly
    ({"head_dim": "64"}, "field 'head_dim' must be an integer in [1, 16384], found \"64\""),
    ({"head_dim": 0}, "field 'head_dim' must be an integer in [1, 16384], found 0"),
    ({"head_dim": 16386}, "field 'head_dim' must be an integer in [1, 16384], found 16386"),
    ({"head_dim": 7}, "field 'head_dim' must be even (RoPE rotates pairs of dimensions), found 7"),
    (
        {"num_attention_heads": 128, "head_dim": 16384},
        "field 'head_dim' must be at most 8192, so that num_attention_heads * head_dim <= 1048576, found 16384",
    ),
    (
        {"hidden_size": 30},
        "field 'hidden_size' (30) must be a multiple of num_attention_heads (4) when field 'head_dim' is not given",
    ),
    (
        {"hidden_size": 36},
        "head_dim, hidden_size / num_attention_heads when field 'head_dim' is not given, must be even (RoPE rotates "
        "pairs of dimensions), found 9",
    ),
    (
        {"hidden_size": 2**16, "num_attention_heads": 2},
        "head_dim, hidden_size / num_attention_heads when field 'head_dim' is not given, must be at most 16384, "
        "found 32768",
    ),
    # numbers: finite and in range
    ({"rms_norm_eps": "x"}, "field 'rms_norm_eps' must be a finite number > 0, found \"x\""),
    ({"rms_norm_eps": 0}, "field 'rms_norm_eps' must be a finite number > 0, found 0"),
    ({"rms_norm_eps": -1e-5}, "field 'rms_norm_eps' must be a finite number > 0, found -1e-05"),
    # rms_norm_eps and the fatrelu threshold are float32 in the graphs: inf or an eps of 0 there is refused here
    (
        {"rms_norm_eps": 1e300},
        "field 'rms_norm_eps' must be a finite number > 0 that float32 holds (from 1.4013e-45 to 3.40282e+38), "
        "found 1e+300",
    ),
    (
        {"rms_norm_eps": 1e-50},
        "field 'rms_norm_eps' must be a finite number > 0 that float32 holds (from 1.4013e-45 to 3.40282e+38), "
        "found 1e-50",
    ),
    (
        {"max_position_embeddings": "2048"},
        "field 'max_position_embeddings' must be an integer in [2, 16777216], found \"2048\"",
    ),
    ({"max_position_embeddings": 1}, "field 'max_position_embeddings' must be an integer in [2, 16777216], found 1"),
    (
        {"max_position_embeddings": 2**40},
        "field 'max_position_embeddings' must be an integer in [2, 16777216], found 1099511627776",
    ),
    ({"rope_theta": 0}, "field 'rope_theta' must be a finite number > 0, found 0"),
    ({"rope_theta": "1e4"}, "field 'rope_theta' must be a finite number > 0, found \"1e4\""),
    # strings and booleans
    ({"hidden_act": 5}, f"field 'hidden_act' must be one of {HIDDEN_ACTS}, found 5"),
    ({"hidden_act": ["relu"]}, f"field 'hidden_act' must be one of {HIDDEN_ACTS}, found [\"relu\"]"),
    ({"hidden_act": "fatrelu"}, "field 'hidden_act_param' is missing; it must be a finite number >= 0"),
    (
        {"hidden_act": "fatrelu", "hidden_act_param": -0.1},
        "field 'hidden_act_param' must be a finite number >= 0, found -0.1",
    ),
    (
        {"hidden_act": "fatrelu", "hidden_act_param": 4e38},
        "field 'hidden_act_param' must be a finite number >= 0 that float32 holds (at most 3.40282e+38), found 4e+38",
    ),
    (
        {"hidden_act": "fatrelu", "hidden_act_param": "0.1"},
        "field 'hidden_act_param' must be a finite number >= 0, found \"0.1\"",
    ),
    ({"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' must be true or false, found \"yes\""),
    ({"attention_bias": "true"}, "field 'attention_bias' must be true or false, found \"true\""),
    ({"attention_bias": 1}, "field 'attention_bias' must be true or false, found 1"),
    ({"mlp_bias": True}, "field 'mlp_bias' must be false (the sparse FFN supports bias-free FFNs only), found true"),
    ({"mlp_bias": "false"}, "field 'mlp_bias' must be true or false, found \"false\""),
    ({"torch_dtype": 5}, "field 'torch_dtype' must be a string, found 5"),
    ({"dtype": {"a": 1}}, "field 'dtype' must be a string, found {\"a\": 1}"),
    ({"model_type": 5}, "field 'model_type' must be a string, found 5"),
    (
        {"model_type": None, "architectures": "LlamaForCausalLM"},
        "field 'architectures' must be a list of strings, found \"LlamaForCausalLM\"",
    ),
    (
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
        "field 'model_type' must be one of llama, mistral, qwen2 (or 'architectures' must name LlamaForCausalLM, "
        'MistralForCausalLM, Qwen2ForCausalLM), found "gpt2"',
    ),
    # token ids: in [0, vocab_size), at most 16 eos ids
    ({"bos_token_id": -1}, "field 'bos_token_id' must be an integer in [0, 49], found -1"),
    ({"bos_token_id": 50}, "field 'bos_token_id' must be an integer in [0, 49], found 50"),
    ({"bos_token_id": True}, "field 'bos_token_id' must be an integer in [0, 49], found true"),
    ({"eos_token_id": "abc"}, f"field 'eos_token_id' must be {EOS}, found \"abc\""),
    ({"eos_token_id": [1, "2"]}, f"field 'eos_token_id' must be {EOS}, found [1, \"2\"]"),
    ({"eos_token_id": [1, 2.5]}, f"field 'eos_token_id' must be {EOS}, found [1, 2.5]"),
    ({"eos_token_id": [49, 50]}, f"field 'eos_token_id' must be {EOS}, found [49, 50]"),
    ({"eos_token_id": [False]}, f"field 'eos_token_id' must be {EOS}, found [false]"),
    ({"eos_token_id": {"id": 2}}, f"field 'eos_token_id' must be {EOS}, found {{\"id\": 2}}"),
    (
        {"eos_token_id": list(range(17))},
        f"field 'eos_token_id' must be {EOS}, found [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
    ),
    (  # a long value is shortened to keep the message one short line
        {"eos_token_id": list(range(20))},
        f"field 'eos_token_id' must be {EOS}, found [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17...",
    ),
    # RoPE scaling, both spellings
    ({"rope_scaling": "linear"}, "field 'rope_scaling' must be a JSON object, found \"linear\""),
    ({"rope_parameters": ["linear"]}, "field 'rope_parameters' must be a JSON object, found [\"linear\"]"),
    (
        {"rope_scaling": {"rope_type": 5}},
        "field 'rope_scaling.rope_type' must be one of default, linear, llama3, dynamic, found 5",
    ),
    (
        {"rope_scaling": {"type": "yarn", "factor": 2}},
        "field 'rope_scaling.type' must be one of default, linear, llama3, dynamic, found \"yarn\"",
    ),
    (
        {"rope_scaling": {"type": "dynamic"}},
        "field 'rope_scaling.factor' is missing; it must be a finite number > 0",
    ),
    (
        {"rope_scaling": {"rope_type": "linear"}},
        "field 'rope_scaling.factor' is missing; it must be a finite number > 0",
    ),
    (
        {"rope_scaling": {"rope_type": "linear", "factor": 0}},
        "field 'rope_scaling.factor' must be a finite number > 0, found 0",
    ),
    (
        {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
        "field 'rope_scaling.factor' must be a finite number > 0, found \"2\"",
    ),
    (
        {"rope_parameters": {"rope_type": "linear", "factor": -2, "rope_theta": 1e4}},
        "field 'rope_parameters.factor' must be a finite number > 0, found -2",
    ),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
        "field 'rope_parameters.rope_theta' must be a finite number > 0, found 0",
    ),
    (
        {"rope_scaling": LLAMA3 | {"low_freq_factor": "1"}},
        "field 'rope_scaling.low_freq_factor' must be a finite number > 0, found \"1\"",
    ),
    (
        {"rope_scaling": LLAMA3 | {"high_freq_factor": 1.0}},
        "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (1), found 1.0",
    ),
    (
        {"rope_scaling": LLAMA3 | {"low_freq_factor": 4.0, "high_freq_factor": 2.0}},
        "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (4), found 2.0",
    ),
    (
        {"rope_scaling": LLAMA3 | {"original_max_position_embeddings": "8192"}},
        "field 'rope_scaling.original_max_position_embeddings' must be an integer in [1, 16777216], found \"8192\"",
    ),
    (
        {"rope_scaling": {k: v for k, v in LLAMA3.items() if k != "high_freq_factor"}},
        "field 'rope_scaling.high_freq_factor' is missing; it must be a finite number > 0",
    ),
    # sliding windows where the family uses them
    (
        {"model_type": "mistral", "sliding_window": "x"},
        "field 'sliding_window' must be an integer in [1, 2147483647], found \"x\"",
    ),
    (
        {"model_type": "mistral", "sliding_window": 0},
        "field 'sliding_window' must be an integer in [1, 2147483647], found 0",
    ),
    (
        {"model_type": "mistral", "sliding_window": -4096},
        "field 'sliding_window' must be an integer in [1, 2147483647], found -4096",
    ),
    (
        {"model_type": "mistral", "sliding_window": 2**31},
        "field 'sliding_window' must be an integer in [1, 2147483647], found 2147483648",
    ),
    (
        {"model_type": "qwen2", "use_sliding_window": "yes"},
        "field 'use_sliding_window' must be true or false, found \"yes\"",
    ),
    (
        {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 0},
        "field 'sliding_window' must be an integer in [1, 2147483647], found 0",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), FIELD_CASES, ids=[json.dumps(case[0])[:56] for case in FIELD_CASES])
def test_a_wrong_field_is_named_with_what_it_must_be(tmp_path, overrides, message):
    content = {key: value for key, value in (BASE | overrides).items() if value is not None}
    path = write_config(tmp_path, content)
    assert refusal(tmp_path) == f"{path}: {message}"


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rope_theta": NAN}, "field 'rope_theta' must be a finite number > 0, found NaN"),
        ({"rope_theta": INF}, "field 'rope_theta' must be a finite number > 0, found Infinity"),
        ({"rms_norm_eps": NAN}, "field 'rms_norm_eps' must be a finite number > 0, found NaN"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": NAN}},
            "field 'rope_scaling.factor' must be a finite number > 0, found NaN",
        ),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": INF}},
            "field 'rope_scaling.factor' must be a finite number > 0, found Infinity",
        ),
        (
            {"rope_scaling": LLAMA3 | {"high_freq_factor": NAN}},
            "field 'rope_scaling.high_freq_factor' must be a finite number > 0, found NaN",
        ),
        (
            {"hidden_act": "fatrelu", "hidden_act_param": NAN},
            "field 'hidden_act_param' must be a finite number >= 0, found NaN",
        ),
        ({"head_dim": NAN}, "field 'head_dim' must be an integer in [1, 16384], found NaN"),
    ],
)
def test_non_finite_numbers_from_python_callers_are_refused(overrides, message):
    """A NaN never gets past strict JSON in a file, but parse_config also takes dicts built in Python."""
    with pytest.raises(CheckpointError) as caught:
        parse_config(BASE | overrides, Path("m/config.json"))
    assert str(caught.value) == f"m/config.json: {message}"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "not valid JSON: nested deeper than 64 levels"),
        ('{"x": [' + "[" * 100_000 + "]" * 100_000 + "]}", "not valid JSON: nested deeper than 64 levels"),
        (json.dumps(BASE)[:-1] + ', "vocab_size": 60}', "not valid JSON: key 'vocab_size' appears twice in one object"),
        (json.dumps(BASE)[:-1] + ', "rope_theta": NaN}', "not valid JSON: NaN is not a JSON number"),
        (
            json.dumps(BASE)[:-1] + ', "rope_scaling": {"rope_type": "linear", "factor": Infinity}}',
            "not valid JSON: Infinity is not a JSON number",
        ),
        (json.dumps(BASE)[:-1] + ', "rms_norm_eps": 1e999}', "not valid JSON: number 1e999 is not finite as a float64"),
        (
            json.dumps(BASE).replace('"vocab_size": 50', '"vocab_size": 123456789012345678901234567890'),
            "field 'vocab_size' must be an integer in [1, 16777216], found 1.2345678901234568e+29",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not valid JSON: not UTF-8 text (byte 0x89 at offset 0)"),
        (b"\xef\xbb\xbf" + json.dumps(BASE).encode(), "not valid JSON: starts with a byte order mark"),
        ("[1, 2, 3]", "expected a JSON object, found a list"),
        ('"config"', "expected a JSON object, found a string"),
        ("", "not valid JSON: Expecting value (line 1, column 1)"),
        (
            json.dumps(BASE) + " {}",
            "not valid JSON: Extra data (line 1, column " + str(len(json.dumps(BASE)) + 2) + ")",
        ),
    ],
    ids=[
        "deep-objects",
        "deep-lists",
        "duplicate-key",
        "nan",
        "infinity",
        "overflow",
        "huge-integer",
        "binary",
        "bom",
        "list",
        "string",
        "empty",
        "trailing",
    ],
)
def test_malformed_json_is_one_line(tmp_path, content, reason):
    path = write_config(tmp_path, content)
    assert refusal(tmp_path) == f"{path}: {reason}"


def test_a_huge_config_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "config.json"
    with path.open("wb") as handle:  # sparse: no 16 MiB written
        handle.truncate(model_config.MAX_CONFIG_BYTES + 1)
    assert refusal(tmp_path) == f"{path}: 16777217 bytes, more than the 16777216 this reader accepts"
    # at the bound it is read (and judged as JSON, which NUL bytes are not)
    os.truncate(path, model_config.MAX_CONFIG_BYTES)
    assert refusal(tmp_path).startswith(f"{path}: not valid JSON: ")


def test_config_json_that_is_not_a_regular_file(tmp_path):
    (tmp_path / "config.json").mkdir()
    assert refusal(tmp_path) == f"{tmp_path / 'config.json'}: is a directory; expected a regular file"
    (tmp_path / "config.json").rmdir()
    os.mkfifo(tmp_path / "config.json")  # must not wait for a writer
    assert refusal(tmp_path) == f"{tmp_path / 'config.json'}: is not a regular file; expected a regular file"
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").symlink_to(tmp_path / "nowhere.json")
    assert refusal(tmp_path) == f"{tmp_path / 'config.json'}: file not found"


def test_model_dir_that_is_not_a_directory(tmp_path):
    assert (
        refusal(tmp_path / "absent")
        == f"{tmp_path / 'absent'}: model directory not found (expected a Hugging Face checkpoint directory)"
    )
    (tmp_path / "file").write_text("{}")
    assert (
        refusal(tmp_path / "file")
        == f"{tmp_path / 'file'}: is not a directory (expected a Hugging Face checkpoint directory)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_config_json(tmp_path):
    path = write_config(tmp_path, BASE)
    path.chmod(0)
    assert refusal(tmp_path) == f"{path}: cannot open (Permission denied)"


def test_an_unreadable_config_json_as_the_system_reports_it(tmp_path, monkeypatch):
    """The same refusal where the tests run as root, which chmod cannot lock out."""
    path = write_config(tmp_path, BASE)
    real_open = os.open

    def denying_open(name, flags, *args):
        if Path(name) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
        return real_open(name, flags, *args)

    monkeypatch.setattr(files.os, "open", denying_open)
    assert refusal(tmp_path) == f"{path}: cannot open (Permission denied)"


def test_a_cache_snapshot_of_symbolic_links_is_read(tmp_path):
    """~/.cache/huggingface/hub/models--x/snapshots/REV/config.json -> ../../blobs/HASH"""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    (blobs / "0123abcd").write_text(json.dumps(BASE | {"vocab_size": 77}))
    (snapshot / "config.json").symlink_to("../../blobs/0123abcd")
    assert stat.S_ISLNK(os.lstat(snapshot / "config.json").st_mode)
    assert load_config(snapshot).vocab_size == 77


def test_values_transformers_writes_are_read_as_meant():
    # null is "not set"; integral floats are integers, as the manifest reads them
    config = parse_config(
        BASE
        | {
            "num_key_value_heads": 2.0,
            "head_dim": None,
            "bos_token_id": None,
            "eos_token_id": 7,
            "architectures": None,
            "rope_scaling": None,
            "torch_dtype": None,
            "dtype": "bfloat16",
            "max_position_embeddings": 4096.0,
        },
        Path("config.json"),
    )
    assert (config.num_kv_heads, config.head_dim, config.max_position_embeddings) == (2, 8, 4096)
    assert type(config.num_kv_heads) is int and type(config.max_position_embeddings) is int
    assert (config.bos_token_id, config.eos_token_ids, config.torch_dtype) == (None, (7,), "bfloat16")
    assert config.rope == model_config.RopeConfig()
    # an explicit head_dim need not divide hidden_size (Qwen3-style narrow heads)
    assert parse_config(BASE | {"hidden_size": 30, "head_dim": 6}, Path("c")).head_dim == 6
    # Mistral: sliding_window null is no window; Qwen2 ignores it unless use_sliding_window
    assert parse_config(BASE | {"model_type": "mistral", "sliding_window": None}, Path("c")).sliding_window is None
    qwen = BASE | {"model_type": "qwen2", "sliding_window": 4096}
    assert parse_config(qwen | {"use_sliding_window": False}, Path("c")).sliding_window is None
    assert parse_config(qwen | {"use_sliding_window": True, "max_window_layers": 0}, Path("c")).sliding_window == 4096


def test_a_qwen2_window_applies_from_max_window_layers_on_as_in_transformers():
    qwen = BASE | {"model_type": "qwen2", "sliding_window": 8, "use_sliding_window": True, "num_hidden_layers": 4}
    # transformers slides only in the layers from max_window_layers (default 28) on: none of these 4 layers
    assert parse_config(qwen, Path("c")).sliding_window is None
    assert parse_config(qwen | {"max_window_layers": 4}, Path("c")).sliding_window is None
    assert parse_config(qwen | {"max_window_layers": 0}, Path("c")).sliding_window == 8
    every = {"layer_types": ["sliding_attention"] * 4}
    assert parse_config(qwen | every, Path("c")).sliding_window == 8
    assert parse_config(qwen | {"layer_types": ["full_attention"] * 4}, Path("c")).sliding_window is None
    # layer_types rules over max_window_layers, as in transformers
    assert parse_config(qwen | every | {"max_window_layers": 28}, Path("c")).sliding_window == 8
    slide = "must be such that every layer or none attends within the sliding window"
    with pytest.raises(CheckpointError, match=rf"'max_window_layers' {slide} .* 2 of the 4 layers slide, from layer 2"):
        parse_config(qwen | {"max_window_layers": 2}, Path("c"))
    mixed = {"layer_types": ["full_attention", "sliding_attention"] * 2}
    with pytest.raises(CheckpointError, match=rf"'layer_types' {slide} .* 2 of the 4 layers slide, from layer 1"):
        parse_config(qwen | mixed, Path("c"))
    for wrong in (["sliding_attention"] * 3, "sliding_attention", ["sliding_attention"] * 3 + ["chunked_attention"]):
        with pytest.raises(CheckpointError, match=r"'layer_types' must be a list of 4 entries, each 'full_attention'"):
            parse_config(qwen | {"layer_types": wrong}, Path("c"))
    # without use_sliding_window neither field is read
    assert parse_config(qwen | {"use_sliding_window": False, "max_window_layers": 2}, Path("c")).sliding_window is None


def test_rope_settings_in_both_spellings():
    legacy = parse_config(BASE | {"rope_theta": 5e5, "rope_scaling": LLAMA3}, Path("c")).rope
    modern = parse_config(BASE | {"rope_parameters": LLAMA3 | {"rope_theta": 5e5}}, Path("c")).rope
    assert legacy == modern == model_config.RopeConfig(5e5, "llama3", 8.0, 1.0, 4.0, 8192)
    # "type" is the old name of "rope_type"; rope_theta may sit beside rope_parameters
    old_type = parse_config(BASE | {"rope_scaling": {"type": "linear", "factor": 2}}, Path("c")).rope
    assert old_type == model_config.RopeConfig(10000.0, "linear", 2.0)
    split = parse_config(BASE | {"rope_theta": 1e6, "rope_parameters": {"rope_type": "linear", "factor": 3}}, Path("c"))
    assert split.rope == model_config.RopeConfig(1e6, "linear", 3.0)


def manifest_accepts(model_section: dict) -> bool:
    try:
        manifest._model(manifest.Fields(model_section, "manifest.json: model"))
    except manifest.BundleError:
        return False
    return True


VALID = BASE | {"head_dim": 8, "bos_token_id": 1, "eos_token_id": [2]}
# (config.json field, its place in the manifest's model section, values on both sides of each limit)
BOUNDARIES = [
    ("vocab_size", ("vocab_size",), [0, 1, 50.0, 2**24, 2**24 + 1, True, "50", 50.5]),
    ("hidden_size", ("hidden_size",), [0, 1, 2**20, 2**20 + 1, "32"]),
    ("intermediate_size", ("intermediate_size",), [0, 1, 2**20, 2**20 + 1, None]),
    ("num_hidden_layers", ("num_layers",), [0, 1, 1024, 1025, 2.0]),
    ("num_attention_heads", ("num_heads",), [2, 4096, 4098, -4]),
    ("num_key_value_heads", ("num_kv_heads",), [0, 1, 3, 4, 8]),
    ("head_dim", ("head_dim",), [0, 2, 7, 16384, 16386, "8"]),
    ("rms_norm_eps", ("rms_norm_eps",), [0, -1e-6, 1e-50, 1.5e-45, 1e-30, 1, 3.4e38, 1e300, NAN, INF, False]),
    ("max_position_embeddings", ("max_position_embeddings",), [1, 2, 2**24, 2**24 + 1, 2048.5]),
    ("bos_token_id", ("bos_token_id",), [-1, 0, 49, 50, True]),
    ("eos_token_id", ("eos_token_ids",), [[], [0], [49], [50], [-1], [0] * 16, [0] * 17, ["1"]]),
    ("rope_theta", ("rope", "theta"), [0, 1e-300, 5e5, -1, NAN, INF]),
    ("tie_word_embeddings", ("tie_word_embeddings",), [True, "true", 0]),
]


@pytest.mark.parametrize(
    ("field", "place", "value"),
    [(field, place, value) for field, place, values in BOUNDARIES for value in values],
)
def test_config_json_refuses_what_the_bundle_manifest_refuses(field, place, value):
    """Where a config.json field becomes a manifest field, both readers give the same verdict on its value."""
    section = parse_config(VALID, Path("config.json")).to_dict()
    target = section
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = value
    try:
        parse_config(VALID | {field: value}, Path("config.json"))
        accepted = True
    except CheckpointError:
        accepted = False
    assert accepted == manifest_accepts(section)


@pytest.mark.parametrize("family", list(family_configs()))
def test_real_configs_pass_and_export_a_manifest_every_reader_accepts(tmp_path, family):
    hf = family_configs()[family]
    write_config(tmp_path, hf.to_json_string())
    config = load_config(tmp_path)
    heads = (hf.num_attention_heads, hf.num_key_value_heads, hf.hidden_size // hf.num_attention_heads)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == heads
    assert (config.rope.rope_type, config.rope.theta) == (
        hf.rope_parameters["rope_type"],
        hf.rope_parameters["rope_theta"],
    )
    assert manifest_accepts(config.to_dict())
