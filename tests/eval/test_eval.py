"""Held-out evaluation of bundles and predictor sweeps on the tiny fixture: the teacher-forced decode scores
what a full forward scores, sparsity costs quality in order, per-layer statistics match a direct
computation, the sweep writes its frontier, and bad input fails with clear errors."""

from __future__ import annotations

import importlib
import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from edge_sdk.bundle import BundleError
from edge_sdk.cli import main
from edge_sdk.errors import EdgeSdkError
from edge_sdk.eval import SWEEP_KINDS, EvalError, evaluate_bundle, format_sweep_markdown, frontier_crossing, sweep
from edge_sdk.eval.evaluate import (
    DecodeStatisticsRecorder,
    TeacherForcedRun,
    held_out_windows,
    pool_layer_metrics,
    read_texts,
    teacher_forced,
    top1_agreement,
)
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.outputs import MARKDOWN_HEADER, report_is_ours
from edge_sdk.runtime.backends import BackendUnavailable, EngineOptions, get_backend
from edge_sdk.sparsity.bundle_model import TorchEngine, bundle_tensor, load_reference_decoder
from edge_sdk.sparsity.metrics import layer_metrics
from edge_sdk.sparsity.settings import CalibrationSettings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Small windows keep every evaluation to a few hundred decode steps; one thread avoids oversubscribing a
# shared CPU, which slows the tiny model's per-token ops by an order of magnitude.
WINDOW = {"max_tokens": 256, "context": 64, "prompt_tokens": 8, "threads": 1}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def held_out(tiny_model_dir):
    return tiny_model_dir / "held_out.txt"


@pytest.fixture(scope="module")
def svd_bundle(tiny_model_dir, tmp_path_factory):
    calibration = CalibrationSettings(rank=16, max_tokens=2048, sparsity=0.5, levels=(0.3, 0.9))
    settings = ExportSettings(dtype="fp32", max_seq_len=128, calibration=calibration)
    out = tmp_path_factory.mktemp("eval") / "svd"
    return export_bundle(tiny_model_dir, out, settings, [tiny_model_dir / "calibration.txt"])


def test_dense_perplexity_equals_full_sequence_forward(svd_bundle, held_out):
    result = evaluate_bundle(svd_bundle.path, [held_out], backend="cpu", layer_stats=False, **WINDOW)
    windows = held_out_windows(
        Tokenizer.from_bundle(svd_bundle), read_texts([held_out]), 256, 64, 8, vocab_size=svd_bundle.config.vocab_size
    )
    decoder = load_reference_decoder(svd_bundle).decoder
    nll = []
    for window in windows:
        with torch.inference_mode():
            logits = decoder.forward(torch.tensor([window]))[0].double()  # [L, V]
        log_probs = torch.log_softmax(logits, dim=-1)
        positions = torch.arange(8, len(window) - 1)  # the decode steps after an 8-token prefill
        nll.append(-log_probs[positions, torch.tensor(window)[positions + 1]])
    nll = torch.cat(nll)
    assert result["windows"] == 4 and result["scored_tokens"] == nll.numel() == 4 * 55
    assert result["dense_perplexity"] == pytest.approx(math.exp(nll.mean().item()), rel=1e-4)
    assert result["sparse_perplexity"] != pytest.approx(result["dense_perplexity"], rel=1e-6)


def test_more_sparsity_costs_more_perplexity(svd_bundle, held_out, tmp_path):
    mild = evaluate_bundle(svd_bundle.path, [held_out], backend="cpu", sparsity=0.3, layer_stats=False, **WINDOW)
    plot = tmp_path / "eval.png"
    strong = evaluate_bundle(
        svd_bundle.path,
        [held_out],
        backend="cpu",
        sparsity=0.9,
        json_path=tmp_path / "eval.json",
        plot_path=plot,
        **WINDOW,
    )
    assert strong["perplexity_change_percent"] > mild["perplexity_change_percent"]
    assert strong["perplexity_change_percent"] > 1.0
    assert 0.0 <= strong["top1_agreement"] < mild["top1_agreement"] <= 1.0
    # the backend's sparse decode and the torch reference agree, so the statistics describe what was scored
    assert strong["reference_sparse_perplexity"] == pytest.approx(strong["sparse_perplexity"], rel=1e-4)
    assert [layer["layer"] for layer in strong["layers"]] == [0, 1, 2, 3]
    for layer in strong["layers"]:
        assert layer["realized_sparsity"] >= layer["predicted_sparsity"] > 0.5
        assert layer["realized_sparsity"] >= layer["true_sparsity"]
        assert 0.0 < layer["importance_weighted_recall"] <= 1.0
    assert json.loads((tmp_path / "eval.json").read_text())["sparsity_level"] == 0.9
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_top1_agreement(svd_bundle, held_out):
    windows = held_out_windows(
        Tokenizer.from_bundle(svd_bundle), read_texts([held_out]), 64, 64, 8, vocab_size=svd_bundle.config.vocab_size
    )
    runs = [
        teacher_forced(
            get_backend("cpu").load(svd_bundle, EngineOptions.of(svd_bundle, dense=True, threads=1)), windows, 8
        )
        for _ in range(2)
    ]
    assert top1_agreement(runs[0], runs[1]) == 1.0
    first = TeacherForcedRun(np.zeros(4), np.array([1, 2, 3, 4]))
    second = TeacherForcedRun(np.zeros(4), np.array([1, 0, 3, 0]))
    assert top1_agreement(first, second) == 0.5
    with pytest.raises(EvalError, match="different positions"):
        top1_agreement(first, TeacherForcedRun(np.zeros(3), np.array([1, 2, 3])))


def test_layer_statistics_equal_direct_computation(svd_bundle, held_out):
    """Two windows through the recorder against layer_metrics on the whole decode, with FFN inputs captured at
    the post-attention norm and the svd predictor's formula applied directly."""
    windows = held_out_windows(
        Tokenizer.from_bundle(svd_bundle), read_texts([held_out]), 48, 24, 8, vocab_size=svd_bundle.config.vocab_size
    )
    model = load_reference_decoder(svd_bundle)
    model.configure(level_index=svd_bundle.sparsity.level_index(0.9))
    recorder = DecodeStatisticsRecorder(model, [16] * 4, 192)
    inputs = {index: [] for index in range(4)}
    realized = {index: [] for index in range(4)}

    def capture(index, module, args, output):
        if model.ffns[index].phase == "decode":
            inputs[index].append(output.reshape(-1, 192).float())

    handles = [
        layer.post_attention_layernorm.register_forward_hook(lambda m, a, o, i=i: capture(i, m, a, o))
        for i, layer in enumerate(model.decoder.layers)
    ]
    engine = TorchEngine(model, 128)
    for window in windows:
        engine.prefill(window[:8])
        for token in window[8:-1]:
            engine.decode(token)
            for index, ffn in enumerate(model.ffns):
                realized[index].append(ffn.last_active)
        recorder.end_window()
    for handle in handles:
        handle.remove()
    recorder.remove()

    level = svd_bundle.sparsity.level_index(0.9)
    for index, measured in enumerate(recorder.results()):
        x = torch.cat(inputs[index])  # [30, d]
        assert x.shape == (2 * 15, 192)
        prefix = f"layers.{index}."
        w_gate, w_up = (
            bundle_tensor(svd_bundle, prefix + "mlp.gate_proj.weight"),
            bundle_tensor(svd_bundle, prefix + "mlp.up_proj.weight"),
        )
        w_down = bundle_tensor(svd_bundle, prefix + "mlp.down_proj.weight_t")
        a, b = bundle_tensor(svd_bundle, prefix + "svd.a"), bundle_tensor(svd_bundle, prefix + "svd.b")
        bias = bundle_tensor(svd_bundle, prefix + "svd.biases")[level]
        gate = torch.relu(x @ w_gate.T)
        importance = (gate * (x @ w_up.T)).square() * w_down.square().sum(dim=1)
        predicted = x @ b.T @ a.T + bias > 0
        direct = layer_metrics(gate > 0, predicted, importance, rank=16, d=192)
        assert measured.keys() == {"layer", *direct.keys()}
        for key, value in direct.items():
            assert measured[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
        assert measured["realized_sparsity"] == pytest.approx(1 - torch.cat(realized[index]).float().mean().item())


def test_threshold_statistics_count_only_neurons_above_their_threshold(tiny_model_dir, held_out, tmp_path):
    """CHESS computes the gate densely and keeps |act(g)| > t: its predicted set lies inside the truly active
    one, so predicted and realized sparsity coincide and exceed the true sparsity at a level above it."""
    calibration = CalibrationSettings(predictor="threshold", max_tokens=1024, levels=(0.95,))
    settings = ExportSettings(dtype="fp32", max_seq_len=128, calibration=calibration)
    bundle = export_bundle(tiny_model_dir, tmp_path / "threshold", settings, [tiny_model_dir / "calibration.txt"])
    result = evaluate_bundle(bundle.path, [held_out], backend="cpu", sparsity=0.95, **WINDOW)
    for layer in result["layers"]:
        assert layer["predicted_sparsity"] == pytest.approx(layer["realized_sparsity"])
        assert layer["predicted_sparsity"] > layer["true_sparsity"] + 0.01
        assert layer["recall"] < 1.0
    assert result["perplexity_change_percent"] > 0.0


def test_pool_layer_metrics_equals_metrics_of_the_concatenation():
    generator = torch.Generator().manual_seed(0)
    truly = torch.rand(50, 40, generator=generator) < 0.3
    truly[:7] = False  # a part without any truly active pair
    predicted = torch.rand(50, 40, generator=generator) < 0.6
    importance = torch.rand(50, 40, generator=generator) * truly
    parts = []
    for start, end in ((0, 7), (7, 20), (20, 50)):
        t, p, w = truly[start:end], predicted[start:end], importance[start:end]
        parts.append((layer_metrics(t, p, w, rank=4, d=16), t.numel(), float(w[t].sum(dtype=torch.float64))))
    pooled = pool_layer_metrics(parts)
    whole = layer_metrics(truly, predicted, importance, rank=4, d=16)
    assert parts[0][0]["recall"] == 1.0  # the empty part's recall must carry no weight
    assert pooled.keys() == whole.keys()
    for key in whole:
        assert pooled[key] == pytest.approx(whole[key], rel=1e-12), key


def test_frontier_crossing_interpolates_hand_numbers():
    settings, speedups, changes = [0.3, 0.5, 0.7, 0.9], [1.1, 1.3, 1.7, 2.0], [0.2, 0.6, 2.6, 9.0]
    one = frontier_crossing(settings, speedups, changes, 1.0)
    # between 0.5 (0.6%) and 0.7 (2.6%): 1% is a fifth of the way
    assert one["status"] == "crossed"
    assert one["setting"] == pytest.approx(0.54) and one["speedup"] == pytest.approx(1.38)
    three = frontier_crossing(settings, speedups, changes, 3.0)
    assert three["setting"] == pytest.approx(0.7 + 0.2 * 0.4 / 6.4) and three["speedup"] == pytest.approx(
        1.7 + 0.3 / 16
    )
    assert frontier_crossing(settings, speedups, changes, 10.0) == {
        "threshold_percent": 10.0,
        "status": "not reached",
        "setting": None,
        "speedup": None,
    }
    assert frontier_crossing(settings, speedups, changes, 0.1)["status"] == "exceeded at the mildest setting"
    # the first upward crossing counts, even when a noisy later point dips back below
    noisy = frontier_crossing([0.999, 0.99, 0.95], [1.0, 1.2, 1.4], [0.5, 1.5, 0.8], 1.0)
    assert noisy["setting"] == pytest.approx(0.9945) and noisy["speedup"] == pytest.approx(1.1)
    with pytest.raises(EvalError, match="one speedup and one perplexity change per setting"):
        frontier_crossing([0.3, 0.5], [1.0], [0.1, 0.2], 1.0)


def test_sweep_writes_frontier_json_plot_and_markdown(tiny_model_dir, held_out, tmp_path):
    calib = tiny_model_dir / "calibration.txt"
    measured = []
    result = sweep(
        tiny_model_dir,
        [calib],
        [held_out],
        tmp_path / "sweep",
        predictors=("svd", "signbit"),
        levels=(0.9, 0.3),
        recall_targets=(0.9, 0.999),
        calibration_tokens=1024,
        rank=16,
        speed_repeats=1,
        timer="cpu",
        markdown_path=tmp_path / "sweep.md",
        command="edge-sdk sweep tiny",
        on_point=lambda kind, point: measured.append((kind, point["setting"])),
        **WINDOW,
    )
    written = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    # marked as edge-sdk's, so the next sweep may replace it
    assert (tmp_path / "sweep.md").read_text() == MARKDOWN_HEADER + format_sweep_markdown(result, "edge-sdk sweep tiny")
    assert report_is_ours(tmp_path / "sweep.md") is None
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:8] == PNG_MAGIC
    assert written["kinds"].keys() == {"svd", "signbit"}
    # mildest setting first: levels ascending, recall targets descending, one signbit bundle per target
    assert measured == [("svd", 0.3), ("svd", 0.9), ("signbit", 0.999), ("signbit", 0.9)]
    assert sorted(p.name for p in (tmp_path / "sweep" / "bundles").iterdir()) == ["signbit-0.9", "signbit-0.999", "svd"]
    for kind in written["kinds"].values():
        points = kind["points"]
        assert points[0]["dense_perplexity"] == pytest.approx(points[1]["dense_perplexity"])
        for point in points:
            assert point["speedup"] == pytest.approx(
                point["sparse_tokens_per_second"] / point["dense_tokens_per_second"]
            )
            assert len(point["layers"]) == 4
        for label, threshold in (("1%", 1.0), ("3%", 3.0)):
            expected = frontier_crossing(
                [p["setting"] for p in points],
                [p["speedup"] for p in points],
                [p["perplexity_change_percent"] for p in points],
                threshold,
            )
            assert kind["crossings"][label] == expected
    svd = written["kinds"]["svd"]["points"]
    assert svd[1]["perplexity_change_percent"] > svd[0]["perplexity_change_percent"]
    assert svd[1]["mean_realized_sparsity"] > svd[0]["mean_realized_sparsity"]
    # the target is judged at the level the svd export chose by default (validation perplexity, 0.5% budget)
    chosen = json.loads((tmp_path / "sweep" / "bundles" / "svd" / "manifest.json").read_text())["sparsity"]
    target = written["target"]
    assert written["kinds"]["svd"]["default_level"] == chosen["default_level"]
    if chosen["default_level"] is None:
        # already 0.3 is over the budget on this short calibration: the default is dense, which is no faster
        assert target["level"] == "dense" and target["status"].startswith("not met (the default is dense")
        assert (target["perplexity_change_percent"], target["speedup"]) == (0.0, 1.0)
    else:
        assert target["level"] == chosen["default_level"]
        at_default = next(point for point in svd if point["setting"] == target["level"])
        assert target["perplexity_change_percent"] == at_default["perplexity_change_percent"]
        assert target["speedup"] == at_default["speedup"]
        met = at_default["perplexity_change_percent"] <= 1.0 and at_default["speedup"] >= 1.5
        assert target["status"] == ("met" if met else "not met")
    assert written["scored_tokens"] == 4 * 55 and written["commit"] == result["commit"]
    assert written["settings"]["timer"] == "cpu" and written["settings"]["threads"] == 1
    markdown = format_sweep_markdown(result, command="edge-sdk sweep tests/fixtures/tiny-relu-llama")
    assert f"| 0.9 | {svd[1]['perplexity_change_percent']:+.2f} | {svd[1]['top1_agreement']:.4f} |" in markdown
    assert "| signbit |" in markdown and "edge-sdk sweep tests/fixtures/tiny-relu-llama" in markdown


def test_bad_input_raises_clear_errors(svd_bundle, held_out, tiny_model_dir, tmp_path, monkeypatch):
    missing = tmp_path / "missing.txt"
    with pytest.raises(EvalError, match=r"missing\.txt: held-out text file not found"):
        evaluate_bundle(svd_bundle.path, [held_out, missing], backend="cpu")
    with pytest.raises(
        BundleError, match=r"sparsity level 0\.7 was not calibrated; calibrated levels: 0\.3, 0\.5, 0\.9"
    ):
        evaluate_bundle(svd_bundle.path, [held_out], backend="cpu", sparsity=0.7)
    with pytest.raises(EvalError, match="context 256 exceeds the bundle's max_seq_len 128"):
        evaluate_bundle(svd_bundle.path, [held_out], backend="cpu", context=256)
    with pytest.raises(EdgeSdkError, match="unknown backend 'gpu'"):
        evaluate_bundle(svd_bundle.path, [held_out], backend="gpu")
    monkeypatch.setattr(type(get_backend("cpu")), "probe", lambda self, threads=0: (False, "native library not built"))
    with pytest.raises(BackendUnavailable, match=r"backend 'cpu' .* not available here: native library not built"):
        evaluate_bundle(svd_bundle.path, [held_out], backend="cpu")
    with pytest.raises(BundleError, match="bundle directory not found"):
        evaluate_bundle(tmp_path / "no-bundle", [held_out])
    out = tmp_path / "sweep"
    with pytest.raises(EvalError, match="'svd-fast' not known"):
        sweep(tiny_model_dir, [tiny_model_dir / "calibration.txt"], [held_out], out, predictors=("svd-fast",))
    with pytest.raises(EvalError, match=r"missing\.txt: held-out text file not found"):
        sweep(tiny_model_dir, [tiny_model_dir / "calibration.txt"], [missing], out)
    with pytest.raises(EvalError, match=r"sweep core beta: expected a number in \(0, 1\], found 1\.5"):
        sweep(tiny_model_dir, [tiny_model_dir / "calibration.txt"], [held_out], out, core_betas=(0.2, 1.5))
    with pytest.raises(EvalError, match="timer 'cpu' adds up the CPU time of all threads: it needs threads=1, found 2"):
        sweep(tiny_model_dir, [tiny_model_dir / "calibration.txt"], [held_out], out, timer="cpu", threads=2)
    assert not out.exists()  # every check ran before any export


def test_eval_and_bench_e2e_show_each_phase_on_stderr(svd_bundle, held_out):
    """Every long phase draws a bar on stderr that reaches its total: the real model's layer statistics took
    minutes with nothing printed."""
    args = ["eval", str(svd_bundle.path), "--text", str(held_out), "--tokens", "600", "--context", "128"]
    result = CliRunner().invoke(main, [*args, "--backend", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    # 600 tokens in windows of 128: 4 full windows and the 88-token remainder per phase
    for phase in ("dense decode", "sparse decode", "layer statistics"):
        assert re.search(rf"{phase}: 100%\|[^|]*\| 5/5", result.stderr), phase
    assert "dense decode" not in result.stdout  # the figures stay on stdout alone
    bench = ["bench", "e2e", str(svd_bundle.path), "--backend", "cpu", "--repeats", "2", "--tokens", "4"]
    result = CliRunner().invoke(main, [*bench, "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert re.search(r"decode runs: 100%\|[^|]*\| 4/4", result.stderr)


class _IdsTokenizer:
    """Each whitespace-separated number of the text is one token id."""

    def encode(self, text):
        return [int(word) for word in text.split()]


@pytest.mark.parametrize(
    ("tokens", "lengths"),
    [(100, [40, 40, 20]), (90, [40, 40, 10]), (89, [40, 40]), (80, [40, 40]), (25, [25]), (10, [10])],
)
def test_held_out_windows_score_the_remainder_after_the_last_full_window(tokens, lengths):
    """The tokens after the last full window form a shorter last window when it holds a scored decode step
    (prompt + 2 tokens): a 511-token text in windows of 256 scored 223 tokens, as a 256-token one, leaving 255 unread.
    """
    text = " ".join(str(i % 50) for i in range(tokens))
    windows = held_out_windows(_IdsTokenizer(), [text], 4096, 40, 8, vocab_size=64)
    assert [len(window) for window in windows] == lengths
    # consecutive tokens: no gap, no overlap
    assert [token for window in windows for token in window] == [i % 50 for i in range(sum(lengths))]


def test_held_out_text_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    path = tmp_path / "held.txt"
    path.write_bytes(b"def f():\n    return '\xc3('\n")
    message = r"held\.txt: the held-out text file is not UTF-8 text \(byte 0xc3 at offset 21\)"
    with pytest.raises(EvalError, match=message):
        read_texts([path])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--predictors", ""], "Invalid value for --predictors: expected a comma-separated list of predictor kinds"),
        (["--predictors", "svd,svd"], "'svd' is listed twice in 'svd,svd'; each kind is swept once"),
        (["--levels", ""], "--levels: expected comma-separated numbers such as 0.5,0.7,0.9, found ''"),
        # a setting of a kind not swept (it was ignored, and the sweep ran with every default)
        (
            ["--predictors", "svd", "--recall-targets", "0.9"],
            "--recall-targets: only signbit read it, and --predictors svd sweeps none",
        ),
        (["--predictors", "signbit,core", "--levels", "0.5"], "--levels: only svd, its ablations and threshold read"),
    ],
)
def test_sweep_refuses_empty_and_repeated_lists_before_any_work(tiny_model_dir, tmp_path, option, message):
    args = ["sweep", str(tiny_model_dir), "--calib", str(tiny_model_dir / "calibration.txt"), "-o", str(tmp_path / "s")]
    result = CliRunner().invoke(main, [*args, "--text", str(tiny_model_dir / "held_out.txt"), *option])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "s").exists()


def test_sweep_refuses_its_markdown_on_the_path_of_its_json_before_any_work(tiny_model_dir, tmp_path):
    args = ["sweep", str(tiny_model_dir), "--calib", str(tiny_model_dir / "calibration.txt"), "-o", str(tmp_path / "s")]
    reports = ["--json", str(tmp_path / "sweep.json"), "--markdown", str(tmp_path / "sweep.json")]
    result = CliRunner().invoke(main, [*args, "--text", str(tiny_model_dir / "held_out.txt"), *reports])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'sweep.json'}: is also the location of another report" in result.output
    assert list(tmp_path.iterdir()) == []


def test_sweep_checks_its_bundles_directory_before_the_first_export(tiny_model_dir, tmp_path):
    """A bundle's location holding the user's directory is refused up front, even with --force, not after the
    earlier exports (--force replaces an earlier sweep's bundles directory whole)."""
    out = tmp_path / "s"
    users = out / "bundles" / "signbit-0.95"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("the user's\n")
    args = ["sweep", str(tiny_model_dir), "--calib", str(tiny_model_dir / "calibration.txt"), "-o", str(out)]
    sweep = [*args, "--text", str(tiny_model_dir / "held_out.txt"), "--predictors", "svd,signbit"]
    result = CliRunner().invoke(main, [*sweep, "--recall-targets", "0.9,0.95", "--force"])
    assert result.exit_code == 2, result.output
    assert f"{out / 'bundles'}: holds 'signbit-0.95', which has no edge-sdk manifest.json" in result.output
    assert sorted(path.name for path in (out / "bundles").iterdir()) == ["signbit-0.95"]
    assert (users / "notes.txt").read_text() == "the user's\n"


def test_a_sweep_takes_the_kinds_the_models_ffn_serves(tiny_model_dir, held_out, tmp_path, monkeypatch):
    """By default every kind for a ReLU-family FFN and threshold alone for SiLU, whose neurons are never exactly zero
    (the default used to start with svd and fail on a SiLU model); a kind named for SiLU that needs exact zeros is
    refused before anything is written. The sweep is stopped before it reads its texts."""
    silu = tmp_path / "silu"
    shutil.copytree(tiny_model_dir, silu)
    config = json.loads((silu / "config.json").read_text())
    (silu / "config.json").write_text(json.dumps(config | {"hidden_act": "silu"}))
    sweep_module = importlib.import_module("edge_sdk.eval.sweep")
    chosen = []
    served_kinds = sweep_module.served_kinds
    monkeypatch.setattr(sweep_module, "served_kinds", lambda *args: chosen.append(served_kinds(*args)) or chosen[-1])

    class Stopped(Exception):
        pass

    def stop(files):
        raise Stopped

    monkeypatch.setattr(sweep_module, "read_calibration_texts", stop)
    calibration, out = [tiny_model_dir / "calibration.txt"], tmp_path / "s"
    settings = {"levels": (0.5,), "recall_targets": (0.9,), "core_betas": (0.3,)}
    with pytest.raises(Stopped):
        sweep(silu, calibration, [held_out], out, **settings)
    assert chosen == [("threshold",)]
    with pytest.raises(Stopped):
        sweep(tiny_model_dir, calibration, [held_out], out, **settings)
    expected = ("svd", "svd-no-whiten", "svd-no-bias", "svd-uniform", "signbit", "core", "threshold")
    assert chosen[1] == expected and len(expected) == len(SWEEP_KINDS)
    refusal = (
        "sweep predictors svd, signbit need a ReLU-family FFN (relu, fatrelu, drelu) whose inactive neurons are exact "
        "zeros; this model's hidden_act is silu: it can sweep threshold"
    )
    with pytest.raises(EvalError, match=re.escape(refusal)):
        sweep(silu, calibration, [held_out], out, predictors=("svd", "signbit", "threshold"))
    args = ["sweep", str(silu), "--calib", str(calibration[0]), "-o", str(out), "--text", str(held_out)]
    result = CliRunner().invoke(main, [*args, "--predictors", "svd,signbit,threshold"])
    assert result.exit_code == 2 and refusal in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_sweep_stopped_after_its_first_bundle_leaves_nothing(tiny_model_dir, held_out, tmp_path, monkeypatch):
    """Each bundle used to be published as it was made, so a sweep stopped part-way left them (and a rerun needed
    --force) while saying nothing was written; the bundles are now published with the reports."""
    sweep_module = importlib.import_module("edge_sdk.eval.sweep")
    measure, measured = sweep_module._measure_bundle, []

    def measure_then_stop(bundle, *args):
        measured.append(bundle.path.name)
        if len(measured) == 2:
            raise KeyboardInterrupt
        return measure(bundle, *args)

    monkeypatch.setattr(sweep_module, "_measure_bundle", measure_then_stop)
    settings = {"predictors": ("signbit",), "recall_targets": (0.999, 0.9), "speed_repeats": 1, **WINDOW}
    with pytest.raises(KeyboardInterrupt):
        sweep(tiny_model_dir, [tiny_model_dir / "calibration.txt"], [held_out], tmp_path / "s", **settings)
    assert measured == ["signbit-0.999", "signbit-0.9"] and list(tmp_path.iterdir()) == []


class NanLogits:
    def prefill(self, ids):
        return None

    def decode(self, token):
        logits = np.zeros(8, dtype=np.float32)
        logits[3] = np.nan
        return logits


def test_logits_that_are_not_finite_are_refused_not_reported_as_nan():
    """A bundle with a nan weight gave `eval` a perplexity of nan and a JSON report no strict reader accepts."""
    with pytest.raises(EvalError, match="decoding gave logits that are not finite numbers"):
        teacher_forced(NanLogits(), [[1, 2, 3, 4]], prompt_tokens=1)


def test_sweeps_help_gives_the_reports_it_writes_unasked():
    """sweep's --json and --plot said "Also write the result as JSON" as eval's do, but a sweep writes OUTPUT/sweep.json
    and OUTPUT/sweep.png whether they are given or not (the user found them beside the bundles)."""
    sweep_help = " ".join(CliRunner().invoke(main, ["sweep", "--help"]).output.split())
    assert "(default: OUTPUT/sweep.json)" in sweep_help and "(default: OUTPUT/sweep.png)" in sweep_help
    eval_help = " ".join(CliRunner().invoke(main, ["eval", "--help"]).output.split())
    assert "Also write the result as JSON." in eval_help and "OUTPUT/sweep" not in eval_help


def test_sweep_markdown_names_the_threads_as_the_option_means_them():
    """--threads 0 is every core: the markdown said "(0 thread(s), ...)"."""
    from edge_sdk.eval.sweep import _threads_text

    assert [_threads_text(n) for n in (0, 1, 4)] == ["every core", "1 thread", "4 threads"]
