"""Calibration text reading, chunking, and the layer-by-layer capture of FFN inputs."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch

from edge_sdk.errors import CalibrationError
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.loader import load_decoder
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.collect import calibration_chunks, read_calibration_texts, stream_layers


def test_plain_text_and_json_lines(tmp_path):
    (tmp_path / "a.txt").write_text("first document\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second"}) + "\n\n" + json.dumps({"text": "third"}) + "\n")
    assert read_calibration_texts([tmp_path / "a.txt", tmp_path / "b.jsonl"]) == ["first document\n", "second", "third"]


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("", ".txt", "calibration file is empty"),
        ("   \n", ".txt", "calibration file is empty"),
        ('{"txt": "x"}\n', ".jsonl", 'b.jsonl:1: expected an object with a string field "text"'),
        ("{broken\n", ".jsonl", "b.jsonl:1: not valid JSON"),
        ('{"text": "a"}\n' + "[" * 200000 + "\n", ".jsonl", r"b.jsonl:2: not valid JSON: nested deeper than 64 levels"),
        (
            '{"text": "hi", "n": ' + "1" * 5000 + "}\n",
            ".jsonl",
            r"b.jsonl:1: not valid JSON: number 1{24} is not finite",
        ),
        ('{"text": "\\ud800"}\n', ".jsonl", r"b.jsonl:1: not valid JSON: a \\u escape is a lone UTF-16 surrogate"),
    ],
)
def test_bad_calibration_files(tmp_path, content, suffix, message):
    path = tmp_path / f"b{suffix}"
    path.write_text(content)
    with pytest.raises(CalibrationError, match=message):
        read_calibration_texts([path])


def test_missing_calibration_file(tmp_path):
    with pytest.raises(CalibrationError, match=r"nope\.txt: calibration file not found"):
        read_calibration_texts([tmp_path / "nope.txt"])
    with pytest.raises(CalibrationError, match="no calibration files given"):
        read_calibration_texts([])


def test_chunks_are_equal_length_and_capped(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    text = (tiny_model_dir / "calibration.txt").read_text()
    vocab_size = Checkpoint(tiny_model_dir).config.vocab_size
    chunks = calibration_chunks(tokenizer, [text], max_tokens=1000, chunk_tokens=128, vocab_size=vocab_size)
    assert chunks.shape == (7, 128)  # 1000 tokens -> 7 full chunks of 128
    assert chunks[0, 0].item() == tokenizer.bos_token_id
    assert chunks.flatten().tolist() == tokenizer.encode(text)[:896]


def test_too_few_tokens_says_how_many_are_needed(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    with pytest.raises(CalibrationError, match="has 4 tokens; at least 256 are needed"):
        calibration_chunks(tokenizer, ["def f():"], min_tokens=256, vocab_size=tokenizer.vocab_size)


def test_streamed_ffn_inputs_equal_the_full_model_forward(tiny_model_dir):
    checkpoint = Checkpoint(tiny_model_dir)
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    text = (tiny_model_dir / "held_out.txt").read_text()
    chunks = calibration_chunks(tokenizer, [text], 300, 100, vocab_size=checkpoint.config.vocab_size)
    decoder = load_decoder(checkpoint)
    expected = []
    hooks = [
        layer.mlp.register_forward_pre_hook(
            lambda module, args: expected.append(args[0].reshape(-1, args[0].shape[-1]))
        )
        for layer in decoder.layers
    ]
    with torch.no_grad():
        decoder(chunks)
    for hook in hooks:
        hook.remove()

    previous_block = None
    for capture in stream_layers(checkpoint, chunks, batch_chunks=2):
        assert capture.ffn_input.shape == (300, checkpoint.config.hidden_size)
        torch.testing.assert_close(capture.ffn_input, expected[capture.index], atol=2e-5, rtol=1e-5)
        # one layer's weights at a time: the previous layer's block is gone once the stream moves on
        if previous_block is not None:
            gc.collect()
            assert previous_block() is None
        previous_block = weakref.ref(capture.block)
        del capture
    assert len(expected) == checkpoint.config.num_layers


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_calibration_text_that_is_not_utf8_is_refused_naming_the_byte(tmp_path, suffix):
    path = tmp_path / f"c{suffix}"
    path.write_bytes(b'{"text": "caf\xe9"}\n' if suffix == ".jsonl" else b"good start \xff then more\n")
    offset, byte = (13, "0xe9") if suffix == ".jsonl" else (11, "0xff")
    message = rf"c\{suffix}: the calibration file is not UTF-8 text \(byte {byte} at offset {offset}\)"
    with pytest.raises(CalibrationError, match=message):
        read_calibration_texts([path])
