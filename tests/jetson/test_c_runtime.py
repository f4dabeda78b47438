"""The C runtime (jetson/): built here for x86-64, under AddressSanitizer + UBSan and for aarch64 (run under qemu);
greedy ids identical to the Python CPU backend on every predictor kind, the tokenizer identical to `tokenizers`,
the API's error contracts, the bundle reader under fuzzing, and the library's dependencies."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from edge_sdk.bundle import Bundle, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.settings import CalibrationSettings

from ..conftest import tied_checkpoint
from .support import (
    BUNDLE_KINDS,
    PROMPT,
    Build,
    generate_command,
    python_cpu_engine,
    qemu_command,
    run,
    sanitizer_env,
    with_tokenizer_files,
)

ALLOWED_LIBRARIES = re.compile(
    r"^(libc\.so\.6|libm\.so\.6|libgomp\.so\.1|libcjson\.so\.1|libpthread\.so\.0|ld-linux.*)$"
)
FUZZ_ITERATIONS = 300
UNICODE_SAMPLE = (
    "Héllo wörld² ³ ½ ٣ 𝔘nicode — “quotes” 日本語テキスト 😀👍🏽 tab\there  \u00a0nbsp \u2003em\u3000ideo\n\n\n"
    "  x <s>a</s><s></s>b it's we'll I'M 12345 ½x ǅ\r\n\x0b\x0c\x85 end   "
)


def generated_ids(result: subprocess.CompletedProcess) -> list[int]:
    assert result.returncode == 0, result.stderr
    return [int(token) for token in result.stdout.split()]


def test_build_is_warning_free(x86_build: Build):
    assert "warning:" not in x86_build.log


def test_library_depends_only_on_libc_libm_openmp_and_cjson(x86_build: Build):
    dynamic = run(["readelf", "-d", x86_build.binary("libedge_sdk.so")], check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert "libcjson.so.1" in needed
    assert [name for name in needed if not ALLOWED_LIBRARIES.match(name)] == []
    symbols = run(["nm", "-D", "--defined-only", x86_build.binary("libedge_sdk.so")], check=True).stdout.split("\n")
    exported = [line.split()[-1] for line in symbols if line.strip()]
    assert "edge_model_open" in exported
    assert [name for name in exported if not name.startswith("edge_")] == []
    assert not any(name.startswith("edge_cpu_") for name in exported)  # the kernels stay internal


@pytest.mark.parametrize("name", list(BUNDLE_KINDS))
def test_greedy_ids_equal_python_cpu_backend(x86_build: Build, bundles, python_greedy_ids, name):
    result = run(generate_command([x86_build.binary("edge_generate")], bundles[name], "--ids"))
    assert generated_ids(result) == python_greedy_ids[name]
    assert len(python_greedy_ids[name]) >= 8  # a real comparison, not an immediate eos


def test_greedy_ids_do_not_depend_on_the_thread_count(x86_build: Build, bundles, python_greedy_ids):
    command = generate_command([x86_build.binary("edge_generate")], bundles["svd-fp16"], "--ids")
    command[command.index("--threads") + 1] = "2"
    assert generated_ids(run(command)) == python_greedy_ids["svd-fp16"]


def test_prefill_blocks_are_complete_when_openmp_gives_fewer_threads(x86_build: Build, bundles, python_greedy_ids):
    """Three threads asked for, one granted (OMP_THREAD_LIMIT): the prefill's block still runs every token's attention
    (a token per thread where there are threads), the one thread taking them all in turn."""
    command = generate_command([x86_build.binary("edge_generate")], bundles["svd-fp16"], "--ids")
    command[command.index("--threads") + 1] = "3"
    result = run(command, env=os.environ | {"OMP_THREAD_LIMIT": "1"})
    assert generated_ids(result) == python_greedy_ids["svd-fp16"]


def test_streamed_text_equals_python_decode(x86_build: Build, bundles, python_greedy_ids):
    command = [str(part) for part in generate_command([x86_build.binary("edge_generate")], bundles["svd-fp32"])]
    result = subprocess.run(command, capture_output=True)  # bytes: no newline translation
    assert result.returncode == 0, result.stderr
    expected = HFTokenizer.from_file(str(bundles["svd-fp32"] / "tokenizer.json")).decode(python_greedy_ids["svd-fp32"])
    assert result.stdout.decode("utf-8") == expected + "\n"
    assert re.search(rb"decode [0-9.]+ tokens/s", result.stderr)


@pytest.mark.parametrize("name", list(BUNDLE_KINDS))
def test_aarch64_build_under_qemu_gives_the_same_ids(aarch64_build: Build, bundles, python_greedy_ids, name):
    elf = run(["readelf", "-h", aarch64_build.binary("libedge_sdk.so")], check=True).stdout
    assert "AArch64" in elf
    result = run(
        generate_command(qemu_command(aarch64_build.binary("edge_generate")), bundles[name], "--ids"), timeout=300
    )
    assert generated_ids(result) == python_greedy_ids[name]


@pytest.mark.parametrize("name", ["svd-int4", "svd-fp16"])
def test_aarch64_build_prefills_in_blocks_with_the_same_ids(aarch64_build: Build, x86_build: Build, bundles, name,
                                                            tiny_model_dir):  # fmt: skip
    """A prompt of several blocks of 32 tokens on two threads under qemu (NEON's row functions, the block's rows,
    neurons and attentions split over the threads): the x86 build's greedy ids on the same prompt."""
    prompt = (tiny_model_dir / "held_out.txt").read_text()[:240]
    command = [bundles[name], prompt, "-n", "8", "--threads", "2", "--ids"]
    expected = run([x86_build.binary("edge_generate"), *command], check=True)
    assert len(HFTokenizer.from_file(str(bundles[name] / "tokenizer.json")).encode(prompt).ids) > 64  # 3 blocks
    assert len(generated_ids(expected)) == 8  # no early end of sequence: 8 ids to compare
    assert generated_ids(run([*qemu_command(aarch64_build.binary("edge_generate")), *command], timeout=300)) == (
        generated_ids(expected)
    )


def test_api_contracts(x86_build: Build, bundles):
    result = run([x86_build.binary("edge_api_check"), bundles["svd-fp32"], bundles["signbit-fp32"]], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"checks: \d{3} passed, 0 failed", result.stdout)


def test_api_contracts_aarch64(aarch64_build: Build, bundles):
    command = [*qemu_command(aarch64_build.binary("edge_api_check")), bundles["svd-fp32"], bundles["signbit-fp32"]]
    result = run(command, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def c_encode(build: Build, bundle: Path, text_file: Path) -> list[int]:
    result = run([build.binary("edge_tokenize"), bundle, "encode", text_file], check=True)
    return [int(token) for token in result.stdout.split()]


@pytest.mark.parametrize("source", ["calibration.txt", "held_out.txt", "unicode", "random"])
def test_tokenizer_encodes_like_tokenizers(x86_build: Build, bundles, tiny_model_dir, tmp_path, source):
    bundle = bundles["svd-fp32"]
    if source == "unicode":
        text = UNICODE_SAMPLE
    elif source == "random":
        generator = random.Random(0)
        pool = [chr(code) for code in [*range(0x20, 0x7F), *range(0xA0, 0x250), 0x85, 0x1680, 0x2028, 0x3000, 0x200B]]
        pool += ["\U0001f600", "\u0660", "\u2160", "\u0e01", "\u0301", "'s", "'ll", " ", "  ", "\n", "\t", "<s>"]
        text = "".join(generator.choice(pool) for _ in range(5000))
    else:
        text = (tiny_model_dir / source).read_text(encoding="utf-8")
    text_file = tmp_path / "text.txt"
    text_file.write_bytes(text.encode("utf-8"))
    expected = HFTokenizer.from_file(str(bundle / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert len(expected) > 100
    assert c_encode(x86_build, bundle, text_file) == expected


DIGIT_ISOLATING_PRE_TOKENIZER = {  # SmolLM2's ("smollm" in its GGUF): every \p{N} code point alone, then ByteLevel
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}


def with_pre_tokenizer(bundle: Path, directory: Path, pre_tokenizer: dict) -> Path:
    """A copy of bundle whose tokenizer.json has another pre-tokenizer."""
    return with_tokenizer_files(bundle, directory, lambda tokenizer: tokenizer.update(pre_tokenizer=pre_tokenizer))


def test_tokenizer_isolating_numbers_encodes_like_tokenizers(x86_build: Build, bundles, tiny_model_dir, tmp_path):
    bundle = with_pre_tokenizer(bundles["svd-fp32"], tmp_path, DIGIT_ISOLATING_PRE_TOKENIZER)
    generator = random.Random(2)
    pool = [*"0123456789", " 12", " 3.14", "x2", "\u0660\u0661", "\u2160", "\u00bd", "\u00b2", " ", "  ", "\n", "'s"]
    pool += ["a", " b", "ab", "!", " (", "\U0001f600", "\u0e01"]
    text = (tiny_model_dir / "held_out.txt").read_text(encoding="utf-8")[:20000] + UNICODE_SAMPLE
    text += "".join(generator.choice(pool) for _ in range(3000))
    text_file = tmp_path / "text.txt"
    text_file.write_bytes(text.encode("utf-8"))
    expected = HFTokenizer.from_file(str(bundle / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    plain = HFTokenizer.from_file(str(bundles["svd-fp32"] / "tokenizer.json")).encode(text, add_special_tokens=False)
    assert len(expected) > len(plain.ids) + 200  # " 12" is " ", "1", "2": the plain regex would fail this test
    assert c_encode(x86_build, bundle, text_file) == expected


BYTE_LEVEL_PROCESSOR = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def bos_template(bos: str) -> dict:
    """A TemplateProcessing post-processor that puts bos first, as Llama-2's tokenizer.json has it."""
    single = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    pair = [*single, {"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": {}}


@pytest.mark.parametrize(
    ("post_processor", "add_bos_token", "prepends"),
    [
        # no add_bos_token: bos only where the post-processor puts it first (transformers' AutoTokenizer); a
        # byte-level BPE file names a bos token it does not add (SmolLM2's, GPT-2's)
        (None, None, False),
        (bos_template("<s>"), None, True),
        ({"type": "Sequence", "processors": [BYTE_LEVEL_PROCESSOR, bos_template("<s>")]}, None, True),
        (bos_template("</s>"), None, False),  # another token first
        # add_bos_token decides whatever the post-processor says
        (bos_template("<s>"), False, False),
        (None, True, True),
    ],
)
def test_tokenizer_prepends_bos_as_the_python_tokenizer(
    x86_build: Build, bundles, tmp_path, post_processor, add_bos_token, prepends
):
    """A prompt's ids (edge_tokenizer_encode with add_bos -1, as edge_generate encodes a prompt) are the Python
    runtime's: the same rule for whether bos comes first."""

    def set_config(config):
        config.pop("add_bos_token")
        if add_bos_token is not None:
            config["add_bos_token"] = add_bos_token

    bundle = with_tokenizer_files(
        bundles["svd-fp32"], tmp_path, lambda tokenizer: tokenizer.update(post_processor=post_processor), set_config
    )
    text_file = tmp_path / "prompt.txt"
    text_file.write_text(PROMPT, encoding="utf-8")
    tokenizer = Tokenizer.from_bundle(Bundle.open(bundle))
    expected = tokenizer.encode(PROMPT)
    assert (expected[0] == tokenizer.bos_token_id) is prepends
    result = run([x86_build.binary("edge_tokenize"), bundle, "prompt", text_file], check=True)
    assert [int(token) for token in result.stdout.split()] == expected


def test_tokenizer_refuses_other_splits(x86_build: Build, bundles, tmp_path):
    qwen2_like = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            DIGIT_ISOLATING_PRE_TOKENIZER["pretokenizers"][1],
        ],
    }
    bundle = with_pre_tokenizer(bundles["svd-fp32"], tmp_path, qwen2_like)
    text_file = tmp_path / "text.txt"
    text_file.write_text("x = 12345\n")
    result = run([x86_build.binary("edge_tokenize"), bundle, "encode", text_file])
    assert result.returncode == 1
    assert "EDGE_ERROR_UNSUPPORTED" in result.stderr
    assert "the pre_tokenizer Sequence is not a Split isolating \\p{N} followed by ByteLevel" in result.stderr


def test_tokenizer_decodes_like_tokenizers(x86_build: Build, bundles, tiny_model_dir, tmp_path):
    bundle = bundles["svd-fp32"]
    reference = HFTokenizer.from_file(str(bundle / "tokenizer.json"))
    held_out = reference.encode((tiny_model_dir / "held_out.txt").read_text(), add_special_tokens=False).ids
    generator = random.Random(1)
    cases = {
        "held_out": held_out[:3000],
        "random": [generator.randrange(2048) for _ in range(3000)],  # byte tokens that break UTF-8 included
        "special": [0, *held_out[:20], 1, 0, 1],
    }
    for name, ids in cases.items():
        ids_file = tmp_path / f"{name}.ids"
        ids_file.write_text(" ".join(map(str, ids)))
        tool = [str(x86_build.binary("edge_tokenize")), str(bundle)]
        for skip in (True, False):
            command = [*tool, "decode", str(ids_file)] + (["--skip"] if skip else [])
            decoded = subprocess.run(command, capture_output=True, check=True).stdout.decode(
                "utf-8"
            )  # no newline mapping
            assert decoded == reference.decode(ids, skip_special_tokens=skip), (name, skip)
        pieces = subprocess.run([*tool, "pieces", str(ids_file)], capture_output=True, check=True).stdout
        assert pieces.decode("utf-8", errors="replace") == reference.decode(ids, skip_special_tokens=False), name


def test_example_and_api_checks_are_clean_under_asan_and_ubsan(asan_build: Build, bundles):
    env = sanitizer_env()
    # the asymmetric int4 bundle: the kernels' per-block corrections and their workspace, the minimums' reads
    for name in ("core-fp16", "svd-fp32", "threshold-fp32", "tied-svd-int4-asym"):
        command = generate_command([asan_build.binary("edge_generate")], bundles[name], "--ids")
        command[command.index("--threads") + 1] = "2"
        result = run(command, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr
    result = run(
        [asan_build.binary("edge_api_check"), bundles["svd-fp32"], bundles["signbit-fp32"]], env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr


def test_fuzzed_bundles_give_errors_never_crashes(asan_build: Build, bundles, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundles["svd-fp16"], copy)
    result = run(
        [asan_build.binary("edge_fuzz_bundle"), copy, str(FUZZ_ITERATIONS), "12345"], env=sanitizer_env(), timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = re.search(r"iterations (\d+): opened (\d+), bad (\d+), errors:(.*)", result.stdout)
    assert summary, result.stdout
    iterations, opened, bad = (int(summary.group(i)) for i in (1, 2, 3))
    errors = sum(int(count) for count in re.findall(r"=(\d+)", summary.group(4)))
    assert iterations == FUZZ_ITERATIONS and bad == 0
    assert errors >= FUZZ_ITERATIONS // 2 and opened + errors == FUZZ_ITERATIONS  # the mutations reach the checks
    assert "restored bundle opens: yes" in result.stdout


def open_error(build: Build, bundle: Path, *extra: str) -> str:
    result = run([build.binary("edge_generate"), bundle, "x", "-n", "2", *extra])
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def test_bad_bundles_and_backends_are_clear_errors(x86_build: Build, bundles, tmp_path):
    assert "EDGE_ERROR_UNAVAILABLE: backend 'tensorrt': this build of libedge_sdk has no TensorRT engine" in open_error(
        x86_build, bundles["svd-fp32"], "--backend", "tensorrt"
    )
    assert "EDGE_ERROR_IO" in open_error(x86_build, tmp_path / "missing")
    # a file where the bundle should be: the words of Bundle.open, not "not found" (the path is there)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a bundle")
    with pytest.raises(EdgeSdkError, match="is a file, not a bundle directory"):
        Bundle.open(notes)
    assert f"EDGE_ERROR_IO: {notes}: is a file, not a bundle directory" in open_error(x86_build, notes)
    changed = tmp_path / "changed-weights"
    shutil.copytree(bundles["svd-fp32"], changed)
    weights = changed / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x40
    weights.write_bytes(bytes(data))
    message = open_error(x86_build, changed)
    assert f"{weights}: sha256 is" in message and "manifest.json says" in message
    weights.write_bytes(bytes(data[:-4]))
    assert f"{weights}: size is {len(data) - 4} bytes, manifest.json says {len(data)}" in open_error(x86_build, changed)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "expected BUNDLE and PROMPT, found neither"),
        (["{bundle}"], "expected BUNDLE and PROMPT, found no PROMPT"),
        (["{bundle}", "x", "y"], "unexpected argument 'y' after BUNDLE and PROMPT (quote a prompt of several words)"),
        (["{bundle}", "x", "-n"], "unknown option or missing value: -n"),
        (["{bundle}", "x", "--bogus"], "unknown option or missing value: --bogus"),
        (["{bundle}", "x", "-n", "1.5"], "-n expects an integer in [0, 16777216], found '1.5'"),
        (["{bundle}", "x", "-n", "-1"], "-n expects an integer in [0, 16777216], found '-1'"),
        (["{bundle}", "x", "-n", "0x10"], "-n expects an integer in [0, 16777216], found '0x10'"),
        (["{bundle}", "x", "-n", "99999999999999999999999"], "-n expects an integer in [0, 16777216], found "),
        (["{bundle}", "x", "--threads", "2.5"], "--threads expects an integer in [0, 4096], found '2.5'"),
        (["{bundle}", "x", "--threads", "-1"], "--threads expects an integer in [0, 4096], found '-1'"),
        (["{bundle}", "x", "--seed", "-1"], "--seed expects an integer in [0, 18446744073709551615], found '-1'"),
        (["{bundle}", "x", "--top-p", "0"], "--top-p expects a number in [1e-09, 1], found '0'"),
        (["{bundle}", "x", "--temperature", "nan"], "--temperature expects a number in [0, 1e+06], found 'nan'"),
        (  # the API takes a float, in which it is 0: greedy, silently
            ["{bundle}", "x", "--temperature", "1e-300"],
            "--temperature expects 0 (greedy) or a number in [1.17549e-38, 1e+06], found '1e-300'",
        ),
        (
            ["{bundle}", "x", "--dense", "--sparsity", "0.5"],
            "dense and sparsity 0.5: the dense model has no sparsity level; give either",
        ),
        # greedy decoding reads no sampling option: ignored silently before, as `edge-sdk run` refuses them
        (["{bundle}", "x", "--seed", "3"], "--seed: only sampling reads it, and --temperature 0 (the default)"),
        (["{bundle}", "x", "--top-k", "5", "--top-p", "0.9"], "--top-k: only sampling reads it"),
        (["{bundle}", "x", "--top-k", "-1"], "--top-k expects an integer in [0, 2147483647], found '-1'"),
    ],
)
def test_bad_command_lines_are_one_line_usage_errors(x86_build: Build, bundles, arguments, message):
    """Exit status 2 and a first line naming the argument and what was expected, before any bundle is read; a
    number is never truncated (-n 1.5) nor wrapped (--seed -1)."""
    command = [argument.format(bundle=bundles["svd-fp32"]) for argument in arguments]
    result = run([x86_build.binary("edge_generate"), *command])
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines()[0].startswith(f"edge_generate: {message}"), result.stderr
    assert result.stdout == ""


def test_top_k_reaches_the_sampler(x86_build: Build, bundles, python_greedy_ids):
    """--top-k 1 keeps the most probable token alone, so sampling at any temperature gives the greedy ids (without
    the option, the same temperature and seed sample others)."""
    command = generate_command([x86_build.binary("edge_generate")], bundles["svd-fp32"], "--ids")
    sampled = ["--temperature", "5", "--seed", "3"]
    top_1 = run([*command, *sampled, "--top-k", "1"])
    assert top_1.returncode == 0, top_1.stderr
    assert [int(token) for token in top_1.stdout.split()] == python_greedy_ids["svd-fp32"]
    free = run([*command, *sampled])
    assert free.returncode == 0 and [int(token) for token in free.stdout.split()] != python_greedy_ids["svd-fp32"]


def test_a_prompt_longer_than_max_seq_len_is_refused_with_the_lengths(x86_build: Build, bundles):
    max_seq_len = Bundle.open(bundles["svd-fp32"]).max_seq_len
    result = run([x86_build.binary("edge_generate"), bundles["svd-fp32"], "x " * max_seq_len, "-n", "2"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""  # a failed generation prints nothing it did not generate
    assert re.search(
        rf"EDGE_ERROR_SEQUENCE_FULL: prompt: \d+ tokens, but max_seq_len is {max_seq_len} and must leave room for at "
        r"least one new token; shorten the prompt",
        result.stderr,
    ), result.stderr


def test_manifest_digest_is_checked_like_python(x86_build: Build, bundles, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundles["signbit-fp32"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=7))  # re-indenting is not a change
    assert run([x86_build.binary("edge_generate"), copy, "x", "-n", "2"]).returncode == 0
    manifest["model"]["rms_norm_eps"] = 1e-06
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert "field 'manifest_sha256' does not match the manifest's content" in open_error(x86_build, copy)


def test_a_null_default_level_decodes_densely(x86_build: Build, bundles, tmp_path):
    copy = tmp_path / "dense-default"
    shutil.copytree(bundles["svd-fp32"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["sparsity"]["default_level"] = None
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    generate = [x86_build.binary("edge_generate")]
    dense = generated_ids(run(generate_command(generate, bundles["svd-fp32"], "--ids", "--dense")))
    default = generated_ids(run(generate_command(generate, copy, "--ids")))
    assert default == dense
    # a calibrated level asked for still decodes sparsely, as on the bundle it was copied from
    level = f"{manifest['sparsity']['levels'][-1]:g}"
    asked = generated_ids(run(generate_command(generate, copy, "--ids", "--sparsity", level)))
    assert asked == generated_ids(run(generate_command(generate, bundles["svd-fp32"], "--ids", "--sparsity", level)))


def test_bf16_bundles_are_refused_with_the_reason(x86_build: Build, tiny_model_dir, tmp_path):
    bundle = tmp_path / "bf16"
    export_bundle(
        tiny_model_dir,
        bundle,
        ExportSettings(dtype="bf16", max_seq_len=32, calibration=CalibrationSettings(predictor="none")),
    )
    message = open_error(x86_build, bundle)
    assert "EDGE_ERROR_UNSUPPORTED" in message and "is BF16" in message and "--dtype fp16" in message


def test_prompt_encoding_matches_python(x86_build: Build, bundles, tmp_path):
    text_file = tmp_path / "prompt.txt"
    text_file.write_text(PROMPT)
    expected = Tokenizer.from_dir(bundles["svd-fp32"]).encode(PROMPT, add_bos=False)
    assert c_encode(x86_build, bundles["svd-fp32"], text_file) == expected


def test_aarch64_build_is_warning_free(aarch64_build: Build):
    assert "warning:" not in aarch64_build.log


@pytest.mark.parametrize("variant", ["sliding_window", "tie_word_embeddings"])
def test_model_config_variants_match_python(x86_build: Build, bundles, tiny_model_dir, tmp_path, variant):
    """Config paths the fixture does not use: a Mistral-style sliding window (switched on in the manifest, digest
    re-stamped) and tied embeddings (a checkpoint without lm_head, exported). The C engine and the Python CPU
    backend must still agree."""
    import edge_sdk
    from edge_sdk.bundle import manifest_digest
    from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD
    from edge_sdk.runtime.generator import SamplingSettings

    copy = tmp_path / "bundle"
    if variant == "sliding_window":
        shutil.copytree(bundles["signbit-fp32"], copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["model"]["sliding_window"] = 5
        manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    else:
        checkpoint = tied_checkpoint(tiny_model_dir, tmp_path / "tied")
        settings = ExportSettings(dtype="fp32", max_seq_len=128, calibration=CalibrationSettings(predictor="none"))
        export_bundle(checkpoint, copy, settings)
    with python_cpu_engine():
        session = edge_sdk.load(copy, backend="cpu", threads=1)
        expected = list(
            session.generator.generate_ids(session.tokenizer.encode(PROMPT), SamplingSettings(max_new_tokens=24))
        )
    original = run(generate_command([x86_build.binary("edge_generate")], bundles["signbit-fp32"], "--ids"))
    changed = run(generate_command([x86_build.binary("edge_generate")], copy, "--ids"))
    assert generated_ids(changed) == expected
    assert generated_ids(changed) != generated_ids(original)  # the change reached the computation
