"""Every engine decodes the fixture's bundles to the committed greedy token ids (tests/fixtures/tiny-relu-llama/
greedy_ids.json): the torch reference, ONNX Runtime, the CPU backend's C runtime and torch engines, and the CANN
gather path on the CPU. The file is the reference's output when it was written, so a drift of the reference, of
calibration or of the exporter is caught as well as a disagreement between engines. The CANN path runs int8 / int4
bundles both ways the backend chooses per chip (backends/cann/quantized.py): dequantized (310P) and through the
weight-quant matmul (Atlas A2 / A3), whose torch_npu operators are replaced by their CPU reference.

After a change that is meant to change the ids (a new fixture, a calibration change), rewrite the file with
`EDGE_SDK_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/runtime/test_golden_ids.py` and say why in the commit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_sdk.backends.cann.engine import load_gather_engine
from edge_sdk.backends.cpu.backend import ENGINE_ENV

from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.native import NativeLibraryError, load_runtime
from edge_sdk.runtime.backends import EngineOptions, get_backend
from edge_sdk.sparsity.bundle_model import configure, load_reference_decoder

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-relu-llama" / "greedy_ids.json"
WRITE_ENV = "EDGE_SDK_WRITE_GOLDEN"
PROMPT = "def parse_args(self, args=None, namespace=None):\n    "
STEPS = 24
# operating points: (level, dense); None is the bundle's default level
POINTS = {"default": (None, False), "dense": (None, True), "0.8": (0.8, False)}
BUNDLES = (
    "svd-fp32",
    "svd-fp16",
    "signbit-fp32",
    "core-fp16",
    "threshold-fp32",
    "none-fp32",
    "svd-int8",
    "svd-int4",
    "tied-svd-int8",
    "tied-svd-int4",
    "svd-int4-head-int8",
    "tied-svd-int4-head-int8",
)


def points_of(bundle) -> list[str]:
    """The operating points a bundle has: a level only where the predictor is calibrated at levels."""
    return [point for point in POINTS if point != "0.8" or bundle.sparsity.levels]


def greedy(prefill: Callable, decode: Callable, ids: list[int]) -> list[int]:
    tokens = [int(np.asarray(prefill(ids)).argmax())]
    for _ in range(STEPS - 1):
        tokens.append(int(np.asarray(decode(tokens[-1])).argmax()))
    return tokens


def reference_ids(bundle, level: float | None, dense: bool, ids: list[int]) -> list[int]:
    model = load_reference_decoder(bundle)
    configure(model, bundle.sparsity.resolve(level, dense))
    return greedy(
        lambda p: model.prefill(torch.tensor([p]))[0, -1], lambda t: model.decode(torch.tensor([[t]]))[0, -1], ids
    )


def onnx_runtime_ids(bundle, level: float | None, dense: bool, ids: list[int]) -> list[int]:
    session = OrtBundleSession(bundle, level, dense)
    return greedy(
        lambda p: session.prefill(np.array([p]))[0, -1], lambda t: session.decode(np.array([[t]]))[0, -1], ids
    )


def cpu_backend_ids(engine_kind: str) -> Callable:
    def run(bundle, level: float | None, dense: bool, ids: list[int]) -> list[int]:
        previous = os.environ.get(ENGINE_ENV)
        os.environ[ENGINE_ENV] = engine_kind
        try:
            engine = get_backend("cpu").load(bundle, EngineOptions.of(bundle, sparsity=level, dense=dense, threads=1))
        finally:
            if previous is None:
                del os.environ[ENGINE_ENV]
            else:
                os.environ[ENGINE_ENV] = previous
        return greedy(engine.prefill, engine.decode, ids)

    return run


def cann_path_ids(bundle, level: float | None, dense: bool, ids: list[int]) -> list[int]:
    engine = load_gather_engine(
        bundle, EngineOptions.of(bundle, sparsity=level, dense=dense), device="cpu", mode="dynamic"
    )
    return greedy(engine.prefill, engine.decode, ids)


def cann_weight_quant_ids(bundle, level: float | None, dense: bool, ids: list[int]) -> list[int]:
    from ..backends.cann_reference import ReferenceWeightQuant

    operators = ReferenceWeightQuant()
    options = EngineOptions.of(bundle, sparsity=level, dense=dense)
    engine = load_gather_engine(bundle, options, device="cpu", mode="dynamic", weight_quant=operators)
    found = greedy(engine.prefill, engine.decode, ids)
    assert operators.matmul_calls > 0, "the weight-quant path never called the operator"
    return found


def prompt_ids(bundle) -> list[int]:
    return Tokenizer.from_bundle(bundle).encode(PROMPT)


def runtime_built() -> bool:
    try:
        load_runtime()
    except NativeLibraryError:
        return False
    return True


ENGINES = {
    "torch reference": reference_ids,
    "onnx runtime": onnx_runtime_ids,
    "cpu: C runtime": cpu_backend_ids("runtime"),
    "cpu: torch engine": cpu_backend_ids("torch"),
    "cann gather path (cpu)": cann_path_ids,
    "cann weight-quant matmul (cpu reference)": cann_weight_quant_ids,
}
QUANTIZED_ONLY = {"cann weight-quant matmul (cpu reference)"}  # the same code as "cann gather path" on float bundles


@pytest.fixture(scope="module")
def golden(bundle_matrix) -> dict:
    if os.environ.get(WRITE_ENV):
        written = {"prompt": PROMPT, "steps": STEPS, "bundles": {}}
        for name in BUNDLES:
            bundle = bundle_matrix[name]
            ids = prompt_ids(bundle)
            points = points_of(bundle)
            written["bundles"][name] = {point: reference_ids(bundle, *POINTS[point], ids) for point in points}
        lines = [f'{{"prompt": {json.dumps(PROMPT)}, "steps": {STEPS}, "bundles": {{']
        for index, (name, points) in enumerate(written["bundles"].items()):
            lines.append(f" {json.dumps(name)}: {{")
            lines += [f"  {json.dumps(point)}: {json.dumps(ids)}," for point, ids in points.items()]
            lines[-1] = lines[-1].removesuffix(",")
            lines.append(" }," if index < len(written["bundles"]) - 1 else " }")
        GOLDEN.write_text("\n".join([*lines, "}}"]) + "\n")
    return json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_the_matrix_and_its_points(golden, bundle_matrix):
    assert golden["prompt"] == PROMPT and golden["steps"] == STEPS
    assert set(golden["bundles"]) == set(BUNDLES)
    for name in BUNDLES:
        assert set(golden["bundles"][name]) == set(points_of(bundle_matrix[name])), name
    dense = {name: golden["bundles"][name]["dense"] for name in BUNDLES}
    # dense decoding ignores the predictor: bundles of one weight dtype agree
    assert dense["svd-fp32"] == dense["signbit-fp32"] == dense["threshold-fp32"] == dense["none-fp32"]
    # and sparsity changes something somewhere, or the sparse points test nothing
    assert any(golden["bundles"][name]["0.8"] != dense[name] for name in ("svd-fp32", "threshold-fp32"))


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        (name, engine)
        for name in BUNDLES
        for engine in ENGINES
        if engine not in QUANTIZED_ONLY or name.endswith(("-int8", "-int4"))
    ],
)
def test_every_engine_decodes_the_golden_ids(golden, bundle_matrix, name, engine):
    if engine == "cpu: C runtime" and not runtime_built():
        pytest.skip("libedge_sdk was not built (cJSON missing at build)")
    bundle = bundle_matrix[name]
    ids = prompt_ids(bundle)
    found = {point: ENGINES[engine](bundle, *POINTS[point], ids) for point in points_of(bundle)}
    assert found == golden["bundles"][name]
