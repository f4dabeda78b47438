"""The svd predictor's factors in F16 (bundle format version 5): stored F16 in every bundle whose weights are not
fp32 and F32 in fp32 ones, calibrated on the values stored, read by every engine, and older bundles (F32 factors)
still run. The engines' agreement on the new bundles is tests/runtime/test_golden_ids.py's (svd-fp16, svd-int8,
svd-int4 and the tied int8 / int4 bundles are F16-factor bundles); the readers' verdicts on factors of the wrong
dtype are tests/jetson/test_bundle_verdicts.py's."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from edge_sdk.bundle import Bundle
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle.check import check_bundle
from edge_sdk.bundle.manifest import BundleError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.model.activation import Activation
from edge_sdk.predictors import svd as svd_kind
from edge_sdk.sparsity.fitting import LayerActivations, LayerWeights
from edge_sdk.sparsity.settings import CalibrationSettings
from edge_sdk.sparsity.svd import SvdPredictor, with_half_factors

from ..conftest import MATRIX_LEVELS, MATRIX_MAX_SEQ_LEN, TINY_MODEL
from ..jetson.test_bundle_verdicts import edit_manifest, setting
from .test_golden_ids import ENGINES, POINTS, prompt_ids, runtime_built

SVD_BUNDLES = {"svd-fp32": "F32", "svd-fp16": "F16", "svd-int8": "F16", "svd-int4": "F16", "tied-svd-int4": "F16"}


@pytest.mark.parametrize(("name", "factor_dtype"), SVD_BUNDLES.items())
def test_factors_are_f16_unless_the_weights_are_fp32(bundle_matrix, name, factor_dtype):
    bundle = bundle_matrix[name]
    version = bundle.manifest.format_version
    assert (version == bundle_format.HALF_PREDICTOR_FACTORS_FORMAT_VERSION) == (factor_dtype == "F16")
    for layer in range(bundle.config.num_layers):
        for tensor, dtype in (("a", factor_dtype), ("b", factor_dtype), ("biases", "F32"), ("capacity", "I32")):
            assert bundle.header.tensors[f"layers.{layer}.svd.{tensor}"].dtype == dtype, (name, layer, tensor)
    report = json.loads((bundle.path / "report.json").read_text())
    assert {layer["factor_dtype"] for layer in report["layers"]} == {factor_dtype}


def test_predictors_without_factors_keep_their_format_version(bundle_matrix):
    """A bundle with nothing F16 version 5 introduced is written as before (readable by older runtimes)."""
    assert bundle_matrix["core-fp16"].manifest.format_version == bundle_format.SIGNED_INT4_FORMAT_VERSION
    assert bundle_matrix["svd-fp32"].manifest.format_version == bundle_format.SIGNED_INT4_FORMAT_VERSION


def layer_activations(d: int, n_neurons: int, tokens: int) -> tuple[LayerActivations, LayerWeights, SimpleNamespace]:
    generator = torch.Generator().manual_seed(0)
    w_gate = torch.randn(n_neurons, d, generator=generator) / d**0.5
    w_up = torch.randn(n_neurons, d, generator=generator) / d**0.5
    # calibration inputs of a large norm: whitening scales A by it and B by its inverse, fp16's range matters
    x = torch.randn(tokens, d, generator=generator) * 40
    weights = LayerWeights(w_gate, w_up, torch.randn(n_neurons, d, generator=generator))
    acts = LayerActivations.compute(x, weights, Activation("relu"))
    return acts, weights, SimpleNamespace(hidden_size=d, intermediate_size=n_neurons)  # all a fixed-rank fit reads


def test_calibration_scores_the_factors_it_stores():
    """The biases and the rank search see exactly the stored F16 factors' scores (widened to float32), so the
    calibrated recall holds for what the runtimes read."""
    acts, weights, config = layer_activations(48, 256, 1024)
    settings = CalibrationSettings(rank=8, levels=(0.5, 0.8), sparsity=0.5)
    fitted = svd_kind.KIND.fit(acts, weights, settings, config, factor_dtype="F16")
    a, b = fitted.tensors["svd.a"], fitted.tensors["svd.b"]
    assert a.dtype == b.dtype == torch.float16 and torch.isfinite(a).all() and torch.isfinite(b).all()
    stored_scores = (acts.x.float() @ b.float().T) @ a.float().T
    assert torch.equal(fitted.score(acts.x), stored_scores)
    full = svd_kind.KIND.fit(acts, weights, settings, config)
    assert full.tensors["svd.a"].dtype == torch.float32
    assert not torch.equal(fitted.tensors["svd.biases"], full.tensors["svd.biases"])  # recalibrated, not copied


def test_half_factors_are_balanced_powers_of_two_apart():
    """A scaled by 2^20 and B by 2^-20 (a whitened fit on inputs of a large norm) overflow and underflow fp16 as
    they are; balanced per rank component their product is unchanged and both fit."""
    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 4, generator=generator) * 2.0**20, torch.randn(4, 32, generator=generator) * 2.0**-20
    rounded = with_half_factors(SvdPredictor(a=a, b=b, whitened=True, regularizer=0.0))
    assert torch.isfinite(rounded.a.half()).all() and rounded.a.abs().max() < 64
    torch.testing.assert_close(rounded.a @ rounded.b, a @ b, rtol=2e-3, atol=1e-3 * float((a @ b).abs().max()))
    unbalanced = a.half().float() @ b.half().float()  # what rounding without the balance would store
    assert not torch.isfinite(unbalanced).all() or unbalanced.abs().max() == 0


@pytest.fixture(scope="module")
def version_2_bundle(tmp_path_factory):
    """svd-fp16 as edge-sdk wrote it before format version 5: F32 factors (calibrated unrounded), format_version 2."""
    calibration = CalibrationSettings(rank=16, max_tokens=2048, levels=MATRIX_LEVELS, sparsity=MATRIX_LEVELS[0])
    settings = ExportSettings(dtype="fp16", max_seq_len=MATRIX_MAX_SEQ_LEN, calibration=calibration)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bundle_format, "FORMAT_VERSION", bundle_format.QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION)
        bundle = export_bundle(
            TINY_MODEL, tmp_path_factory.mktemp("old") / "svd-fp16-v2", settings, [TINY_MODEL / "calibration.txt"]
        )
    assert bundle.manifest.format_version == bundle_format.SIGNED_INT4_FORMAT_VERSION
    assert bundle.header.tensors["layers.0.svd.a"].dtype == "F32"
    return bundle


@pytest.mark.parametrize("engine", ["onnx runtime", "cpu: C runtime", "cpu: torch engine", "cann gather path (cpu)"])
def test_a_bundle_of_an_older_format_version_still_runs(version_2_bundle, engine):
    if engine == "cpu: C runtime" and not runtime_built():
        pytest.skip("libedge_sdk was not built (cJSON missing at build)")
    bundle = Bundle.open(version_2_bundle.path)
    check_bundle(bundle.path)
    ids = prompt_ids(bundle)
    for point in ("default", "0.8"):
        expected = ENGINES["torch reference"](bundle, *POINTS[point], ids)
        assert ENGINES[engine](bundle, *POINTS[point], ids) == expected, point


def test_factors_in_the_wrong_dtype_for_the_version_are_refused(bundle_matrix, version_2_bundle, tmp_path):
    cases = {
        "v5 F16 factors read as version 3": (
            bundle_matrix.path("svd-fp16"),
            setting("format_version", 3),
            "format version 3 stores predictor factors in F32 (F16 since version 5)",
        ),
        "v2 F32 factors read as version 5": (
            version_2_bundle.path,
            setting("format_version", 5),
            "format version 5 stores the predictor factors of fp16 bundles in F16",
        ),
    }
    for name, (source, change, message) in cases.items():
        copy = tmp_path / name.replace(" ", "-")
        shutil.copytree(source, copy)
        edit_manifest(change)(copy)
        with pytest.raises(BundleError, match=r"tensor 'layers\.0\.svd\.a' is declared") as refused:
            Bundle.open(copy)
        assert message in str(refused.value), name
