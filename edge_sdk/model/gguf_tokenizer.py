"""tokenizer.json and tokenizer_config.json from a GGUF file's `tokenizer.ggml.*` metadata.

A GGUF carries no tokenizer.json: it stores the vocabulary, the merges or scores and the special token ids under
llama.cpp's keys. They are rebuilt into the two files a Hugging Face checkpoint has, as transformers' GGUF
integration (integrations/gguf/gguf_tokenizer_mapping.py) does, so the Tokenizer class and the bundle writer serve
a GGUF exactly like a checkpoint directory:

- `gpt2`: byte-level BPE with the file's merges. The pre-tokenizer's split rule comes from `tokenizer.ggml.pre`
  (llama.cpp's name for the regular expression the merges were learned with); only the names whose rule is known
  here are accepted, since a wrong split tokenizes silently differently. A file without the key gets llama.cpp's
  own `default` rule, as llama.cpp reads it. The Llama 3 names (llama-bpe, llama3, llama-v3) take a whole word
  found in the vocabulary as one token before any merge (ignore_merges, as llama.cpp and Llama 3's tokenizer.json).
  The Qwen2 names NFC-normalize the text first, as Qwen2's tokenizer.json and transformers do and llama.cpp does not:
  decomposed text (`e` + U+0301) is the one input whose ids differ from llama.cpp's.
- `llama`: a SentencePiece BPE vocabulary with scores: byte fallback, `<unk>`, a `▁` before the text and after
  every added token, whatever the text starts with (llama.cpp's and SentencePiece's dummy prefix; none when
  `tokenizer.ggml.add_space_prefix` is false); merges from the file, or recovered from the scores when absent (the
  score of a token orders the merge that makes it, as SentencePiece does).
- tokens typed control (and the unknown token) become special added tokens and user-defined ones plain added
  tokens, matched whole (llama.cpp's tokenize with parse_special); both keep the text the file gives them, which
  llama.cpp's converter writes decoded, not in the byte-level alphabet.
- bos / eos / unk / pad tokens, `add_bos_token` (llama.cpp's default when absent: true for `llama` and the Llama 3
  pre-tokenizers, false for other `gpt2` files) and the chat template go to tokenizer_config.json.
"""

from __future__ import annotations

import json
from functools import cache

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from edge_sdk.errors import CheckpointError
from edge_sdk.model.gguf_metadata import GgufMetadata
from edge_sdk.model.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

# llama.cpp's token types (gguf.TokenType)
UNKNOWN_TOKEN = 2
CONTROL_TOKEN = 3
USER_DEFINED_TOKEN = 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# SmolLM isolates every digit, then applies the GPT-2 rule (its tokenizer.json: Digits(individual_digits), ByteLevel)
_SMOLLM_DIGITS = r"\p{N}"
# llama.cpp's rule for a file without tokenizer.ggml.pre (or "default"): these splits one after the other
# (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_DEFAULT; llama.cpp warns that it is likely not the model's own)
_DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")
# tokenizer.ggml.pre -> (split rule, NFC-normalize first). The GPT-2 rule is ByteLevel's own (use_regex).
PRE_TOKENIZER_SPLITS = {
    "default": ("default", False),
    "gpt-2": (_GPT2_SPLIT, False),
    "llama-bpe": (_LLAMA3_SPLIT, False),
    "llama3": (_LLAMA3_SPLIT, False),
    "llama-v3": (_LLAMA3_SPLIT, False),
    "smaug-bpe": (_LLAMA3_SPLIT, False),
    "smollm": (_SMOLLM_DIGITS, False),
    "qwen2": (_QWEN2_SPLIT, True),
    "deepseek-r1-qwen": (_QWEN2_SPLIT, True),
}
TOKENIZER_MODELS = ("gpt2", "llama")
# names llama.cpp reads as its llama3 pre-tokenizer (llama-vocab.cpp): whole-word vocabulary hits skip the merges
# (ignore_merges, as Llama 3's tokenizer.json) and bos is added unless tokenizer.ggml.add_bos_token says otherwise
LLAMA3_PRE_TOKENIZERS = ("llama-bpe", "llama3", "llama-v3")


@cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (byte-level BPE vocabularies are written in it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


def _merges(metadata: GgufMetadata, vocab: dict[str, int]) -> list[tuple[str, str]] | None:
    """The file's merges, each two tokens of `vocab` that make a third (what tokenizers' BPE requires, which it
    reports naming neither the key nor the entry)."""
    merges = metadata.strings("tokenizer.ggml.merges", default=None)
    if merges is None:
        return None
    pairs = []
    for index, merge in enumerate(merges):
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise CheckpointError(
                f"{metadata.path}: metadata key 'tokenizer.ggml.merges' entry {index} must be two tokens separated "
                f"by one space, found {merge[:60]!r}"
            )
        for token in (left, right, left + right):
            if token not in vocab:
                raise CheckpointError(
                    f"{metadata.path}: metadata key 'tokenizer.ggml.merges' entry {index} ({merge[:60]!r}) needs the "
                    f"token {token[:60]!r}, which is not in 'tokenizer.ggml.tokens'"
                )
        pairs.append((left, right))
    return pairs


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary tokens, best-scored token first (transformers'
    generate_merges with scores): SentencePiece merges the pair whose result scores highest."""
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = []
    for token, score in zip(tokens, scores, strict=True):
        splits = [(token[:cut], token[cut:]) for cut in range(1, len(token))]
        found = [(left, right) for left, right in splits if left in vocab and right in vocab]
        found.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges += [(score, left, right) for left, right in found]
    merges.sort(key=lambda merge: (merge[0], len(merge[1]), len(merge[2])), reverse=True)
    return [(left, right) for _, left, right in merges]


def _byte_level(metadata: GgufMetadata, tokens: list[str], token_types: list[int]) -> HFTokenizer:
    pre = metadata.string("tokenizer.ggml.pre", default="default")  # llama.cpp's choice without the key
    if pre not in PRE_TOKENIZER_SPLITS:
        raise CheckpointError(
            f"{metadata.path}: metadata key 'tokenizer.ggml.pre' must be one of {', '.join(PRE_TOKENIZER_SPLITS)} "
            f"(the pre-tokenizers edge-sdk rebuilds), found {pre!r}"
        )
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    # a normal token outside the byte alphabet (a llama.cpp mislabel) is respelled in it, as transformers does;
    # control and user-defined tokens are written as their text (convert_hf_to_gguf.py decodes added tokens) and
    # matched whole as added tokens, so they keep that text here: respelled, the added token of the same text
    # would get a new id past the vocabulary
    raw = (CONTROL_TOKEN, USER_DEFINED_TOKEN)
    vocab = {
        token
        if set(token) <= alphabet or (index < len(token_types) and token_types[index] in raw)
        else "".join(spelling[byte] for byte in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    merges = _merges(metadata, vocab)
    if merges is None:
        raise CheckpointError(
            f"{metadata.path}: metadata key 'tokenizer.ggml.merges' is missing; a gpt2 tokenizer needs its merges"
        )
    ignore_merges = pre in LLAMA3_PRE_TOKENIZERS
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges))
    split, nfc = PRE_TOKENIZER_SPLITS[pre]
    if split == _GPT2_SPLIT:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "default":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                *(pre_tokenizers.Split(Regex(rule), behavior="isolated") for rule in _DEFAULT_SPLITS),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif split == _SMOLLM_DIGITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if nfc:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(metadata: GgufMetadata, tokens: list[str], unknown: str | None) -> HFTokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges(metadata, vocab)
    if merges is None:
        scores = metadata.numbers("tokenizer.ggml.scores")
        if len(scores) != len(tokens):
            raise CheckpointError(
                f"{metadata.path}: metadata key 'tokenizer.ggml.scores' must have one score per token "
                f"({len(tokens)}), found {len(scores)}"
            )
        merges = _merges_from_scores(tokens, [float(score) for score in scores])
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unknown, fuse_unk=True, byte_fallback=True))
    prefix = metadata.boolean("tokenizer.ggml.add_space_prefix", default=True)
    # llama.cpp (llama_vocab::tokenize, SPM) puts a space before every piece of text that starts the text or follows
    # an added token, whatever the piece starts with (SentencePiece's dummy prefix): a normalizer, which the
    # tokenizers library runs on each piece between the added tokens, unlike Metaspace's prepend_scheme
    steps = [normalizers.Prepend("▁")] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return backend


def gguf_tokenizer_files(metadata: GgufMetadata) -> dict[str, bytes]:
    """{tokenizer.json, tokenizer_config.json} contents rebuilt from the metadata; {} when it has no tokenizer."""
    if not metadata.has("tokenizer.ggml.model"):
        return {}
    kind = metadata.string("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise CheckpointError(
            f"{metadata.path}: metadata key 'tokenizer.ggml.model' must be one of {', '.join(TOKENIZER_MODELS)}, "
            f"found {kind!r}"
        )
    tokens = metadata.strings("tokenizer.ggml.tokens")
    token_types = metadata.integers("tokenizer.ggml.token_type", default=[])
    if token_types and len(token_types) != len(tokens):
        raise CheckpointError(
            f"{metadata.path}: metadata key 'tokenizer.ggml.token_type' must have one type per token "
            f"({len(tokens)}), found {len(token_types)}"
        )
    special = {
        name: metadata.token_id(f"tokenizer.ggml.{key}", len(tokens))
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
    }
    unknown = tokens[special["unk_token"]] if special["unk_token"] is not None else None
    backend = (
        _byte_level(metadata, tokens, token_types) if kind == "gpt2" else _sentencepiece(metadata, tokens, unknown)
    )
    backend.add_special_tokens(
        [
            AddedToken(token, normalized=False, special=True)
            for token, token_type in zip(tokens, token_types, strict=False)
            if token_type in (CONTROL_TOKEN, UNKNOWN_TOKEN)
        ]
    )
    backend.add_tokens(
        [
            AddedToken(token, normalized=False, special=False)
            for token, token_type in zip(tokens, token_types, strict=False)
            if token_type == USER_DEFINED_TOKEN
        ]
    )
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    config |= {name: tokens[token] for name, token in special.items() if token is not None}
    adds_bos = kind == "llama" or metadata.string("tokenizer.ggml.pre", default=None) in LLAMA3_PRE_TOKENIZERS
    config["add_bos_token"] = metadata.boolean("tokenizer.ggml.add_bos_token", default=adds_bos)
    template = metadata.string("tokenizer.chat_template", default=None)
    if template is not None:
        config["chat_template"] = template
    return {
        TOKENIZER_FILE: backend.to_str().encode("utf-8"),
        TOKENIZER_CONFIG_FILE: (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    }
