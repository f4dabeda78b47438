"""make_synthetic_checkpoint.py --target-sparsity: the sparsity it builds, measured by the reference decoder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge_sdk.model.loader import load_decoder
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.collect import calibration_chunks, read_calibration_texts

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tiny-relu-llama"
TINY_SHAPE = ["--layers", "2", "--d", "128", "--ffn", "512", "--heads", "4", "--kv-heads", "4", "--vocab", "2048"]


def gate_activity(checkpoint: Path) -> torch.Tensor:
    """[layers, tokens, D] booleans: gate pre-activation > 0 on the first 512 held-out tokens (a ReLU neuron fires)."""
    decoder = load_decoder(checkpoint)
    texts = read_calibration_texts([FIXTURE / "held_out.txt"])
    ids = calibration_chunks(Tokenizer.from_dir(FIXTURE), texts, 512, 256, vocab_size=decoder.config.vocab_size)
    captured = []
    hooks = [
        layer.mlp.gate_proj.register_forward_hook(lambda _m, _i, out: captured.append(out.flatten(0, 1) > 0))
        for layer in decoder.layers
    ]
    with torch.inference_mode():
        decoder(ids)
    for hook in hooks:
        hook.remove()
    return torch.stack(captured)


@pytest.mark.slow
@pytest.mark.parametrize("target", [0.89, 0.7])
def test_target_sparsity_is_realized_on_held_out_text(tmp_path, target):
    out = tmp_path / "synthetic"
    command = [sys.executable, "benchmarks/make_synthetic_checkpoint.py", "--out", str(out), *TINY_SHAPE]
    subprocess.run([*command, "--target-sparsity", str(target)], cwd=REPO, check=True, capture_output=True)
    active = gate_activity(out)
    realized = 1 - active.float().mean().item()
    assert abs(realized - target) < 0.03
    assert json.loads((out / "synthetic.json").read_text())["held_out_sparsity"] == pytest.approx(realized, abs=0.03)
    rates = active.float().mean(1)  # [layers, D]: each neuron's firing rate
    assert rates.max() > 0.5 and rates.median() < 1 - target  # a few hot neurons, most cold
    # which neurons fire depends on the token: consecutive tokens share well under half their active neurons
    first, second = active[:, :-1], active[:, 1:]
    overlap = (first & second).sum() / (first | second).sum()
    assert overlap < 0.5


@pytest.mark.slow
def test_random_weights_are_about_half_sparse(tmp_path):
    out = tmp_path / "random"
    command = [sys.executable, "benchmarks/make_synthetic_checkpoint.py", "--out", str(out), *TINY_SHAPE]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    assert abs(1 - gate_activity(out).float().mean().item() - 0.5) < 0.05
    assert not (out / "synthetic.json").exists()
