"""Tokenizer of a checkpoint: tokenizer.json through the `tokenizers` library, plus tokenizer_config.json
(bos/eos tokens, whether to prepend bos, chat template)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from edge_sdk.errors import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as {"content": "...", ...}
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class Tokenizer:
    backend: HFTokenizer
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        prepend = self.add_bos if add_bos is None else add_bos
        return [self.bos_token_id, *ids] if prepend and self.bos_token_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @classmethod
    def from_dir(cls, directory: str | Path, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
        """Load DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.

        eos_token_ids from config.json are added to the tokenizer config's eos token, since chat models
        often stop on several ids."""
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise CheckpointError(f"{path}: tokenizer.json is missing")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as error:  # the tokenizers library raises a bare Exception on bad files
            raise CheckpointError(f"{path}: not a valid tokenizers file ({error})") from None
        config: dict[str, Any] = {}
        config_path = directory / TOKENIZER_CONFIG_FILE
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{config_path}: not valid JSON ({error})") from None

        def token_id(field: str) -> int | None:
            content = _token_content(config.get(field))
            if content is None:
                return None
            found = backend.token_to_id(content)
            if found is None:
                raise CheckpointError(f"{config_path}: {field} {content!r} is not in the vocabulary of {path}")
            return found

        bos = token_id("bos_token")
        eos = token_id("eos_token")
        eos_ids = tuple(dict.fromkeys(([eos] if eos is not None else []) + list(eos_token_ids)))
        return cls(
            backend=backend,
            bos_token_id=bos,
            eos_token_ids=eos_ids,
            add_bos=bool(config.get("add_bos_token", bos is not None)),
            chat_template=config.get("chat_template"),
        )
