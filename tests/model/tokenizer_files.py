"""Small tokenizers of the three conventions real checkpoints use, trained on the fixture's calibration text with
the `tokenizers` library and saved by the transformers class of each convention (transformers is test-only)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny-relu-llama"
VOCAB_SIZE = 400
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
BYTE_TOKENS = tuple(f"<0x{byte:02X}>" for byte in range(256))


def training_text() -> list[str]:
    return (FIXTURE / "calibration.txt").read_text().splitlines()[:2000]


def _llama2_backend() -> HFTokenizer:
    """A Llama-2 style tokenizer.json: SentencePiece BPE with byte fallback, `▁` word prefix, <unk>/<s>/</s> at
    ids 0-2 and the 256 byte tokens at 3-258, as Llama-2's vocabulary is laid out."""
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trainer_backend = HFTokenizer(models.BPE())
    trainer_backend.pre_tokenizer = metaspace
    trainer_backend.train_from_iterator(
        training_text(), trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False)
    )
    trained = json.loads(trainer_backend.to_str())["model"]
    vocab = {token: index for index, token in enumerate((*LLAMA_SPECIALS, *BYTE_TOKENS))}
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in trained["merges"]]
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    backend.pre_tokenizer = metaspace
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in LLAMA_SPECIALS])
    return backend


def _byte_level_backend(specials: tuple[str, ...]) -> HFTokenizer:
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(training_text(), trainer)
    return backend


def save_llama2_style(directory: Path) -> None:
    """LlamaTokenizerFast: bos <s> in the post-processor template, as in Llama-2's tokenizer.json; its config
    written without add_bos_token (AutoTokenizer adds bos)."""
    from transformers import LlamaTokenizerFast

    tokenizer = LlamaTokenizerFast(
        tokenizer_object=_llama2_backend(), bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )
    _save_without_add_bos(tokenizer, directory)


def save_qwen2_style(directory: Path) -> None:
    """Qwen2TokenizerFast with a bos token named anyway: AutoTokenizer still adds none."""
    from transformers import Qwen2TokenizerFast

    backend = _byte_level_backend(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|im_end|>", unk_token=None
    )
    _save_without_add_bos(tokenizer, directory)


def save_gpt2_style(directory: Path) -> None:
    """GPT2TokenizerFast (SmolLM2's convention): bos <|endoftext|>, which AutoTokenizer does not add."""
    from transformers import GPT2TokenizerFast

    backend = _byte_level_backend(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    tokenizer = GPT2TokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    _save_without_add_bos(tokenizer, directory)


def _save_without_add_bos(tokenizer, directory: Path) -> None:
    tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("add_bos_token", None)
    # transformers writes 1e30 here when no length is set, beyond what edge-sdk's strict JSON rule reads
    config["model_max_length"] = 1024
    config_path.write_text(json.dumps(config, indent=2))
