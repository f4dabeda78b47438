"""Choosing the default level on validation perplexity: the token split, the rule, the measurement itself
(against the reference decoder decoding token by token) and calibration/export/CLI end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from edge_sdk.bundle import Bundle, LevelChoice
from edge_sdk.cli import QUANTIZATION_NOTE_PERCENT, _default_level_text, _quantization_text, main
from edge_sdk.errors import CalibrationError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.export.quantized_checkpoint import QuantizedCheckpoint
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.loader import load_layer
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import bundle_predictors, load_reference_decoder
from edge_sdk.sparsity.collect import read_calibration_texts, token_chunks, token_stream
from edge_sdk.sparsity.pipeline import calibrate_model, fitting_chunks
from edge_sdk.sparsity.settings import (
    DEFAULT_PPL_BUDGET_PERCENT,
    DEFAULT_VALIDATION_TOKENS,
    CalibrationSettings,
    validate_settings,
)
from edge_sdk.sparsity.validation import LevelValidation, choose_level, split_validation, validation_chunks

LEVELS = (0.3, 0.6, 0.9)


def test_validation_tokens_follow_the_fit_tokens_when_the_text_is_long_enough():
    tokens = list(range(10_000))
    fit, held = split_validation(tokens, fit_tokens=4000, validation_tokens=2048, min_fit_tokens=256)
    assert fit == tokens[:4000] and held == tokens[4000:6048]


def test_short_text_holds_back_its_last_fifth_for_validation():
    tokens = list(range(3000))
    fit, held = split_validation(tokens, fit_tokens=20_000, validation_tokens=2048, min_fit_tokens=256)
    assert fit == tokens[:2400] and held == tokens[2400:]
    # more text than the fit tokens but less than fit + validation: the spare tokens, at least a fifth
    fit, held = split_validation(list(range(5000)), fit_tokens=4500, validation_tokens=2048, min_fit_tokens=256)
    assert fit == list(range(4000)) and held == list(range(4000, 5000))


def test_too_short_text_gets_no_validation():
    tokens = list(range(600))  # a fifth is 120 tokens, under the 128 a validation chunk needs
    assert split_validation(tokens, 20_000, 2048, 256) == (tokens, [])
    tokens = list(range(300))  # holding back 128 would leave 172 < 256 to fit on
    assert split_validation(tokens, 20_000, 2048, 256)[1] == []


@pytest.mark.parametrize(
    ("held", "shape"),
    [(2048, (4, 512)), (1024, (2, 512)), (800, (2, 400)), (600, (2, 300)), (1801, (4, 450)), (300, (1, 300))],
)
def test_every_held_back_token_is_validated(held, shape):
    """The tokens held back from fitting are cut into equal chunks of at most 512 that leave fewer than one token per
    chunk over: chunks of 512 left 288 of 800 held-back tokens neither fitted on nor validated."""
    chunks = validation_chunks(list(range(held)), 512)
    assert tuple(chunks.shape) == shape and chunks.flatten().tolist() == list(range(chunks.numel()))
    assert held - chunks.numel() < chunks.shape[0]


def test_a_short_calibration_text_validates_all_it_holds_back(tiny_model_dir, tmp_path):
    checkpoint = Checkpoint(tiny_model_dir)
    short = tmp_path / "short.txt"
    short.write_text((tiny_model_dir / "calibration.txt").read_text()[:13_500])  # about 4000 tokens
    stream = token_stream(checkpoint.tokenizer(), [short.read_text()], 22_048, checkpoint.config.vocab_size)
    held_back = split_validation(stream, 20_000, 2048, 256)[1]  # its last fifth
    assert 600 < len(held_back) < 1024
    held = fitting_chunks(checkpoint, CalibrationSettings(), [short])[1]
    assert held.flatten().tolist() == held_back[: held.numel()] and len(held_back) - held.numel() < held.shape[0]


def test_the_level_rises_while_the_change_stays_within_the_budget():
    changes = {0.3: 0.01, 0.5: 0.2, 0.7: 0.49, 0.8: 1.9}
    assert choose_level(changes, 0.5) == (0.7, True)
    assert choose_level(changes, 0.1) == (0.3, True)
    assert choose_level(changes, 5.0) == (0.8, True)
    # a level back under the budget after one over it is noise: the walk stops at the first one over
    assert choose_level({0.3: 0.1, 0.5: 0.8, 0.7: 0.4}, 0.5) == (0.3, True)
    # already the mildest is over: no level is chosen, dense is the default
    assert choose_level({0.3: 2.0, 0.5: 3.0}, 0.5) == (None, False)


@pytest.fixture(scope="module")
def fp32_bundle(tiny_model_dir, tmp_path_factory):
    calibration = CalibrationSettings(rank=16, max_tokens=1024, sparsity=0.3, levels=LEVELS)
    settings = ExportSettings(dtype="fp32", max_seq_len=64, calibration=calibration)
    out = tmp_path_factory.mktemp("validation") / "svd"
    return export_bundle(tiny_model_dir, out, settings, [tiny_model_dir / "calibration.txt"])


def _teacher_forced_perplexity(reference, chunks: torch.Tensor, prompt: int) -> float:
    """Dense prefill of each chunk's prompt, then one decode call per token, as `edge-sdk eval` does."""
    nll = []
    for chunk in chunks:
        reference.prefill(chunk[None, :prompt])
        for position in range(prompt, chunk.numel() - 1):
            logits = reference.decode(chunk[None, position : position + 1])[0, -1].double()
            nll.append(-torch.log_softmax(logits, dim=-1)[chunk[position + 1]].item())
    return math.exp(sum(nll) / len(nll))


def test_one_masked_forward_per_level_equals_decoding_token_by_token(fp32_bundle, tiny_model_dir):
    checkpoint = Checkpoint(tiny_model_dir)
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    texts = read_calibration_texts([tiny_model_dir / "held_out.txt"])
    tokens = token_stream(tokenizer, texts, 128, checkpoint.config.vocab_size)
    chunks = token_chunks(tokens, 64)  # [2, 64]
    validation = LevelValidation(checkpoint, chunks, LEVELS, prompt_tokens=8)
    for index, predictor in enumerate(bundle_predictors(fp32_bundle)):
        validation.advance(load_layer(checkpoint, index), predictor)
    measured = validation.perplexities()

    reference = load_reference_decoder(fp32_bundle)
    reference.configure(dense=True)
    expected = {None: _teacher_forced_perplexity(reference, chunks, 8)}
    for level_index, level in enumerate(LEVELS):
        reference.configure(level_index=level_index)
        expected[level] = _teacher_forced_perplexity(reference, chunks, 8)
    assert measured.keys() == expected.keys()
    for level, perplexity in expected.items():
        assert measured[level] == pytest.approx(perplexity, rel=2e-5), level
    # the levels really differ, so a stream mixed up with another would show
    assert expected[0.9] > expected[0.3] * 1.01 and validation.scored_tokens == 2 * 55


@pytest.fixture(scope="module")
def chosen_report(tiny_model_dir):
    settings = CalibrationSettings(rank=16, max_tokens=2048, levels=(0.3, 0.5, 0.7, 0.9))
    return calibrate_model(Checkpoint(tiny_model_dir), settings, [tiny_model_dir / "calibration.txt"]).report


def test_calibration_chooses_the_level_on_tokens_it_did_not_fit_on(chosen_report):
    choice = chosen_report["default_level_choice"]
    assert choice["method"] == "validation perplexity" and choice["budget_percent"] == DEFAULT_PPL_BUDGET_PERCENT
    # the fit uses exactly the requested tokens; validation the 2048 after them (4 chunks of 512, 32-token prompts)
    assert chosen_report["calibration_tokens"] == 2048
    assert choice["validation_tokens"] == 2048 and choice["scored_tokens"] == 4 * (512 - 32 - 1)
    changes = {float(level): change for level, change in choice["perplexity_change_percent"].items()}
    assert sorted(changes) == [0.3, 0.5, 0.7, 0.9]
    assert changes[0.9] > 3.0  # the fixture does not tolerate 0.9: a rule ignoring the budget would pick it
    expected = choose_level(changes, DEFAULT_PPL_BUDGET_PERCENT)
    assert (chosen_report["default_level"], choice["within_budget"]) == expected
    assert choice["level"] == chosen_report["default_level"] < 0.9
    # the per-layer headline metrics are those of the chosen level
    for layer in chosen_report["layers"]:
        at_level = layer["per_level"][f"{chosen_report['default_level']:g}"]
        assert {key: layer[key] for key in at_level} == at_level


def test_a_larger_budget_allows_a_sparser_default(tiny_model_dir, chosen_report):
    changes = chosen_report["default_level_choice"]["perplexity_change_percent"]
    budget = max(changes.values()) + 1.0
    settings = CalibrationSettings(rank=16, max_tokens=2048, levels=(0.3, 0.5, 0.7, 0.9), ppl_budget=budget)
    report = calibrate_model(Checkpoint(tiny_model_dir), settings, [tiny_model_dir / "calibration.txt"]).report
    assert report["default_level"] == 0.9 and report["default_level_choice"]["within_budget"]
    # the same fit and validation tokens give the same measurement, bit for bit
    assert report["default_level_choice"]["perplexity_change_percent"] == changes


def test_a_quantized_model_s_choice_reports_what_quantization_cost(tiny_model_dir, chosen_report):
    """Given the model before quantization, the validation also runs its dense stream: the same tokens and code as
    the unquantized calibration's dense figure, so the same bits; the change is the quantized dense model's."""
    checkpoint = Checkpoint(tiny_model_dir)
    settings = CalibrationSettings(rank=16, max_tokens=2048, levels=(0.3, 0.5, 0.7, 0.9))
    calibration = [tiny_model_dir / "calibration.txt"]
    quantized = QuantizedCheckpoint(checkpoint, "int4", 32)
    report = calibrate_model(quantized, settings, calibration, unquantized=checkpoint).report
    choice = report["default_level_choice"]
    assert choice["unquantized_dense_perplexity"] == chosen_report["default_level_choice"]["dense_perplexity"]
    assert choice["dense_perplexity"] != choice["unquantized_dense_perplexity"]
    expected = 100.0 * (choice["dense_perplexity"] / choice["unquantized_dense_perplexity"] - 1.0)
    assert choice["quantization_change_percent"] == pytest.approx(expected, rel=1e-12)
    assert "quantization_change_percent" not in chosen_report["default_level_choice"]
    text = _quantization_text(report | {"quantization": {"format": "int4", "group_size": 32, "method": "rtn"}})
    assert text.startswith("quantization int4 (groups of 32, rtn): dense validation perplexity ")
    assert f"({choice['quantization_change_percent']:+.2f}%)" in text
    # above QUANTIZATION_NOTE_PERCENT the line says what loses less
    costly = report | {"quantization": {"format": "int4", "group_size": 32, "method": "rtn"}}
    costly["default_level_choice"] = choice | {"quantization_change_percent": QUANTIZATION_NOTE_PERCENT + 1}
    assert _quantization_text(costly).endswith(
        "; --dtype int8 or --head-dtype int8 or --down-dtype int8 or --int4-scheme asymmetric or --quant-method awq "
        "lose less "
        "(benchmarks/README.md section 9)"
    )
    # what the export already took is not suggested again
    taken = {"format": "int4", "group_size": 32, "method": "awq", "int4_scheme": "asymmetric", "head_format": "int8"}
    taken_text = _quantization_text(costly | {"quantization": taken | {"down_format": "int8"}})
    assert taken_text.startswith("quantization int4 asymmetric, LM head int8, FFN down int8 (groups of 32, awq): ")
    assert taken_text.endswith("; --dtype int8 lose less (benchmarks/README.md section 9)")
    assert _quantization_text(costly | {"quantization": taken}).endswith(
        "; --dtype int8 or --down-dtype int8 lose less (benchmarks/README.md section 9)"
    )
    asymmetric = report | {
        "quantization": {"format": "int4", "group_size": 32, "method": "rtn", "int4_scheme": "asymmetric"}
    }
    assert _quantization_text(asymmetric).startswith("quantization int4 asymmetric (groups of 32, rtn): ")
    assert _quantization_text(chosen_report) is None


def test_a_given_level_skips_validation_and_short_text_falls_back(tiny_model_dir, tmp_path):
    checkpoint = Checkpoint(tiny_model_dir)
    calibration = [tiny_model_dir / "calibration.txt"]
    given = calibrate_model(checkpoint, CalibrationSettings(rank=16, max_tokens=1024, sparsity=0.7), calibration)
    assert given.report["default_level"] == 0.7 and given.report["default_level_choice"] == {"method": "given"}
    short = tmp_path / "short.txt"
    tokens = token_stream(
        Tokenizer.from_dir(tiny_model_dir), read_calibration_texts(calibration), 400, checkpoint.config.vocab_size
    )
    short.write_text(Tokenizer.from_dir(tiny_model_dir).decode(tokens[1:]))
    fallback = calibrate_model(checkpoint, CalibrationSettings(rank=16), [short]).report
    assert fallback["default_level"] == 0.5 and fallback["default_level_choice"]["method"] == "fallback"
    assert "give more text or --sparsity" in fallback["default_level_choice"]["reason"]
    signbit = calibrate_model(checkpoint, CalibrationSettings(predictor="signbit", max_tokens=1024), calibration)
    assert signbit.report["default_level_choice"]["method"].startswith("nominal")
    # export and calibrate said "default level 0.5 (nominal ...)", a level run then refused as not calibrated
    assert _default_level_text(signbit.report) == (
        "no sparsity levels: signbit has none to choose from (its fitted setting decides which neurons it skips)"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ppl_budget": -1.0}, "perplexity budget must be a percentage >= 0, found -1.0"),
        ({"ppl_budget": math.nan}, "perplexity budget must be a percentage >= 0, found nan"),
        ({"validation_tokens": 100}, "validation tokens 100 is too few: at least 128 are needed"),
        ({"levels": ()}, "no sparsity levels to choose the default level from"),
        (
            {"levels": tuple(i / 100 for i in range(1, 65)), "sparsity": 0.995},
            r"65 distinct sparsity levels \(--levels with --sparsity\) are too many: a bundle holds at most 64",
        ),
    ],
)
def test_bad_choice_settings_are_refused(tiny_model_dir, settings, message):
    with pytest.raises(CalibrationError, match=message):
        validate_settings(Checkpoint(tiny_model_dir).config, CalibrationSettings(**settings))


def test_export_cli_reports_the_choice_and_writes_it_to_the_manifest(tiny_model_dir, tmp_path):
    out = tmp_path / "bundle"
    calibration = str(tiny_model_dir / "calibration.txt")
    args = ["export", str(tiny_model_dir), "-o", str(out), "--calib", calibration, "--tokens", "1024"]
    quick = ["--rank", "16", "--levels", "0.3,0.9", "--dtype", "fp32", "--validation-tokens", "1024"]
    result = CliRunner().invoke(main, [*args, *quick])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    report = json.loads((out / "report.json").read_text())
    level = manifest["sparsity"]["default_level"]
    assert level == report["default_level"] and manifest["sparsity"]["levels"] == [0.3, 0.9]
    assert report["default_level_choice"]["within_budget"] and level == 0.3
    # 1024 validation tokens: two chunks of 512, each scoring all but its 32-token prompt and its last token
    assert "default level 0.3: within the 0.5% perplexity budget on 958 validation tokens" in result.output
    assert report["default_level_choice"]["validation_tokens"] == 1024
    # the per-layer metrics, as calibrate prints them (export printed the predicted sparsity alone, unlabelled)
    lines = result.output.splitlines()
    header = lines.index("per layer, on calibration text at sparsity 0.3: true, predicted and realized sparsity, "
                         "recall, importance-weighted recall")  # fmt: skip
    for layer, line in zip(report["layers"], lines[header + 2 : header + 6], strict=True):
        sparsities = [f"{layer[key]:.3f}" for key in ("true_sparsity", "predicted_sparsity", "realized_sparsity")]
        recalls = [f"{layer['recall']:.4f}", f"{layer['importance_weighted_recall']:.5f}"]
        assert line.split() == [str(layer["layer"]), *sparsities, *recalls]
    for flag, value, message in (
        ("--ppl-budget", "-2", "'--ppl-budget': -2.0 is not in the range x>=0"),
        ("--validation-tokens", "64", "validation tokens 64 is too few: at least 128 are needed"),
    ):
        refused = CliRunner().invoke(main, [*args, flag, value, "--force"])
        assert refused.exit_code == 2 and message in refused.output and "Traceback" not in refused.output


@pytest.mark.parametrize("command", ["calibrate", "export"])
def test_cli_defaults_are_the_library_defaults(command):
    options = {option.name: option.default for option in main.commands[command].params}
    assert options["sparsity"] is None
    assert options["ppl_budget"] == DEFAULT_PPL_BUDGET_PERCENT
    assert options["validation_tokens"] == DEFAULT_VALIDATION_TOKENS


def test_with_no_level_within_the_budget_the_default_is_dense(tiny_model_dir, tmp_path):
    out = tmp_path / "bundle"
    calibration = str(tiny_model_dir / "calibration.txt")
    args = ["export", str(tiny_model_dir), "-o", str(out), "--calib", calibration, "--tokens", "1024", "--rank", "16"]
    # 0.5 costs the fixture about 0.2% on validation, so a 0.01% budget admits no level
    tight = ["--levels", "0.5,0.9", "--ppl-budget", "0.01", "--dtype", "fp32", "--validation-tokens", "1024"]
    result = CliRunner().invoke(main, [*args, *tight])
    assert result.exit_code == 0, result.output
    assert "default dense: no level within the 0.01% perplexity budget on 958 validation tokens" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert manifest["sparsity"]["default_level"] is None and manifest["sparsity"]["levels"] == [0.5, 0.9]
    choice = report["default_level_choice"]
    assert report["default_level"] is None and choice["dense"] and not choice["within_budget"]
    assert min(choice["perplexity_change_percent"].values()) > 0.01
    # the per-layer headline metrics are the mildest level's, and the report says so
    assert report["metrics_level"] == 0.5
    for layer in report["layers"]:
        at_level = layer["per_level"]["0.5"]
        assert {key: layer[key] for key in at_level} == at_level
    sparsity = Bundle.open(out).sparsity
    assert sparsity.resolve(None) == LevelChoice(None, None, True)
    assert sparsity.resolve(0.9) == LevelChoice(1, 0.9, False)  # any calibrated level can still be asked for
    # and eval says it compared dense with dense (it said "svd at None")
    held_out = str(tiny_model_dir / "held_out.txt")
    evaluated = CliRunner().invoke(main, ["eval", str(out), "--text", held_out, "--tokens", "200", "--context", "64"])
    assert evaluated.exit_code == 0, evaluated.output
    assert "cpu, dense: perplexity dense" in evaluated.output
    # the reference decoder follows the default: its decode equals dense decoding, not the mildest level's
    model = load_reference_decoder(Bundle.open(out))
    prompt = torch.tensor([Tokenizer.from_dir(tiny_model_dir).encode("def main(argv=None):")])
    default_logits = _decode_logits(model, prompt)
    model.configure(level_index=0, dense=True)
    dense_logits = _decode_logits(model, prompt)
    model.configure(level_index=0, dense=False)
    mildest_logits = _decode_logits(model, prompt)
    assert torch.equal(default_logits, dense_logits) and not torch.equal(default_logits, mildest_logits)
    # bench e2e times no "sparse" run that is dense too (it printed a speedup of two dense runs), and says how to
    # time a level
    bench = ["bench", "e2e", str(out), "--backend", "cpu", "--threads", "1", "--repeats", "1", "--tokens", "2"]
    benched = CliRunner().invoke(main, [*bench, "--json", str(tmp_path / "e2e.json")])
    assert benched.exit_code == 0, benched.output
    assert "sparse" not in benched.stdout and "x;" not in benched.stdout
    assert "no sparse run: the bundle's default is dense decoding" in benched.stderr
    assert "pass --sparsity with one of its levels (0.5, 0.9)" in benched.stderr
    e2e = json.loads((tmp_path / "e2e.json").read_text())
    assert e2e["speedup"] is None and e2e["sparse_tokens_per_second"] is None and e2e["dense_tokens_per_second"] > 0
    at_level = CliRunner().invoke(main, [*bench, "--sparsity", "0.9"])
    assert at_level.exit_code == 0 and "(sparsity 0.9): " in at_level.stdout, at_level.output
    assert "no sparse run" not in at_level.output


def _decode_logits(model, prompt: torch.Tensor, steps: int = 8) -> torch.Tensor:
    """Greedy decode steps after the prompt: [steps, V] logits of each decode step."""
    with torch.inference_mode():
        return _greedy_logits(model, prompt, steps)


def _greedy_logits(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    model.reset()
    logits = model.prefill(prompt)[:, -1]
    steps_logits = []
    for _ in range(steps):
        logits = model.decode(logits.argmax(-1, keepdim=True))[:, -1]
        steps_logits.append(logits[0])
    return torch.stack(steps_logits)


@pytest.mark.parametrize(
    "option", [["--levels", "0.5"], ["--rank", "8"], ["--sparsity", "0.5"], ["--no-whiten"], ["--eval", "x.txt"]]
)
def test_export_without_a_predictor_refuses_the_options_only_a_predictor_uses(tiny_model_dir, tmp_path, option):
    out = tmp_path / "bundle"
    result = CliRunner().invoke(main, ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", *option])
    assert result.exit_code == 2, result.output
    assert f"{option[0]}: only a calibrated predictor uses it; --predictor none fits none" in result.output
    assert not out.exists()
    quick = ["--predictor", "none", "--max-seq-len", "32"]
    assert CliRunner().invoke(main, ["export", str(tiny_model_dir), "-o", str(out), *quick]).exit_code == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--calib", "c.txt"],
            "--calib: nothing reads it: --predictor none fits no predictor, and only --quant-method",
        ),
        (["--dtype", "int4", "--tokens", "512"], "--tokens: nothing reads it: --predictor none fits no predictor"),
        (["--group-size", "64"], "--group-size: only an int8 or int4 export reads it, not --dtype fp16"),
    ],
)
def test_export_refuses_the_options_nothing_in_it_reads(tiny_model_dir, tmp_path, options, message):
    """Each was silently ignored: calibration text without a predictor or AWQ to read it, an fp16 group size."""
    (tmp_path / "c.txt").write_text("text\n")
    out = tmp_path / "bundle"
    args = ["export", str(tiny_model_dir), "-o", str(out), "--predictor", "none", *options]
    result = CliRunner().invoke(main, [arg.replace("c.txt", str(tmp_path / "c.txt")) for arg in args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()
