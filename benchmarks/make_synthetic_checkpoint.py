"""Write a random-weight Llama checkpoint of a given shape (default ~1.1B parameters, TinyLlama-shaped, fp16),
for export speed and memory benchmarks. Tensors are generated and written one shard at a time.

    .venv/bin/python benchmarks/make_synthetic_checkpoint.py --out /tmp/synthetic-1b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from edge_sdk.model.checkpoint import hf_tensor_shapes
from edge_sdk.model.config import parse_config

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-relu-llama"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--d", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab,
        "hidden_size": args.d,
        "intermediate_size": args.ffn,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "hidden_act": "relu",
        "max_position_embeddings": 2048,
        "torch_dtype": "float16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = hf_tensor_shapes(parse_config(config, args.out / "config.json"))
    generator = torch.Generator().manual_seed(0)
    weight_map, shard, shard_index, total = {}, {}, 0, 0

    def flush() -> None:
        nonlocal shard, shard_index
        name = f"model-{shard_index:05d}.safetensors"
        save_file(shard, str(args.out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard, shard_index = {}, shard_index + 1

    for name, shape in shapes.items():
        scale = 1.0 if name.endswith("norm.weight") else 0.02
        shard[name] = (torch.randn(shape, generator=generator) * scale).half()
        total += shard[name].numel()
        if sum(t.numel() for t in shard.values()) > 250_000_000:
            flush()
    if shard:
        flush()
    index = {"metadata": {"total_size": total * 2}, "weight_map": weight_map}
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    # the fixture's tokenizer: its 2048 ids are valid in any larger vocabulary, so calibration text works
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / file, args.out / file)
    print(f"{total:,} parameters, {total * 2 / 1e9:.2f} GB in {shard_index} shards at {args.out}")


if __name__ == "__main__":
    main()
