"""The CPU backend on fixture bundles, with each of its engines (the C runtime's decoder and torch + kernels):
same greedy tokens as the torch reference and ONNX Runtime; the Python API; `edge-sdk run` and its bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from edge_sdk.backends.c_runtime import RuntimeEngine
from edge_sdk.backends.cpu.backend import ENGINE_ENV

import edge_sdk
from edge_sdk.bundle import manifest_digest
from edge_sdk.bundle.format import FORMAT_VERSION, MANIFEST_DIGEST_FIELD
from edge_sdk.cli import main
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.native import NativeLibraryError, load_runtime
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend
from edge_sdk.sparsity.bundle_model import TorchEngine, load_reference_decoder
from edge_sdk.sparsity.settings import CalibrationSettings

PROMPT = "class Namespace(object):\n    def __init__(self"
STEPS = 24


@pytest.fixture(scope="module")
def bundles(bundle_matrix):
    """The session's fixture bundles (tests/conftest.py), by "kind-dtype" name."""
    return bundle_matrix


def runtime_built() -> bool:
    try:
        load_runtime()
    except NativeLibraryError:
        return False
    return True


needs_runtime = pytest.mark.skipif(not runtime_built(), reason="libedge_sdk was not built (cJSON missing at build)")
ENGINES = [pytest.param("runtime", marks=needs_runtime), "torch"]


@pytest.fixture(params=ENGINES)
def cpu_engine(request, monkeypatch):
    """Runs the test with $EDGE_SDK_CPU_ENGINE set to each engine."""
    monkeypatch.setenv(ENGINE_ENV, request.param)
    return request.param


def greedy(prefill, decode, ids):
    tokens = [int(np.asarray(prefill(ids)).argmax())]
    for _ in range(STEPS - 1):
        tokens.append(int(np.asarray(decode(tokens[-1])).argmax()))
    return tokens


@pytest.mark.parametrize("name", ["svd-fp32", "svd-fp16", "signbit-fp32", "core-fp16", "threshold-fp32"])
def test_cpu_greedy_tokens_equal_reference_and_onnx_runtime(bundles, tiny_model_dir, name, cpu_engine):
    bundle = bundles[name]
    ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    engine = get_backend("cpu").load(bundle, EngineOptions.of(bundle))
    assert isinstance(engine, RuntimeEngine if cpu_engine == "runtime" else TorchEngine)
    reference = load_reference_decoder(bundle)
    session = OrtBundleSession(bundle)
    cpu_tokens = greedy(engine.prefill, engine.decode, ids)
    reference_tokens = greedy(
        lambda p: reference.prefill(torch.tensor([p]))[0, -1],
        lambda t: reference.decode(torch.tensor([[t]]))[0, -1],
        ids,
    )
    ort_tokens = greedy(
        lambda p: session.prefill(np.array([p]))[0, -1], lambda t: session.decode(np.array([[t]]))[0, -1], ids
    )
    assert cpu_tokens == reference_tokens == ort_tokens


def test_cpu_decode_is_deterministic_and_levels_change_the_result(bundles, tiny_model_dir, cpu_engine):
    bundle = bundles["svd-fp32"]
    ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    first = get_backend("cpu").load(bundle, EngineOptions.of(bundle, sparsity=0.8))
    second = get_backend("cpu").load(bundle, EngineOptions.of(bundle, sparsity=0.8, threads=1))
    runs = []
    for engine in (first, second, first):
        engine.prefill(ids)
        runs.append(engine.decode(ids[-1]))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])
    dense = get_backend("cpu").load(bundle, EngineOptions.of(bundle, dense=True))
    dense.prefill(ids)
    assert not np.array_equal(dense.decode(ids[-1]), runs[0])


@needs_runtime
def test_engines_agree_on_logits(bundles, tiny_model_dir, monkeypatch):
    """Dense and sparse decode logits of the C runtime and the torch engine agree to float32 rounding."""
    ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    bundle = bundles["svd-fp16"]
    for options in (EngineOptions.of(bundle, sparsity=0.5), EngineOptions.of(bundle, dense=True)):
        logits = {}
        for choice in ("runtime", "torch"):
            monkeypatch.setenv(ENGINE_ENV, choice)
            engine = get_backend("cpu").load(bundle, options)
            engine.prefill(ids)
            logits[choice] = [engine.decode(token) for token in ids[-4:]]
        for runtime_step, torch_step in zip(logits["runtime"], logits["torch"], strict=True):
            np.testing.assert_allclose(runtime_step, torch_step, rtol=1e-4, atol=1e-4)


@needs_runtime
def test_runtime_logits_are_identical_with_one_thread_and_two_on_a_long_context(tiny_model_dir, tmp_path, monkeypatch):
    """One thread runs every kernel without OpenMP, two threads run them in parallel regions: attention over 400
    positions (enough work to split the heads), the LM head, the predictor and the FFN. Same bits either way."""
    settings = ExportSettings(dtype="fp16", max_seq_len=512, calibration=CalibrationSettings(rank=16, max_tokens=2048))
    bundle = export_bundle(tiny_model_dir, tmp_path / "long", settings, [tiny_model_dir / "calibration.txt"])
    ids = Tokenizer.from_dir(tiny_model_dir).encode((tiny_model_dir / "held_out.txt").read_text())[:410]
    assert len(ids) == 410
    monkeypatch.setenv(ENGINE_ENV, "runtime")
    runs = []
    for threads in (1, 2):
        engine = get_backend("cpu").load(bundle, EngineOptions.of(bundle, sparsity=0.5, threads=threads))
        assert isinstance(engine, RuntimeEngine)
        engine.prefill(ids[:400])
        runs.append([engine.decode(token) for token in ids[400:]])
    for one_thread, two_threads in zip(*runs, strict=True):
        assert np.array_equal(one_thread, two_threads)


@needs_runtime
@pytest.mark.parametrize("name", ["svd-fp32", "svd-fp16", "svd-int8", "svd-int4", "tied-svd-int4"])
def test_runtime_prefill_in_blocks_gives_the_bits_of_decoding_the_prompt_token_by_token(bundles, name, monkeypatch):
    """The C runtime prefills blocks of 32 tokens through the layers together (each weight row read once per block);
    every token's values are the one-token kernels'. A prompt of 70 tokens (blocks of 32, 32 and 6): the prefill's
    logits equal, bit for bit, those of prefilling its first token and decoding the rest one by one with the dense FFN
    (what prefill computes), and so do the decode steps after it (the same KV cache), on one thread and on three."""
    monkeypatch.setenv(ENGINE_ENV, "runtime")
    bundle = bundles[name]
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT * 12)[:70]
    assert len(ids) == 70
    for threads in (1, 3):
        engine = get_backend("cpu").load(bundle, EngineOptions.of(bundle, dense=True, threads=threads))
        in_blocks = [np.asarray(engine.prefill(ids))] + [np.asarray(engine.decode(token)) for token in ids[:2]]
        engine.prefill(ids[:1])
        token_by_token = [np.asarray(engine.decode(token)) for token in ids[1:]][-1:]
        token_by_token += [np.asarray(engine.decode(token)) for token in ids[:2]]
        for step, (blocks, one_by_one) in enumerate(zip(in_blocks, token_by_token, strict=True)):
            assert np.array_equal(blocks.view(np.int32), one_by_one.view(np.int32)), (name, threads, step)


@needs_runtime
@pytest.mark.parametrize("name", ["svd-fp32", "svd-fp16", "svd-int4", "tied-svd-int8", "core-fp16"])
def test_runtime_prefill_gives_the_same_bits_on_any_number_of_threads(bundles, name, monkeypatch):
    """Prompts of 1, 2, 7 and 40 tokens (a block and a part) on 1, 2 and 3 threads (the projections' rows, the FFN's
    neurons and columns and the block's attentions split over them; the core predictor counting the prompt's tokens
    in order): the prefill's logits and the decode steps after it are the one-thread run's, bit for bit."""
    monkeypatch.setenv(ENGINE_ENV, "runtime")
    bundle = bundles[name]
    ids = Tokenizer.from_bundle(bundle).encode(PROMPT * 8)
    assert len(ids) >= 43
    for length in (1, 2, 7, 40):
        runs = []
        for threads in (1, 2, 3):
            engine = get_backend("cpu").load(bundle, EngineOptions.of(bundle, threads=threads))
            logits = [np.asarray(engine.prefill(ids[:length]))]
            logits += [np.asarray(engine.decode(token)) for token in ids[length : length + 3]]
            runs.append(np.stack(logits))
        for other in runs[1:]:
            assert np.array_equal(runs[0].view(np.int32), other.view(np.int32)), (length, name)


def test_engine_choice_is_validated(bundles, monkeypatch):
    monkeypatch.setenv(ENGINE_ENV, "gpu")
    with pytest.raises(EdgeSdkError, match=r"EDGE_SDK_CPU_ENGINE='gpu': expected one of auto, runtime, torch"):
        get_backend("cpu").load(bundles["svd-fp32"], EngineOptions.of(bundles["svd-fp32"]))
    monkeypatch.setenv(ENGINE_ENV, "torch")
    assert "decode in torch + kernels ($EDGE_SDK_CPU_ENGINE=torch)" in get_backend("cpu").probe()[1]


@needs_runtime
def test_runtime_engine_is_the_default_and_bf16_falls_back_to_torch(bundles, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert "decode in the C runtime libedge_sdk" in get_backend("cpu").probe()[1]
    assert isinstance(
        get_backend("cpu").load(bundles["svd-fp32"], EngineOptions.of(bundles["svd-fp32"])), RuntimeEngine
    )
    settings = ExportSettings(dtype="bf16", max_seq_len=64, calibration=CalibrationSettings(predictor="none"))
    bf16 = export_bundle(tiny_model_dir, tmp_path / "bf16", settings, [])
    assert isinstance(get_backend("cpu").load(bf16, EngineOptions.of(bf16)), TorchEngine)
    monkeypatch.setenv(ENGINE_ENV, "runtime")
    with pytest.raises(BackendUnavailable, match=r"EDGE_SDK_CPU_ENGINE=runtime.*bf16"):
        get_backend("cpu").load(bf16, EngineOptions.of(bf16))


def test_python_api_generates_and_reports(bundles):
    session = edge_sdk.load(bundles["svd-fp32"].path, sparsity=0.8)
    text = "".join(session.generate("def main():\n    ", max_new_tokens=12))
    assert text and session.stats.generated_tokens <= 12
    info = session.info
    assert info["backend"] == "cpu" and info["sparsity_level"] == 0.8 and info["calibrated_levels"] == [0.5, 0.8]
    assert (info["layers"], info["hidden_size"], info["intermediate_size"]) == (4, 192, 768)
    greedy_again = "".join(session.generate("def main():\n    ", max_new_tokens=12))
    assert greedy_again == text


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bundle": 123}, "bundle: expected the path of a bundle directory, found int"),
        ({"dense": "no"}, "dense: expected True or False, found 'no'"),
        ({"verify_checksums": "no"}, "verify_checksums: expected True or False, found 'no'"),
        ({"log": 5}, "log: expected a function taking a line of text, or None, found int"),
    ],
)
def test_python_api_load_refuses_arguments_of_the_wrong_type(bundles, arguments, message):
    bundle = arguments.pop("bundle", bundles["svd-fp32"].path)
    with pytest.raises(EdgeSdkError, match=message):
        edge_sdk.load(bundle, "cpu", **arguments)


def test_python_api_generate_refuses_an_unknown_setting(bundles):
    session = edge_sdk.load(bundles["svd-fp32"].path, "cpu")
    with pytest.raises(EdgeSdkError, match="max_tokens: not a sampling setting; expected one of max_new_tokens"):
        session.generate("x", max_tokens=3)
    with pytest.raises(EdgeSdkError, match="chat: expected True or False, found 'yes'"):
        session.generate("x", chat="yes")


def test_a_library_override_that_names_nothing_is_an_error_not_a_fallback(monkeypatch, tmp_path):
    from edge_sdk.native import CPU_KERNELS_ENV, RUNTIME_ENV, find_library

    for variable, library in ((CPU_KERNELS_ENV, "libedge_cpu_kernels.so"), (RUNTIME_ENV, "libedge_sdk.so")):
        monkeypatch.setenv(variable, str(tmp_path / "missing.so"))
        with pytest.raises(NativeLibraryError, match=rf"\${variable}=.*missing\.so: does not exist; expected the path"):
            find_library(library, variable)
        monkeypatch.setenv(variable, str(tmp_path))
        with pytest.raises(NativeLibraryError, match=rf"\${variable}=.*: is a directory"):
            find_library(library, variable)
        monkeypatch.delenv(variable)


def test_run_streams_the_continuation_and_reports_speed(bundles):
    prompt = "def main():\n    "
    result = CliRunner().invoke(
        main, ["run", str(bundles["svd-fp32"].path), "--prompt", prompt, "--max-new-tokens", "10"]
    )
    assert result.exit_code == 0, result.output
    assert "backend cpu: selected" in result.stderr and "decode: " in result.stderr and "tok/s" in result.stderr
    # stdout is exactly the greedy continuation (the prompt is not echoed), then a newline
    continuation = "".join(edge_sdk.load(bundles["svd-fp32"].path).generate(prompt, max_new_tokens=10))
    assert continuation and result.stdout == continuation + "\n"


@pytest.mark.parametrize(
    ("name", "options", "decoded"),
    [
        ("svd-fp32", [], None),  # the bundle's default level
        ("svd-fp32", ["--dense"], "dense"),
        ("signbit-fp32", [], "signbit predictor"),  # no levels: its calibrated alpha
        ("none-fp32", [], "no predictor"),
    ],
)
def test_run_says_how_it_decoded(bundles, name, options, decoded):
    """The stats line named a level-less predictor's or a predictor-less bundle's operating point 'sparsity None'."""
    bundle = bundles[name]
    decoded = decoded or f"sparsity {bundle.sparsity.default_level:g}"
    args = ["run", str(bundle.path), "--prompt", "x", "--backend", "cpu", *options]
    result = CliRunner().invoke(main, [*args, "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert f"(cpu, {decoded}, stop: max_new_tokens)" in result.stderr
    nothing = CliRunner().invoke(main, [*args, "--max-new-tokens", "0"])
    assert nothing.exit_code == 0 and "prefill: 2 tokens, not run; decode: 0 tokens" in nothing.stderr  # bos, x


def test_run_reads_the_prompt_from_stdin(bundles):
    args = ["run", str(bundles["svd-fp32"].path), "--max-new-tokens", "5"]
    from_stdin = CliRunner().invoke(main, args, input="import os\n")
    from_option = CliRunner().invoke(main, [*args, "--prompt", "import os\n"])
    assert from_stdin.exit_code == 0 and from_stdin.stdout == from_option.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sparsity", "0.65"], "sparsity level 0.65 was not calibrated; calibrated levels: 0.5, 0.8"),
        (["--backend", "tensorrt"], "backend 'tensorrt' (--backend) is not available here"),
        (["--backend", "npu"], "unknown backend 'npu'"),
    ],
)
def test_run_bad_options(bundles, extra, message):
    result = CliRunner().invoke(main, ["run", str(bundles["svd-fp32"].path), "--prompt", "x", *extra])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_run_bad_bundles(bundles, tmp_path):
    missing = CliRunner().invoke(main, ["run", str(tmp_path / "nothing"), "--prompt", "x"])
    assert missing.exit_code == 2 and "bundle directory not found" in missing.stderr
    copy = tmp_path / "copy"
    shutil.copytree(bundles["svd-fp32"].path, copy)
    manifest = json.loads((copy / "manifest.json").read_text()) | {"format_version": FORMAT_VERSION + 1}
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    newer = CliRunner().invoke(main, ["run", str(copy), "--prompt", "x"])
    assert newer.exit_code == 2 and f"format version {FORMAT_VERSION + 1} is newer" in newer.stderr
    shutil.rmtree(copy)
    shutil.copytree(bundles["svd-fp32"].path, copy)
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    corrupted = CliRunner().invoke(main, ["run", str(copy), "--prompt", "x"])
    assert corrupted.exit_code == 2 and "weights.safetensors: sha256 is" in corrupted.stderr
