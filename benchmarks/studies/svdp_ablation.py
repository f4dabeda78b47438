"""SVDP ablation on a model (the paper's Table 3 shape): whitening and greedy bias calibration on and off.

For each variant, importance-weighted recall per layer at equal predicted sparsity (interpolated along
the calibrated levels), measured on the calibration distribution and on held-out text.

    .venv/bin/python benchmarks/studies/svdp_ablation.py --json benchmarks/results/svdp-ablation-tiny-relu-llama.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edge_sdk.bench.record import with_machine_info
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.sparsity.pipeline import calibrate_model
from edge_sdk.sparsity.settings import CalibrationSettings
from edge_sdk.sparsity.svd import default_rank

TARGETS = (0.5, 0.6, 0.7, 0.8, 0.9)


def weighted_recall_at(layer: dict, predicted_sparsity: float) -> float:
    points = sorted((m["predicted_sparsity"], m["importance_weighted_recall"]) for m in layer["per_level"].values())
    xs, ys = zip(*points, strict=True)
    return float(np.interp(predicted_sparsity, xs, ys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("tests/fixtures/tiny-relu-llama"))
    parser.add_argument("--calib", type=Path, default=None, help="default: MODEL/calibration.txt")
    parser.add_argument("--eval", type=Path, default=None, help="default: MODEL/held_out.txt")
    parser.add_argument("--rank", type=int, default=None, help="default: about 2%% of D")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    checkpoint = Checkpoint(args.model)
    rank = args.rank or default_rank(checkpoint.config.intermediate_size)
    calib = args.calib or args.model / "calibration.txt"
    held_out = args.eval or args.model / "held_out.txt"
    levels = (0.3, 0.4, *TARGETS, 0.95)
    variants = {
        "svdp (whitened + greedy bias)": CalibrationSettings(rank=rank, levels=levels),
        "naive svd + greedy bias": CalibrationSettings(rank=rank, levels=levels, whiten=False),
        "whitened svd, no bias calibration": CalibrationSettings(rank=rank, levels=levels, calibrate_bias=False),
    }
    results = {"model": str(args.model), "rank": rank, "targets": TARGETS, "variants": {}}
    for name, settings in variants.items():
        per_set = {}
        for label, evaluation in (("calibration", []), ("held_out", [held_out])):
            report = calibrate_model(checkpoint, settings, [calib], evaluation).report
            per_set[label] = [[weighted_recall_at(layer, t) for t in TARGETS] for layer in report["layers"]]
        results["variants"][name] = per_set
    for label in ("calibration", "held_out"):
        print(f"\nimportance-weighted recall on {label} text, rank {rank}, mean over layers (per layer in JSON)")
        print(f"{'variant':<36}" + "".join(f"{f'@{t:g}':>9}" for t in TARGETS))
        for name, per_set in results["variants"].items():
            means = np.mean(per_set[label], axis=0)
            print(f"{name:<36}" + "".join(f"{m:9.4f}" for m in means))
    if args.json:
        args.json.write_text(json.dumps(with_machine_info({"benchmark": "svdp_ablation", **results}), indent=2) + "\n")


if __name__ == "__main__":
    main()
