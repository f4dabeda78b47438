"""The `edge-sdk` command line: click commands only; the work happens in the library."""

from __future__ import annotations

import json
import sys

import click

from edge_sdk import __version__
from edge_sdk.errors import EdgeSdkError

USAGE_ERROR = 2


class EdgeSdkGroup(click.Group):
    """Turns library errors into one line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EdgeSdkError as error:
            click.echo(f"edge-sdk: error: {error}", err=True)
            ctx.exit(USAGE_ERROR)


def _print_table(rows: dict, indent: str = "") -> None:
    width = max((len(str(k)) for k in rows), default=0)
    for key, value in rows.items():
        if isinstance(value, dict):
            click.echo(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            click.echo(f"{indent}{str(key).ljust(width)}  {value}")


_SPARSITY_HELP = (
    "Default operating level: target fraction of neurons predicted inactive over all layers (default: the most "
    "aggressive calibrated level whose perplexity on validation tokens of the calibration text, which the "
    "predictors are not fitted on, stays within --ppl-budget of dense)."
)
_PPL_BUDGET_HELP = "Choosing the default level: allowed perplexity increase over dense, in percent."
_LEVEL_ALLOCATION_HELP = (
    "How a level's sparsity is spread over the layers: 'importance' gives each layer the most it can take while "
    "every layer misses the same share of its FFN output's importance; 'uniform' gives every layer the level."
)
_level_allocation_option = click.option(
    "--level-allocation",
    type=click.Choice(["importance", "uniform"]),
    default="importance",
    show_default=True,
    help=_LEVEL_ALLOCATION_HELP,
)
_VALIDATION_TOKENS_HELP = "Choosing the default level: most calibration-text tokens to validate on, after --tokens."


@click.group(cls=EdgeSdkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edge-sdk")
def main() -> None:
    """Deploy activation-sparse LLMs to edge devices."""


@main.command()
@click.argument("model_dir", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(model_dir: str, as_json: bool) -> None:
    """Validate a Hugging Face checkpoint and show its architecture."""
    from edge_sdk.model.summary import describe_checkpoint

    summary = describe_checkpoint(model_dir)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    summary["parameters"] = f"{summary['parameters']:,}"
    _print_table(summary)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(as_json: bool) -> None:
    """Report versions, native libraries and which backends can run here."""
    from edge_sdk.runtime.doctor import diagnose

    report = diagnose()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    versions = {k: v or "not installed" for k, v in report["versions"].items()}
    _print_table({"versions": versions, "native libraries": report["native"]})
    click.echo("backends:")
    for name, status in report["backends"].items():
        state = ("available: " if status["available"] else "not available: ") + status["reason"]
        click.echo(f"  {name.ljust(8)}  {state}")


def _parse_levels(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers such as 0.5,0.7,0.9, found {text!r}") from None


def _default_level_text(report: dict) -> str:
    """One line on the default operating level: given, or chosen on validation perplexity (and how)."""
    level, choice = report["default_level"], report["default_level_choice"]
    if choice["method"] != "validation perplexity":
        return f"default level {level:g} ({choice['method']}{': ' + choice['reason'] if 'reason' in choice else ''})"
    changes = ", ".join(f"{key} {change:+.2f}%" for key, change in choice["perplexity_change_percent"].items())
    verdict = "within" if choice["within_budget"] else "no level within"
    hint = "" if choice["within_budget"] else "; more calibration tokens, a higher rank or milder levels may help"
    return (
        f"default level {level:g}: {verdict} the {choice['budget_percent']:g}% perplexity budget on "
        f"{choice['scored_tokens']} validation tokens (dense {choice['dense_perplexity']:.3f}; {changes}){hint}"
    )


@main.command()
@click.argument("model_dir", type=click.Path(path_type=str))
@click.option(
    "--calib",
    "calibration_files",
    multiple=True,
    required=True,
    help="Calibration text: plain text or JSON lines with a 'text' field. Repeatable.",
)
@click.option(
    "--eval",
    "evaluation_files",
    multiple=True,
    help="Held-out text to measure the predictors on (default: the calibration text). Repeatable.",
)
@click.option(
    "--predictor", type=click.Choice(["svd", "signbit", "core", "threshold"]), default="svd", show_default=True
)
@click.option(
    "--rank",
    type=int,
    default=None,
    help="SVD predictor rank for every layer (default: per layer, from ~2% of D doubling until the layer's "
    "importance-weighted recall on the calibration tokens reaches 0.998).",
)
@click.option("--sparsity", type=float, default=None, help=_SPARSITY_HELP)
@click.option("--ppl-budget", type=float, default=0.5, show_default=True, help=_PPL_BUDGET_HELP)
@click.option("--validation-tokens", type=int, default=2048, show_default=True, help=_VALIDATION_TOKENS_HELP)
@click.option("--levels", default=None, help="Comma-separated sparsity levels to calibrate (default 0.3,...,0.9).")
@_level_allocation_option
@click.option("--no-whiten", is_flag=True, help="Naive SVD of W_gate (ablation).")
@click.option(
    "--no-bias-calibration", is_flag=True, help="One global threshold instead of per-neuron biases (ablation)."
)
@click.option("--recall-target", type=float, default=0.99, show_default=True, help="signbit: per-layer recall.")
@click.option("--tokens", "max_tokens", type=int, default=20000, show_default=True, help="Calibration tokens.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=str))
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
def calibrate(
    model_dir,
    calibration_files,
    evaluation_files,
    predictor,
    rank,
    sparsity,
    ppl_budget,
    validation_tokens,
    levels,
    level_allocation,
    no_whiten,
    no_bias_calibration,
    recall_target,
    max_tokens,
    out_dir,
    force,
) -> None:
    """Build sparsity predictors from calibration text; write predictors.safetensors and a report."""
    from tqdm import tqdm

    from edge_sdk.model.checkpoint import Checkpoint
    from edge_sdk.sparsity.pipeline import (
        DEFAULT_LEVELS,
        CalibrationSettings,
        calibrate_model,
        check_output_dir,
        validate_settings,
        write_calibration,
    )

    check_output_dir(out_dir, force)
    checkpoint = Checkpoint(model_dir)
    settings = CalibrationSettings(
        predictor=predictor,
        rank=rank,
        sparsity=sparsity,
        ppl_budget=ppl_budget,
        validation_tokens=validation_tokens,
        levels=_parse_levels(levels) or DEFAULT_LEVELS,
        level_allocation=level_allocation,
        whiten=not no_whiten,
        calibrate_bias=not no_bias_calibration,
        recall_target=recall_target,
        max_tokens=max_tokens,
    )
    validate_settings(checkpoint.config, settings)
    with tqdm(
        total=checkpoint.config.num_layers,
        desc="calibrating layers",
        unit="layer",
        file=sys.stderr,
    ) as bar:
        result = calibrate_model(checkpoint, settings, calibration_files, evaluation_files, lambda _: bar.update())
    written = write_calibration(result, out_dir, force=force)
    click.echo(f"{'layer':>5}  {'true':>6}  {'pred':>6}  {'real':>6}  {'recall':>7}  {'w-recall':>8}")
    for layer in result.report["layers"]:
        click.echo(
            f"{layer['layer']:>5}  {layer['true_sparsity']:6.3f}  {layer['predicted_sparsity']:6.3f}  "
            f"{layer['realized_sparsity']:6.3f}  {layer['recall']:7.4f}  {layer['importance_weighted_recall']:8.5f}"
        )
    click.echo(_default_level_text(result.report))
    click.echo(
        f"wrote {written}/predictors.safetensors, report.json, report.png "
        f"(metrics on {result.report['evaluated_on']} text at sparsity {result.report['default_level']:g})"
    )


@main.command()
@click.argument("model_dir", type=click.Path(path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=str), help="Bundle directory.")
@click.option("--calib", "calibration_files", multiple=True, help="Calibration text (plain or JSON lines). Repeatable.")
@click.option("--eval", "evaluation_files", multiple=True, help="Held-out text for the report. Repeatable.")
@click.option(
    "--predictor",
    type=click.Choice(["svd", "signbit", "core", "threshold", "none"]),
    default="svd",
    show_default=True,
)
@click.option(
    "--rank",
    type=int,
    default=None,
    help="SVD predictor rank for every layer (default: per layer, from ~2% of D doubling until the layer's "
    "importance-weighted recall on the calibration tokens reaches 0.998).",
)
@click.option("--sparsity", type=float, default=None, help=_SPARSITY_HELP)
@click.option("--ppl-budget", type=float, default=0.5, show_default=True, help=_PPL_BUDGET_HELP)
@click.option("--validation-tokens", type=int, default=2048, show_default=True, help=_VALIDATION_TOKENS_HELP)
@click.option("--levels", default=None, help="Comma-separated sparsity levels to calibrate (default 0.3,...,0.9).")
@_level_allocation_option
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "fp32"]), default="fp16", show_default=True)
@click.option("--max-seq-len", type=int, default=None, help="Longest sequence the bundle serves.")
@click.option("--tokens", "max_tokens", type=int, default=20000, show_default=True, help="Calibration tokens.")
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
def export(
    model_dir,
    out_dir,
    calibration_files,
    evaluation_files,
    predictor,
    rank,
    sparsity,
    ppl_budget,
    validation_tokens,
    levels,
    level_allocation,
    dtype,
    max_seq_len,
    max_tokens,
    force,
) -> None:
    """Export a checkpoint and its predictors to a bundle (ONNX + weights + tokenizer + manifest)."""
    from tqdm import tqdm

    from edge_sdk.export.exporter import ExportSettings, check_output, export_bundle
    from edge_sdk.model.config import load_config
    from edge_sdk.sparsity.pipeline import DEFAULT_LEVELS, CalibrationSettings

    check_output(out_dir, force)
    config = load_config(model_dir)
    calibration = CalibrationSettings(
        predictor=predictor if predictor != "none" else "svd",
        rank=rank,
        sparsity=sparsity,
        ppl_budget=ppl_budget,
        validation_tokens=validation_tokens,
        levels=_parse_levels(levels) or DEFAULT_LEVELS,
        level_allocation=level_allocation,
        max_tokens=max_tokens,
    )
    settings = ExportSettings(predictor=predictor, dtype=dtype, max_seq_len=max_seq_len, calibration=calibration)
    calibrating = tqdm(
        total=config.num_layers, desc="calibrating", unit="layer", file=sys.stderr, disable=predictor == "none"
    )
    writing = tqdm(desc="writing tensors", unit="tensor", file=sys.stderr)
    with calibrating, writing:
        bundle = export_bundle(
            model_dir,
            out_dir,
            settings,
            calibration_files,
            evaluation_files,
            force,
            on_layer_calibrated=lambda _: calibrating.update(),
            on_tensor_written=lambda _: writing.update(),
        )
    click.echo(f"bundle {bundle.path}")
    for name, entry in bundle.manifest["files"].items():
        click.echo(f"  {name:<24} {entry['size'] / 1e6:10.2f} MB")
    if bundle.sparsity.predictor != "none":
        click.echo(f"predictor {bundle.sparsity.predictor}")
        report = json.loads((bundle.path / "report.json").read_text())
        click.echo(_default_level_text(report))
        for layer in bundle.sparsity.layers:
            click.echo(f"  layer {layer['layer']:>3}: predicted sparsity {layer.get('predicted_sparsity', 0):.3f}")
        click.echo(f"report: {bundle.path / 'report.json'} and report.png")


@main.command()
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--steps", type=int, default=8, show_default=True, help="Greedy decode steps to compare.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def verify(bundle_dir: str, steps: int, as_json: bool) -> None:
    """Check a bundle's files and checksums, then ONNX Runtime against the torch reference."""
    from edge_sdk.export.verify import verify_bundle

    result = verify_bundle(bundle_dir, decode_steps=steps)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _print_table({k: v for k, v in result.items() if k != "text"})
    click.echo(f"greedy continuation: {result['text']!r}")
    click.echo("OK")


@main.command()
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--prompt", default=None, help="Prompt text (default: read standard input).")
@click.option("--backend", default="auto", show_default=True, help="auto, tensorrt, cann or cpu ($EDGE_SDK_BACKEND).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--sparsity", type=float, default=None, help="One of the bundle's calibrated levels.")
@click.option("--dense", is_flag=True, help="Decode the dense model: every FFN neuron computed (no sparsity).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the bundle's chat template.")
@click.option("--threads", type=int, default=0, help="CPU threads (default: all cores).")
def run(
    bundle_dir, prompt, backend, max_new_tokens, temperature, top_k, top_p, seed, stop, sparsity, dense, chat, threads
) -> None:
    """Generate text from a bundle: streams the continuation to stdout, timings to stderr."""
    import edge_sdk

    if prompt is None:
        prompt = sys.stdin.read()
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
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    stats = session.stats
    click.echo(
        f"prefill: {stats.prompt_tokens} tokens, {stats.prefill_tokens_per_second:.1f} tok/s; "
        f"decode: {stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s "
        f"({session.info['backend']}, sparsity {session.info['sparsity_level']}, stop: {stats.stop_reason})",
        err=True,
    )


@main.group()
def bench() -> None:
    """Benchmarks: the sparse FFN kernel, and end-to-end decoding."""


def _write_json(path: str | None, payload: dict) -> None:
    from edge_sdk.bench.record import with_machine_info

    if path:
        record = with_machine_info(payload)  # before the file is truncated: it may be a tracked result
        with open(path, "w") as handle:
            json.dump(record, handle, indent=2)
            handle.write("\n")
        click.echo(f"wrote {path}", err=True)


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
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@click.option("--threads", type=int, default=0, help="Threads for both torch and the kernel (default: all).")
@click.option("--repeats", type=int, default=20, show_default=True)
@click.option("--json", "json_path", default=None, help="Also write the rows as JSON (with the machine description).")
def bench_ffn_command(shape, sparsities, backend, mode, dtype, threads, repeats, json_path) -> None:
    """Time one decode FFN: torch dense matmul vs our dense and sparse kernels."""
    from edge_sdk.bench.ffn import bench_ffn, parse_shape
    from edge_sdk.bench.gather import bench_gather_ffn

    devices = {"cann": "npu", "torch-cpu": "cpu", "torch-cuda": "cuda"}
    try:
        d, n_neurons = parse_shape(shape)
        levels = _parse_levels(sparsities)
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
        raise click.BadParameter(str(error)) from None
    path = f", {mode}" if backend != "cpu" else ""
    click.echo(f"FFN d={d} D={n_neurons} {dtype} backend={backend}{path}")
    click.echo(f"{'sparsity':>8} {'torch ms':>9} {'dense ms':>9} {'sparse ms':>10} {'vs torch':>9} {'GB/s':>7}")
    for row in rows:
        click.echo(
            f"{row['sparsity']:8.2f} {row['dense_torch_ms']:9.2f} {row['dense_kernel_ms']:9.2f} "
            f"{row['sparse_ms']:10.2f} {row['speedup_vs_torch']:8.2f}x {row['sparse_gb_per_s']:7.1f}"
        )
    _write_json(json_path, {"benchmark": "ffn", "shape": shape, "backend": backend, "mode": mode, "rows": rows})


@bench.command("e2e")
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--backend", default="auto", show_default=True)
@click.option("--sparsity", type=float, default=None, help="A calibrated level (default: the bundle's).")
@click.option("--tokens", type=int, default=64, show_default=True, help="Decode steps per run.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--threads", type=int, default=0)
@click.option("--json", "json_path", default=None)
def bench_e2e_command(bundle_dir, backend, sparsity, tokens, repeats, threads, json_path) -> None:
    """Decode tokens/s of a bundle, dense vs sparse on the same backend."""
    from edge_sdk.bench.e2e import bench_e2e

    result = bench_e2e(bundle_dir, None if backend == "auto" else backend, sparsity, tokens, repeats, threads)
    click.echo(
        f"{result['backend']}: dense {result['dense_tokens_per_second']:.1f} tok/s, sparse "
        f"{result['sparse_tokens_per_second']:.1f} tok/s ({result['predictor']} at {result['sparsity_level']}): "
        f"{result['speedup']:.2f}x"
    )
    _write_json(json_path, {"benchmark": "e2e", **result})


@main.command()
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--cache-dir", default=None, help="Engine cache (default: $EDGE_SDK_ENGINE_CACHE or ~/.cache/edge-sdk).")
@click.option("--force", is_flag=True, help="Rebuild even when a cached engine exists.")
def build(bundle_dir: str, cache_dir: str | None, force: bool) -> None:
    """Build and cache the TensorRT engines of a bundle on this device (ahead of `edge-sdk run`)."""
    from edge_sdk.backends.tensorrt import build_engine
    from edge_sdk.export.bundle import Bundle

    Bundle.open(bundle_dir, verify_checksums=True)
    engine_dir = build_engine(bundle_dir, cache_dir=cache_dir, force=force, log=lambda line: click.echo(line, err=True))
    click.echo(f"engines cached in {engine_dir}")


@main.command("eval")
@click.argument("target", type=click.Path(path_type=str))
@click.option(
    "--sweep", is_flag=True, help="TARGET is a checkpoint directory: export and evaluate every predictor kind."
)
@click.option("--text", "text_files", multiple=True, required=True, help="Held-out text. Repeatable.")
@click.option("--backend", default="auto", show_default=True)
@click.option("--sparsity", type=float, default=None, help="A calibrated level (bundle mode; default: the bundle's).")
@click.option("--tokens", "max_tokens", type=int, default=4096, show_default=True, help="Held-out tokens to score.")
@click.option("--context", type=int, default=None, help="Window length (default: min(256, max_seq_len)).")
@click.option("--prompt-tokens", type=int, default=32, show_default=True, help="Dense prefill per window.")
@click.option("--threads", type=int, default=0, help="CPU threads (1 is often fastest for tiny models).")
@click.option("--no-layer-stats", is_flag=True, help="Skip the per-layer sparsity and recall statistics.")
@click.option("--json", "json_path", default=None)
@click.option("--plot", "plot_path", default=None)
@click.option("--calib", "calibration_files", multiple=True, help="Sweep: calibration text. Repeatable.")
@click.option("-o", "--output", "out_dir", default=None, help="Sweep: directory for bundles and results.")
@click.option("--predictors", default=None, help="Sweep: comma-separated kinds (default: all six).")
@click.option("--levels", default=None, help="Sweep: sparsity levels (default 0.3,...,0.9).")
@click.option("--calib-tokens", type=int, default=4096, show_default=True, help="Sweep: calibration tokens.")
@click.option("--markdown", "markdown_path", default=None, help="Sweep: also write the tables as markdown.")
@click.option("--force", is_flag=True, help="Sweep: replace existing bundles in the output directory.")
def eval_command(
    target,
    sweep,
    text_files,
    backend,
    sparsity,
    max_tokens,
    context,
    prompt_tokens,
    threads,
    no_layer_stats,
    json_path,
    plot_path,
    calibration_files,
    out_dir,
    predictors,
    levels,
    calib_tokens,
    markdown_path,
    force,
) -> None:
    """Held-out perplexity of sparse vs dense decoding (teacher-forced), top-1 agreement and per-layer statistics;
    with --sweep, the quality-vs-speed frontier of every predictor kind."""
    from edge_sdk.eval import EvalError, evaluate_bundle, format_sweep_markdown

    if not sweep:
        result = evaluate_bundle(
            target,
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
        )
        click.echo(
            f"{result['backend']}, {result['predictor']} at {result['sparsity_level']}: perplexity dense "
            f"{result['dense_perplexity']:.3f}, sparse {result['sparse_perplexity']:.3f} "
            f"({result['perplexity_change_percent']:+.2f}%), top-1 agreement {result['top1_agreement']:.4f} "
            f"over {result['scored_tokens']} tokens"
        )
        for layer in result.get("layers", []):
            click.echo(
                f"  layer {layer['layer']:>3}: true {layer['true_sparsity']:.3f} predicted "
                f"{layer['predicted_sparsity']:.3f} realized {layer['realized_sparsity']:.3f} recall "
                f"{layer['recall']:.4f} weighted {layer['importance_weighted_recall']:.5f}"
            )
        return
    from edge_sdk.eval import SWEEP_KINDS
    from edge_sdk.eval import sweep as run_sweep

    if not calibration_files or out_dir is None:
        raise EvalError("--sweep needs --calib FILE and -o DIR (TARGET is the checkpoint directory)")
    kinds = tuple(k for k in (predictors or ",".join(SWEEP_KINDS)).split(",") if k)
    result = run_sweep(
        target,
        calibration_files,
        text_files,
        out_dir,
        predictors=kinds,
        **({"levels": _parse_levels(levels)} if levels else {}),
        backend="cpu" if backend == "auto" else backend,
        calibration_tokens=calib_tokens,
        max_tokens=max_tokens,
        context=context or 256,
        prompt_tokens=prompt_tokens,
        threads=threads,
        layer_stats=not no_layer_stats,
        force=force,
        json_path=json_path,
        plot_path=plot_path,
        on_point=lambda kind, point: click.echo(f"{kind}: {point}", err=True),
    )
    markdown = format_sweep_markdown(result, command="edge-sdk " + " ".join(sys.argv[1:]))
    if markdown_path:
        with open(markdown_path, "w") as handle:
            handle.write(markdown)
    click.echo(markdown)


@main.command()
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.argument("archive", type=click.Path(path_type=str))
@click.option("--no-verify", is_flag=True, help="Skip checking the bundle's checksums before packing.")
def pack(bundle_dir: str, archive: str, no_verify: bool) -> None:
    """Pack a bundle into one deterministic .tar for shipping to a device."""
    from edge_sdk.export.archive import pack_bundle

    click.echo(f"wrote {pack_bundle(bundle_dir, archive, verify=not no_verify)}")


@main.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.argument("bundle_dir", type=click.Path(path_type=str))
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
def unpack(archive: str, bundle_dir: str, force: bool) -> None:
    """Unpack a bundle archive, refusing unsafe members, and verify every checksum."""
    from edge_sdk.export.archive import unpack_bundle

    bundle = unpack_bundle(archive, bundle_dir, force=force)
    click.echo(f"unpacked and verified {bundle.path} ({len(bundle.manifest['files'])} files)")
