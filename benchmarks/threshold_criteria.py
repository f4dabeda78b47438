"""Which activation a SiLU FFN should threshold: the perplexity-vs-sparsity frontier of three criteria.

    .venv/bin/python benchmarks/threshold_criteria.py MODEL --calib FILE... --text FILE... [--json OUT]

Each criterion sets one per-layer threshold at the sparsity-quantile of its score over the calibration tokens
(dense forward), then drops every neuron whose score is at or below it on the held-out text:

- chess: E|up_i| * |act(gate_i)|, CHESS eq. 7 (what edge_sdk/sparsity/threshold.py implements and every runtime
  runs). Needs only the gate to decide, so up and down rows of dropped neurons are skipped.
- product: |act(gate_i) * up_i|, the exact contribution CHESS approximates (eq. 5, as CATS/TEAL-style
  thresholds on the product). Needs the up projection of every neuron to decide: only down rows are skipped.
- gate: |act(gate_i)| alone (CATS): no channel weighting.

Every position of every held-out chunk goes through the thresholded FFN (teacher-forced, whole-sequence
forward), so the figures are the criterion's own loss, without the dense prompt `edge-sdk eval` keeps.

Equal sparsity is not equal work: each point also gives `ffn_weight_reads`, the fraction of the dense FFN's
weight rows a decode step reads (gate rows always; up rows only for kept neurons under chess and gate, always under
product; down rows only for kept neurons), which is what the decode time follows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.model.decoder import FeedForward
from edge_sdk.model.loader import load_decoder

CRITERIA = ("chess", "product", "gate")
CHUNK = 256


def token_chunks(tokenizer, files: list[str], max_tokens: int) -> torch.Tensor:
    """[C, CHUNK] token ids of the files' text, in order, at most max_tokens."""
    ids: list[int] = []
    for file in files:
        ids += tokenizer.encode(Path(file).read_text(encoding="utf-8"), add_bos=False)
    count = min(len(ids), max_tokens) // CHUNK
    if count == 0:
        sys.exit(f"{', '.join(files)}: expected at least {CHUNK} tokens, found {len(ids)}")
    return torch.tensor(ids[: count * CHUNK]).view(count, CHUNK)


def scores(criterion: str, gate_act: torch.Tensor, up: torch.Tensor, mean_abs_up: torch.Tensor) -> torch.Tensor:
    """gate_act, up: [..., D] -> [..., D] the criterion's score per neuron."""
    if criterion == "chess":
        return gate_act.abs() * mean_abs_up
    if criterion == "product":
        return (gate_act * up).abs()
    return gate_act.abs()


class ThresholdedFFN:
    """Replaces one FeedForward's forward: calibrate (records E|up|), fit (quantile per level), apply."""

    def __init__(self, ffn: FeedForward):
        self.ffn = ffn
        self.gate_act: list[torch.Tensor] = []
        self.up: list[torch.Tensor] = []
        self.mean_abs_up: torch.Tensor | None = None
        self.threshold: float | None = None  # None: dense
        self.criterion = "chess"
        self.kept = 0
        self.total = 0
        ffn.forward = self.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d] -> [B, S, d]
        ffn = self.ffn
        gate_act = ffn.activation.gate(ffn.gate_proj(x))
        up = ffn.activation.up(ffn.up_proj(x))
        if self.mean_abs_up is None:
            self.gate_act.append(gate_act.flatten(0, 1))
            self.up.append(up.flatten(0, 1))
        elif self.threshold is not None:
            keep = scores(self.criterion, gate_act, up, self.mean_abs_up) > self.threshold
            self.kept += int(keep.sum())
            self.total += keep.numel()
            gate_act = gate_act * keep
        return ffn.down_proj(gate_act * up)

    def finish_calibration(self) -> None:
        self.gate_act, self.up = torch.cat(self.gate_act), torch.cat(self.up)  # [N, D]
        self.mean_abs_up = self.up.abs().mean(0)

    def quantile(self, criterion: str, level: float) -> float:
        values = scores(criterion, self.gate_act, self.up, self.mean_abs_up).flatten()
        rank = math.ceil(level * values.numel())
        return -math.inf if rank == 0 else float(values.kthvalue(rank).values)


@torch.inference_mode()
def perplexity(decoder, chunks: torch.Tensor) -> float:
    total = 0.0
    for chunk in chunks:
        logits = decoder(chunk[None])[0, :-1].double()  # [S-1, V]
        total += float(F.cross_entropy(logits, chunk[1:], reduction="sum"))
    return math.exp(total / (chunks.shape[0] * (chunks.shape[1] - 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--calib", nargs="+", required=True)
    parser.add_argument("--text", nargs="+", required=True)
    parser.add_argument("--levels", default="0.3,0.4,0.5,0.6,0.7")
    parser.add_argument("--calib-tokens", type=int, default=4096)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    levels = [float(level) for level in args.levels.split(",")]
    checkpoint = open_checkpoint(args.model)
    tokenizer = checkpoint.tokenizer()
    calibration = token_chunks(tokenizer, args.calib, args.calib_tokens)
    held_out = token_chunks(tokenizer, args.text, args.eval_tokens)
    decoder = load_decoder(checkpoint)
    hooks = [ThresholdedFFN(layer.mlp) for layer in decoder.layers]
    with torch.inference_mode():
        for chunk in calibration:
            decoder(chunk[None])
    for hook in hooks:
        hook.finish_calibration()
    dense = perplexity(decoder, held_out)
    print(f"dense perplexity {dense:.4f} on {held_out.numel()} held-out tokens", file=sys.stderr)
    frontier = {criterion: [] for criterion in CRITERIA}
    for criterion in CRITERIA:
        for level in levels:
            for hook in hooks:
                hook.criterion, hook.threshold = criterion, hook.quantile(criterion, level)
                hook.kept = hook.total = 0
            value = perplexity(decoder, held_out)
            realized = 1.0 - sum(hook.kept for hook in hooks) / sum(hook.total for hook in hooks)
            up_reads = 1.0 if criterion == "product" else 1.0 - realized
            point = {
                "level": level,
                "realized_sparsity": realized,
                "ffn_weight_reads": (1.0 + up_reads + (1.0 - realized)) / 3.0,
                "perplexity": value,
                "perplexity_change_percent": 100.0 * (value / dense - 1.0),
            }
            frontier[criterion].append(point)
            print(
                f"{criterion:>8} {level:.2f}: sparsity {realized:.3f} weight reads {point['ffn_weight_reads']:.3f} "
                f"ppl {value:.4f} "
                f"({point['perplexity_change_percent']:+.2f}%)",
                file=sys.stderr,
            )
    result = {
        "model": str(args.model),
        "calibration_files": args.calib,
        "held_out_files": args.text,
        "calibration_tokens": int(calibration.numel()),
        "held_out_tokens": int(held_out.numel()),
        "dense_perplexity": dense,
        "frontier": frontier,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
