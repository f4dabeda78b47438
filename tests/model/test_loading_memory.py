"""Loading materializes one tensor at a time: the model never sits in memory twice."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import save_file

from edge_sdk.model.checkpoint import hf_tensor_shapes
from edge_sdk.model.config import parse_config

PROBE = """
import json, sys, torch
from edge_sdk.model.loader import load_decoder

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
# a first load pays the one-time costs (imports, allocator arenas) outside the measurement
warm_up = load_decoder(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
del warm_up
before = status("RssAnon")
decoder = load_decoder(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
print(json.dumps({"anon_growth": status("RssAnon") - before}))
"""


def run_probe(model_dir, dtype: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(model_dir), dtype], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_loading_keeps_one_copy(tmp_path):
    config_dict = {
        "model_type": "llama",
        "vocab_size": 2048,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "hidden_act": "relu",
    }
    shapes = hf_tensor_shapes(parse_config(config_dict, tmp_path / "config.json"))
    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=generator).half() for name, shape in shapes.items()}
    fp16_bytes = sum(t.numel() * 2 for t in tensors.values())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    del tensors

    # Same dtype as stored: parameters stay backed by the memory-mapped file.
    assert run_probe(tmp_path, "float16")["anon_growth"] < 0.25 * fp16_bytes
    # Cast to fp32: one fp32 copy (2x the file) plus at most one tensor in flight, never the fp16 model too.
    largest_fp32_tensor = 2048 * 512 * 4
    assert run_probe(tmp_path, "float32")["anon_growth"] < 2 * fp16_bytes + 2 * largest_fp32_tensor
