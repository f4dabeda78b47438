"""Tokenizer of a checkpoint or a bundle: tokenizer.json through the `tokenizers` library, plus tokenizer_config.json
(bos/eos tokens, whether to prepend bos, chat template).

Both files pass the strict JSON rule (formats/strict_json.py) before any library sees them, and a bundle's are read
through the bundle (listed files only, no links), so the Python runtime and the C runtime (jetson/src/tokenizer.c)
refuse the same tokenizer files. A bundle run by libedge_sdk may tokenize through its C tokenizer instead
(backends/c_runtime.py, `RuntimeTokenizer`): the same ids and text for the byte-level BPE files it takes, without the
second copy of the vocabulary and the two parses of tokenizer.json in the Python process (tens of MB on a small
model's run). tokenizer_config.json fields edge-sdk reads must have their documented types:
`bos_token` / `eos_token` a string or {"content": string}, `add_bos_token` a boolean, `chat_template` a string or
a list of {"name", "template"} (the template called "default" is used, as transformers does).

Current transformers saves the chat template beside tokenizer_config.json as chat_template.jinja (processors as
chat_template.json, {"chat_template": ...}); such a file takes priority over the config's field, as in
transformers, and read_tokenizer_files puts it into the tokenizer_config.json a bundle carries, so bundle readers
(Python and C) keep reading two tokenizer files.

Whether encode prepends bos: tokenizer_config.json's `add_bos_token` when present (the model's stated intent, as
transformers 4's Llama tokenizers and llama.cpp apply it; transformers 5 leaves a saved post-processor as it is, so
a file with `add_bos_token: true` and no bos in its post-processor gets none there), otherwise whether
tokenizer.json's post-processor puts the bos token first, as transformers' AutoTokenizer, whatever the tokenizer
class. Llama-2-style files have both and add bos; Qwen2 and GPT-2/SmolLM2-style files have neither, so they add no
bos even when they name one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_sdk.errors import CheckpointError, EdgeSdkError
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import read_bounded

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

    from edge_sdk.bundle import Bundle

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_JINJA_FILE = "chat_template.jinja"
CHAT_TEMPLATE_JSON_FILE = "chat_template.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# the named special tokens transformers passes a chat template besides bos_token and eos_token
TEMPLATE_ONLY_TOKENS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", *TEMPLATE_ONLY_TOKENS)
MAX_TOKENIZER_JSON_BYTES = 64 << 20  # the C runtime reads JSON files of at most this size too


def _token_content(config: dict[str, Any], field: str, where: str) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": "...", ...}."""
    value = config.get(field)
    content = value.get("content") if isinstance(value, dict) else value
    if value is None or isinstance(content, str):
        return content
    raise CheckpointError(f"{where}: field '{field}' must be a string or an object with a string 'content'")


def template_tokens_of(config: dict[str, Any], where: str) -> dict[str, str]:
    """The named special tokens a chat template sees besides bos and eos (transformers passes its whole
    special_tokens_map: unk_token, pad_token, ...), as tokenizer_config.json names them."""
    tokens = ((name, _token_content(config, name, where)) for name in TEMPLATE_ONLY_TOKENS)
    return {name: content for name, content in tokens if content is not None}


def chat_template_of(config: dict[str, Any], where: str) -> str | None:
    """tokenizer_config.json's chat template: a string, or the list entry named "default"; None without one."""
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        default = named.get("default")
        if isinstance(default, str) and len(named) == len(template):
            return default
    raise CheckpointError(
        f'{where}: field \'chat_template\' must be a string or a list of {{"name", "template"}} objects with one '
        f"named 'default'"
    )


def _post_processor_adds(processor: Any, token: str) -> bool:
    """Whether a tokenizer.json post-processor puts `token` first in a single sequence."""
    if not isinstance(processor, dict):
        return False
    if processor.get("type") == "Sequence":
        return any(_post_processor_adds(step, token) for step in processor.get("processors") or [])
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    first = single[0] if isinstance(single, list) and single else None
    special = first.get("SpecialToken") if isinstance(first, dict) else None
    return isinstance(special, dict) and special.get("id") == token


def _add_bos_default(tokenizer_json: dict[str, Any], bos_token: str | None) -> bool:
    """AutoTokenizer's choice when tokenizer_config.json has no add_bos_token (see the module docstring)."""
    return bos_token is not None and _post_processor_adds(tokenizer_json.get("post_processor"), bos_token)


def _separate_chat_template(directory: Path) -> str | None:
    """The chat template transformers saved beside tokenizer_config.json, if any."""
    jinja = directory / CHAT_TEMPLATE_JINJA_FILE
    if jinja.is_file():
        return read_bounded(jinja, MAX_TOKENIZER_JSON_BYTES, follow_symlinks=True, error=CheckpointError).decode()
    path = directory / CHAT_TEMPLATE_JSON_FILE
    if not path.is_file():
        return None
    data = read_bounded(path, MAX_TOKENIZER_JSON_BYTES, follow_symlinks=True, error=CheckpointError)
    template = chat_template_of(strict_json.parse_object(data, str(path), error=CheckpointError), str(path))
    if template is None:
        raise CheckpointError(f"{path}: field 'chat_template' is missing; it must be a string")
    return template


def _legacy_special_tokens(directory: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The named special tokens of special_tokens_map.json, which transformers still reads for a tokenizer_config.json
    without added_tokens_decoder (files saved before transformers 4.34), its entries winning over the config's."""
    path = directory / SPECIAL_TOKENS_MAP_FILE
    if "added_tokens_decoder" in config or not path.is_file():
        return {}
    data = read_bounded(path, MAX_TOKENIZER_JSON_BYTES, follow_symlinks=True, error=CheckpointError)
    mapping = strict_json.parse_object(data, str(path), error=CheckpointError)
    return {name: mapping[name] for name in NAMED_SPECIAL_TOKENS if mapping.get(name) is not None}


def read_tokenizer_files(directory: str | Path) -> dict[str, bytes]:
    """DIR/tokenizer.json and DIR/tokenizer_config.json as a bundle carries them: the config (when there is one, a
    separate chat template or a legacy special_tokens_map.json) with the chat template of chat_template.jinja /
    .json in its 'chat_template' and the named special tokens of special_tokens_map.json where transformers reads
    them (_legacy_special_tokens)."""
    directory = Path(directory)
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: tokenizer.json is missing")
    files = {TOKENIZER_FILE: read_bounded(path, MAX_TOKENIZER_JSON_BYTES, follow_symlinks=True, error=CheckpointError)}
    config_path = directory / TOKENIZER_CONFIG_FILE
    config_text = None
    if config_path.is_file():
        config_text = read_bounded(config_path, MAX_TOKENIZER_JSON_BYTES, follow_symlinks=True, error=CheckpointError)
    config = {}
    if config_text is not None:
        config = strict_json.parse_object(config_text, str(config_path), error=CheckpointError)
    changes = _legacy_special_tokens(directory, config)
    template = _separate_chat_template(directory)
    if template is not None:
        changes["chat_template"] = template
    if changes:
        config_text = (json.dumps({**config, **changes}, indent=2, ensure_ascii=False) + "\n").encode()
    if config_text is not None:
        files[TOKENIZER_CONFIG_FILE] = config_text
    return files


def not_unicode_error(text: str) -> EdgeSdkError | None:
    """The error for a str that is not Unicode text (lone surrogates, as from undecodable bytes), naming the first
    such character, or None."""
    bad = next((index for index, char in enumerate(text) if 0xD800 <= ord(char) <= 0xDFFF), None)
    if bad is None:
        return None
    return EdgeSdkError(f"text: not valid Unicode at character {bad} (bytes that are not UTF-8?); give UTF-8 text")


class TokenizerBackend(Protocol):
    """The library that turns text into ids and back: the tokenizers library (HFBackend) or libedge_sdk's C tokenizer
    (backends/c_runtime.py RuntimeTokenizer). Special-token templates (bos) are Tokenizer's."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """The ids of text, no special-token template; EdgeSdkError when it cannot be encoded (not_unicode_error)."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...

    def special_token_text(self, token: int) -> str:
        """The text of a special (added) token such as bos or eos: its content."""
        ...


class HFBackend:
    """TokenizerBackend over a tokenizers.Tokenizer."""

    def __init__(self, library: HFTokenizer) -> None:
        self.library = library

    @property
    def vocab_size(self) -> int:
        return self.library.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        try:
            return self.library.encode(text, add_special_tokens=False).ids
        except Exception as error:  # the tokenizers library raises a bare Exception
            failure = not_unicode_error(text) or EdgeSdkError(f"text: the tokenizer could not encode it ({error})")
            raise failure from None

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.library.decode(ids, skip_special_tokens=skip_special_tokens)

    def special_token_text(self, token: int) -> str:
        return self.library.id_to_token(token)


@dataclass
class Tokenizer:
    backend: TokenizerBackend
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None
    template_tokens: dict[str, str] = field(default_factory=dict)  # template_tokens_of: unk_token, pad_token, ...

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of text; a str that is not Unicode text (lone surrogates, as from undecodable bytes) is an
        EdgeSdkError naming the first such character."""
        ids = self.backend.encode(text)
        prepend = self.add_bos if add_bos is None else add_bos
        return [self.bos_token_id, *ids] if prepend and self.bos_token_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def special_token_text(self, token: int) -> str:
        return self.backend.special_token_text(token)

    @classmethod
    def from_dir(cls, directory: str | Path, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
        """DIR/tokenizer.json and, when present, DIR/tokenizer_config.json of a checkpoint directory.

        eos_token_ids from config.json are added to the tokenizer config's eos token, since chat models often stop
        on several ids."""
        directory = Path(directory)
        files = read_tokenizer_files(directory)
        return cls.from_bytes(
            files[TOKENIZER_FILE],
            str(directory / TOKENIZER_FILE),
            files.get(TOKENIZER_CONFIG_FILE),
            str(directory / TOKENIZER_CONFIG_FILE),
            eos_token_ids,
        )

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> Tokenizer:
        """The bundle's tokenizer (its listed tokenizer.json and, when listed, tokenizer_config.json)."""
        text = bundle.read_file(TOKENIZER_FILE, MAX_TOKENIZER_JSON_BYTES)
        config_text = None
        if bundle.has_file(TOKENIZER_CONFIG_FILE):
            config_text = bundle.read_file(TOKENIZER_CONFIG_FILE, MAX_TOKENIZER_JSON_BYTES)
        return cls.from_bytes(
            text,
            str(bundle.path / TOKENIZER_FILE),
            config_text,
            str(bundle.path / TOKENIZER_CONFIG_FILE),
            bundle.config.eos_token_ids,
        )

    @classmethod
    def from_bytes(
        cls,
        text: bytes,
        where: str,
        config_text: bytes | None,
        config_where: str,
        eos_token_ids: tuple[int, ...] = (),
    ) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer  # here: a run through libedge_sdk's tokenizer loads none

        tokenizer_json = strict_json.parse_object(text, where, error=CheckpointError)
        try:
            backend = HFTokenizer.from_str(text.decode("utf-8"))
        except Exception as error:  # the tokenizers library raises a bare Exception on bad files
            raise CheckpointError(f"{where}: not a valid tokenizers file ({error})") from None
        _check_token_ids(tokenizer_json, backend, where)
        config = parse_config(config_text, config_where)

        def token_id(field: str) -> int | None:
            content = _token_content(config, field, config_where)
            if content is None:
                return None
            found = backend.token_to_id(content)
            if found is None:
                raise CheckpointError(f"{config_where}: {field} {content!r} is not in the vocabulary of {where}")
            return found

        bos = token_id("bos_token")
        eos = token_id("eos_token")
        bos_token = _token_content(config, "bos_token", config_where)
        add_bos = config.get("add_bos_token", _add_bos_default(tokenizer_json, bos_token))
        if not isinstance(add_bos, bool):
            raise CheckpointError(f"{config_where}: field 'add_bos_token' must be true or false, found {add_bos!r}")
        return cls(
            backend=HFBackend(backend),
            bos_token_id=bos,
            eos_token_ids=merged_eos_ids(eos, eos_token_ids),
            add_bos=add_bos,
            chat_template=chat_template_of(config, config_where),
            template_tokens=template_tokens_of(config, config_where),
        )


def _check_token_ids(tokenizer_json: dict[str, Any], backend, where: str) -> None:
    """The ids tokenizer.json writes must be the ids the tokenizers library encodes with. It renumbers, with a
    logged warning only, an added token whose id is not its own (its id in model.vocab, else the next one after the
    vocabulary and the added tokens before it), and of two vocab entries given one id, or of an added token listed
    twice, it keeps one by rules of its own; the C tokenizer (libedge_sdk) reads the ids as written and would encode
    others. Refused, in the C reader's words (jetson/src/tokenizer.c load_vocab). tokenizer_json passed the
    tokenizers library's own reading, so its fields have their types."""
    vocab = tokenizer_json["model"].get("vocab")
    if isinstance(vocab, dict):
        owners: dict[int, str] = {}
        for text, token in vocab.items():
            if owners.setdefault(token, text) != text:
                raise CheckpointError(f"{where}: vocab id {token} is given to two tokens")
    listed: set[str] = set()
    for added in tokenizer_json.get("added_tokens") or ():
        content, written = added["content"], added["id"]
        if content in listed:
            raise CheckpointError(f"{where}: added token {content[:64]!r} is listed twice in added_tokens")
        listed.add(content)
        encoded = backend.token_to_id(content)
        if encoded != written:
            rule = (
                "its id in model.vocab"
                if isinstance(vocab, dict) and content in vocab
                else "the next id after model.vocab and the added tokens before it"
            )
            raise CheckpointError(
                f"{where}: added token {content[:64]!r} has id {written}, but the tokenizers library gives it id "
                f"{encoded} ({rule})"
            )


def parse_config(config_text: bytes | None, config_where: str) -> dict[str, Any]:
    """tokenizer_config.json's fields ({} without the file), through the strict JSON rule."""
    if config_text is None:
        return {}
    return strict_json.parse_object(config_text, config_where, error=CheckpointError)


def merged_eos_ids(eos: int | None, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The tokenizer config's eos id, then config.json's (chat models often stop on several), each once."""
    return tuple(dict.fromkeys(([eos] if eos is not None else []) + list(eos_token_ids)))
