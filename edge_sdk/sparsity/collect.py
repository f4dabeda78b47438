"""Calibration data: read text, tokenize it into chunks, and capture each layer's FFN input.

The model is streamed one layer at a time: the residual stream of every calibration token [N, d]
is kept, one layer's weights are loaded, its FFN inputs (the post-attention-norm hidden states) are
handed to the caller, and then the layer's FFN advances the residual stream. Memory stays at two
[N, d] activations plus one layer's weights, so a 7B model calibrates on a 24 GiB machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from edge_sdk.errors import CalibrationError, EdgeSdkError
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import read_utf8_text
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.decoder import TransformerBlock, rope_tables
from edge_sdk.model.loader import load_layer
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.settings import DEFAULT_CALIBRATION_TOKENS, DEFAULT_CHUNK_TOKENS

JSON_LINES_SUFFIXES = (".jsonl", ".json")


def read_calibration_texts(files: Sequence[str | Path]) -> list[str]:
    """Documents from plain-text files (one document each) or JSON-lines files ({"text": ...} per line)."""
    if not files:
        raise CalibrationError("no calibration files given (expected plain-text or JSON-lines files)")
    texts: list[str] = []
    for file in map(Path, files):
        if not file.is_file():
            found = "is not a regular file" if file.exists() else "not found"
            raise CalibrationError(f"{file}: calibration file {found}")
        content = read_utf8_text(file, "calibration file", CalibrationError)
        if file.suffix in JSON_LINES_SUFFIXES:
            documents = []
            for number, line in enumerate(content.splitlines(), start=1):
                if not line.strip():
                    continue
                # strict JSON: deep nesting, huge integers and lone surrogates are refused, naming the line
                record = strict_json.parse(line.encode("utf-8"), f"{file}:{number}", error=CalibrationError)
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise CalibrationError(f'{file}:{number}: expected an object with a string field "text"')
                documents.append(record["text"])
        else:
            documents = [content]
        documents = [d for d in documents if d.strip()]
        if not documents:
            raise CalibrationError(f"{file}: calibration file is empty")
        texts += documents
    return texts


def token_stream(tokenizer: Tokenizer, texts: Sequence[str], max_tokens: int, vocab_size: int) -> list[int]:
    """The documents' tokens (each with its bos) concatenated, at most max_tokens; every id must have a row in the
    model's vocab_size embeddings (a tokenizer larger than its model, which the embedding lookup would fail on)."""
    stream: list[int] = []
    for text in texts:
        stream += tokenizer.encode(text)
        if len(stream) >= max_tokens:
            break
    stream = stream[:max_tokens]
    largest = max(stream, default=0)
    if largest >= vocab_size:
        raise EdgeSdkError(
            f"the tokenizer gives token id {largest} for the text, but the model has {vocab_size} token embeddings "
            f"(vocab_size): expected the model's own tokenizer, whose ids are below {vocab_size}"
        )
    return stream


def token_chunks(tokens: Sequence[int], chunk_tokens: int, min_tokens: int = 1) -> torch.Tensor:
    """Token ids [C, L]: tokens cut into equal chunks of at most chunk_tokens; the ragged end is dropped."""
    if len(tokens) < min_tokens:
        raise CalibrationError(
            f"calibration data has {len(tokens)} tokens; at least {min_tokens} are needed (add text: about "
            f"{DEFAULT_CALIBRATION_TOKENS} tokens is the recommended amount)"
        )
    chunk_len = min(chunk_tokens, len(tokens))
    chunks = len(tokens) // chunk_len
    return torch.tensor(list(tokens[: chunks * chunk_len]), dtype=torch.long).view(chunks, chunk_len)


def calibration_chunks(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    min_tokens: int = 1,
    *,
    vocab_size: int,
) -> torch.Tensor:
    """Token ids [C, L]: documents (each with bos) concatenated and cut into equal chunks, at most max_tokens."""
    return token_chunks(token_stream(tokenizer, texts, max_tokens, vocab_size), chunk_tokens, min_tokens)


@dataclass
class LayerCapture:
    """One layer of the streamed model: its weights and the FFN inputs of every calibration token."""

    index: int
    block: TransformerBlock
    ffn_input: torch.Tensor  # [N, d], read-only: the stream uses it to advance after the caller is done


@torch.inference_mode()
def stream_layers(
    checkpoint: Checkpoint, chunks: torch.Tensor, dtype: torch.dtype = torch.float32, batch_chunks: int = 4
) -> Iterator[LayerCapture]:
    """Yield each layer's FFN inputs over the calibration chunks [C, L], loading one layer at a time."""
    config = checkpoint.config
    num_chunks, chunk_len = chunks.shape
    hidden = F.embedding(chunks, checkpoint.tensor("model.embed_tokens.weight", dtype))  # [C, L, d]
    cos, sin = rope_tables(config.rope, config.head_dim, chunk_len)
    ffn_input = torch.empty_like(hidden)
    for index in range(config.num_layers):
        block = load_layer(checkpoint, index, dtype)
        for start in range(0, num_chunks, batch_chunks):
            rows = slice(start, start + batch_chunks)
            h = hidden[rows]
            h = h + block.self_attn(block.input_layernorm(h), cos, sin, 0)
            hidden[rows] = h
            ffn_input[rows] = block.post_attention_layernorm(h)
        yield LayerCapture(index, block, ffn_input.view(-1, config.hidden_size))
        for start in range(0, num_chunks, batch_chunks):
            rows = slice(start, start + batch_chunks)
            hidden[rows] += block.mlp(ffn_input[rows])
        del block
