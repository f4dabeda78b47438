"""`edge-sdk export` bundles: ONNX Runtime parity with the torch reference, format, integrity checks, bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from edge_sdk.bundle import Bundle, BundleError, manifest_digest
from edge_sdk.bundle.format import FORMAT_VERSION, MANIFEST_DIGEST_FIELD
from edge_sdk.cli import main
from edge_sdk.export import ops
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.export.ort_session import OrtBundleSession
from edge_sdk.export.verify import verify_graphs
from edge_sdk.formats.files import sha256_of
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.bundle_model import load_reference_decoder
from edge_sdk.sparsity.settings import CalibrationSettings

KINDS = ("svd", "signbit", "core", "threshold", "none")
DECODE_STEPS = 32
PROMPT = "def parse_args(self, args=None, namespace=None):\n    "


def write_manifest(bundle_dir, manifest: dict) -> None:
    """Save an edited manifest with a matching digest, as a tampering exporter would."""
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))


def quick_settings(kind: str, dtype: str = "fp32") -> ExportSettings:
    calibration = CalibrationSettings(predictor=kind, rank=16, max_tokens=2048, levels=(0.5, 0.8))
    return ExportSettings(dtype=dtype, max_seq_len=128, calibration=calibration)


@pytest.fixture(scope="module")
def bundles(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    calibration = [tiny_model_dir / "calibration.txt"]
    return {kind: export_bundle(tiny_model_dir, root / kind, quick_settings(kind), calibration) for kind in KINDS}


def greedy_logits(step_prefill, step_decode, ids: list[int], tokens_from=None):
    """Prefill, then DECODE_STEPS greedy steps; returns (logits rows, chosen tokens)."""
    rows = [step_prefill(ids)]
    chosen = []
    for step in range(DECODE_STEPS):
        token = int(rows[-1].argmax()) if tokens_from is None else tokens_from[step]
        chosen.append(token)
        rows.append(step_decode(token))
    return rows, chosen


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_runtime_matches_the_torch_reference(bundles, tiny_model_dir, kind):
    bundle = bundles[kind]
    ids = Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)
    reference = load_reference_decoder(bundle)
    session = OrtBundleSession(bundle)
    expected, expected_tokens = greedy_logits(
        lambda p: reference.prefill(torch.tensor([p]))[0, -1],
        lambda t: reference.decode(torch.tensor([[t]]))[0, -1],
        ids,
    )
    found, _ = greedy_logits(
        lambda p: torch.from_numpy(session.prefill(np.array([p]))[0, -1]),
        lambda t: torch.from_numpy(session.decode(np.array([[t]]))[0, -1]),
        ids,
        tokens_from=expected_tokens,
    )
    for step, (ours, theirs) in enumerate(zip(expected, found, strict=True)):
        assert (ours - theirs).abs().max().item() <= 1e-4, f"{kind}: step {step}"
    greedy_ort = [int(row.argmax()) for row in found[:-1]]
    assert greedy_ort == expected_tokens
    # the sparse decode really is sparse: some neurons were skipped at the last step
    if kind != "none":
        assert any((~ffn.last_active).any() for ffn in reference.ffns)


def test_sparse_decode_differs_from_dense_only_slightly(bundles, tiny_model_dir):
    """The predictor changes logits (it is not a no-op), and --dense gives the dense model back."""
    bundle = bundles["svd"]
    ids = np.array([Tokenizer.from_dir(tiny_model_dir).encode(PROMPT)])
    sparse, dense = OrtBundleSession(bundle, level=0.8), OrtBundleSession(bundle, dense=True)
    token = int(sparse.prefill(ids)[0, -1].argmax())
    dense.prefill(ids)
    sparse_logits, dense_logits = sparse.decode(np.array([[token]])), dense.decode(np.array([[token]]))
    assert np.abs(sparse_logits - dense_logits).max() > 1e-4
    reference = load_reference_decoder(bundle)
    reference.configure(dense=True)
    reference.prefill(torch.from_numpy(ids))
    expected = reference.decode(torch.tensor([[token]])).numpy()
    assert np.abs(dense_logits - expected).max() <= 1e-4


def test_graphs_pass_the_full_checker_and_carry_the_plugin_attributes(bundles):
    for kind, bundle in bundles.items():
        for which in ("prefill", "decode"):
            onnx.checker.check_model(str(bundle.graph_path(which)), full_check=True)
        decode = onnx.load(str(bundle.graph_path("decode")), load_external_data=False)
        prefill = onnx.load(str(bundle.graph_path("prefill")), load_external_data=False)
        assert decode.ir_version == 10
        custom = [node for node in decode.graph.node if node.domain == ops.DOMAIN]
        expected_ops = {"svd": {"SvdPredictor", "SparseFFN"}, "signbit": {"SignBitPredictor", "SparseFFN"}}
        assert {node.op_type for node in custom} == expected_ops.get(kind, {"SparseFFN"})
        assert sum(node.op_type == "SparseFFN" for node in custom) == bundle.config.num_layers
        for node in custom:
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attributes["plugin_version"] == b"1" and attributes["plugin_namespace"] == b"edge_sdk"
            ops.validate_node(node)
        assert not [node for node in prefill.graph.node if node.domain == ops.DOMAIN]
        assert {f.name for f in decode.functions} == set(ops.SCHEMAS) - set(ops.QUANTIZED_OPS)  # float bundles


def test_weights_are_stored_once(bundles, tiny_model_dir):
    bundle = bundles["svd"]
    weights = bundle.path / "weights.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        stored = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    tensor_bytes = sum(t.numel() * t.element_size() for t in stored.values())
    assert weights.stat().st_size - tensor_bytes < 16 * 1024  # header only
    for which in ("prefill", "decode"):
        graph_file = bundle.graph_path(which)
        assert graph_file.stat().st_size < 0.05 * weights.stat().st_size
        model = onnx.load(str(graph_file), load_external_data=False)
        external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert external and all(
            {e.key: e.value for e in t.external_data}["location"] == "weights.safetensors" for t in external
        )
    # W_down is stored neuron-major and equals the checkpoint's down_proj transposed
    from edge_sdk.model.checkpoint import Checkpoint

    checkpoint = Checkpoint(tiny_model_dir)
    down = checkpoint.tensor("model.layers.1.mlp.down_proj.weight", torch.float32)
    assert torch.equal(stored["layers.1.mlp.down_proj.weight_t"], down.T)
    assert stored["layers.1.svd.biases"].shape == (2, 768)


def test_manifest_describes_the_bundle(bundles):
    bundle = bundles["svd"]
    manifest = bundle.manifest.raw
    assert manifest["format"] == "edge-sdk-bundle" and manifest["format_version"] == 2
    assert manifest["exporter"]["name"] == "edge-sdk" and manifest["dtype"] == "fp32"
    assert manifest["model"]["architecture"] == "LlamaForCausalLM"
    assert manifest["sparsity"]["predictor"] == "svd" and manifest["sparsity"]["levels"] == [0.5, 0.8]
    assert [layer["rank"] for layer in manifest["sparsity"]["layers"]] == [16] * 4
    # each layer's own level under 0.5 and 0.8, from the report; the layer_level is that of the level the report's
    # metrics are at: the default level, or the mildest when the default is dense
    report = json.loads((bundle.path / "report.json").read_text())
    assert manifest["sparsity"]["default_level"] == report["default_level"]
    assert report["metrics_level"] == (0.5 if report["default_level"] is None else report["default_level"])
    default = f"{report['metrics_level']:g}"
    for layer, measured in zip(manifest["sparsity"]["layers"], report["layers"], strict=True):
        assert layer["layer_levels"] == [measured["per_level"][level]["layer_level"] for level in ("0.5", "0.8")]
        assert layer["layer_level"] == measured["per_level"][default]["layer_level"]
    assert [layer["layer_levels"] for layer in manifest["sparsity"]["layers"]] != [[0.5, 0.8]] * 4
    assert set(manifest["files"]) == {
        "weights.safetensors",
        "prefill.onnx",
        "decode.onnx",
        "tokenizer.json",
        "tokenizer_config.json",
        "report.json",
        "report.png",
    }
    for name, entry in manifest["files"].items():
        assert (entry["size"], entry["sha256"]) == sha256_of(bundle.path / name, follow_symlinks=False)


def test_fp16_bundle_stores_half_weights_and_keeps_parity(tiny_model_dir, tmp_path):
    bundle = export_bundle(
        tiny_model_dir, tmp_path / "b", quick_settings("svd", "fp16"), [tiny_model_dir / "calibration.txt"]
    )
    assert bundle.manifest.tensors["layers.0.mlp.gate_proj.weight"].dtype == "F16"
    assert bundle.manifest.tensors["layers.0.svd.a"].dtype == "F16"  # bundle format 5: F16 factors
    assert bundle.manifest.tensors["layers.0.svd.biases"].dtype == "F32"
    result = CliRunner().invoke(main, ["verify", str(bundle.path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["max_abs_logit_diff"] <= 1e-4


def test_export_and_verify_through_the_cli(tiny_model_dir, tmp_path):
    out = tmp_path / "bundle"
    args = [
        "export",
        str(tiny_model_dir),
        "-o",
        str(out),
        "--calib",
        str(tiny_model_dir / "calibration.txt"),
        "--predictor",
        "signbit",
        "--tokens",
        "1024",
        "--max-seq-len",
        "64",
        "--dtype",
        "fp32",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "weights.safetensors" in result.output
    assert "no sparsity levels: signbit has none to choose from" in result.output  # not "default level 0.5"
    assert "per layer, on calibration text at sparsity 0.5: true, predicted and realized sparsity" in result.output
    verified = CliRunner().invoke(main, ["verify", str(out)])
    assert verified.exit_code == 0 and verified.output.strip().endswith("OK")
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "already exists (use --force" in again.output


def test_verify_fits_its_decode_steps_in_a_short_kv_cache(tiny_model_dir, tmp_path):
    """The prompt (11 tokens) and the decode steps share max_seq_len 4: by default as many steps as fit after a
    one-token prompt are taken; a --steps that leaves no room for one prompt token is refused before any graph runs."""
    settings = ExportSettings(max_seq_len=4, calibration=CalibrationSettings(predictor="none"))
    bundle = export_bundle(tiny_model_dir, tmp_path / "b", settings, [])
    result = verify_graphs(bundle)
    assert (result["prompt_tokens"], result["decode_steps"]) == (1, 3)
    assert verify_graphs(bundle, decode_steps=2)["prompt_tokens"] == 2
    for steps in ("4", "1024"):
        refused = CliRunner().invoke(main, ["verify", str(bundle.path), "--steps", steps])
        assert refused.exit_code == 2 and refused.output.strip() == (
            f"edge-sdk: error: {bundle.path}: --steps {steps} leaves no room in the bundle's max_seq_len 4 for the "
            "11-token prompt (cut to fit, but at least 1 token): expected --steps at most 3"
        )


@pytest.mark.parametrize("victim", ["weights.safetensors", "decode.onnx", "tokenizer.json", "manifest.json"])
def test_a_changed_byte_fails_verify_and_load_naming_the_file(bundles, tmp_path, victim):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["svd"].path, copy)
    path = copy / victim
    data = bytearray(path.read_bytes())
    position = len(data) // 2 if victim != "manifest.json" else data.index(b'"dtype": "fp32"') + 10
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 2 and victim in result.output
    with pytest.raises(BundleError, match=victim):
        Bundle.open(copy)


@pytest.mark.parametrize("bad_path", ["/etc/passwd", "../outside.bin", "sub/../../x", ".hidden", "a\\b"])
def test_paths_leaving_the_bundle_are_rejected(bundles, tmp_path, bad_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["none"].path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"][bad_path] = {"size": 1, "sha256": "0" * 64}
    write_manifest(copy, manifest)
    with pytest.raises(BundleError, match="is not allowed: a bundle lists plain file names of its own directory"):
        Bundle.open(copy)


def test_external_data_outside_the_bundle_is_rejected(bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["none"].path, copy)
    model = onnx.load(str(copy / "decode.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    next(e for e in tensor.external_data if e.key == "location").value = "../../secrets.bin"
    onnx.save(model, str(copy / "decode.onnx"))
    manifest = json.loads((copy / "manifest.json").read_text())
    size, digest = sha256_of(copy / "decode.onnx", follow_symlinks=False)
    manifest["files"]["decode.onnx"] = {"size": size, "sha256": digest}
    write_manifest(copy, manifest)
    with pytest.raises(BundleError, match=r"decode.onnx: tensor .* outside the graph refers to '../../secrets.bin'"):
        Bundle.open(copy)


def test_newer_format_version_is_refused(bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["none"].path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    write_manifest(copy, manifest | {"format_version": FORMAT_VERSION + 1})
    result = CliRunner().invoke(main, ["verify", str(copy)])
    newer = f"bundle format version {FORMAT_VERSION + 1} is newer than this edge-sdk supports ({FORMAT_VERSION})"
    assert result.exit_code == 2 and newer in result.output


def test_bad_export_input_leaves_nothing_behind(tiny_model_dir, tmp_path):
    calib = str(tiny_model_dir / "calibration.txt")
    bad_sparsity = CliRunner().invoke(
        main, ["export", str(tiny_model_dir), "-o", str(tmp_path / "b"), "--calib", calib, "--sparsity", "1.5"]
    )
    assert bad_sparsity.exit_code == 2 and "'--sparsity': 1.5 is not in the range 0<=x<=1" in bad_sparsity.output
    no_text = CliRunner().invoke(main, ["export", str(tiny_model_dir), "-o", str(tmp_path / "b")])
    expected = "predictor 'svd' needs calibration text: pass --calib FILE, or --predictor none for a bundle without"
    assert no_text.exit_code == 2 and expected in no_text.output
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4096])
    corrupt = CliRunner().invoke(main, ["export", str(broken), "-o", str(tmp_path / "b"), "--predictor", "none"])
    assert corrupt.exit_code == 2 and "model.safetensors: truncated" in corrupt.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_a_failure_during_export_leaves_no_partial_bundle(tiny_model_dir, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr("edge_sdk.export.graph.build_graph", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        export_bundle(tiny_model_dir, tmp_path / "b", quick_settings("none"))
    assert list(tmp_path.iterdir()) == []


def test_an_svd_bundle_of_rank_1_exports_and_verifies(tiny_model_dir, tmp_path):
    """--rank 1: every layer's svd.a is [D, 1], a transposed view (the writer failed on its strides)."""
    calibration = CalibrationSettings(predictor="svd", rank=1, max_tokens=512, levels=(0.5,), sparsity=0.5)
    settings = ExportSettings(dtype="fp16", max_seq_len=64, calibration=calibration)
    bundle = export_bundle(tiny_model_dir, tmp_path / "rank1", settings, [tiny_model_dir / "calibration.txt"])
    assert bundle.array("layers.0.svd.a").shape == (bundle.config.intermediate_size, 1)
    assert verify_graphs(bundle, decode_steps=2)["greedy_tokens_match"]
