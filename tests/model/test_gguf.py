"""GGUF input: config, tokenizer and logits of GGUF files the tests write against the safetensors checkpoints they
come from, the CLI end to end, and the files it must refuse."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import normalizers, pre_tokenizers

from edge_sdk import quant
from edge_sdk.bundle import Bundle
from edge_sdk.bundle.layout import TRANSPOSED_SUFFIX, is_quantized_matrix, model_tensor_names
from edge_sdk.errors import CheckpointError
from edge_sdk.model.checkpoint import Checkpoint, open_checkpoint
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.gguf_metadata import GgufMetadata, open_reader
from edge_sdk.model.gguf_tokenizer import gguf_tokenizer_files
from edge_sdk.model.loader import load_decoder
from edge_sdk.model.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer
from edge_sdk.sparsity.bundle_model import quantized_matrix

from .gguf_files import RANDOM_BLOCK_SCALES, Q, gguf_layout, patch_gguf, tokenizer_keys, truncate_gguf, write_gguf
from .hf_models import VOCAB, family_configs, save_hf_model
from .tokenizer_files import save_llama2_style

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny-relu-llama"
IDS = torch.tensor([list(range(5, 1900, 47))])  # 41 tokens spread over the fixture's vocabulary
# Each supported tensor type with the bound on max |logit - source logit| / max |source logit| on the fixture's
# 41 tokens. Every type must also give exactly the logits of a checkpoint holding the weights it dequantizes to.
# F32 / F16 are exact (the fixture is fp16); the K-quants and IQ4s are written as random blocks (the gguf package
# cannot quantize them), so their source is what the blocks dequantize to and the bound is 0 too.
TENSOR_TYPE_BOUNDS = {
    Q.F32: 0.0,
    Q.F16: 0.0,
    Q.BF16: 0.01,  # measured 0.0032
    Q.Q8_0: 0.02,  # measured 0.0077
    Q.Q5_0: 0.15,  # measured 0.067
    Q.Q5_1: 0.15,  # measured 0.072
    Q.Q4_0: 0.3,  # measured 0.143
    Q.Q4_1: 0.3,  # measured 0.155
    Q.Q2_K: 0.0,
    Q.Q3_K: 0.0,
    Q.Q4_K: 0.0,
    Q.Q5_K: 0.0,
    Q.Q6_K: 0.0,
    Q.IQ1_S: 0.0,
    Q.IQ2_XXS: 0.0,
    Q.IQ2_XS: 0.0,
    Q.IQ2_S: 0.0,
    Q.IQ3_XXS: 0.0,
    Q.IQ3_S: 0.0,
    Q.IQ4_NL: 0.0,
    Q.IQ4_XS: 0.0,
}
TEXTS = [
    "def main(argv=None):\n    return 0\n",
    "Hello, wörld! 12345 \t tabs  and  spaces",
    "<s> special tokens </s> inside text",
]


def block_256_model(directory: Path, vocab_size: int = VOCAB) -> Path:
    """A transformers tiny Llama whose rows are whole 256-value blocks (K-quants, IQ4_XS)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="relu",
        rms_norm_eps=1e-5,
    )
    save_hf_model(config, directory)
    return directory


def dequantized_checkpoint(source: Path, tensors: dict[str, np.ndarray], directory: Path) -> Path:
    """A safetensors checkpoint of source's config holding `tensors` (what a GGUF dequantizes to)."""
    directory.mkdir()
    shutil.copy(source / "config.json", directory / "config.json")
    save_file(
        {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in tensors.items()},
        directory / "model.safetensors",
    )
    return directory


def fixture_gguf(path: Path, tensor_type=Q.F16) -> Path:
    write_gguf(FIXTURE, path, tensor_type, extra_keys=tokenizer_keys(FIXTURE, "gpt2"))
    return path


def test_fixture_config_round_trips(tmp_path):
    found = open_checkpoint(fixture_gguf(tmp_path / "tiny.gguf")).config
    expected = Checkpoint(FIXTURE).config
    # GGUF stores the epsilon as float32
    assert found.rms_norm_eps == pytest.approx(expected.rms_norm_eps, rel=1e-6)
    assert found == replace(expected, rms_norm_eps=found.rms_norm_eps)
    assert found.activation.kind == "relu"  # from llama.hidden_act: silu otherwise


@pytest.mark.parametrize("family", ["llama-relu", "mistral-gqa", "qwen2-bias-tied", "llama-rope-linear"])
def test_family_config_and_logits_match_safetensors(family, tmp_path):
    source = tmp_path / "hf"
    save_hf_model(family_configs()[family], source)
    path = tmp_path / f"{family}.gguf"
    write_gguf(source, path, Q.F32)
    checkpoint = open_checkpoint(path)
    expected = Checkpoint(source).config
    if family == "mistral-gqa":
        # llama.cpp writes Mistral as llama and stores no sliding window (4096 here, beyond the test's 41 tokens)
        expected = replace(expected, model_type="llama", sliding_window=None)
    assert checkpoint.config == replace(expected, rms_norm_eps=checkpoint.config.rms_norm_eps, torch_dtype="float32")
    ids = IDS % VOCAB
    assert torch.equal(load_decoder(checkpoint)(ids), load_decoder(source)(ids))


# RoPE scaling as llama.cpp reads it (llama-model.cpp load_hparams, llama-context.cpp): the type defaults to linear,
# the factor is rope.scaling.factor or else rope.scale_linear (0: none), and type none never scales. Each case was
# checked against llama.cpp's logits (a factor read differently moves every logit after the first position).
ROPE_SCALING_KEYS = [  # (case, keys, the rope type and factor read)
    ("no keys", {}, ("default", 1.0)),
    ("type and factor", {"scaling.type": ("string", "linear"), "scaling.factor": ("float32", 4.0)}, ("linear", 4.0)),
    ("factor without a type", {"scaling.factor": ("float32", 4.0)}, ("linear", 4.0)),
    ("old key without a type", {"scale_linear": ("float32", 4.0)}, ("linear", 4.0)),
    (
        "linear type with the old key",
        {"scaling.type": ("string", "linear"), "scale_linear": ("float32", 2.0)},
        ("linear", 2.0),
    ),
    (
        "factor before the old key",
        {"scaling.factor": ("float32", 4.0), "scale_linear": ("float32", 2.0)},
        ("linear", 4.0),
    ),
    ("factor 0", {"scaling.type": ("string", "linear"), "scaling.factor": ("float32", 0.0)}, ("default", 1.0)),
    (
        "type none with a factor",
        {"scaling.type": ("string", "none"), "scaling.factor": ("float32", 4.0)},
        ("default", 1.0),
    ),
    (
        "type none with the old key",
        {"scaling.type": ("string", "none"), "scale_linear": ("float32", 4.0)},
        ("default", 1.0),
    ),
]


@pytest.mark.parametrize(("case", "keys", "expected"), ROPE_SCALING_KEYS, ids=[case for case, *_ in ROPE_SCALING_KEYS])
def test_rope_scaling_keys_read_as_llama_cpp_reads_them(case, keys, expected, tmp_path):
    path = tmp_path / "model.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys={f"llama.rope.{key}": value for key, value in keys.items()})
    rope = GgufCheckpoint(path).config.rope
    assert (rope.rope_type, rope.factor) == expected


def test_silu_is_the_default_activation(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(FIXTURE, path, Q.F16, hidden_act=False)
    assert open_checkpoint(path).config.activation.kind == "silu"


@pytest.mark.parametrize("tensor_type", list(TENSOR_TYPE_BOUNDS), ids=lambda kind: kind.name)
def test_logits_match_safetensors_within_the_type_bound(tensor_type, tmp_path):
    source = block_256_model(tmp_path / "hf") if tensor_type in RANDOM_BLOCK_SCALES else FIXTURE
    ids = IDS % open_checkpoint(source).config.vocab_size
    path = tmp_path / f"model-{tensor_type.name}.gguf"
    written = write_gguf(source, path, tensor_type)
    checkpoint = open_checkpoint(path)
    assert checkpoint.entries["model.layers.0.mlp.up_proj.weight"].tensor_type == tensor_type
    logits = load_decoder(checkpoint)(ids)

    dequantized = load_decoder(dequantized_checkpoint(source, written, tmp_path / "dequantized"))(ids)
    assert torch.equal(logits, dequantized)
    if tensor_type in RANDOM_BLOCK_SCALES:
        return  # their source is the dequantized checkpoint itself
    reference = load_decoder(source)(ids)
    relative = ((logits - reference).abs().max() / reference.abs().max()).item()
    assert relative <= TENSOR_TYPE_BOUNDS[tensor_type], f"{tensor_type.name}: relative logit error {relative}"
    if tensor_type not in (Q.F32, Q.F16):
        assert relative > 0  # the file really holds the type


def test_llama_q_and_k_rows_are_unpermuted(tmp_path):
    checkpoint = open_checkpoint(fixture_gguf(tmp_path / "tiny.gguf", Q.F32))
    with safe_open(str(FIXTURE / "model.safetensors"), framework="pt") as handle:
        for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
            expected = handle.get_tensor(name).float()
            assert torch.equal(checkpoint.tensor(name), expected)
            # the file holds llama.cpp's permuted rows
            assert not np.array_equal(checkpoint.entries[name].data, expected.numpy())


@pytest.mark.parametrize("dropped", ["o_proj", "qkv"])
def test_llama_attention_biases_are_read_each_where_present(dropped, tmp_path):
    """llama.cpp reads a llama GGUF's q/k/v biases and its output bias each as optional (a llamafied checkpoint may
    have q/k/v biases only): the file computes as the checkpoint with the biases it lacks at zero."""
    from safetensors.torch import load_file

    config = family_configs()["llama-relu"]
    config.attention_bias = True
    source, reference, without = tmp_path / "hf", tmp_path / "reference", tmp_path / "without"
    save_hf_model(config, source)
    tensors = load_file(source / "model.safetensors")
    biases = ("o_proj.bias",) if dropped == "o_proj" else ("q_proj.bias", "k_proj.bias", "v_proj.bias")
    for directory, kept in ((reference, True), (without, False)):
        shutil.copytree(source, directory)
        save_file(
            {
                name: tensor.zero_() if name.endswith(biases) else tensor
                for name, tensor in tensors.items()
                if kept or not name.endswith(biases)
            },
            directory / "model.safetensors",
        )
    path = tmp_path / "model.gguf"
    write_gguf(without, path, Q.F32)
    checkpoint = open_checkpoint(path)
    assert (checkpoint.config.qkv_bias, checkpoint.config.o_bias) == (dropped == "o_proj", dropped == "qkv")
    ids = IDS % VOCAB
    assert torch.allclose(load_decoder(checkpoint)(ids), load_decoder(reference)(ids), rtol=0, atol=1e-6)


def test_gpt2_tokenizer_matches_the_fixture(tmp_path):
    ours = open_checkpoint(fixture_gguf(tmp_path / "tiny.gguf")).tokenizer()
    theirs = Tokenizer.from_dir(FIXTURE)
    texts = [*TEXTS, *(FIXTURE / "held_out.txt").read_text().splitlines()[:200]]
    for text in texts:
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.encode("<s>")[-1] == 0  # a control token stays whole
    assert (ours.bos_token_id, ours.eos_token_ids, ours.add_bos) == (0, (1,), True)
    assert ours.chat_template == theirs.chat_template
    assert ours.vocab_size == theirs.vocab_size == 2048


def test_smollm_pre_tokenizer_isolates_every_digit_like_smollm2s_tokenizer_json(tmp_path):
    """SmolLM's tokenizer.json splits digits one by one (Digits(individual_digits)) before the GPT-2 split; its
    GGUF says only `tokenizer.ggml.pre = smollm`."""
    keys = tokenizer_keys(FIXTURE, "gpt2") | {"tokenizer.ggml.pre": ("string", "smollm")}
    path = tmp_path / "smollm.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys=keys)
    ours = open_checkpoint(path).tokenizer()
    reference = HFTokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    texts = ["for i in range(2024):", "x = 1234567 + 89", "version 3.11.7, port 8080", *TEXTS]
    for text in texts:
        assert ours.encode(text, add_bos=False) == reference.encode(text, add_special_tokens=False).ids, text
    digits = ours.encode("x = 1234567", add_bos=False)
    assert [ours.decode([token]) for token in digits][-7:] == list("1234567")


def test_sentencepiece_tokenizer_matches_a_llama2_style_tokenizer(tmp_path):
    """`llama` vocabularies carry scores, not merges: the merges are recovered from the scores."""
    reference = tmp_path / "llama2-tokenizer"
    reference.mkdir()
    save_llama2_style(reference)
    keys = tokenizer_keys(reference, "llama")
    assert "tokenizer.ggml.merges" not in keys
    path = tmp_path / "spm.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys=keys)
    ours = open_checkpoint(path).tokenizer()
    theirs = Tokenizer.from_dir(reference)
    # llama.cpp (and SentencePiece, and Llama-2's own tokenizer.json) put `▁` before the text and before every piece
    # after an added token, whatever it starts with: Llama-2's normalizer rather than Metaspace's prepend_scheme
    library = theirs.backend.library
    library.pre_tokenizer = None
    library.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    texts = [*TEXTS, "héllo ☃ 日本語", " leading space", "<s>[INST] hi [/INST]", "a</s>b", "<unk>"]
    texts += (FIXTURE / "held_out.txt").read_text().splitlines()[:200]
    for text in texts:
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.encode("x")[0] == 1  # llama vocabularies add bos
    assert ours.encode("<unk>", add_bos=False) == [0]  # the unknown token is matched whole, as control tokens are
    assert ours.decode(ours.encode("héllo ☃ 日本語")) == "héllo ☃ 日本語"  # byte fallback round trip


def gguf_metadata_tokenizer(path: Path) -> Tokenizer:
    """The Tokenizer of a GGUF's tokenizer metadata alone (its tensors need not fit the vocabulary)."""
    files = gguf_tokenizer_files(GgufMetadata(open_reader(path), path))
    return Tokenizer.from_bytes(files[TOKENIZER_FILE], "tokenizer.json", files[TOKENIZER_CONFIG_FILE], "config")


def test_added_tokens_outside_the_byte_alphabet_keep_their_ids(tmp_path):
    """llama.cpp's converter writes added tokens as their text, such as DeepSeek-R1's <｜begin▁of▁sentence｜>, not in
    the byte-level alphabet; llama.cpp encodes each to its own id."""
    keys = tokenizer_keys(FIXTURE, "gpt2")
    tokens, types = keys["tokenizer.ggml.tokens"][1], keys["tokenizer.ggml.token_type"][1]
    added = {"<｜begin▁of▁sentence｜>": 3, "日本": 4, "  ": 4}
    keys["tokenizer.ggml.tokens"] = ("array", [*tokens, *added])
    keys["tokenizer.ggml.token_type"] = ("array", [*types, *added.values()])
    write_gguf(FIXTURE, tmp_path / "added.gguf", Q.F16, extra_keys=keys)
    ours = gguf_metadata_tokenizer(tmp_path / "added.gguf")
    for index, text in enumerate(added):
        assert ours.encode(f"x{text}y", add_bos=False)[1:-1] == [len(tokens) + index], text
    assert ours.vocab_size == len(tokens) + len(added)


def test_llama3_pre_tokenizers_add_bos_and_take_whole_words_as_llama_cpp_does(tmp_path):
    """llama.cpp's llama3 pre-tokenizer (llama-bpe, llama3, llama-v3): a word of the vocabulary is one token whatever
    the merges make (ignore_merges), and bos is added when the file does not say."""
    keys = tokenizer_keys(FIXTURE, "gpt2") | {"tokenizer.ggml.pre": ("string", "llama-bpe")}
    del keys["tokenizer.ggml.add_bos_token"]
    tokens, types = keys["tokenizer.ggml.tokens"][1], keys["tokenizer.ggml.token_type"][1]
    keys["tokenizer.ggml.tokens"] = ("array", [*tokens, "Ġzqxjv"])  # " zqxjv", which no merge makes
    keys["tokenizer.ggml.token_type"] = ("array", [*types, 1])
    write_gguf(FIXTURE, tmp_path / "llama3.gguf", Q.F16, extra_keys=keys)
    ours = gguf_metadata_tokenizer(tmp_path / "llama3.gguf")
    assert ours.encode("a zqxjv") == [ours.bos_token_id, *ours.encode("a", add_bos=False), len(tokens)]


def test_a_byte_level_file_without_a_pre_tokenizer_name_splits_as_llama_cpp_does(tmp_path):
    """A GGUF written before tokenizer.ggml.pre existed: llama.cpp splits its text by its `default` rules one after
    the other (punctuation runs, GPT-2's rule, digit runs, then three digits at a time); the GPT-2 rule alone was
    used here."""
    keys = tokenizer_keys(FIXTURE, "gpt2")
    del keys["tokenizer.ggml.pre"]
    write_gguf(FIXTURE, tmp_path / "old.gguf", Q.F16, extra_keys=keys)
    splitter = gguf_metadata_tokenizer(tmp_path / "old.gguf").backend.library.pre_tokenizer
    pieces = [piece for piece, _ in splitter.pre_tokenize_str("don't 1234")]
    assert pieces == ["don", "'", "t", "Ġ", "123", "4"]  # llama.cpp's pieces of it (GPT-2's vocabulary: 9099 6 83 ...)


def test_a_directory_holding_one_gguf_is_read(tmp_path):
    fixture_gguf(tmp_path / "tiny.gguf")
    assert isinstance(open_checkpoint(tmp_path), GgufCheckpoint)
    fixture_gguf(tmp_path / "other.gguf")
    with pytest.raises(CheckpointError, match=r"holds 2 GGUF files \(other.gguf, tiny.gguf\)"):
        open_checkpoint(tmp_path)


def edge_sdk(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_sdk", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_cli_info_and_export(tmp_path):
    path = fixture_gguf(tmp_path / "tiny.gguf")
    info = edge_sdk("info", str(path), "--json")
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout)
    assert summary["architecture"] == "LlamaForCausalLM"
    assert (summary["layers"], summary["hidden_size"], summary["vocab_size"]) == (4, 192, 2048)
    assert summary["gguf_tensor_types"] == {"F16": 30, "F32": 9}
    assert summary["int4_scheme"] == "symmetric"
    # an fp16 file: int4 is a choice of size, no matrix kept wider
    assert (summary["int4_head_dtype"], summary["int4_down_dtype"]) == ("int4", "int4")
    assert summary["tokenizer"] is True

    out = tmp_path / "bundle"
    export = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none")
    assert export.returncode == 0, export.stderr
    bundle = Bundle.open(out)
    expected = Checkpoint(FIXTURE).config
    assert bundle.config == replace(expected, rms_norm_eps=bundle.config.rms_norm_eps)
    tokenizer = Tokenizer.from_bundle(bundle)
    assert tokenizer.encode(TEXTS[0]) == Tokenizer.from_dir(FIXTURE).encode(TEXTS[0])
    assert tokenizer.chat_template == Tokenizer.from_dir(FIXTURE).chat_template
    # fp16 bundle of an fp16 source: the weights are the fixture's, bit for bit
    with (
        safe_open(str(out / "weights.safetensors"), framework="pt") as weights,
        safe_open(str(FIXTURE / "model.safetensors"), framework="pt") as source,
    ):
        for name, hf_name in model_tensor_names(expected):
            tensor = weights.get_tensor(name)
            stored = source.get_tensor(hf_name).to(tensor.dtype)
            assert torch.equal(tensor.T if name.endswith("_t") else tensor, stored), name


def _unsupported_type_gguf(path: Path) -> None:
    write_gguf(block_256_model(path.parent / "hf"), path, Q.TQ2_0)


REFUSED_FILES = [  # (case, write the file, the message)
    (
        "unknown architecture",
        lambda path: write_gguf(FIXTURE, path, Q.F16, architecture="gpt2"),
        "metadata key 'general.architecture' must be one of llama, qwen2",
    ),
    (
        "PowerInfer",
        lambda path: write_gguf(
            FIXTURE, path, Q.F16, extra_tensors={"blk.0.ffn_down_t.weight": np.zeros((768, 192), np.float32)}
        ),
        "tensor 'blk.0.ffn_down_t.weight' marks a PowerInfer GGUF",
    ),
    (
        "llama3 rope factors",
        lambda path: write_gguf(FIXTURE, path, Q.F16, extra_tensors={"rope_freqs.weight": np.ones(16, np.float32)}),
        "tensor 'rope_freqs.weight' holds per-dimension RoPE frequency factors",
    ),
    ("unsupported tensor type", _unsupported_type_gguf, "tensor 'token_embd.weight' has type TQ2_0, expected one of"),
    (
        "missing metadata key",
        lambda path: write_gguf(FIXTURE, path, Q.F16, skip_keys=("llama.attention.head_count",)),
        "metadata key 'llama.attention.head_count' is missing; it must be an integer",
    ),
    (
        "mistyped metadata key",
        lambda path: write_gguf(FIXTURE, path, Q.F16, extra_keys={"llama.context_length": ("string", "1024")}),
        "metadata key 'llama.context_length' must be an integer in [2, 16777216], found a value of type STRING",
    ),
    ("not a GGUF file", lambda path: path.write_bytes(b"GGML" + bytes(60)), "not a readable GGUF file"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "make", "message"), REFUSED_FILES, ids=[case for case, _, _ in REFUSED_FILES])
def test_refused_files_exit_2_with_one_line(case, make, message, tmp_path, torch_that_fails):
    """Refused before torch is imported (the GGUF reader needs none): at once, where importing torch takes seconds."""
    path = tmp_path / "model.gguf"
    make(path)
    for command in (["info", str(path)], ["export", str(path), "-o", str(tmp_path / "out"), "--predictor", "none"]):
        result = edge_sdk(*command, env=torch_that_fails)
        assert result.returncode == 2, (case, result.stderr)
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("edge-sdk: error: "), result.stderr
        assert message in lines[0], lines[0]
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tensor_type", [Q.BF16, Q.Q8_0, Q.Q4_1, Q.Q6_K, Q.IQ4_XS], ids=lambda kind: kind.name)
def test_row_blocks_dequantize_exactly_as_one_call(tensor_type, tmp_path, monkeypatch):
    """Large tensors are dequantized a block of rows per gguf call (memory); one row per call here, so a block
    boundary falls between every two rows, and the values must equal one call over the whole tensor."""
    import gguf

    import edge_sdk.model.gguf_checkpoint as gguf_checkpoint

    source = block_256_model(tmp_path / "hf") if tensor_type in RANDOM_BLOCK_SCALES else FIXTURE
    write_gguf(source, tmp_path / "model.gguf", tensor_type)
    checkpoint = open_checkpoint(tmp_path / "model.gguf")
    monkeypatch.setattr(gguf_checkpoint, "DEQUANTIZE_CALL_BYTES", 1)
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        entry = checkpoint.entries[name]
        whole = torch.from_numpy(gguf.quants.dequantize(entry.data, entry.tensor_type).reshape(entry.shape).copy())
        assert torch.equal(checkpoint.tensor(name, torch.float32), whole.float())


@pytest.mark.slow
@pytest.mark.parametrize(("tensor_type", "dtype"), [(Q.Q8_0, "int8"), (Q.Q4_0, "int4")], ids=["Q8_0", "Q4_0"])
def test_q8_0_and_q4_0_weights_keep_their_values_in_the_bundle(tensor_type, dtype, tmp_path):
    """Q8_0 and Q4_0 are our int8 and int4 at group size 32 (fp16 scale = max|w| / 127, and = m / -8 for m the value
    of largest magnitude): re-quantizing their dequantized values gives back the same codes and scales, so every
    matrix whose groups run along the GGUF's rows is carried over exactly. The down projection is stored neuron-major
    (its groups run along the other axis), so it alone is quantized again."""
    path = fixture_gguf(tmp_path / "tiny.gguf", tensor_type)
    out = tmp_path / "bundle"
    export = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none", "--dtype", dtype)
    assert export.returncode == 0, export.stderr
    bundle = Bundle.open(out)
    assert bundle.manifest.group_size == quant.DEFAULT_GROUP_SIZE == 32
    assert_carried_over_exactly(bundle, open_checkpoint(path), tensor_type)


def assert_carried_over_exactly(bundle: Bundle, source: GgufCheckpoint, tensor_type) -> None:
    """Every quantized matrix of the bundle stored in the GGUF as tensor_type holds the GGUF's values to the bit
    (the LM head; q, k, v, o, gate and up per layer), but the neuron-major down projection, quantized again."""
    carried = 0
    for name, hf_name in model_tensor_names(bundle.config):
        expected = source.tensor(hf_name, torch.float32).numpy()
        tied = bundle.config.tie_word_embeddings
        if not is_quantized_matrix(name, expected.shape, tied) or source.entries[hf_name].tensor_type != tensor_type:
            continue
        stored = quant.dequantize(quantized_matrix(bundle, name))
        if name.endswith(TRANSPOSED_SUFFIX):
            assert not np.array_equal(stored.T, expected), name
            continue
        assert np.array_equal(stored, expected), name
        carried += 1
    assert carried == 1 + 6 * bundle.config.num_layers


@pytest.mark.slow
def test_a_q4_1_file_exports_as_asymmetric_int4_and_keeps_its_values(tmp_path):
    """Q4_1 is asymmetric int4 at group size 32 (fp16 minimum and scale (max - min) / 15 per block): `--dtype int4`
    of a Q4_1 file picks the asymmetric scheme by itself (--int4-scheme auto) and carries every matrix whose groups
    run along the GGUF's rows over to the bit, codes, scales and minimums; the neuron-major down projection alone is
    quantized again, at int8 (--down-dtype auto: the file groups ffn_down along the neurons), the Q4_1 head kept at
    int4. `--int4-scheme symmetric` re-rounds them all."""
    path = fixture_gguf(tmp_path / "tiny.gguf", Q.Q4_1)
    assert GgufCheckpoint(path).asymmetric_grid
    info = edge_sdk("info", str(path), "--json")
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout)
    assert (summary["int4_scheme"], summary["int4_head_dtype"], summary["int4_down_dtype"]) == (
        "asymmetric",
        "int4",
        "int8",
    )
    assert not GgufCheckpoint(fixture_gguf(tmp_path / "f16.gguf")).asymmetric_grid
    out = tmp_path / "bundle"
    export = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none", "--dtype", "int4")
    assert export.returncode == 0, export.stderr
    assert (
        "--dtype int4 of a GGUF whose FFN rows have 4 bits or fewer keeps what int4 rows would round again: "
        "--down-dtype int8 (it groups ffn_down "
        "along the neurons); --down-dtype int4 makes the smaller bundle" in export.stdout
    ), export.stdout
    bundle = Bundle.open(out)
    assert bundle.manifest.asymmetric and bundle.manifest.format_version == 7
    assert (bundle.manifest.lm_head_dtype, bundle.manifest.ffn_down_dtype) == ("int4", "int8")
    source = open_checkpoint(path)
    assert_carried_over_exactly(bundle, source, Q.Q4_1)
    symmetric = tmp_path / "symmetric"
    export = edge_sdk(
        "export",
        str(path),
        "-o",
        str(symmetric),
        "--predictor",
        "none",
        "--dtype",
        "int4",
        "--int4-scheme",
        "symmetric",
    )
    assert export.returncode == 0, export.stderr
    plain = Bundle.open(symmetric)
    assert not plain.manifest.asymmetric
    gate = "layers.0.mlp.gate_proj.weight"
    expected = source.tensor(f"model.{gate}", torch.float32).numpy()
    assert not np.array_equal(quant.dequantize(quantized_matrix(plain, gate)), expected)


@pytest.mark.parametrize(
    ("tensor_type", "head_type", "head_dtype", "down_dtype"),
    [
        (Q.F16, None, "int4", "int4"),  # a float file: int4 is a choice of size
        (Q.Q8_0, None, "int4", "int4"),  # an 8-bit file: likewise
        (Q.Q4_0, None, "int4", "int8"),  # the Q4_0 head as stored; ffn_down's blocks run along the neurons
        (Q.Q4_1, Q.Q8_0, "int8", "int8"),  # SmolLM2-135M's file: Q4_1 with a Q8_0 head
        (Q.Q4_0, Q.F16, "int8", "int8"),
        (Q.Q5_0, Q.Q8_0, "int4", "int4"),  # 5-bit FFN rows: not a low-bit file
        (Q.Q3_K, Q.Q6_K, "int8", "int8"),  # a Q3_K_M file's gate rows and head
        (Q.IQ4_XS, Q.IQ4_XS, "int4", "int8"),
        (Q.Q6_K, Q.Q6_K, "int4", "int4"),
    ],
    ids=[
        "F16",
        "Q8_0",
        "Q4_0",
        "Q4_1-head-Q8_0",
        "Q4_0-head-F16",
        "Q5_0-head-Q8_0",
        "Q3_K-head-Q6_K",
        "IQ4_XS",
        "Q6_K",
    ],
)
def test_an_int4_bundle_keeps_a_low_bit_files_wider_matrices_wider(
    tensor_type, head_type, head_dtype, down_dtype, tmp_path
):
    """--head-dtype / --down-dtype auto (exporter.default_head_dtype / default_down_dtype): int8 for --dtype int4 of a
    GGUF whose FFN rows have 4 bits or fewer, where int4 rows would round the file's values again (a head stored
    wider, ffn_down grouped along the neurons), the bundle's dtype for any other dtype or source."""
    from edge_sdk.export.exporter import default_down_dtype, default_head_dtype

    types = {} if head_type is None else {"lm_head.weight": head_type}
    source = block_256_model(tmp_path / "hf") if tensor_type in RANDOM_BLOCK_SCALES else FIXTURE
    path = tmp_path / "model.gguf"
    write_gguf(source, path, tensor_type, tensor_types=types)
    checkpoint = GgufCheckpoint(path)
    assert checkpoint.head_type == (head_type or tensor_type)
    assert (default_head_dtype(checkpoint, "int4"), default_down_dtype(checkpoint, "int4")) == (head_dtype, down_dtype)
    for dtype in ("fp16", "int8"):
        assert (default_head_dtype(checkpoint, dtype), default_down_dtype(checkpoint, dtype)) == (dtype, dtype)
    safetensors = Checkpoint(FIXTURE)
    assert (default_head_dtype(safetensors, "int4"), default_down_dtype(safetensors, "int4")) == ("int4", "int4")


def test_a_tied_models_head_is_its_embedding(tmp_path):
    """A tied model's head is token_embd.weight: its type decides --head-dtype auto."""
    model = tmp_path / "tied"
    save_hf_model(family_configs()["qwen2-bias-tied"], model)
    path = tmp_path / "tied.gguf"
    write_gguf(model, path, Q.Q4_0, tensor_types={"model.embed_tokens.weight": Q.Q8_0})
    checkpoint = GgufCheckpoint(path)
    assert checkpoint.config.tie_word_embeddings and checkpoint.head_type == Q.Q8_0
    assert checkpoint.int4_head_dtype == "int8"


@pytest.mark.slow
def test_a_q4_1_file_with_a_q8_0_head_keeps_the_head_to_the_bit(tmp_path):
    """SmolLM2-135M's layout: Q4_1 rows, a Q8_0 head. `--dtype int4` keeps the head int8, every value as the file
    has it (Q8_0 is int8 at groups of 32), and the down rows int8; --head-dtype int4 --down-dtype int4 make the
    smaller bundle the earlier default made (format version 6, both int4)."""
    path = tmp_path / "tiny.gguf"
    write_gguf(
        FIXTURE,
        path,
        Q.Q4_1,
        extra_keys=tokenizer_keys(FIXTURE, "gpt2"),
        tensor_types={"lm_head.weight": Q.Q8_0},
    )
    out = tmp_path / "bundle"
    export = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none", "--dtype", "int4")
    assert export.returncode == 0, export.stderr
    assert (
        "--head-dtype int8 (its LM head is Q8_0), --down-dtype int8 (it groups ffn_down along the neurons); "
        "--head-dtype int4 --down-dtype int4 makes the smaller bundle" in export.stdout
    ), export.stdout
    bundle = Bundle.open(out)
    assert (bundle.manifest.lm_head_dtype, bundle.manifest.ffn_down_dtype) == ("int8", "int8")
    source = open_checkpoint(path)
    head = quant.dequantize(quantized_matrix(bundle, "lm_head.weight"))
    assert np.array_equal(head, source.tensor("lm_head.weight", torch.float32).numpy())

    smaller = tmp_path / "smaller"
    args = ["--predictor", "none", "--dtype", "int4", "--head-dtype", "int4", "--down-dtype", "int4"]
    export = edge_sdk("export", str(path), "-o", str(smaller), *args)
    assert export.returncode == 0, export.stderr
    assert "4 bits or fewer" not in export.stdout
    plain = Bundle.open(smaller)
    assert plain.manifest.format_version == 6
    assert (plain.manifest.lm_head_dtype, plain.manifest.ffn_down_dtype) == ("int4", "int4")
    assert plain.manifest.asymmetric


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tensor_type", "asymmetric"),
    [(Q.Q3_K, False), (Q.Q2_K, True), (Q.IQ4_XS, False), (Q.IQ2_XXS, False)],
    ids=["Q3_K", "Q2_K", "IQ4_XS", "IQ2_XXS"],
)
def test_a_low_bit_file_exports_to_int4(tensor_type, asymmetric, tmp_path):
    """Q3_K (a Q3_K_M file's FFN rows), Q2_K (block minimums: the asymmetric scheme), IQ4_XS and IQ2_XXS (indices into
    non-uniform grids) have no int4 counterpart: `--dtype int4` rounds the values the file dequantizes to (the gate
    rows hold exactly the codes round-to-nearest gives them) and keeps the down rows int8."""
    path = tmp_path / "model.gguf"
    model = block_256_model(tmp_path / "hf", vocab_size=Tokenizer.from_dir(FIXTURE).vocab_size)
    write_gguf(model, path, tensor_type, extra_keys=tokenizer_keys(FIXTURE, "gpt2"))
    out = tmp_path / "bundle"
    export = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none", "--dtype", "int4")
    assert export.returncode == 0, export.stderr
    bundle = Bundle.open(out)
    assert bundle.manifest.asymmetric == asymmetric
    assert (bundle.manifest.lm_head_dtype, bundle.manifest.ffn_down_dtype) == ("int4", "int8")
    gate = "layers.1.mlp.gate_proj.weight"
    values = open_checkpoint(path).tensor(f"model.{gate}", torch.float32).numpy()
    expected = quant.quantize(values, "int4", quant.DEFAULT_GROUP_SIZE, asymmetric)
    stored = quantized_matrix(bundle, gate)
    assert np.array_equal(stored.data, expected.data) and np.array_equal(stored.scales, expected.scales)


def test_a_gguf_weight_that_is_not_finite_is_refused_naming_its_tensor(tmp_path):
    """A NaN in a GGUF's tensor: one line naming the GGUF tensor and its Hugging Face name, exit 2, nothing written."""
    from safetensors.torch import load_file

    model = tmp_path / "model"
    model.mkdir()
    for path in FIXTURE.glob("*.json"):
        shutil.copy(path, model)
    tensors = {name: tensor.float() for name, tensor in load_file(FIXTURE / "model.safetensors").items()}
    tensors["model.layers.1.mlp.up_proj.weight"][3, 4] = float("nan")
    save_file(tensors, model / "model.safetensors")
    path = tmp_path / "nan.gguf"
    write_gguf(model, path, Q.F32, extra_keys=tokenizer_keys(FIXTURE, "gpt2"))
    out = tmp_path / "bundle"
    result = edge_sdk("export", str(path), "-o", str(out), "--predictor", "none", "--dtype", "int4")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "tensor 'blk.1.ffn_up.weight' (model.layers.1.mlp.up_proj.weight) holds NaN or infinite values" in lines[0]
    assert not out.exists()


# Hostile metadata: every integer hyperparameter is type- and range-checked under its GGUF key before it is used
# (a head count of 0 divided the hidden size, a negative one was reported as a RoPE dimension mismatch).
BAD_METADATA = [  # (case, extra_keys, skip_keys, the message after "PATH: ")
    (
        "head_count 0",
        {"llama.attention.head_count": ("uint32", 0)},
        (),
        "metadata key 'llama.attention.head_count' must be an integer in [1, 4096], found 0",
    ),
    (
        "head_count negative",
        {"llama.attention.head_count": ("int32", -6)},
        (),
        "metadata key 'llama.attention.head_count' must be an integer in [1, 4096], found -6",
    ),
    (
        "head_count bool",
        {"llama.attention.head_count": ("bool", True)},
        (),
        "metadata key 'llama.attention.head_count' must be an integer in [1, 4096], found a value of type BOOL",
    ),
    (
        "head_count not dividing embedding_length",
        {"llama.attention.head_count": ("uint32", 10)},  # 192 / 10; head_count_kv 2 divides 10
        ("llama.attention.key_length", "llama.attention.value_length", "llama.rope.dimension_count"),
        "metadata key 'llama.attention.head_count' must divide llama.embedding_length (192) when "
        "llama.attention.key_length is not given, found 10",
    ),
    (
        "head_count_kv 0",
        {"llama.attention.head_count_kv": ("uint32", 0)},
        (),
        "metadata key 'llama.attention.head_count_kv' must be an integer in [1, 4096], found 0",
    ),
    (
        "head_count_kv not dividing head_count",
        {"llama.attention.head_count_kv": ("uint32", 4)},
        (),
        "metadata key 'llama.attention.head_count_kv' must divide llama.attention.head_count (6), found 4",
    ),
    (
        "embedding_length 0",
        {"llama.embedding_length": ("uint32", 0)},
        (),
        "metadata key 'llama.embedding_length' must be an integer in [1, 1048576], found 0",
    ),
    (
        "feed_forward_length negative",
        {"llama.feed_forward_length": ("int32", -768)},
        (),
        "metadata key 'llama.feed_forward_length' must be an integer in [1, 1048576], found -768",
    ),
    (
        "block_count huge",
        {"llama.block_count": ("uint64", 1 << 40)},
        (),
        "metadata key 'llama.block_count' must be an integer in [1, 1024], found 1099511627776",
    ),
    (
        "context_length 0",
        {"llama.context_length": ("uint32", 0)},
        (),
        "metadata key 'llama.context_length' must be an integer in [2, 16777216], found 0",
    ),
    (
        "key_length 0",
        {"llama.attention.key_length": ("uint32", 0)},
        (),
        "metadata key 'llama.attention.key_length' must be an integer in [1, 16384], found 0",
    ),
    (
        "vocab_size other than the embedding's rows",
        {"llama.vocab_size": ("uint32", 2047)},
        (),
        "metadata key 'llama.vocab_size' must equal the rows of tensor 'token_embd.weight' (2048), found 2047",
    ),
    (
        "vocab_size float",
        {"llama.vocab_size": ("float32", 2048.0)},
        (),
        "metadata key 'llama.vocab_size' must be an integer in [1, 16777216], found a value of type FLOAT32",
    ),
]


@pytest.mark.parametrize(
    ("case", "extra_keys", "skip_keys", "message"), BAD_METADATA, ids=[case for case, *_ in BAD_METADATA]
)
def test_bad_integer_metadata_is_refused_naming_its_key(case, extra_keys, skip_keys, message, tmp_path):
    path = tmp_path / "model.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys=extra_keys, skip_keys=skip_keys)
    with pytest.raises(CheckpointError) as refused:
        GgufCheckpoint(path)
    assert str(refused.value) == f"{path}: {message}"


def test_a_fatrelu_threshold_float32_cannot_hold_is_refused_naming_the_field(tmp_path):
    """A float64 hidden_act_param beyond float32 would be an infinite threshold in every graph."""
    path = tmp_path / "model.gguf"
    keys = {"llama.hidden_act": ("string", "fatrelu"), "llama.hidden_act_param": ("float64", 1e300)}
    write_gguf(FIXTURE, path, Q.F16, extra_keys=keys)
    with pytest.raises(CheckpointError) as refused:
        GgufCheckpoint(path)
    assert str(refused.value) == (
        f"{path} (metadata read as config.json): field 'hidden_act_param' must be a finite number >= 0 that float32 "
        "holds (at most 3.40282e+38), found 1e+300"
    )


def test_valid_integer_metadata_still_reads(tmp_path):
    """The checks accept what a real file states: any integer type, vocab_size equal to the embedding's rows."""
    path = tmp_path / "model.gguf"
    keys = {"llama.attention.head_count": ("int64", 6), "llama.vocab_size": ("uint32", 2048)}
    write_gguf(FIXTURE, path, Q.F16, extra_keys=keys)
    config = GgufCheckpoint(path).config
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (6, 2, 32, 2048)


def _corrupt_files() -> list[tuple[str, object]]:
    """(case, corrupt(path, layout) -> the message after "PATH: ") for a copy of the fixture's GGUF (F16 weights,
    gpt2 tokenizer keys: 25 key/values, 39 tensors), each naming what a file whose header, key/values, tensor infos
    or tensor data run past its end or declare impossible counts has wrong."""
    tokens, last_key = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"

    def truncated_after_header(path, layout):
        truncate_gguf(path, 24)
        needed = 24 + 13 * layout.kv_count + 24 * layout.tensor_count
        return (
            f"truncated at byte 24 (the {layout.kv_count} key/values and {layout.tensor_count} tensor infos the "
            f"header declares need at least {needed} bytes)"
        )

    def truncated_in_token_list(path, layout):
        start = layout.values[tokens] + 12  # after the element type and count
        truncate_gguf(path, start + 2000)
        # each of the 2048 strings takes at least its 8-byte length
        return f"truncated at byte {start + 2000} (the key/value section needs at least {start + 8 * 2048} bytes)"

    def truncated_in_a_key(path, layout):
        cut = layout.keys[last_key] + 8 + 4
        truncate_gguf(path, cut)
        needed = layout.keys[last_key] + 8 + len(last_key)
        return f"truncated at byte {cut} (the key/value section needs at least {needed} bytes)"

    def truncated_in_tensor_infos(path, layout):
        second = sorted(layout.tensor_infos.values())[1]
        truncate_gguf(path, second + 3)  # inside its name's length
        return f"truncated at byte {second + 3} (the tensor-info section needs at least {second + 8} bytes)"

    def truncated_by_one_byte(path, layout):
        assert layout.size == max(begin + size for begin, size in layout.tensor_data.values())
        name, (begin, size) = max(layout.tensor_data.items(), key=lambda item: item[1][0])
        truncate_gguf(path, layout.size - 1)
        return (
            f"tensor '{name}' data at offset {begin} + {size} bytes lies past the end of the file "
            f"({layout.size - 1} bytes)"
        )

    def count(field_offset, value, what, least):
        def corrupt(path, layout):
            patch_gguf(path, field_offset, "<Q", value)
            return (
                f"{what} {value} (header byte {field_offset}) exceeds what a file of {layout.size} bytes can hold "
                f"(each takes at least {least} bytes)"
            )

        return corrupt

    def kv_count_short_from(key):
        """The header's key/value count short of key and every key/value after it."""

        def corrupt(path, layout):
            missing = sum(offset >= layout.keys[key] for offset in layout.keys.values())
            patch_gguf(path, 16, "<Q", layout.kv_count - missing)
            # the first key/value not counted is read as a tensor info, its key as the tensor's name
            return (
                f"corrupt tensor-info section: the tensor info at byte {layout.keys[key]} is named '{key}', a metadata "
                f"key: the header's key/value count ({layout.kv_count - missing}, header byte 16) is lower than the "
                f"number of key/values the file holds"
            )

        return corrupt

    def kv_count_over(extra):
        """The header's key/value count higher than the file's by extra."""

        def corrupt(path, layout):
            patch_gguf(path, 16, "<Q", layout.kv_count + extra)
            # the first tensor info is read as a key/value, its name as the key; what follows it fails somewhere
            first, offset = min(layout.tensor_infos.items(), key=lambda item: item[1])
            return (
                f"corrupt key/value section: the key/value at byte {offset} is named '{first}', a tensor's name: the "
                f"header's key/value count ({layout.kv_count + extra}, header byte 16) is higher than the number of "
                f"key/values the file holds"
            )

        return corrupt

    def key_length_huge(path, layout):
        patch_gguf(path, 24, "<Q", 1 << 62)
        return (
            f"corrupt key/value section: a string of {1 << 62} bytes at byte 32 runs past the end of the file "
            f"({layout.size} bytes)"
        )

    def array_count_huge(path, layout):
        patch_gguf(path, layout.values[tokens] + 4, "<Q", 1 << 40)
        return (
            f"corrupt key/value section: the array at byte {layout.values[tokens]} declares {1 << 40} elements of "
            f"at least 8 bytes, past the end of the file ({layout.size} bytes)"
        )

    def value_type_unknown(path, layout):
        patch_gguf(path, layout.value_type("llama.block_count"), "<I", 99)
        return (
            f"corrupt key/value section: value type 99 at byte {layout.value_type('llama.block_count')} is not a "
            f"GGUF value type"
        )

    def n_dims_huge(path, layout):
        name = "token_embd.weight"
        patch_gguf(path, layout.tensor_infos[name] + 8 + len(name), "<I", 1 << 31)
        return (
            f"corrupt tensor-info section: tensor '{name}' (tensor info at byte {layout.tensor_infos[name]}) has "
            f"{1 << 31} dimensions, expected at most 4"
        )

    def tensor_type_unknown(path, layout):
        patch_gguf(path, layout.tensor_type("token_embd.weight"), "<I", 99)
        return "tensor 'token_embd.weight' has type 99, which is not a GGML tensor type"

    def tensor_offset_past_end(path, layout):
        name = "token_embd.weight"
        patch_gguf(path, layout.tensor_offset(name), "<Q", layout.size)
        return (
            f"tensor '{name}' data at offset {layout.data_start + layout.size} + {layout.tensor_data[name][1]} bytes "
            f"lies past the end of the file ({layout.size} bytes)"
        )

    def key_not_utf8(path, layout):
        patch_gguf(path, layout.keys["llama.block_count"] + 8, "<B", 0xFF)
        return "corrupt key/value section: a key or tensor name is not UTF-8 (invalid start byte)"

    def string_value_not_utf8(path, layout):
        patch_gguf(path, layout.values["tokenizer.ggml.pre"] + 8, "<B", 0xFF)  # after the string's length
        return (
            "metadata key 'tokenizer.ggml.pre' must be a string in UTF-8, found bytes that are not UTF-8 "
            "(invalid start byte)"
        )

    def empty(path, layout):
        truncate_gguf(path, 0)
        return "the file is empty (expected a GGUF file)"

    def truncated_in(cut, section, needed):
        """A file cut short before the reader has parsed a field: "not a readable GGUF file (When changing to a
        larger dtype, its size must be a divisor ...)", numpy's words, for a 3-byte file."""

        def corrupt(path, layout):
            truncate_gguf(path, cut)
            return f"truncated at byte {cut} (the {section} needs at least {needed} bytes)"

        return corrupt

    return [
        ("truncated in the magic", truncated_in(3, "header", 4)),
        ("truncated after the magic", truncated_in(4, "header", 8)),
        ("truncated after the header", truncated_after_header),
        ("truncated in the token list", truncated_in_token_list),
        ("truncated in a key", truncated_in_a_key),
        ("truncated in the tensor infos", truncated_in_tensor_infos),
        ("truncated by one byte", truncated_by_one_byte),
        ("tensor count 2^63", count(8, 1 << 63, "tensor count", 24)),
        ("tensor count 2^60", count(8, 1 << 60, "tensor count", 24)),
        ("key/value count 2^63", count(16, 1 << 63, "key/value count", 13)),
        ("key/value count 2^60", count(16, 1 << 60, "key/value count", 13)),
        ("key/value count one short", kv_count_short_from(last_key)),
        ("key/value count short of an architecture key", kv_count_short_from("llama.block_count")),
        ("key/value count short of a general key", kv_count_short_from("general.architecture")),
        ("key/value count one over", kv_count_over(1)),
        ("key/value count five over", kv_count_over(5)),
        ("key length 2^62", key_length_huge),
        ("array count 2^40", array_count_huge),
        ("unknown value type", value_type_unknown),
        ("n_dims 2^31", n_dims_huge),
        ("unknown tensor type", tensor_type_unknown),
        ("tensor offset past the end", tensor_offset_past_end),
        ("key not UTF-8", key_not_utf8),
        ("string value not UTF-8", string_value_not_utf8),
        ("empty file", empty),
    ]


CORRUPT_FILES = _corrupt_files()


@pytest.fixture(scope="module")
def intact_gguf(tmp_path_factory) -> Path:
    return fixture_gguf(tmp_path_factory.mktemp("intact") / "tiny.gguf")


@pytest.mark.parametrize(("case", "corrupt"), CORRUPT_FILES, ids=[case for case, _ in CORRUPT_FILES])
def test_a_corrupt_gguf_is_refused_saying_what_is_wrong(case, corrupt, intact_gguf, tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(intact_gguf, path)
    message = corrupt(path, gguf_layout(intact_gguf))
    with pytest.raises(CheckpointError) as refused:
        GgufCheckpoint(path)
    assert str(refused.value) == f"{path}: {message}"


def test_a_merge_of_tokens_outside_the_vocabulary_is_refused_naming_the_entry(tmp_path):
    """tokenizers' BPE refuses it with a bare Exception naming neither the key nor the entry."""
    keys = tokenizer_keys(FIXTURE, "gpt2")
    merges = list(keys["tokenizer.ggml.merges"][1])
    merges[5] = "Ġthe zzq"
    path = tmp_path / "model.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys=keys | {"tokenizer.ggml.merges": ("array", merges)})
    with pytest.raises(CheckpointError) as refused:
        GgufCheckpoint(path)
    assert str(refused.value) == (
        f"{path}: metadata key 'tokenizer.ggml.merges' entry 5 ('Ġthe zzq') needs the token 'zzq', which is not in "
        f"'tokenizer.ggml.tokens'"
    )


def test_arrays_nested_too_deep_are_refused(tmp_path):
    """llama.cpp reads no arrays of arrays; a deeply nested one (a hostile file's thousands of levels) must not reach
    Python's recursion limit."""
    nested: list = [1]
    for _ in range(20):
        nested = [nested]
    path = tmp_path / "model.gguf"
    write_gguf(FIXTURE, path, Q.F16, extra_keys={"general.nested": ("array", nested)})
    offset = path.read_bytes().index(b"general.nested") + len("general.nested") + 4  # after the key and its type
    with pytest.raises(CheckpointError) as refused:
        GgufCheckpoint(path)
    depth = 8 * (4 + 8)  # the 9th array's element type and count
    assert str(refused.value) == (
        f"{path}: the array at byte {offset + depth} of the key/value section nests arrays more than 8 deep "
        f"(llama.cpp reads no arrays of arrays)"
    )


def test_the_cli_refuses_hostile_ggufs_with_exit_2_and_no_traceback(intact_gguf, tmp_path):
    """info, export and calibrate of a GGUF whose head count is 0 (a ZeroDivisionError before), info of corrupt
    ones (numpy's messages before): one line, exit 2."""
    from click.testing import CliRunner

    from edge_sdk.cli import main

    zero_heads = tmp_path / "zero-heads.gguf"
    write_gguf(FIXTURE, zero_heads, Q.F16, extra_keys={"llama.attention.head_count": ("uint32", 0)})
    calib = tmp_path / "calib.txt"
    calib.write_text("some calibration text\n")
    heads = "metadata key 'llama.attention.head_count' must be an integer in [1, 4096], found 0"
    runs = [
        (["info", str(zero_heads)], heads),
        (["export", str(zero_heads), "-o", str(tmp_path / "out"), "--predictor", "none"], heads),
        (["calibrate", str(zero_heads), "-o", str(tmp_path / "out"), "--calib", str(calib)], heads),
    ]
    layout = gguf_layout(intact_gguf)
    truncated = tmp_path / "truncated.gguf"
    shutil.copy(intact_gguf, truncated)
    truncate_gguf(truncated, layout.size - 1)
    runs.append((["info", str(truncated)], f"lies past the end of the file ({layout.size - 1} bytes)"))
    huge = tmp_path / "huge-count.gguf"
    shutil.copy(intact_gguf, huge)
    patch_gguf(huge, 8, "<Q", 1 << 63)
    runs.append((["info", str(huge)], f"tensor count {1 << 63} (header byte 8) exceeds what a file of"))
    for args, message in runs:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert isinstance(result.exception, SystemExit), (args, result.exception)
        assert "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("edge-sdk: error: "), result.output
        assert message in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_the_checked_reads_match_the_installed_gguf_package():
    """open_reader checks what the gguf package reads only while the package's read steps are those it overrides;
    an upgrade that changes them would silently drop the checks above, so this says so first."""
    from edge_sdk.model import gguf_metadata

    assert gguf_metadata.CHECKED_READS
