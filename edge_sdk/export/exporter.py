"""`edge-sdk export`: checkpoint + calibration text -> bundle directory, and the bundle's torch reference.

The export streams: predictors are calibrated layer by layer (sparsity/pipeline.py), then each model
tensor is read from the memory-mapped checkpoint, cast, and appended to weights.safetensors before
the next is read, so the model is never in memory twice. Everything is written to a temporary
directory next to the target and renamed at the end: a failed or interrupted export leaves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from edge_sdk import __version__, outputs, predictors, quant
from edge_sdk.bundle import Bundle
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle.layout import (
    MINS_SUFFIX,
    QUANTIZED_DTYPES,
    SCALES_SUFFIX,
    WIDER_DOWN_DTYPES,
    WIDER_HEAD_DTYPES,
    is_quantized_matrix,
    model_tensor_names,
    model_tensors,
    quantized_part,
)
from edge_sdk.bundle.manifest import manifest_digest
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export import graph as graphs
from edge_sdk.export.quantized_checkpoint import QUANT_METHODS, QuantizedCheckpoint, search_awq_scales
from edge_sdk.export.safetensors_writer import TORCH_TO_SAFETENSORS, SafetensorsWriter, TensorSpec
from edge_sdk.formats.files import sha256_of
from edge_sdk.model.checkpoint import Checkpoint, open_checkpoint
from edge_sdk.model.decoder import rope_tables
from edge_sdk.model.gguf_checkpoint import GgufCheckpoint
from edge_sdk.model.loader import parse_dtype
from edge_sdk.sparsity.pipeline import calibrate_model, fitting_chunks
from edge_sdk.sparsity.report import write_report_plot
from edge_sdk.sparsity.settings import CalibrationSettings, validate_settings

DEFAULT_MAX_SEQ_LEN = 2048


class ExportError(EdgeSdkError):
    """Export settings or the output location are not usable."""


@dataclass(frozen=True)
class ExportSettings:
    """What to export; the predictor is the calibration's (`none`: no predictor, nothing calibrated)."""

    dtype: str = "fp32"  # fp16 | bf16 | fp32 | int8 | int4: how model weights are stored in the bundle
    group_size: int = quant.DEFAULT_GROUP_SIZE  # int8 / int4: values per fp16 scale along each row
    quant_method: str = "rtn"  # int8 / int4: "rtn", or "awq" (activation-aware scales folded in first)
    # the LM head's dtype (None: dtype's): "int8" with dtype "int4" stores the head (a tied model's embedding, which
    # is its head) as int8 codes with fp16 scales of group_size (bundle format version 4)
    head_dtype: str | None = None
    # int4: "symmetric" (code * scale, Q4_0's grid) or "asymmetric" ((code + 8) * scale + min per group, Q4_1's grid,
    # bundle format version 6)
    int4_scheme: str = "symmetric"
    # the FFN down projections' dtype (None: dtype's): "int8" with dtype "int4" stores them as int8 codes with fp16
    # scales of group_size, still neuron-major (bundle format version 7)
    down_dtype: str | None = None
    max_seq_len: int | None = None  # None: min(model's max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)

    @property
    def predictor(self) -> str:
        return self.calibration.predictor

    @property
    def wider_head_dtype(self) -> str | None:
        """The head's dtype where it differs from the bundle's (what the manifest records as head_dtype), else None."""
        return None if self.head_dtype in (None, self.dtype) else self.head_dtype

    @property
    def wider_down_dtype(self) -> str | None:
        """The down projections' dtype where it differs from the bundle's (the manifest's down_dtype), else None."""
        return None if self.down_dtype in (None, self.dtype) else self.down_dtype

    @property
    def asymmetric(self) -> bool:
        """Whether the int4 matrices are stored with group minimums."""
        return self.dtype == "int4" and self.int4_scheme == "asymmetric"


def default_int4_scheme(checkpoint: Checkpoint | GgufCheckpoint) -> str:
    """The int4 scheme that keeps a checkpoint's own grid: "asymmetric" for a GGUF whose FFN weights carry per-block
    minimums (Q4_1, Q4_K, ...: symmetric int4 re-rounds them, +31% held-out perplexity on SmolLM2-135M's Q4_1
    where asymmetric int4 reproduces every value), "symmetric" otherwise."""
    return "asymmetric" if isinstance(checkpoint, GgufCheckpoint) and checkpoint.asymmetric_grid else "symmetric"


def default_head_dtype(checkpoint: Checkpoint | GgufCheckpoint, dtype: str) -> str:
    """The LM head's storage for --head-dtype auto (GgufCheckpoint.int4_head_dtype): int8 in an int4 bundle of a GGUF
    whose FFN rows have 4 bits or fewer and its head more, --dtype otherwise (an int4 bundle of a float checkpoint is a
    choice of size, not a copy of a file). SmolLM2-135M's Q4_1 file has a Q8_0 embedding, which int8 at groups of 32
    keeps to the bit; with int8 down rows its int4 bundle is +6.2% over the fp16 bundle's held-out perplexity on code
    with an int4 head, +0.7% with this one (benchmarks/README.md section 9)."""
    return checkpoint.int4_head_dtype if dtype == "int4" and isinstance(checkpoint, GgufCheckpoint) else dtype


def default_down_dtype(checkpoint: Checkpoint | GgufCheckpoint, dtype: str) -> str:
    """The FFN down projections' storage for --down-dtype auto (GgufCheckpoint.int4_down_dtype): int8 in an int4
    bundle of a GGUF whose FFN rows have 4 bits or fewer, --dtype otherwise. Such a file groups ffn_down's codes along
    the neurons, a bundle's neuron-major down rows along d, so int4 rows would round the file's values again
    (SmolLM2-135M's Q4_1 file, with the int8 head: +7.1% over the fp16 bundle's held-out perplexity on code with int4
    down rows, +0.7% with int8 rows)."""
    return checkpoint.int4_down_dtype if dtype == "int4" and isinstance(checkpoint, GgufCheckpoint) else dtype


def _model_tensor_spec(
    checkpoint: Checkpoint | GgufCheckpoint, name: str, hf_name: str, dtype: torch.dtype
) -> TensorSpec:
    shape = checkpoint.expected_shapes[hf_name]
    stored = dtype if len(shape) > 1 else torch.float32  # norms and biases stay fp32: tiny, and precise
    if name.endswith("_t"):
        shape = shape[::-1]
    return TensorSpec(name, stored, tuple(shape))


def _model_tensor_specs(checkpoint: Checkpoint | GgufCheckpoint, settings: ExportSettings) -> list[TensorSpec]:
    """Every model tensor the bundle stores (quantized bundles: codes and scales per matrix, layout.py)."""
    if settings.dtype not in QUANTIZED_DTYPES:
        dtype = parse_dtype(settings.dtype)
        return [_model_tensor_spec(checkpoint, n, hf, dtype) for n, hf in model_tensor_names(checkpoint.config)]
    torch_dtypes = {"F32": torch.float32, "F16": torch.float16, "I8": torch.int8, "U8": torch.uint8}
    expected = model_tensors(
        checkpoint.config,
        settings.dtype,
        2,
        settings.group_size,
        settings.wider_head_dtype,
        settings.asymmetric,
        settings.wider_down_dtype,
    )
    return [
        TensorSpec(name, torch_dtypes[want.dtype], want.shape)
        for name, want in expected.items()
        if not name.startswith("rope.")
    ]


class _QuantizedTensors:
    """The codes (name), the scales (name.scales) or the minimums (name.mins) of the model's quantized matrices
    (neuron-major for the down projection). The writer takes every F16 tensor before the codes (largest elements
    first), a matrix's scales and minimums one after the other: the last matrix quantized serves both, so an
    asymmetric matrix is quantized twice, not three times, and only one matrix is held."""

    def __init__(self, model: QuantizedCheckpoint):
        self.model = model
        self.last: tuple[str, quant.QuantizedMatrix] | None = None

    def tensor(self, name: str, hf_name: str) -> torch.Tensor:
        matrix_name, part = quantized_part(name)
        if self.last is None or self.last[0] != matrix_name:
            self.last = matrix_name, self.model.quantized_matrix(hf_name, neuron_major=matrix_name.endswith("_t"))
        matrix = self.last[1]
        array = {"": matrix.data, SCALES_SUFFIX: matrix.scales, MINS_SUFFIX: matrix.mins}[part]
        return torch.from_numpy(np.ascontiguousarray(array))


def check_output(
    out_dir: str | Path, force: bool, model_dir: str | Path, inputs: Sequence[str | Path] = ()
) -> outputs.Target:
    """The bundle's output location, checked before any work starts (edge_sdk.outputs: --force replaces only an
    earlier edge-sdk bundle, never the model, the current directory or anything else)."""
    return outputs.check_model_output(out_dir, outputs.BUNDLE, replace=force, model_dir=model_dir, input_files=inputs)


def _check_wider_dtype(
    option: str, value: str | None, dtype: str, wider: dict[str, tuple[str, ...]], what: str
) -> None:
    """value (an option storing some matrices in their own dtype) must be None, dtype, or one of wider[dtype]."""
    if value not in (None, dtype, *wider.get(dtype, ())):
        allowed = ", ".join(f"{choice} with --dtype {base}" for base, choices in wider.items() for choice in choices)
        raise ExportError(
            f"{option} {value} is not allowed with --dtype {dtype}: {what} may be stored wider than the other "
            f"matrices only as {allowed} (or in the bundle's own dtype)"
        )


def _validate(checkpoint: Checkpoint | GgufCheckpoint, settings: ExportSettings) -> int:
    if settings.predictor not in predictors.KINDS:
        raise ExportError(f"predictor {settings.predictor!r} is not one of {', '.join(predictors.KINDS)}")
    _check_wider_dtype("--head-dtype", settings.head_dtype, settings.dtype, WIDER_HEAD_DTYPES, "the LM head")
    _check_wider_dtype(
        "--down-dtype", settings.down_dtype, settings.dtype, WIDER_DOWN_DTYPES, "the FFN down projections"
    )
    if settings.int4_scheme not in quant.INT4_SCHEMES:
        schemes = ", ".join(quant.INT4_SCHEMES)
        raise ExportError(f"--int4-scheme must be one of {schemes}, found {settings.int4_scheme!r}")
    if settings.int4_scheme != "symmetric" and settings.dtype != "int4":
        raise ExportError(
            f"--int4-scheme {settings.int4_scheme} needs --dtype int4, found --dtype {settings.dtype} (only int4 "
            f"matrices have group minimums)"
        )
    if settings.dtype in QUANTIZED_DTYPES:
        if settings.quant_method not in QUANT_METHODS:
            raise ExportError(
                f"--quant-method must be one of {', '.join(QUANT_METHODS)}, found {settings.quant_method!r}"
            )
        config = checkpoint.config
        for what, cols in (
            ("hidden_size", config.hidden_size),
            ("num_heads * head_dim", config.num_heads * config.head_dim),
        ):
            if settings.group_size not in quant.GROUP_SIZES or cols % settings.group_size:
                raise ExportError(
                    f"--group-size must be one of {', '.join(map(str, quant.GROUP_SIZES))} dividing the model's "
                    f"{what} {cols} for --dtype {settings.dtype}, found {settings.group_size}"
                )
    else:
        parse_dtype(settings.dtype)
        if settings.quant_method != "rtn":
            raise ExportError(
                f"--quant-method {settings.quant_method} chooses how int8 / int4 weights are rounded; --dtype "
                f"{settings.dtype} keeps them unquantized: give --dtype int8 or int4, or drop --quant-method"
            )
    if settings.calibration.kind.calibrated:
        validate_settings(checkpoint.config, settings.calibration)
    limit = checkpoint.config.max_position_embeddings
    max_seq_len = settings.max_seq_len or min(limit, DEFAULT_MAX_SEQ_LEN)
    if not 2 <= max_seq_len <= limit:
        raise ExportError(
            f"max sequence length must be in [2, {limit}] (the model's max_position_embeddings), found {max_seq_len}"
        )
    return max_seq_len


def export_bundle(
    source: str | Path | Checkpoint | GgufCheckpoint,
    out_dir: str | Path,
    settings: ExportSettings,
    calibration_files: Sequence[str | Path] = (),
    evaluation_files: Sequence[str | Path] = (),
    force: bool = False,
    on_layer_calibrated: Callable[[int], None] | None = None,
    on_tensor_written: Callable[[str], None] | None = None,
    on_layer_validated: Callable[[int], None] | None = None,
) -> Bundle:
    """Export a checkpoint directory or a GGUF file (a path, or the checkpoint opened from it) to a bundle at
    out_dir; returns the opened bundle.

    force: replace an earlier edge-sdk bundle at out_dir (nothing else is ever replaced)."""
    opened = not isinstance(source, (str, Path))
    model_dir = source.model_dir if opened else source
    target = check_output(out_dir, force, model_dir, (*calibration_files, *evaluation_files))
    # opening a GGUF parses its whole metadata (the vocabulary as numpy arrays): a caller that opened it passes it on
    checkpoint = source if opened else open_checkpoint(model_dir)
    config = checkpoint.config
    max_seq_len = _validate(checkpoint, settings)
    # a bundle carries a tokenizer its readers load; every runtime stops on the manifest's eos ids, so they include
    # the tokenizer config's eos token (chat models often stop on several)
    eos_token_ids = checkpoint.tokenizer().eos_token_ids
    calibration = settings.calibration
    kind = calibration.kind
    if kind.calibrated and not calibration_files:
        raise ExportError(
            f"predictor '{settings.predictor}' needs calibration text: pass --calib FILE, or --predictor none for a "
            "bundle without a predictor (dense decoding only)"
        )
    quantized = settings.dtype in QUANTIZED_DTYPES
    if quantized and settings.quant_method == "awq" and not calibration_files:
        raise ExportError("--quant-method awq searches its scales on calibration text: pass --calib FILE")

    # what the bundle will hold: predictors are fitted and the default level validated on it
    model, quantization = checkpoint, None
    if quantized:
        model, quantization = _quantized_model(checkpoint, settings, calibration, calibration_files)
    predictor_tensors: dict[str, torch.Tensor] = {}
    report: dict[str, Any] | None = None
    factor_dtype = bundle_format.predictor_factor_dtype(settings.dtype, bundle_format.FORMAT_VERSION)
    if kind.calibrated:
        result = calibrate_model(
            model,
            calibration,
            calibration_files,
            evaluation_files,
            on_layer_calibrated,
            on_layer_validated,
            factor_dtype=factor_dtype,
            unquantized=checkpoint if quantized else None,
        )
        predictor_tensors, report = result.tensors, result.report
        if quantization is not None:
            report["quantization"] = quantization

    cos, sin = rope_tables(config.rope, config.head_dim, max_seq_len)
    extra_tensors = {"rope.cos": cos, "rope.sin": sin} | predictor_tensors
    names = model_tensor_names(config)
    specs = _model_tensor_specs(checkpoint, settings)
    specs += [TensorSpec(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in extra_tensors.items()]
    hf_names = dict(names)
    shapes = {spec.name: spec.shape for spec in specs}
    quantized_names = {
        name for name, _ in names if quantized and is_quantized_matrix(name, shapes[name], config.tie_word_embeddings)
    }

    with outputs.staged_output(target) as staging:
        writer = SafetensorsWriter(
            staging / bundle_format.WEIGHTS_FILE, specs, metadata={"format": "pt", "producer": "edge-sdk"}
        )
        quantized_tensors = _QuantizedTensors(model) if quantized else None
        with writer:
            for spec in writer.order:
                if spec.name in extra_tensors:
                    tensor = extra_tensors[spec.name]
                elif (matrix_name := quantized_part(spec.name)[0]) in quantized_names:
                    tensor = quantized_tensors.tensor(spec.name, hf_names[matrix_name])
                else:
                    tensor = model.tensor(hf_names[spec.name], spec.dtype)
                    if spec.name.endswith("_t"):
                        tensor = tensor.T.contiguous()
                writer.write(spec.name, tensor)
                del tensor
                if on_tensor_written is not None:
                    on_tensor_written(spec.name)
        external = {
            spec.name: graphs.ExternalTensor(
                spec.name, TORCH_TO_SAFETENSORS[spec.dtype], spec.shape, *writer.absolute_offset(spec.name)
            )
            for spec in specs
        }
        graph_spec = graphs.GraphSpec(
            config,
            bundle_format.WEIGHTS_FILE,
            external,
            settings.predictor,
            _layer_attributes(kind, predictor_tensors, config.num_layers),
            quant_format=settings.dtype if quantized else None,
            group_size=settings.group_size if quantized else None,
        )
        for file, decode in ((bundle_format.PREFILL_GRAPH, False), (bundle_format.DECODE_GRAPH, True)):
            model = graphs.build_graph(graph_spec, decode)
            onnx.save(model, str(staging / file))
            onnx.checker.check_model(str(staging / file), full_check=True)
        for file, contents in checkpoint.tokenizer_files().items():
            (staging / file).write_bytes(contents)
        if report is not None:
            (staging / bundle_format.REPORT_FILE).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
            write_report_plot(report, staging / bundle_format.PLOT_FILE)
        manifest = _manifest(
            replace(config, eos_token_ids=eos_token_ids),
            settings,
            calibration,
            max_seq_len,
            specs,
            report,
            staging,
            half_factors=factor_dtype == "F16" and any(tensor.factor for tensor in kind.tensors),
        )
        (staging / bundle_format.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
        Bundle.open(staging, verify_checksums=False)  # never publish a bundle the readers would refuse
    return Bundle.open(target.path, verify_checksums=False)


def _layer_attributes(
    kind: predictors.PredictorKind, predictor_tensors: dict[str, torch.Tensor], n_layers: int
) -> tuple[dict[str, float], ...]:
    """Per layer, the node attributes its predictor's graph reads from the fitted tensors (graph_attributes)."""
    return tuple(
        kind.graph_attributes(lambda name, i=layer: predictor_tensors[predictors.tensor_name(i, kind.name, name)])
        for layer in range(n_layers)
    )


def _quantized_model(
    checkpoint: Checkpoint | GgufCheckpoint,
    settings: ExportSettings,
    calibration: CalibrationSettings,
    calibration_files: Sequence[str | Path],
) -> tuple[QuantizedCheckpoint, dict[str, Any]]:
    """The checkpoint as the int8 / int4 bundle holds it, with AWQ scales searched on the calibration tokens the
    predictors are fitted on (never the validation tokens) when asked; and what the report says about it."""
    described: dict[str, Any] = {
        "format": settings.dtype,
        "group_size": settings.group_size,
        "method": settings.quant_method,
    }
    scales = None
    if settings.quant_method == "awq":
        chunks, _ = fitting_chunks(checkpoint, calibration, calibration_files)
        scales, described["awq_layers"] = search_awq_scales(
            checkpoint,
            chunks,
            settings.dtype,
            settings.group_size,
            scale_ffn_hidden=not calibration.kind.ranks_by_up,
            asymmetric=settings.asymmetric,
            down_format=settings.wider_down_dtype,
        )
    if settings.wider_head_dtype is not None:
        described["head_format"] = settings.wider_head_dtype
    if settings.wider_down_dtype is not None:
        described["down_format"] = settings.wider_down_dtype
    if settings.dtype == "int4":
        described["int4_scheme"] = settings.int4_scheme
    quantized = QuantizedCheckpoint(
        checkpoint,
        settings.dtype,
        settings.group_size,
        scales,
        settings.wider_head_dtype,
        settings.asymmetric,
        settings.wider_down_dtype,
    )
    return quantized, described


def _manifest(
    config, settings, calibration, max_seq_len, specs, report, staging: Path, half_factors: bool
) -> dict[str, Any]:
    kind = calibration.kind
    levels = report["levels"] if report and kind.has_levels else []
    layers = []
    for index in range(config.num_layers):
        layer: dict[str, Any] = {"layer": index, "kind": settings.predictor}
        if report is not None:
            measured = report["layers"][index]
            for key in (
                "rank",
                "alpha",
                "layer_level",
                "predicted_sparsity",
                "true_sparsity",
                "importance_weighted_recall",
            ):
                if key in measured:
                    layer[key] = measured[key]
            if levels:
                # this layer's own level under each model-wide level, in the order of `levels`
                layer["layer_levels"] = [measured["per_level"][f"{level:g}"]["layer_level"] for level in levels]
        layers.append(layer)
    files = {}
    for path in sorted(staging.iterdir()):
        if path.name != bundle_format.MANIFEST_FILE:
            size, digest = sha256_of(path, follow_symlinks=False)
            files[path.name] = {"size": size, "sha256": digest}
    manifest = {
        "format": bundle_format.FORMAT,
        "format_version": bundle_format.written_format_version(
            settings.dtype in QUANTIZED_DTYPES and config.tie_word_embeddings,
            settings.wider_head_dtype is not None,
            half_factors,
            settings.asymmetric,
            settings.wider_down_dtype is not None,
        ),
        "exporter": {"name": "edge-sdk", "version": __version__},
        "model": config.to_dict(),
        "dtype": settings.dtype,
        "max_seq_len": max_seq_len,
        "sparsity": {
            "predictor": settings.predictor,
            "levels": levels,
            "default_level": report["default_level"] if levels else None,
            "core_alpha": calibration.core_alpha,
            "core_beta": calibration.core_beta,
            "settings": asdict(calibration) if kind.calibrated else None,
            "layers": layers,
        },
        "graphs": {"prefill": bundle_format.PREFILL_GRAPH, "decode": bundle_format.DECODE_GRAPH},
        "tensors": {
            spec.name: {"dtype": TORCH_TO_SAFETENSORS[spec.dtype], "shape": list(spec.shape)} for spec in specs
        },
        "files": files,
    }
    if settings.dtype in QUANTIZED_DTYPES:
        manifest["group_size"] = settings.group_size
    if settings.wider_head_dtype is not None:
        manifest["head_dtype"] = settings.wider_head_dtype
    if settings.asymmetric:
        manifest["int4_scheme"] = settings.int4_scheme
    if settings.wider_down_dtype is not None:
        manifest["down_dtype"] = settings.wider_down_dtype
    manifest[bundle_format.MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    return manifest
