"""Tokenizer behaviour that must follow transformers: whether bos is prepended when tokenizer_config.json does not
say, and the chat template saved beside it as chat_template.jinja / chat_template.json (carried into bundles)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edge_sdk.bundle import Bundle
from edge_sdk.errors import CheckpointError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.settings import CalibrationSettings

from .tokenizer_files import save_gpt2_style, save_llama2_style, save_qwen2_style

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny-relu-llama"
TEXTS = ["def main(argv=None):\n    return 0", "Hello, wörld! 12345", "  two  spaces"]
JINJA_TEMPLATE = "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}{% endfor %}"


@pytest.mark.parametrize(
    ("save", "adds_bos"),
    [(save_llama2_style, True), (save_qwen2_style, False), (save_gpt2_style, False)],
    ids=["llama2", "qwen2", "gpt2-smollm2"],
)
def test_bos_follows_auto_tokenizer_without_add_bos_token(save, adds_bos, tmp_path):
    from transformers import AutoTokenizer

    save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "add_bos_token" not in config and config["bos_token"]  # every convention names a bos token
    ours = Tokenizer.from_dir(tmp_path)
    reference = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert ours.encode(text) == reference(text)["input_ids"], text
    assert (ours.encode(TEXTS[0])[0] == ours.bos_token_id) is adds_bos


def _fixture_copy(directory: Path, with_template: bool) -> Path:
    shutil.copytree(FIXTURE, directory, ignore=shutil.ignore_patterns("*.txt", "train*", "README.md"))
    if not with_template:
        config = json.loads((directory / "tokenizer_config.json").read_text())
        del config["chat_template"]
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("with_template_in_config", [False, True])
def test_chat_template_jinja_is_read_and_wins(with_template_in_config, tmp_path):
    model = _fixture_copy(tmp_path / "model", with_template_in_config)
    (model / "chat_template.jinja").write_text(JINJA_TEMPLATE)
    assert Tokenizer.from_dir(model).chat_template == JINJA_TEMPLATE


def test_chat_template_json_is_read(tmp_path):
    model = _fixture_copy(tmp_path / "model", with_template=False)
    (model / "chat_template.json").write_text(json.dumps({"chat_template": JINJA_TEMPLATE}))
    assert Tokenizer.from_dir(model).chat_template == JINJA_TEMPLATE
    (model / "chat_template.json").write_text(json.dumps({"template": JINJA_TEMPLATE}))
    with pytest.raises(CheckpointError, match=r"chat_template.json: field 'chat_template' is missing"):
        Tokenizer.from_dir(model)


def test_export_carries_the_jinja_chat_template_into_the_bundle(tmp_path):
    model = _fixture_copy(tmp_path / "model", with_template=False)
    (model / "chat_template.jinja").write_text(JINJA_TEMPLATE)
    export_bundle(model, tmp_path / "bundle", ExportSettings(calibration=CalibrationSettings(predictor="none")))
    bundle = Bundle.open(tmp_path / "bundle")  # every listed file's size and sha256 checked
    assert Tokenizer.from_bundle(bundle).chat_template == JINJA_TEMPLATE
    assert "chat_template.jinja" not in bundle.manifest.files  # carried inside tokenizer_config.json
    config = json.loads((tmp_path / "bundle" / "tokenizer_config.json").read_text())
    assert (config["chat_template"], config["bos_token"], config["add_bos_token"]) == (JINJA_TEMPLATE, "<s>", True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t["added_tokens"][1].update(id=5),
            "added token '</s>' has id 5, but the tokenizers library gives it id 1 (its id in model.vocab)",
        ),
        (
            lambda t: t["added_tokens"].append({**t["added_tokens"][1], "content": "<x>", "id": 4000}),
            "added token '<x>' has id 4000, but the tokenizers library gives it id 2048 (the next id after "
            "model.vocab and the added tokens before it)",
        ),
        (lambda t: t["added_tokens"].append(dict(t["added_tokens"][0])), "added token '<s>' is listed twice"),
        (lambda t: t["model"]["vocab"].update(zzzz=5), "vocab id 5 is given to two tokens"),
    ],
    ids=["renumbered", "past-the-next-id", "listed-twice", "shared-vocab-id"],
)
def test_ids_the_tokenizers_library_would_not_encode_with_are_refused(change, message, tmp_path):
    """tokenizers renumbers such an added token (a logged warning at most) or keeps one of two tokens by rules of its
    own, while the C tokenizer reads the ids as written: a checkpoint (and so a bundle) with them is refused, as the
    C reader refuses it, before either encodes other ids than the other."""
    shutil.copy(FIXTURE / "tokenizer_config.json", tmp_path)
    tokenizer = json.loads((FIXTURE / "tokenizer.json").read_text())
    change(tokenizer)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(CheckpointError) as refused:
        Tokenizer.from_dir(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / 'tokenizer.json'}: {message}")
