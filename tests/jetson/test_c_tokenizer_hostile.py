"""The C tokenizer on tokenizer.json files written to mislead it: a bundle comes from anywhere, and whoever rewrites
its tokenizer.json can re-stamp manifest.json's digests. The C tokenizer must then encode as the `tokenizers` library
does, or refuse the file with a clear error: never crash, nor give other ids than the Python runtime would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from .support import Build, run, sanitizer_env, with_tokenizer_files


@pytest.fixture(scope="module")
def base_bundle(bundle_matrix) -> Path:
    """The fixture bundle whose tokenizer.json the tests rewrite (exported once, in setup)."""
    return bundle_matrix.path("svd-fp32")


def with_tokenizer(bundle: Path, directory: Path, change) -> Path:
    """A copy of bundle whose tokenizer.json change() rewrote in place, the manifest re-stamped as an attacker
    would."""
    return with_tokenizer_files(bundle, directory, change)


def added_token(token_id: int, content: str, *, special: bool, normalized: bool) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": normalized,
        "special": special,
    }


def encode(build: Build, bundle: Path, text: str, directory: Path, env: dict | None = None):
    text_file = directory / "text.txt"
    text_file.write_bytes(text.encode("utf-8"))
    return run([build.binary("edge_tokenize"), bundle, "encode", text_file], env=env)


def expected_ids(bundle: Path, text: str) -> list[int]:
    return HFTokenizer.from_file(str(bundle / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_added_token_whose_id_is_not_its_vocab_id_is_refused(x86_build: Build, base_bundle, tmp_path):
    """tokenizers gives an added token found in the vocabulary its vocabulary id, whatever id added_tokens writes:
    the file's id would be a silent other id for that text."""

    def misnumber(tokenizer):
        tokenizer["added_tokens"].append(added_token(5, "hello", special=True, normalized=False))
        tokenizer["model"]["vocab"]["hello"] = len(tokenizer["model"]["vocab"])  # a word no merge spells

    bundle = with_tokenizer(base_bundle, tmp_path, misnumber)
    vocab_id = json.loads((bundle / "tokenizer.json").read_text())["model"]["vocab"]["hello"]
    assert expected_ids(bundle, "hello") == [vocab_id]
    result = encode(x86_build, bundle, "hello", tmp_path)
    assert result.returncode == 1, result.stdout
    assert "EDGE_ERROR_BUNDLE" in result.stderr
    assert (
        f"added token 'hello' has id 5, but the tokenizers library gives it id {vocab_id} (its id in model.vocab)"
        in result.stderr
    )


def test_added_token_numbered_past_the_next_id_is_refused(x86_build: Build, base_bundle, tmp_path):
    """An added token missing from the vocabulary gets the next id after it in tokenizers, not the file's."""
    bundle = with_tokenizer(
        base_bundle,
        tmp_path,
        lambda tokenizer: tokenizer["added_tokens"].append(added_token(4000, "<x>", special=True, normalized=False)),
    )
    next_id = len(json.loads((bundle / "tokenizer.json").read_text())["model"]["vocab"])
    assert expected_ids(bundle, "a<x>")[-1] == next_id
    result = encode(x86_build, bundle, "a<x>", tmp_path)
    assert result.returncode == 1, result.stdout
    assert (
        f"added token '<x>' has id 4000, but the tokenizers library gives it id {next_id} (the next id after "
        "model.vocab and the added tokens before it)" in result.stderr
    )


def test_added_tokens_that_are_not_normalized_are_matched_first(x86_build: Build, base_bundle, tmp_path):
    """tokenizers finds the added tokens with normalized false in the whole text before the normalized ones in the
    pieces between, so a special "y" inside a normalized "<x>y" wins over the longer match."""

    def overlap(tokenizer):
        vocab = tokenizer["model"]["vocab"]
        tokenizer["added_tokens"] += [
            added_token(len(vocab), "<x>y", special=False, normalized=True),
            added_token(vocab["y"], "y", special=True, normalized=False),
            added_token(len(vocab) + 1, "<x>", special=False, normalized=True),
        ]

    bundle = with_tokenizer(base_bundle, tmp_path, overlap)
    text = "q<x>yq <x>y<x>\n<s>y</s>"
    expected = expected_ids(bundle, text)
    vocab = json.loads((bundle / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) not in expected  # "<x>y" is never matched: its "y" is taken first
    result = encode(x86_build, bundle, text, tmp_path)
    assert result.returncode == 0, result.stderr
    assert [int(token) for token in result.stdout.split()] == expected


def test_added_token_listed_twice_is_refused(x86_build: Build, base_bundle, tmp_path):
    """tokenizers keeps one of the two by rules of its own (the first id, the last flags); decoding the second id
    gives nothing there."""

    def twice(tokenizer):
        next_id = len(tokenizer["model"]["vocab"])
        tokenizer["added_tokens"] += [
            added_token(next_id, "<x>", special=True, normalized=False),
            added_token(next_id + 1, "<x>", special=True, normalized=False),
        ]

    bundle = with_tokenizer(base_bundle, tmp_path, twice)
    result = encode(x86_build, bundle, "a<x>", tmp_path)
    assert result.returncode == 1, result.stdout
    assert "added token '<x>' is listed twice in added_tokens" in result.stderr


def test_vocab_id_given_to_two_tokens_is_refused(x86_build: Build, base_bundle, tmp_path):
    """tokenizers decodes such an id to either token, whichever its hash map keeps."""

    def share_id(tokenizer):
        vocab = tokenizer["model"]["vocab"]
        vocab["zzzq"] = vocab["a"]

    bundle = with_tokenizer(base_bundle, tmp_path, share_id)
    a_id = json.loads((bundle / "tokenizer.json").read_text())["model"]["vocab"]["a"]
    result = encode(x86_build, bundle, "a", tmp_path)
    assert result.returncode == 1, result.stdout
    assert f"vocab id {a_id} is given to two tokens" in result.stderr


def test_merge_of_two_empty_tokens_is_clean_under_ubsan(asan_build: Build, base_bundle, tmp_path):
    """A vocab entry "" and the merge ["", ""] (tokenizers accepts both) once passed a NULL buffer to memcpy."""

    def empty_merge(tokenizer):
        tokenizer["model"]["vocab"][""] = len(tokenizer["model"]["vocab"])
        tokenizer["model"]["merges"].insert(0, ["", ""])

    bundle = with_tokenizer(base_bundle, tmp_path, empty_merge)
    result = encode(asan_build, bundle, "hello world", tmp_path, env=sanitizer_env())
    assert "runtime error" not in result.stderr and "Sanitizer" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    assert [int(token) for token in result.stdout.split()] == expected_ids(bundle, "hello world")
