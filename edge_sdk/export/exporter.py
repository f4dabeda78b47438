"""`edge-sdk export`: checkpoint + calibration text -> bundle directory, and the bundle's torch reference.

The export streams: predictors are calibrated layer by layer (sparsity/pipeline.py), then each model
tensor is read from the memory-mapped checkpoint, cast, and appended to weights.safetensors before
the next is read, so the model is never in memory twice. Everything is written to a temporary
directory next to the target and renamed at the end: a failed or interrupted export leaves nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
import torch

from edge_sdk import __version__
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export import graph as graphs
from edge_sdk.export.bundle import (
    DECODE_GRAPH,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_DIGEST_FIELD,
    MANIFEST_FILE,
    PREFILL_GRAPH,
    WEIGHTS_FILE,
    Bundle,
    manifest_digest,
    sha256_file,
)
from edge_sdk.export.safetensors_writer import TORCH_TO_SAFETENSORS, SafetensorsWriter, TensorSpec
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.decoder import Decoder, rope_tables
from edge_sdk.model.loader import parse_dtype
from edge_sdk.model.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from edge_sdk.sparsity.pipeline import (
    PLOT_FILE,
    REPORT_FILE,
    CalibrationSettings,
    calibrate_model,
    validate_settings,
)
from edge_sdk.sparsity.report import write_report_plot
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseDecoder, SparseFeedForward
from edge_sdk.staging import staged_directory

EXPORT_PREDICTORS = ("svd", "signbit", "core", "threshold", "none")
DEFAULT_MAX_SEQ_LEN = 2048


class ExportError(EdgeSdkError):
    """Export settings or the output location are not usable."""


@dataclass(frozen=True)
class ExportSettings:
    predictor: str = "svd"
    dtype: str = "fp32"  # fp16 | bf16 | fp32: how model weights are stored in the bundle
    max_seq_len: int | None = None  # None: min(model's max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)


def _model_tensor_names(checkpoint: Checkpoint) -> list[tuple[str, str]]:
    """(bundle name, checkpoint name) of every model tensor; W_down is renamed: it is stored transposed."""
    names = []
    for hf_name in checkpoint.expected_shapes:
        name = hf_name.removeprefix("model.")
        if name.endswith("mlp.down_proj.weight"):
            name += "_t"
        names.append((name, hf_name))
    return names


def _model_tensor_spec(checkpoint: Checkpoint, name: str, hf_name: str, dtype: torch.dtype) -> TensorSpec:
    shape = checkpoint.expected_shapes[hf_name]
    stored = dtype if len(shape) > 1 else torch.float32  # norms and biases stay fp32: tiny, and precise
    if name.endswith("_t"):
        shape = shape[::-1]
    return TensorSpec(name, stored, tuple(shape))


def check_output(out_dir: str | Path, force: bool) -> None:
    """Refuse to replace an existing output unless forced (checked before any work starts)."""
    if Path(out_dir).exists() and not force:
        raise ExportError(f"{out_dir}: output directory already exists (use --force to replace it)")


def _validate(checkpoint: Checkpoint, settings: ExportSettings) -> int:
    if settings.predictor not in EXPORT_PREDICTORS:
        raise ExportError(f"predictor {settings.predictor!r} is not one of {', '.join(EXPORT_PREDICTORS)}")
    parse_dtype(settings.dtype)
    if settings.predictor != "none":
        validate_settings(checkpoint.config, settings.calibration)
    max_seq_len = settings.max_seq_len or min(checkpoint.config.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    if max_seq_len < 2:
        raise ExportError(f"max sequence length must be at least 2, found {max_seq_len}")
    return max_seq_len


def export_bundle(
    model_dir: str | Path,
    out_dir: str | Path,
    settings: ExportSettings,
    calibration_files: Sequence[str | Path] = (),
    evaluation_files: Sequence[str | Path] = (),
    force: bool = False,
    on_layer_calibrated: Callable[[int], None] | None = None,
    on_tensor_written: Callable[[str], None] | None = None,
) -> Bundle:
    """Export a checkpoint to a bundle at out_dir; returns the opened (verified) bundle."""
    out_dir = Path(out_dir)
    check_output(out_dir, force)
    checkpoint = Checkpoint(model_dir)
    config = checkpoint.config
    max_seq_len = _validate(checkpoint, settings)
    if settings.predictor != "none" and not calibration_files:
        raise ExportError(f"predictor '{settings.predictor}' needs calibration text: pass --calib FILE")
    dtype = parse_dtype(settings.dtype)

    predictor_tensors: dict[str, torch.Tensor] = {}
    report: dict[str, Any] | None = None
    calibration = replace(settings.calibration, predictor=settings.predictor)
    if settings.predictor != "none":
        result = calibrate_model(checkpoint, calibration, calibration_files, evaluation_files, on_layer_calibrated)
        predictor_tensors, report = result.tensors, result.report

    cos, sin = rope_tables(config.rope, config.head_dim, max_seq_len)
    extra_tensors = {"rope.cos": cos, "rope.sin": sin} | predictor_tensors
    names = _model_tensor_names(checkpoint)
    specs = [_model_tensor_spec(checkpoint, name, hf_name, dtype) for name, hf_name in names]
    specs += [TensorSpec(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in extra_tensors.items()]
    hf_names = dict(names)

    with staged_directory(out_dir) as staging:
        writer = SafetensorsWriter(staging / WEIGHTS_FILE, specs, metadata={"format": "pt", "producer": "edge-sdk"})
        with writer:
            for spec in writer.order:
                if spec.name in extra_tensors:
                    tensor = extra_tensors[spec.name]
                else:
                    tensor = checkpoint.tensor(hf_names[spec.name], spec.dtype)
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
        signbit_alphas = tuple(
            float(predictor_tensors[f"layers.{i}.signbit.alpha"][0])
            for i in range(config.num_layers)
            if settings.predictor == "signbit"
        )
        graph_spec = graphs.GraphSpec(
            config, WEIGHTS_FILE, external, settings.predictor, calibration.core_alpha, signbit_alphas
        )
        for file, decode in ((PREFILL_GRAPH, False), (DECODE_GRAPH, True)):
            model = graphs.build_graph(graph_spec, decode)
            onnx.save(model, str(staging / file))
            onnx.checker.check_model(str(staging / file), full_check=True)
        for file in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE):
            if (checkpoint.model_dir / file).is_file():
                shutil.copyfile(checkpoint.model_dir / file, staging / file)
        if report is not None:
            (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
            write_report_plot(report, staging / PLOT_FILE)
        manifest = _manifest(checkpoint, settings, calibration, max_seq_len, specs, report, staging)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return Bundle.open(out_dir, verify_checksums=False)


def _manifest(checkpoint, settings, calibration, max_seq_len, specs, report, staging: Path) -> dict[str, Any]:
    config = checkpoint.config
    levels = report["levels"] if report and settings.predictor in ("svd", "threshold") else []
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
    files = {
        path.name: {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(staging.iterdir())
        if path.name != MANIFEST_FILE
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
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
            "settings": asdict(calibration) if settings.predictor != "none" else None,
            "layers": layers,
        },
        "graphs": {"prefill": PREFILL_GRAPH, "decode": DECODE_GRAPH},
        "tensors": {
            spec.name: {"dtype": TORCH_TO_SAFETENSORS[spec.dtype], "shape": list(spec.shape)} for spec in specs
        },
        "files": files,
    }
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    return manifest


def _is_predictor_tensor(name: str) -> bool:
    """layers.{i}.{kind}.{tensor} for a predictor kind, as opposed to the model's own tensors."""
    parts = name.split(".")
    return len(parts) > 3 and parts[0] == "layers" and parts[2] in EXPORT_PREDICTORS


def load_reference_decoder(
    bundle: Bundle,
    dtype: torch.dtype = torch.float32,
    ffn_class: Callable[..., SparseFeedForward] = SparseFeedForward,
    ffn_as_stored: bool = False,
) -> SparseDecoder:
    """The torch reference of a bundle: its weights in the reference decoder with sparse FFNs.

    ffn_as_stored keeps the FFN matrices as the memory-mapped tensors of weights.safetensors (no cast, no
    copy) for FFN implementations that read fp16 directly; ffn_class picks that implementation."""
    config = bundle.config
    with torch.device("meta"):
        decoder = Decoder(config)
    for name in bundle.manifest["tensors"]:
        if name.startswith("rope.") or _is_predictor_tensor(name):
            continue
        tensor = bundle.tensor(name)
        is_ffn_matrix = ".mlp." in name
        if not (ffn_as_stored and is_ffn_matrix):
            tensor = tensor.to(dtype)
        target_name = name
        if name.endswith("down_proj.weight_t"):
            tensor, target_name = tensor.T, name.removesuffix("_t")
        *path, leaf = target_name.split(".")
        module = decoder
        for part in path:
            module = getattr(module, part)
        setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=False))
    if config.tie_word_embeddings:
        decoder.lm_head.weight = decoder.embed_tokens.weight
    decoder.eval()
    decoder.setup_cache(bundle.manifest["max_seq_len"])
    # the bundle's RoPE tables are what every backend uses, so the reference uses them too
    decoder.rope_cos, decoder.rope_sin = bundle.tensor("rope.cos"), bundle.tensor("rope.sin")
    model = SparseDecoder(decoder, bundle_predictors(bundle), ffn_class)
    if bundle.sparsity.levels:
        model.configure(level_index=bundle.sparsity.level_index(None))
    return model


def bundle_predictors(bundle: Bundle) -> list[LayerPredictor]:
    """Each layer's predictor as the bundle stores it (tensors memory-mapped, names without `layers.{i}.`)."""
    sparsity = bundle.sparsity
    predictors = []
    for index in range(bundle.config.num_layers):
        prefix = f"layers.{index}."
        tensors = {
            name.removeprefix(prefix): bundle.tensor(name)
            for name in bundle.manifest["tensors"]
            if name.startswith(prefix) and _is_predictor_tensor(name)
        }
        predictors.append(LayerPredictor(sparsity.predictor, tensors, sparsity.core_alpha, sparsity.core_beta))
    return predictors
