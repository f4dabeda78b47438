"""The `edge-sdk` command line: click commands only; the work happens in the library.

Every failure a user can cause ends as one line on stderr and exit status 2, never a traceback: library errors
(EdgeSdkError), operating-system errors (a full disk, a read-only file system), running out of memory, and input
that is not UTF-8. An interrupt (Ctrl-C) exits with 130, SIGTERM and SIGHUP with 128 + the signal's number; outputs
are published whole or not at all (edge_sdk.outputs), so an interrupted command leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from edge_sdk import __version__, memory, outputs, predictors
from edge_sdk.bundle import operating_point_text
from edge_sdk.errors import EdgeSdkError
from edge_sdk.quant import DEFAULT_GROUP_SIZE, GROUP_SIZES, INT4_SCHEMES
from edge_sdk.quant import FORMATS as QUANTIZED_FORMATS
from edge_sdk.runtime.backends import MAX_THREADS
from edge_sdk.runtime.generator import MAX_SEED
from edge_sdk.sparsity.settings import (
    DEFAULT_LEVELS,
    LEVEL_ALLOCATIONS,
    LEVEL_FIELDS,
    CalibrationSettings,
    kinds_reading,
)

if TYPE_CHECKING:
    from edge_sdk.model.config import ModelConfig

USAGE_ERROR = 2
INTERRUPTED = 130
STDOUT_CLOSED = 128 + signal.SIGPIPE  # the shell's status for a command whose reader stopped reading (`| head`)
PROGRESS_DELAY = 1.0  # seconds before a progress bar shows: quick refusals print their one line and nothing else
# Every bar on the first line below the cursor: a command's bars are made before their phases run (or, in a sweep,
# while the one before is still open), and tqdm gives each further open bar the next line, reached with a newline and
# left with a cursor-up escape: in a log file (stderr not a terminal) every update of the second bar was an empty
# line and "\x1b[A". The phases run one after another, so one line serves them all.
PROGRESS_POSITION = 0


def _os_error_text(error: OSError) -> str:
    where = error.filename if error.filename is not None else "edge-sdk"
    return f"{where}: {error.strerror or error}"


def _one_line(message: str) -> str:
    return " ".join(message.split())


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf, which pass its comparisons (and a range up to the largest
    float, the way to refuse inf, printed that float in --help)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"expected a finite number, found {value!r}", param, ctx)
        return number


class InputPath(click.Path):
    """The path of something a command reads: an empty one is refused (Path("") is the current directory, where
    `info ""` read whatever model was there)."""

    def convert(self, value, param, ctx):
        if value == "":
            self.fail("expected a path, found an empty string", param, ctx)
        return super().convert(value, param, ctx)


INPUT_PATH = InputPath(path_type=str)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt, so that the output being
    written is removed on the way out instead of left for the next command to sweep."""

    def __init__(self, signal_number: int):
        super().__init__(signal_number)
        self.signal_number = signal_number


TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The signal (SIGINT, SIGTERM, SIGHUP) received while the command runs, if any. A library that calls back into Python
# can catch the exception the signal's handler raised there and raise an error of its own instead (safetensors
# reading a tensor gave a ValueError); whatever error then ends the command, the signal is what stopped it.
_received_signal: list[int] = []


def _raise_terminated(signal_number: int, frame) -> None:
    signal.signal(signal_number, signal.SIG_DFL)  # a second one ends the process at once, even mid-cleanup
    _received_signal.append(signal_number)
    raise Terminated(signal_number)


def _raise_interrupt(signal_number: int, frame) -> None:
    _received_signal.append(signal_number)
    signal.default_int_handler(signal_number, frame)  # KeyboardInterrupt, as Python's own handler


@contextlib.contextmanager
def _terminating_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated while the command runs, SIGINT KeyboardInterrupt as Python's own handler
    does, each remembered (_received_signal); a signal the caller ignores (nohup) stays ignored, and the handlers
    before are restored after (the command may run inside another program, such as a test)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, *TERMINATING_SIGNALS)}
    _received_signal.clear()
    if before[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupt)
    for number in TERMINATING_SIGNALS:
        if before[number] is signal.SIG_DFL:
            signal.signal(number, _raise_terminated)
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _user_error_message(error: Exception) -> str | None:
    """The one-line message of an error a user can cause (a bad input, a full disk, too little memory), else None."""
    if isinstance(error, EdgeSdkError):
        return str(error)
    if isinstance(error, OSError):
        return _os_error_text(error)
    if isinstance(error, MemoryError):
        return "out of memory; use a smaller model, fewer tokens or a shorter max sequence length"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start})"
    return None


class EdgeSdkGroup(click.Group):
    """Turns every error a user can cause into one line on stderr and a nonzero exit status, never a traceback:
    usage errors (a bad option value) included, which click would otherwise print as a usage block."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Terminated as terminated:  # here, before click turns it into an Abort like Ctrl-C's
            self._stopped(ctx, terminated.signal_number)
        except BrokenPipeError:
            self._stdout_closed()
        except Exception as error:
            if _received_signal and not isinstance(error, click.exceptions.Exit):
                if _received_signal[0] == signal.SIGINT:
                    raise KeyboardInterrupt from None  # main's "interrupted", as for Ctrl-C anywhere else
                self._stopped(ctx, _received_signal[0])
            message = _user_error_message(error)
            if message is None:
                raise
        click.echo(f"edge-sdk: error: {_one_line(message)}", err=True)
        ctx.exit(USAGE_ERROR)

    @staticmethod
    def _stdout_closed() -> None:
        """`edge-sdk run ... | head -c 20`: the reader of standard output has what it wanted and went away. Not an
        error to report: the command stops quietly, as one killed by SIGPIPE does, and standard output is pointed at
        /dev/null so that the interpreter's own flush of it on the way out fails no more."""
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(STDOUT_CLOSED)

    @staticmethod
    def _stopped(ctx: click.Context, signal_number: int) -> None:
        """Ends the command stopped by a terminating signal; what it was writing was removed on the way out."""
        click.echo(f"edge-sdk: stopped by {signal.Signals(signal_number).name}; nothing was written", err=True)
        ctx.exit(128 + signal_number)

    def main(self, *args, **kwargs):
        if not kwargs.get("standalone_mode", True):
            return super().main(*args, **kwargs)
        try:
            with _terminating_signals_interrupt():
                result = super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.UsageError as error:
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
            click.echo(f"edge-sdk: error: {_one_line(error.format_message())}{hint}", err=True)
            sys.exit(USAGE_ERROR)
        except click.ClickException as error:
            click.echo(f"edge-sdk: error: {_one_line(error.format_message())}", err=True)
            sys.exit(error.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("edge-sdk: interrupted; nothing was written", err=True)
            sys.exit(INTERRUPTED)
        sys.exit(result if isinstance(result, int) else 0)


def _print_table(rows: dict, indent: str = "") -> None:
    width = max((len(str(k)) for k in rows), default=0)
    for key, value in rows.items():
        if isinstance(value, dict):
            click.echo(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            click.echo(f"{indent}{str(key).ljust(width)}  {shown}")


def _needs_export(purpose: str) -> None:
    from edge_sdk.runtime.extras import require_extra

    require_extra("export", purpose)


def _open_model(model_dir: str, gguf_checkpoint):
    """The model check_model_path passed: the GGUF file it already opened, or else the checkpoint directory, opened
    now (which imports torch)."""
    if gguf_checkpoint is not None:
        return gguf_checkpoint
    from edge_sdk.model.checkpoint import open_checkpoint

    return open_checkpoint(model_dir)


def _runs_torch_pipeline(purpose: str) -> None:
    """For the commands that run models in torch over many tokens: the extra they need, and freed activations given
    back to the system instead of piling up in the heap (memory.map_large_blocks)."""
    _needs_export(purpose)
    memory.map_large_blocks()


def _parse_levels(text: str | None, option: str) -> tuple[float, ...] | None:
    """The numbers of a comma-separated option value (None when the option was not given); a value holding none is
    refused, never taken for the option's default."""
    if text is None:
        return None
    try:
        numbers = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        numbers = ()
    if not numbers:
        raise click.BadParameter(
            f"expected comma-separated numbers such as 0.5,0.7,0.9, found {text!r}", param_hint=option
        )
    return numbers


def _options(*decorators: Callable) -> Callable:
    """Several click options as one decorator (applied in the order written)."""

    def apply(function: Callable) -> Callable:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


_SPARSITY_HELP = (
    "Default operating level: target fraction of neurons predicted inactive over all layers (default: the most "
    "aggressive calibrated level whose perplexity on validation tokens of the calibration text, which the "
    "predictors are not fitted on, stays within --ppl-budget of dense)."
)
_LEVEL_ALLOCATION_HELP = (
    "How a level's sparsity is spread over the layers: 'importance' gives each layer the most it can take while "
    "every layer misses the same share of its FFN output's importance; 'uniform' gives every layer the level."
)


_DEFAULT_LEVELS_TEXT = ",".join(f"{level:g}" for level in DEFAULT_LEVELS)


def _level_help(text: str) -> str:
    """An option's help, led by the kinds calibrated at levels: only they read it, and the others refuse it."""
    return f"{' and '.join(predictors.LEVEL_KINDS)}: {text}"


_RANK_HELP = (
    "SVD predictor rank for every layer (default: per layer, from ~2% of D doubling until the layer's "
    "importance-weighted recall on the calibration tokens reaches 0.998)."
)
_FORCE_HELP = "Replace an earlier edge-sdk output at that path (never anything edge-sdk did not write)."

_group_size_option = click.option(
    "--group-size",
    type=click.Choice([str(size) for size in GROUP_SIZES]),
    default=str(DEFAULT_GROUP_SIZE),
    show_default=True,
    help="int8 / int4: values per fp16 scale along each weight row. 32 by measurement: on SmolLM2-135M int4 costs "
    "+23% held-out perplexity at 32 and +32% at 64, for 6% more bytes (kernels/cpu/QUANT.md, 'Quality').",
)


@contextlib.contextmanager
def _phase_progress() -> Iterator[Callable[[str, int, int], None]]:
    """An on_progress(phase, done, total) callback drawing one stderr bar per phase of a long command; a phase
    reports 0 done as it starts, so its bar shows before its first (possibly minute-long) step ends."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            bars[phase] = tqdm(total=total, desc=phase, file=sys.stderr, position=PROGRESS_POSITION)
        bars[phase].update(done - bars[phase].n)
        if done >= total:
            bars[phase].close()

    try:
        yield report
    finally:
        for bar in bars.values():
            bar.close()


def _one_after_another(*bars) -> list[Callable[[Any], None]]:
    """Per tqdm bar, its phase's step callback, for phases that run one after another. The bars are made before the
    work starts, so a later phase's clock counted the earlier ones' time (export showed "validating levels: 1/4
    [01:41<05:03, 101.10s/layer]" for 15 s of validation): when a phase ends, the clocks of the bars not yet
    started restart (a phase that does not run, its bar disabled, never ends and leaves the next bars' clocks to the
    phase before it). A bar closes when its phase ends."""

    def step_of(index: int) -> Callable[[Any], None]:
        def step(_: Any) -> None:
            bar = bars[index]
            bar.update()
            if bar.total is not None and bar.n == bar.total:
                bar.close()  # its figures final now, not recomputed when the command ends
                for later in bars[index + 1 :]:
                    if later.n == 0:  # its clock and its display delay from now (tqdm's clock: time.time)
                        later.start_t = later.last_print_t = time.time()

        return step

    return [step_of(index) for index in range(len(bars))]


def _default_level_text(report: dict) -> str:
    """One line on the default operating level: given, or chosen on validation perplexity (and how)."""
    level, choice = report["default_level"], report["default_level_choice"]
    if choice["method"].startswith("nominal"):  # the bundle's default_level is null: nothing to pass as --sparsity
        return (
            f"no sparsity levels: {report['predictor']} has none to choose from (its fitted setting decides which "
            "neurons it skips)"
        )
    if choice["method"] != "validation perplexity":
        return f"default level {level:g} ({choice['method']}{': ' + choice['reason'] if 'reason' in choice else ''})"
    changes = ", ".join(f"{key} {change:+.2f}%" for key, change in choice["perplexity_change_percent"].items())
    measured = f"on {choice['scored_tokens']} validation tokens (dense {choice['dense_perplexity']:.3f}; {changes})"
    if level is None:
        return (
            f"default dense: no level within the {choice['budget_percent']:g}% perplexity budget {measured}; "
            "the bundle decodes densely unless a level is asked for (--sparsity); more calibration tokens, "
            "a higher rank, milder levels or a larger --ppl-budget may help"
        )
    return f"default level {level:g}: within the {choice['budget_percent']:g}% perplexity budget {measured}"


# Above this validation-perplexity cost of quantization the export says which choices lose less.
QUANTIZATION_NOTE_PERCENT = 5.0


def _quantization_text(report: dict) -> str | None:
    """One line on what quantization cost the dense model on the validation tokens, when the export measured it."""
    choice, quantization = report["default_level_choice"], report.get("quantization")
    if quantization is None or "quantization_change_percent" not in choice:
        return None
    change = choice["quantization_change_percent"]
    text = (
        f"quantization {quantization['format']}{_scheme_text(quantization)} (groups of {quantization['group_size']}, "
        f"{quantization['method']}): "
        f"dense validation perplexity {choice['dense_perplexity']:.3f} against "
        f"{choice['unquantized_dense_perplexity']:.3f} unquantized ({change:+.2f}%)"
    )
    if change > QUANTIZATION_NOTE_PERCENT:
        text += f"; {' or '.join(_less_lossy_choices(quantization))} lose less (benchmarks/README.md section 9)"
    return text


def _less_lossy_choices(quantization: dict) -> list[str]:
    """The export options that lose less than the quantization the report describes, those not taken already."""
    choices = ["--dtype int8"]
    if quantization["format"] == "int4":
        if "head_format" not in quantization:
            choices.append("--head-dtype int8")
        if "down_format" not in quantization:
            choices.append("--down-dtype int8")
        if quantization.get("int4_scheme") != "asymmetric":
            choices.append("--int4-scheme asymmetric")
    if quantization["method"] != "awq":
        choices.append("--quant-method awq")
    return choices


def _scheme_text(quantization: dict) -> str:
    """An asymmetric int4's scheme, and the matrices stored in a wider format (an export's report.json words)."""
    text = " asymmetric" if quantization.get("int4_scheme") == "asymmetric" else ""
    wider = [f"LM head {quantization['head_format']}"] if "head_format" in quantization else []
    wider += [f"FFN down {quantization['down_format']}"] if "down_format" in quantization else []
    return text + (f", {', '.join(wider)}" if wider else "")


def _predictor_choices(with_none: bool) -> list[str]:
    return [predictors.AUTO, *(name for name in predictors.KINDS if with_none or name != predictors.NO_PREDICTOR)]


def _chosen_predictor(fit: dict[str, Any], config: ModelConfig) -> None:
    """--predictor auto made concrete for the opened model (predictors.default_kind); then a usage error for an option
    given that the chosen kind does not read (kinds_reading), which it would silently ignore."""
    chosen = f"--predictor {fit['predictor']}"
    if fit["predictor"] == predictors.AUTO:
        fit["predictor"] = predictors.default_kind(config.activation)
        chosen = f"--predictor auto chose {fit['predictor']} for this model's {config.activation.kind} FFN"
    if fit["predictor"] == predictors.NO_PREDICTOR or not predictors.serves(fit["predictor"], config.activation):
        return  # (a kind that cannot serve this model is refused with that reason: validate_settings)
    context = click.get_current_context()
    for parameter in context.command.params:
        field = SETTINGS_FIELD_OF_OPTION.get(parameter.name)
        if field is None or context.get_parameter_source(parameter.name) not in GIVEN:
            continue
        readers = kinds_reading(field)
        if fit["predictor"] not in readers:
            verb = "reads" if len(readers) == 1 else "read"
            raise click.UsageError(f"{parameter.opts[0]}: only {' and '.join(readers)} {verb} it; {chosen}")
    if fit["sparsity"] is not None:
        # the default level is given, so none is chosen on validation perplexity: nothing reads these
        _refuse_given_options(
            ("ppl_budget", "validation_tokens"),
            f"only choosing the default level reads it, and --sparsity {fit['sparsity']:g} gives the level",
        )


# what calibrate and export share: the model and the output, the calibration text, the predictor and its fit, the
# choice of the default level (one option set, so the two commands fit predictors alike)
def _predictor_fit_options(*, output_help: str, calib_required: bool, with_none: bool) -> Callable:
    calib_help = "Calibration text: plain text or JSON lines with a 'text' field. Repeatable."
    return _options(
        click.argument("model_dir", type=INPUT_PATH),
        click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=str), help=output_help),
        click.option("--calib", "calibration_files", multiple=True, required=calib_required, help=calib_help),
        click.option(
            "--predictor",
            type=click.Choice(_predictor_choices(with_none)),
            default=predictors.AUTO,
            show_default=True,
            help="auto: svd (SVDP) for a ReLU-family FFN (relu, fatrelu, drelu), threshold (CHESS) for SiLU.",
        ),
        click.option("--eval", "evaluation_files", multiple=True, help="Held-out text for the report. Repeatable."),
        click.option("--rank", type=click.IntRange(min=1), default=None, help=_RANK_HELP),
        click.option("--sparsity", type=FiniteFloatRange(0, 1), default=None, help=_level_help(_SPARSITY_HELP)),
        click.option(
            "--ppl-budget",
            type=FiniteFloatRange(min=0),
            default=CalibrationSettings.ppl_budget,
            show_default=True,
            help=_level_help("Choosing the default level: allowed perplexity increase over dense, in percent."),
        ),
        click.option(
            "--validation-tokens",
            type=click.IntRange(min=1),
            default=CalibrationSettings.validation_tokens,
            show_default=True,
            help=_level_help(
                "Choosing the default level: most calibration-text tokens to validate on, after --tokens."
            ),
        ),
        click.option(
            "--levels",
            default=None,
            help=_level_help(f"Comma-separated sparsity levels to calibrate (default {_DEFAULT_LEVELS_TEXT})."),
        ),
        click.option(
            "--level-allocation",
            type=click.Choice(LEVEL_ALLOCATIONS),
            default=CalibrationSettings.level_allocation,
            show_default=True,
            help=_level_help(_LEVEL_ALLOCATION_HELP),
        ),
        click.option(
            "--tokens",
            "max_tokens",
            type=click.IntRange(min=1),
            default=CalibrationSettings.max_tokens,
            show_default=True,
            help="Calibration tokens.",
        ),
        click.option("--no-whiten", is_flag=True, help="svd: naive SVD of W_gate (ablation)."),
        click.option(
            "--no-bias-calibration",
            is_flag=True,
            help="svd: one global threshold instead of per-neuron biases (ablation).",
        ),
        click.option(
            "--recall-target",
            type=FiniteFloatRange(0, 1),
            default=CalibrationSettings.recall_target,
            show_default=True,
            help="signbit: per-layer recall.",
        ),
        click.option("--force", is_flag=True, help=_FORCE_HELP),
    )


# The options of _predictor_fit_options that only fitting a predictor reads (--calib and --tokens also feed AWQ).
PREDICTOR_FIT_OPTIONS = (
    "evaluation_files",
    "rank",
    "sparsity",
    "ppl_budget",
    "validation_tokens",
    "levels",
    "level_allocation",
    "no_whiten",
    "no_bias_calibration",
    "recall_target",
)


# The options of _predictor_fit_options that set a CalibrationSettings field only some kinds read (kinds_reading)
SETTINGS_FIELD_OF_OPTION = {
    "rank": "rank",
    "no_whiten": "whiten",
    "no_bias_calibration": "calibrate_bias",
    "recall_target": "recall_target",
    **{field: field for field in LEVEL_FIELDS},
}
# where an option's value comes from when the user gave it
GIVEN = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def _refuse_given_options(names: tuple[str, ...], why: str) -> None:
    """A usage error naming the first of these options the user gave on the command line (or through the
    environment): an option the command would silently ignore."""
    context = click.get_current_context()
    for parameter in context.command.params:
        if parameter.name in names and context.get_parameter_source(parameter.name) in GIVEN:
            raise click.UsageError(f"{parameter.opts[0]}: {why}")


def _calibration_settings(fit: dict[str, Any]) -> CalibrationSettings:
    """CalibrationSettings from the predictor options of _predictor_fit_options."""
    return CalibrationSettings(
        predictor=fit["predictor"],
        rank=fit["rank"],
        sparsity=fit["sparsity"],
        ppl_budget=fit["ppl_budget"],
        validation_tokens=fit["validation_tokens"],
        levels=_parse_levels(fit["levels"], "--levels") or DEFAULT_LEVELS,
        whiten=not fit["no_whiten"],
        calibrate_bias=not fit["no_bias_calibration"],
        recall_target=fit["recall_target"],
        level_allocation=fit["level_allocation"],
        max_tokens=fit["max_tokens"],
    )


@click.group(cls=EdgeSdkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edge-sdk")
def main() -> None:
    """Deploy activation-sparse LLMs to edge devices."""


@main.command()
@click.argument("model_dir", type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(model_dir: str, as_json: bool) -> None:
    """Validate a Hugging Face checkpoint or a GGUF file and show its architecture."""
    _needs_export("`edge-sdk info`")
    from edge_sdk.model.location import check_model_path

    # before torch is imported: a wrong path or a GGUF file the reader refuses is refused at once
    gguf_checkpoint = check_model_path(model_dir)
    from edge_sdk.model.summary import describe_checkpoint

    summary = describe_checkpoint(_open_model(model_dir, gguf_checkpoint))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    summary["parameters"] = f"{summary['parameters']:,}"
    summary["weight_bytes"] = f"{summary['weight_bytes']:,} ({summary['weight_bytes'] / 2**30:.2f} GiB)"
    _print_table(summary)


@main.command()
@click.argument("bundle_dir", required=False, type=INPUT_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(bundle_dir: str | None, as_json: bool) -> None:
    """Report versions, native libraries and which backends can run here (and run BUNDLE, when given)."""
    from edge_sdk.runtime.doctor import diagnose

    report = diagnose(bundle_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    versions = {k: v or "not installed" for k, v in report["versions"].items()}
    _print_table({"versions": versions, "native libraries": report["native"]})
    if "bundle" in report:  # the verdicts below are for this bundle
        contents = report["bundle_contents"]
        click.echo(f"backends for {report['bundle']} ({contents['dtype']}, predictor {contents['predictor']}):")
    else:
        click.echo("backends:")
    for name, status in report["backends"].items():
        state = ("available: " if status["available"] else "not available: ") + status["reason"]
        click.echo(f"  {name.ljust(8)}  {state}")


@main.command()
@_predictor_fit_options(output_help="Predictors directory.", calib_required=True, with_none=False)
def calibrate(model_dir, out_dir, calibration_files, evaluation_files, force, **fit) -> None:
    """Build sparsity predictors from calibration text; write predictors.safetensors and a report.

    For comparing predictor settings on their report: export takes the same options and fits its own predictors
    (on the weights it stores, quantized or not), so no command reads this directory back."""
    _runs_torch_pipeline("`edge-sdk calibrate`")
    # before torch is imported: a wrong location or model path, or a GGUF file the reader refuses, is refused at once
    from edge_sdk.model.location import check_model_path

    target = outputs.check_model_output(
        out_dir,
        outputs.PREDICTORS,
        replace=force,
        model_dir=model_dir,
        input_files=(*calibration_files, *evaluation_files),
    )
    gguf_checkpoint = check_model_path(model_dir)
    from tqdm import tqdm

    from edge_sdk.sparsity.pipeline import calibrate_model
    from edge_sdk.sparsity.predictors_dir import write_calibration
    from edge_sdk.sparsity.settings import validate_settings

    checkpoint = _open_model(model_dir, gguf_checkpoint)
    _chosen_predictor(fit, checkpoint.config)
    settings = _calibration_settings(fit)
    validate_settings(checkpoint.config, settings)
    layers = checkpoint.config.num_layers
    calibrating = tqdm(
        total=layers,
        desc="calibrating layers",
        unit="layer",
        file=sys.stderr,
        delay=PROGRESS_DELAY,
        position=PROGRESS_POSITION,
    )
    validating = tqdm(
        total=layers,
        desc="validating levels",
        unit="layer",
        file=sys.stderr,
        disable=not settings.chooses_level,
        delay=PROGRESS_DELAY,
        position=PROGRESS_POSITION,
    )
    with calibrating, validating:
        on_layer_calibrated, on_layer_validated = _one_after_another(calibrating, validating)
        result = calibrate_model(
            checkpoint, settings, calibration_files, evaluation_files, on_layer_calibrated, on_layer_validated
        )
    written = write_calibration(result, target)
    _print_layer_metrics(result.report)
    click.echo(_default_level_text(result.report))
    click.echo(f"wrote {written}/predictors.safetensors, report.json, report.png")


def _print_layer_metrics(report: dict) -> None:
    """calibrate's and export's per-layer table: true, predicted and realized sparsity, recall and importance-weighted
    recall, on the text the report says (held-out with --eval) at its metrics level."""
    click.echo(
        f"per layer, on {report['evaluated_on']} text at sparsity {report['metrics_level']:g}: true, predicted and "
        "realized sparsity, recall, importance-weighted recall"
    )
    click.echo(f"{'layer':>5}  {'true':>6}  {'pred':>6}  {'real':>6}  {'recall':>7}  {'w-recall':>8}")
    for layer in report["layers"]:
        click.echo(
            f"{layer['layer']:>5}  {layer['true_sparsity']:6.3f}  {layer['predicted_sparsity']:6.3f}  "
            f"{layer['realized_sparsity']:6.3f}  {layer['recall']:7.4f}  {layer['importance_weighted_recall']:8.5f}"
        )


@main.command()
@_predictor_fit_options(output_help="Bundle directory.", calib_required=False, with_none=True)
@click.option(
    "--dtype",
    type=click.Choice(["fp16", "bf16", "fp32", "int8", "int4"]),
    default="fp16",
    show_default=True,
    help="Weight storage; int8 / int4: weight-only group-wise quantization (an untied embedding fp16, see "
    "kernels/cpu/QUANT.md).",
)
@click.option(
    "--head-dtype",
    type=click.Choice(["auto", "int8", "int4"]),
    default="auto",
    show_default=True,
    help="Storage of the LM head matrix (a tied model's embedding, which is its head). int8 with --dtype int4 keeps "
    "the head at int8 (codes + fp16 scales of --group-size; bundle format version 4), as llama.cpp's 4-bit files "
    "keep their output matrix wider: SmolLM2-135M's tied int4 head alone costs +7.4% held-out perplexity "
    "(kernels/cpu/QUANT.md, 'In a bundle'). 'auto' is int8 for --dtype int4 of a GGUF whose FFN rows have 4 bits "
    "or fewer (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K, the IQ types) and whose head has more, --dtype otherwise.",
)
@click.option(
    "--down-dtype",
    type=click.Choice(["auto", "int8", "int4"]),
    default="auto",
    show_default=True,
    help="Storage of the FFN down projections. int8 with --dtype int4 keeps them at int8 (codes + fp16 scales of "
    "--group-size, still one row per neuron; bundle format version 7), as llama.cpp's Q4_K_M keeps ffn_down wider: "
    "from SmolLM2-135M's Q4_1 file, int4 down rows cost +7.1% held-out perplexity and int8 ones +0.7%, for 12% "
    "more bytes (benchmarks/README.md section 9). 'auto' is int8 for --dtype int4 of a GGUF whose FFN rows have 4 "
    "bits or fewer (it groups ffn_down along the neurons, so int4 rows would round its values again), --dtype "
    "otherwise.",
)
@_group_size_option
@click.option(
    "--int4-scheme",
    type=click.Choice(["auto", *INT4_SCHEMES]),
    default="auto",
    show_default=True,
    help="int4's grid: 'symmetric', code * scale per group (llama.cpp's Q4_0), or 'asymmetric', (code + 8) * scale + "
    "min per group (Q4_1's grid, 11% more bytes, bundle format version 6). 'auto' is asymmetric for a GGUF whose "
    "weights are stored with block minimums (Q4_1, Q4_K, Q2_K, ...), whose grid it then keeps (Q4_1's exactly), and "
    "symmetric otherwise.",
)
@click.option(
    "--quant-method",
    type=click.Choice(["rtn", "awq"]),
    default="rtn",
    show_default=True,
    help="int8 / int4: round to nearest, or first fold activation-aware (AWQ) input-channel scales searched on the "
    "calibration text into the weights: recommended for int4 (SmolLM2-135M: +17.8% held-out perplexity over fp16 "
    "instead of +23.2%), no gain for int8, several times the export time (kernels/cpu/QUANT.md, 'Quality').",
)
@click.option(
    "--max-seq-len",
    type=click.IntRange(min=2),
    default=None,
    help="Longest sequence the bundle serves (default: min(2048, the model's max_position_embeddings)).",
)
def export(
    model_dir,
    out_dir,
    calibration_files,
    evaluation_files,
    force,
    dtype,
    head_dtype,
    down_dtype,
    group_size,
    int4_scheme,
    quant_method,
    max_seq_len,
    **fit,
) -> None:
    """Export a checkpoint and its predictors to a bundle (ONNX + weights + tokenizer + manifest)."""
    _runs_torch_pipeline("`edge-sdk export`")
    if fit["predictor"] == predictors.NO_PREDICTOR:
        _refuse_given_options(PREDICTOR_FIT_OPTIONS, "only a calibrated predictor uses it; --predictor none fits none")
    if dtype not in QUANTIZED_FORMATS:
        _refuse_given_options(("group_size",), f"only an int8 or int4 export reads it, not --dtype {dtype}")
    if fit["predictor"] == predictors.NO_PREDICTOR and not (dtype in QUANTIZED_FORMATS and quant_method == "awq"):
        _refuse_given_options(
            ("calibration_files", "max_tokens"),
            "nothing reads it: --predictor none fits no predictor, and only --quant-method awq (int8, int4) reads "
            "calibration text",
        )
    # before torch is imported: a wrong location or model path, or a GGUF file the reader refuses, is refused at once
    from edge_sdk.model.location import check_model_path

    outputs.check_model_output(
        out_dir, outputs.BUNDLE, replace=force, model_dir=model_dir, input_files=(*calibration_files, *evaluation_files)
    )
    gguf_checkpoint = check_model_path(model_dir)
    from tqdm import tqdm

    from edge_sdk.export.exporter import (
        ExportSettings,
        default_down_dtype,
        default_head_dtype,
        default_int4_scheme,
        export_bundle,
    )

    checkpoint = _open_model(model_dir, gguf_checkpoint)
    config = checkpoint.config
    _chosen_predictor(fit, config)
    if int4_scheme == "auto":
        int4_scheme = default_int4_scheme(checkpoint) if dtype == "int4" else "symmetric"
    wider = {}  # the options 'auto' resolved wider than --dtype, with why
    if head_dtype == "auto":
        head_dtype = default_head_dtype(checkpoint, dtype)
        if head_dtype != dtype:
            wider["--head-dtype"] = (head_dtype, f"its LM head is {checkpoint.head_type.name}")
    if down_dtype == "auto":
        down_dtype = default_down_dtype(checkpoint, dtype)
        if down_dtype != dtype:
            wider["--down-dtype"] = (down_dtype, "it groups ffn_down along the neurons")
    if wider:
        reasons = ", ".join(f"{option} {value} ({why})" for option, (value, why) in wider.items())
        smaller = " ".join(f"{option} {dtype}" for option in wider)
        click.echo(
            f"--dtype {dtype} of a GGUF whose FFN rows have 4 bits or fewer keeps what int4 rows would round again: "
            f"{reasons}; {smaller} makes the smaller bundle"
        )
    settings = ExportSettings(
        dtype=dtype,
        head_dtype=head_dtype,
        down_dtype=down_dtype,
        group_size=int(group_size),
        int4_scheme=int4_scheme,
        quant_method=quant_method,
        max_seq_len=max_seq_len,
        calibration=_calibration_settings(fit),
    )
    calibrating = tqdm(
        total=config.num_layers,
        desc="calibrating",
        unit="layer",
        file=sys.stderr,
        disable=not settings.calibration.kind.calibrated,
        delay=PROGRESS_DELAY,
        position=PROGRESS_POSITION,
    )
    validating = tqdm(
        total=config.num_layers,
        desc="validating levels",
        unit="layer",
        file=sys.stderr,
        disable=not settings.calibration.chooses_level,
        delay=PROGRESS_DELAY,
        position=PROGRESS_POSITION,
    )
    writing = tqdm(
        desc="writing tensors", unit="tensor", file=sys.stderr, delay=PROGRESS_DELAY, position=PROGRESS_POSITION
    )
    with calibrating, validating, writing:
        on_layer_calibrated, on_layer_validated, on_tensor_written = _one_after_another(
            calibrating, validating, writing
        )
        bundle = export_bundle(
            checkpoint,
            out_dir,
            settings,
            calibration_files,
            evaluation_files,
            force,
            on_layer_calibrated=on_layer_calibrated,
            on_tensor_written=on_tensor_written,
            on_layer_validated=on_layer_validated,
        )
    click.echo(f"bundle {bundle.path}")
    for name, entry in bundle.manifest.files.items():
        click.echo(f"  {name:<24} {entry.size / 1e6:10.2f} MB")
    if predictors.kind(bundle.sparsity.predictor).calibrated:
        click.echo(f"predictor {bundle.sparsity.predictor}")
        report = bundle.read_json("report.json", 64 << 20)
        click.echo(_default_level_text(report))
        quantization_text = _quantization_text(report)
        if quantization_text is not None:
            click.echo(quantization_text)
        _print_layer_metrics(report)
        click.echo(f"report: {bundle.path / 'report.json'} and report.png")


@main.command()
@click.argument("bundle_dir", type=INPUT_PATH)
@click.option(
    "--steps",
    type=click.IntRange(1, 4096),
    default=None,
    help="Greedy decode steps to compare (default 8, fewer where the bundle's max_seq_len is shorter).",
)
@click.option(
    "--files-only",
    is_flag=True,
    help="Check the files (manifest, sizes, checksums, weights, graphs, tokenizer) without running the graphs.",
)
@click.option(
    "--target",
    type=click.Choice(["onnxruntime", "tensorrt"]),
    default="onnxruntime",
    show_default=True,
    help="tensorrt: also check the graphs against TensorRT 10.3's parser rules (static, no GPU needed).",
)
@click.option(
    "--against",
    "against_model",
    metavar="MODEL",
    type=INPUT_PATH,
    default=None,
    help="Also run transformers on MODEL (the Hugging Face checkpoint directory the bundle came from) with the "
    "bundle's weights and compare the dense logits: checks that export read config.json as transformers does.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def verify(
    bundle_dir: str, steps: int, files_only: bool, target: str, against_model: str | None, as_json: bool
) -> None:
    """Check a bundle's files and checksums, then ONNX Runtime against the torch reference (and, with --target
    tensorrt, the graphs against TensorRT 10.3's parser rules; with --against, the torch reference against
    transformers)."""
    from edge_sdk.bundle.check import check_bundle

    bundle, result = check_bundle(bundle_dir)
    if target == "tensorrt":
        _needs_export("Checking the graphs against TensorRT's rules")
        from edge_sdk.backends.tensorrt.compatibility import check_bundle as check_tensorrt

        violations, memory = check_tensorrt(bundle)
        for violation in violations:
            click.echo(f"edge-sdk: error: {violation}", err=True)
        if violations:
            click.get_current_context().exit(USAGE_ERROR)
        result["tensorrt_engine_weight_bytes"] = {"engine": memory.engine, "bundle weights": memory.bundle_weights}
    if not files_only:
        _needs_export("Comparing the bundle's graphs with the torch reference (skip it with --files-only)")
        from edge_sdk.export.verify import verify_graphs

        result |= verify_graphs(bundle, decode_steps=steps)
    if against_model is not None:
        _needs_export("Comparing the bundle with transformers")
        from edge_sdk.export.against import compare_with_transformers
        from edge_sdk.export.verify import DEFAULT_DECODE_STEPS, DEFAULT_PROMPT

        result |= compare_with_transformers(bundle, against_model, DEFAULT_PROMPT, steps or DEFAULT_DECODE_STEPS)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _print_table({k: v for k, v in result.items() if k != "text"})
    if "text" in result:
        click.echo(f"greedy continuation: {result['text']!r}")
    click.echo("OK")


def _prompt_text(prompt: str | None) -> str:
    """The prompt from --prompt or standard input; bytes that are not UTF-8 are refused, naming the offset."""
    if prompt is None:
        if sys.stdin.isatty():
            click.echo("edge-sdk: reading the prompt from standard input (end it with Ctrl-D)", err=True)
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise EdgeSdkError(
                f"standard input: the prompt is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})"
            ) from None
    _check_utf8_option("--prompt", prompt)
    return prompt


def _check_utf8_option(option: str, text: str) -> None:
    """An option's text must be UTF-8: the shell hands undecodable bytes over as surrogates, which no text matches."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise EdgeSdkError(
            f"{option}: not UTF-8 text (an undecodable byte at character {error.start}); give UTF-8 text"
        ) from None


_threads_option = click.option(
    "--threads", type=click.IntRange(0, MAX_THREADS), default=0, help="CPU threads (0: every core)."
)


@main.command()
@click.argument("bundle_dir", type=INPUT_PATH)
@click.option("--prompt", default=None, help="Prompt text (default: read standard input).")
@click.option("--backend", default="auto", show_default=True, help="auto, tensorrt, cann or cpu ($EDGE_SDK_BACKEND).")
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=0),
    default=128,
    show_default=True,
    help="At most this many tokens after the prompt (fewer where the bundle's positions end).",
)
@click.option("--temperature", type=FiniteFloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off; with --temperature.")
@click.option(
    "--top-p", type=FiniteFloatRange(0, 1, min_open=True), default=1.0, show_default=True, help="With --temperature."
)
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None, help="Sampling seed, 0 to 2^64-1.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--sparsity", type=FiniteFloatRange(0, 1), default=None, help="One of the bundle's calibrated levels.")
@click.option("--dense", is_flag=True, help="Decode the dense model: every FFN neuron computed (no sparsity).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the bundle's chat template.")
@_threads_option
def run(
    bundle_dir, prompt, backend, max_new_tokens, temperature, top_k, top_p, seed, stop, sparsity, dense, chat, threads
) -> None:
    """Generate text from a bundle: streams the continuation to stdout, timings to stderr."""
    import edge_sdk

    if temperature == 0:
        _refuse_given_options(
            ("top_k", "top_p", "seed"),
            "only sampling reads it, and --temperature 0 (the default) decodes greedily; give a --temperature above 0",
        )
    if dense and sparsity is not None:
        raise click.UsageError(
            f"--dense and --sparsity {sparsity:g}: the dense model has no sparsity level; give either"
        )
    for text in stop:
        if not text:
            raise click.UsageError("--stop: expected a non-empty text, found ''")
        _check_utf8_option("--stop", text)
    prompt = _prompt_text(prompt)
    session = edge_sdk.load(
        bundle_dir,
        backend,
        sparsity=sparsity,
        dense=dense,
        threads=threads,
        log=lambda line: click.echo(line, err=True),
    )
    pieces = session.generate(
        prompt,
        chat=chat,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=tuple(stop),
    )
    for piece in pieces:
        # color=True: the model's text as it is; click strips ANSI escape sequences from a piece when stdout is not a
        # terminal, so a pipe would get other text than the API (and only where a sequence falls within one piece)
        click.echo(piece, nl=False, color=True)
        sys.stdout.flush()
    click.echo()
    stats = session.stats
    prefill = f"{stats.prefill_tokens_per_second:.1f} tok/s" if stats.prefill_seconds > 0 else "not run"
    info = session.info
    click.echo(
        f"prefill: {stats.prompt_tokens} tokens, {prefill}; "
        f"decode: {stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s "
        f"({info['backend']}, {operating_point_text(info['predictor'], info['sparsity_level'])}, "
        f"stop: {stats.stop_reason})",
        err=True,
    )


@main.group()
def bench() -> None:
    """Benchmarks: the sparse FFN kernel, and end-to-end decoding."""


def _write_json(path: str | None, payload: dict, inputs: tuple[tuple[str, str], ...] = ()) -> None:
    from edge_sdk.bench.record import with_machine_info

    if path:
        record = with_machine_info(payload)
        outputs.write_report(path, lambda staging: staging.write_text(outputs.report_json(record)), inputs)
        click.echo(f"wrote {path}", err=True)


def _check_report_paths(*paths: str | None, inputs: tuple[tuple[str, str], ...] = ()) -> None:
    """The command's report locations (None: not asked for): distinct, and none of its inputs or inside one."""
    outputs.check_reports(paths, inputs)


@bench.command("ffn")
@click.option("--shape", default="llama2-7b", show_default=True, help="llama2-7b, mistral-7b, qwen2-7b or dxD.")
@click.option("--sparsity", "sparsities", default="0.5,0.8,0.9,0.95", show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["cpu", "cann", "torch-cpu", "torch-cuda"]),
    default="cpu",
    show_default=True,
    help="cpu: native C kernels; cann: the gather-plus-matmul path on an Ascend NPU; torch-cpu / torch-cuda: "
    "the same gather path on a torch device, for comparison.",
)
@click.option(
    "--mode",
    type=click.Choice(["dynamic", "static"]),
    default="dynamic",
    show_default=True,
    help="Gather paths: nonzero (dynamic) or top-k to the capacity (static shapes).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "int8", "int4"]),
    default="fp32",
    show_default=True,
    help="int8 / int4 (cpu backend): the sparse kernel over quantized rows against the same step in fp16.",
)
@_group_size_option
@click.option(
    "--int4-scheme",
    type=click.Choice(INT4_SCHEMES),
    default="symmetric",
    show_default=True,
    help="--dtype int4: symmetric rows (Q4_0's grid), or asymmetric ones with a minimum per group (Q4_1's).",
)
@click.option(
    "--down-dtype",
    type=click.Choice(["int8"]),
    default=None,
    help="--dtype int4: the down rows int8, as in a bundle exported with --down-dtype int8 [default: --dtype].",
)
@_threads_option
@click.option("--repeats", type=click.IntRange(1, 10000), default=20, show_default=True)
@click.option("--json", "json_path", default=None, help="Also write the rows as JSON (with the machine description).")
def bench_ffn_command(
    shape, sparsities, backend, mode, dtype, group_size, int4_scheme, down_dtype, threads, repeats, json_path
) -> None:
    """Time one decode FFN: torch dense matmul vs our dense and sparse kernels (int8 / int4: quantized vs fp16)."""
    _needs_export("`edge-sdk bench ffn`")
    _check_report_paths(json_path)
    from edge_sdk.bench.ffn import QUANTIZED_DTYPES, bench_ffn, parse_shape
    from edge_sdk.bench.gather import bench_gather_ffn

    devices = {"cann": "npu", "torch-cpu": "cpu", "torch-cuda": "cuda"}
    for option, value, given in (
        ("--int4-scheme", int4_scheme, int4_scheme != "symmetric"),
        ("--down-dtype", down_dtype, down_dtype is not None),
    ):
        if given and dtype != "int4":
            raise click.BadParameter(f"{option} {value} needs --dtype int4, found --dtype {dtype}")
    if dtype not in QUANTIZED_DTYPES:
        _refuse_given_options(("group_size",), f"only an int8 or int4 benchmark reads it, found --dtype {dtype}")
    if dtype in QUANTIZED_DTYPES:
        if backend != "cpu":
            raise click.BadParameter(f"--dtype {dtype} runs on the cpu backend only, found --backend {backend}")
        asymmetric = int4_scheme == "asymmetric"
        _bench_quantized_ffn(
            shape, sparsities, dtype, int(group_size), threads, repeats, json_path, asymmetric, down_dtype
        )
        return
    try:
        d, n_neurons = parse_shape(shape)
        levels = _parse_levels(sparsities, "--sparsity")
        if backend == "cpu":
            rows = bench_ffn(d, n_neurons, levels, dtype=dtype, threads=threads, repeats=repeats)
        else:
            rows = bench_gather_ffn(
                d,
                n_neurons,
                levels,
                dtype=dtype,
                device=devices[backend],
                mode=mode,
                repeats=repeats,
                warmup=3,
                threads=threads,
            )
    except ValueError as error:
        raise _bench_setting_error(error) from None
    path = f", {mode}" if backend != "cpu" else ""
    click.echo(f"FFN d={d} D={n_neurons} {dtype} backend={backend}{path}")
    click.echo(f"{'sparsity':>8} {'torch ms':>9} {'dense ms':>9} {'sparse ms':>10} {'vs torch':>9} {'GB/s':>7}")
    for row in rows:
        click.echo(
            f"{row['sparsity']:8.2f} {row['dense_torch_ms']:9.2f} {row['dense_kernel_ms']:9.2f} "
            f"{row['sparse_ms']:10.2f} {row['speedup_vs_torch']:8.2f}x {row['sparse_gb_per_s']:7.1f}"
        )
    _write_json(json_path, {"benchmark": "ffn", "shape": shape, "backend": backend, "mode": mode, "rows": rows})


# The library's names of the benchmark's settings (its ValueError messages start "SETTING: "), as options
_BENCH_SETTING_OPTIONS = {"shape": "--shape", "d, D": "--shape", "sparsities": "--sparsity"}


def _bench_setting_error(error: ValueError) -> click.BadParameter:
    """The usage error of a bench setting the library refused, naming the option the user typed ("--sparsity"), not
    the library's parameter ("sparsities")."""
    setting, _, problem = str(error).partition(": ")
    option = _BENCH_SETTING_OPTIONS.get(setting)
    if option is None or not problem:
        return click.BadParameter(str(error))
    return click.BadParameter(problem, param_hint=f"'{option}'")


def _bench_quantized_ffn(
    shape, sparsities, dtype, group_size, threads, repeats, json_path, asymmetric, down_dtype
) -> None:
    """`bench ffn --dtype int8|int4`: the sparse kernel over quantized rows against fp16, interleaved."""
    from edge_sdk.bench.ffn import QUANTIZED_COLUMNS, bench_quantized_ffn, format_table, parse_shape

    try:
        d, n_neurons = parse_shape(shape)
        levels = _parse_levels(sparsities, "--sparsity")
        rows = bench_quantized_ffn(
            d,
            n_neurons,
            levels,
            dtype=dtype,
            group_size=group_size,
            threads=threads,
            repeats=repeats,
            asymmetric=asymmetric,
            down_dtype=down_dtype,
        )
    except ValueError as error:
        raise _bench_setting_error(error) from None
    scheme = (" asymmetric" if asymmetric else "") + (f", {down_dtype} down rows" if down_dtype else "")
    click.echo(
        f"FFN d={d} D={n_neurons} {dtype}{scheme}, group size {group_size}, backend=cpu threads={rows[0]['threads']}: "
        f"sparse kernel ({dtype} rows, integer dot products; fp32_x: x in fp32) vs fp16 rows, each timed inside the "
        "library (sparse_call_ms: the default call timed from Python), and a streaming read of 256 MiB "
        "(read_gb_per_s; read_fraction = sparse_gb_per_s / read_gb_per_s)"
    )
    click.echo(format_table(rows, QUANTIZED_COLUMNS))
    _write_json(json_path, {"benchmark": "ffn", "shape": shape, "backend": "cpu", "dtype": dtype, "rows": rows})


@bench.command("e2e")
@click.argument("bundle_dir", type=INPUT_PATH)
@click.option("--backend", default="auto", show_default=True, help="auto, tensorrt, cann or cpu.")
@click.option(
    "--sparsity", type=FiniteFloatRange(0, 1), default=None, help="A calibrated level (default: the bundle's)."
)
@click.option("--tokens", type=click.IntRange(1, 1 << 20), default=64, show_default=True, help="Decode steps per run.")
@click.option("--repeats", type=click.IntRange(1, 10000), default=3, show_default=True)
@_threads_option
@click.option("--prompt-file", default=None, help="Prompt text file (default: a short code prompt).")
@click.option("--prompt-tokens", type=click.IntRange(1), default=None, help="Use the prompt's first N tokens.")
@click.option("--json", "json_path", default=None, help="Also write the result as JSON (with the machine description).")
def bench_e2e_command(
    bundle_dir, backend, sparsity, tokens, repeats, threads, prompt_file, prompt_tokens, json_path
) -> None:
    """Decode tokens/s of a bundle, dense vs sparse on the same backend, and the prompt's prefill tokens/s.

    A bundle without a predictor, or whose default is dense when no --sparsity is given, is timed dense only."""
    report_inputs = (("bundle", bundle_dir),) + ((("prompt file", prompt_file),) if prompt_file else ())
    _check_report_paths(json_path, inputs=report_inputs)
    from edge_sdk.bench.e2e import DEFAULT_PROMPT, bench_e2e, read_prompt_file

    prompt = DEFAULT_PROMPT if prompt_file is None else read_prompt_file(prompt_file)
    with _phase_progress() as on_progress:
        result = bench_e2e(
            bundle_dir,
            None if backend == "auto" else backend,
            sparsity,
            tokens,
            repeats,
            threads,
            prompt,
            on_progress=on_progress,
            prompt_tokens=prompt_tokens,
        )
    prefill = f"prefill {result['prefill_tokens_per_second']:.1f} tok/s ({result['prompt_tokens']} prompt tokens)"
    if result["speedup"] is None:
        click.echo(f"{result['backend']}: dense {result['dense_tokens_per_second']:.1f} tok/s; {prefill}")
        click.echo(f"no sparse run: {result['no_sparse_run']}", err=True)
    else:
        click.echo(
            f"{result['backend']}: dense {result['dense_tokens_per_second']:.1f} tok/s, sparse "
            f"{result['sparse_tokens_per_second']:.1f} tok/s "
            f"({operating_point_text(result['predictor'], result['sparsity_level'])}): "
            f"{result['speedup']:.2f}x; {prefill}"
        )
    _write_json(json_path, {"benchmark": "e2e", **result}, report_inputs)


@main.command()
@click.argument("bundle_dir", type=INPUT_PATH)
@click.option(
    "--cache-dir",
    default=None,
    help="Engine cache (default: $EDGE_SDK_ENGINE_CACHE, else $XDG_CACHE_HOME/edge-sdk/tensorrt, else "
    "~/.cache/edge-sdk/tensorrt).",
)
@click.option("--force", is_flag=True, help="Rebuild even when a cached engine exists.")
def build(bundle_dir: str, cache_dir: str | None, force: bool) -> None:
    """Build and cache the TensorRT engine of a bundle on this device (ahead of `edge-sdk run`)."""
    from edge_sdk.backends.tensorrt import build_engine
    from edge_sdk.bundle import Bundle

    bundle = Bundle.open(bundle_dir, verify_checksums=True)
    engine_dir = build_engine(bundle, cache_dir=cache_dir, force=force, log=lambda line: click.echo(line, err=True))
    click.echo(f"engine cached in {engine_dir}")


def _window_options(
    json_help: str = "Also write the result as JSON.", plot_help: str = "Also draw the result as a PNG."
) -> Callable:
    """The options eval and sweep share; sweep writes its JSON and plot whether asked or not (json_help, plot_help)."""
    return _options(
        click.option("--text", "text_files", multiple=True, required=True, help="Held-out text. Repeatable."),
        click.option("--backend", default="auto", show_default=True, help="auto, tensorrt, cann or cpu."),
        click.option(
            "--tokens",
            "max_tokens",
            type=click.IntRange(1, 1 << 24),
            default=4096,
            show_default=True,
            help="Held-out tokens read (each window's prompt tokens are not scored).",
        ),
        click.option(
            "--prompt-tokens",
            type=click.IntRange(min=1),
            default=32,
            show_default=True,
            help="Dense prefill per window.",
        ),
        _threads_option,
        click.option("--no-layer-stats", is_flag=True, help="Skip the per-layer sparsity and recall statistics."),
        click.option("--json", "json_path", default=None, help=json_help),
        click.option("--plot", "plot_path", default=None, help=plot_help),
    )


@main.command("eval")
@click.argument("bundle_dir", type=INPUT_PATH)
@_window_options()
@click.option(
    "--sparsity", type=FiniteFloatRange(0, 1), default=None, help="A calibrated level (default: the bundle's)."
)
@click.option(
    "--context", type=click.IntRange(min=2), default=None, help="Window length (default: min(256, max_seq_len))."
)
def eval_command(
    bundle_dir,
    text_files,
    backend,
    max_tokens,
    prompt_tokens,
    threads,
    no_layer_stats,
    json_path,
    plot_path,
    sparsity,
    context,
) -> None:
    """Held-out perplexity of sparse vs dense decoding (teacher-forced), top-1 agreement and per-layer statistics."""
    _runs_torch_pipeline("`edge-sdk eval`")
    # before torch is imported: a refused report location is answered at once (evaluate_bundle, which checks the
    # locations first of all for its other callers, would give the same verdict after the import)
    report_inputs = (("bundle", bundle_dir), *(("text file", text) for text in text_files))
    _check_report_paths(json_path, plot_path, inputs=report_inputs)
    from edge_sdk.eval import evaluate_bundle

    with _phase_progress() as on_progress:
        result = evaluate_bundle(
            bundle_dir,
            text_files,
            None if backend == "auto" else backend,
            sparsity,
            max_tokens=max_tokens,
            context=context,
            prompt_tokens=prompt_tokens,
            threads=threads,
            layer_stats=not no_layer_stats,
            json_path=json_path,
            plot_path=plot_path,
            on_progress=on_progress,
        )
    click.echo(
        f"{result['backend']}, {operating_point_text(result['predictor'], result['sparsity_level'])}: "
        f"perplexity dense {result['dense_perplexity']:.3f}, sparse {result['sparse_perplexity']:.3f} "
        f"({result['perplexity_change_percent']:+.2f}%), top-1 agreement {result['top1_agreement']:.4f} "
        f"over {result['scored_tokens']} tokens"
    )
    for layer in result.get("layers", []):
        click.echo(
            f"  layer {layer['layer']:>3}: true {layer['true_sparsity']:.3f} predicted "
            f"{layer['predicted_sparsity']:.3f} realized {layer['realized_sparsity']:.3f} recall "
            f"{layer['recall']:.4f} weighted {layer['importance_weighted_recall']:.5f}"
        )


# sweep's per-kind settings: (option's parameter, the SWEEP_KINDS setting it gives, the kinds that read it)
SWEEP_SETTINGS = (
    ("levels", "level", "svd, its ablations and threshold"),
    ("recall_targets", "recall_target", "signbit"),
    ("core_betas", "core_beta", "core"),
)


@main.command("sweep")
@click.argument("model_dir", type=INPUT_PATH)
@click.option("--calib", "calibration_files", multiple=True, required=True, help="Calibration text. Repeatable.")
@click.option("-o", "--output", "out_dir", required=True, help="Directory for the bundles and results.")
@_window_options(
    json_help="Where to write the result as JSON (default: OUTPUT/sweep.json).",
    plot_help="Where to draw the frontier as a PNG (default: OUTPUT/sweep.png).",
)
@click.option("--context", type=click.IntRange(min=2), default=256, show_default=True, help="Window length.")
@click.option(
    "--predictors",
    default=None,
    help="Comma-separated kinds (default: every kind the model's FFN serves, with svd's ablations svd-no-whiten, "
    "svd-no-bias and svd-uniform: seven for a ReLU model, each exported at every setting; for SiLU, threshold "
    "alone).",
)
@click.option("--levels", default=None, help="Sparsity levels of svd, its ablations and threshold.")
@click.option("--recall-targets", default=None, help="signbit's recall targets (default 0.999,0.99,0.95,0.9).")
@click.option("--core-betas", default=None, help="core's betas (default 0.5,0.4,0.3,0.2,0.1).")
@click.option("--calib-tokens", type=click.IntRange(min=1), default=4096, show_default=True, help="Calibration tokens.")
@click.option("--rank", type=click.IntRange(min=1), default=None, help=_RANK_HELP)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True)
@click.option("--repeats", type=click.IntRange(1, 1000), default=5, show_default=True, help="Timing runs (best of).")
@click.option(
    "--timer",
    type=click.Choice(["wall", "cpu"]),
    default="wall",
    show_default=True,
    help="Decode timing: wall clock, or process CPU time (one thread only; robust on a shared machine).",
)
@click.option("--markdown", "markdown_path", default=None, help="Also write the tables as markdown.")
@click.option("--force", is_flag=True, help="Replace an earlier sweep's bundles (OUT/bundles, as a whole).")
def sweep_command(
    model_dir,
    calibration_files,
    out_dir,
    text_files,
    backend,
    max_tokens,
    prompt_tokens,
    threads,
    no_layer_stats,
    json_path,
    plot_path,
    context,
    predictors,
    levels,
    recall_targets,
    core_betas,
    calib_tokens,
    rank,
    dtype,
    repeats,
    timer,
    markdown_path,
    force,
) -> None:
    """The quality-vs-speed frontier of every predictor kind: export, evaluate and time each setting."""
    _runs_torch_pipeline("`edge-sdk sweep`")
    from edge_sdk.eval import format_sweep_markdown
    from edge_sdk.eval import sweep as run_sweep

    kinds = None if predictors is None else tuple(kind for kind in predictors.split(",") if kind)
    if kinds == ():
        raise click.BadParameter(
            f"expected a comma-separated list of predictor kinds, found {predictors!r}", param_hint="--predictors"
        )
    repeated = sorted({kind for kind in kinds or () if kinds.count(kind) > 1})
    if repeated:
        raise click.BadParameter(
            f"{repeated[0]!r} is listed twice in {predictors!r}; each kind is swept once", param_hint="--predictors"
        )
    chosen = {}
    for name, value in (("levels", levels), ("recall_targets", recall_targets), ("core_betas", core_betas)):
        if value is not None:
            chosen[name] = _parse_levels(value, "--" + name.replace("_", "-"))
    if kinds is not None:
        from edge_sdk.eval.sweep import SWEEP_KINDS

        swept = {SWEEP_KINDS[kind].setting for kind in kinds if kind in SWEEP_KINDS}
        for name, setting, readers in SWEEP_SETTINGS:
            if name in chosen and setting not in swept:
                option = "--" + name.replace("_", "-")
                raise click.UsageError(f"{option}: only {readers} read it, and --predictors {predictors} sweeps none")
    command = "edge-sdk " + " ".join(sys.argv[1:])
    with _phase_progress() as on_progress:
        result = run_sweep(
            model_dir,
            calibration_files,
            text_files,
            out_dir,
            predictors=kinds,
            **chosen,
            backend="cpu" if backend == "auto" else backend,
            calibration_tokens=calib_tokens,
            rank=rank,
            dtype=dtype,
            max_tokens=max_tokens,
            context=context,
            prompt_tokens=prompt_tokens,
            speed_repeats=repeats,
            timer=timer,
            threads=threads,
            layer_stats=not no_layer_stats,
            force=force,
            json_path=json_path,
            plot_path=plot_path,
            markdown_path=markdown_path or None,
            command=command,
            on_point=lambda kind, point: click.echo(
                f"{kind} {point['setting']:g}: perplexity {point['perplexity_change_percent']:+.2f}%, top-1 agreement "
                f"{point['top1_agreement']:.4f}, decode speedup {point['speedup']:.3f}x",
                err=True,
            ),
            on_progress=on_progress,
        )
    click.echo(format_sweep_markdown(result, command))


@main.command()
@click.argument("bundle_dir", type=INPUT_PATH)
@click.argument("archive", type=click.Path(path_type=str))
@click.option("--no-verify", is_flag=True, help="Skip checking the bundle's checksums before packing.")
@click.option("--force", is_flag=True, help="Replace an earlier edge-sdk archive at that path.")
def pack(bundle_dir: str, archive: str, no_verify: bool, force: bool) -> None:
    """Pack a bundle into one deterministic, uncompressed .tar for shipping to a device."""
    from edge_sdk.bundle.archive import pack_bundle

    click.echo(f"wrote {pack_bundle(bundle_dir, archive, verify=not no_verify, force=force)}")


@main.command()
@click.argument("archive", type=INPUT_PATH)
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--force", is_flag=True, help="Replace an earlier edge-sdk bundle at that path.")
def unpack(archive: str, bundle_dir: str, force: bool) -> None:
    """Unpack a bundle archive, refusing unsafe members, and verify every checksum."""
    from edge_sdk.bundle.archive import unpack_bundle

    bundle = unpack_bundle(archive, bundle_dir, force=force)
    listed = len(bundle.manifest.files)
    click.echo(f"unpacked and verified {bundle.path} (manifest.json and the {listed} files it lists)")
