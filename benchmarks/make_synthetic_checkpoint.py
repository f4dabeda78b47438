"""Write a synthetic Llama checkpoint (fp16 safetensors) of a given shape, for speed and memory benchmarks.

Two kinds of weights:

- random (the default): every weight Gaussian; a ReLU FFN over such weights is about 50% sparse, which says
  nothing about a real ReLU model's sparsity, so use it for export speed and memory only;
- `--target-sparsity S`: a ReLU model built so that a fraction S of FFN neurons is inactive on its own text, as in
  ProSparse-LLaMA2-7B (S = 0.89), with the structure that lets a real predictor find which ones fire (below).

    .venv/bin/python benchmarks/make_synthetic_checkpoint.py --out /tmp/synthetic-1b
    .venv/bin/python benchmarks/make_synthetic_checkpoint.py --out /tmp/synthetic-7b-4l --shape llama2-7b \
        --layers 4 --target-sparsity 0.89

How the sparse model is built (hidden states of real LLMs share a few dominant directions and live mostly in a
low-dimensional subspace; ReLU neurons have a per-neuron firing rate from "almost always" to "almost never"):

- every token embedding is a common offset along one direction u, plus a token-specific part in a subspace of
  dimension d / 32 (orthogonal to u), plus a little isotropic noise; so u . x_norm is about the same for every
  token while the rest of x_norm depends on the token;
- gate row i = a random direction r_i in that subspace (plus a little isotropic noise) minus beta_i u. Neuron i
  fires when r_i . x_norm > beta_i (u . x_norm): which neurons fire depends on the token, and beta_i sets how often;
- the firing rates p_i follow a power law over a random ranking of the neurons (a few hot, most cold) scaled to mean
  1 - S; beta_i is set layer by layer from the statistics of the layer's real FFN input on the calibration text
  (the fixture's calibration.txt, run through the layers generated so far), as a Gaussian quantile;
- attention and FFN outputs are scaled to a modest share of the residual stream, so the structure survives the
  layers, and the LM head is scaled so that the next-token distribution is peaked (a perplexity that notices
  dropped neurons, which choosing the default level needs).

The realized sparsity (fraction of gate pre-activations <= 0) on the fixture's held_out.txt, which no statistic
was taken from, is printed per layer and written to synthetic.json beside the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from edge_sdk.model.checkpoint import hf_tensor_shapes
from edge_sdk.model.config import ModelConfig, parse_config
from edge_sdk.model.decoder import TransformerBlock, rope_tables
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.sparsity.collect import calibration_chunks, read_calibration_texts

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-relu-llama"
SHAPES = {
    "tinyllama-1.1b": {"layers": 22, "d": 2048, "ffn": 5632, "heads": 32, "kv_heads": 4, "vocab": 32000},
    "llama2-7b": {"layers": 32, "d": 4096, "ffn": 11008, "heads": 32, "kv_heads": 32, "vocab": 32000},
}
SHARD_ELEMENTS = 250_000_000


@dataclass(frozen=True)
class SparseDesign:
    """The knobs of the sparse ReLU model (module docstring); the defaults are what the benchmarks use."""

    target_sparsity: float
    firing_rate_exponent: float = 0.8  # power law of the per-neuron firing rates over their rank
    max_firing_rate: float = 0.9
    embedding_offset: float = 0.6  # shares of an embedding's norm: along u, in the token subspace, isotropic
    embedding_token_part: float = 0.75
    embedding_noise: float = 0.28
    gate_noise: float = 0.1  # isotropic part of a gate row against its subspace part (what no low rank captures)
    attention_output_gain: float = 0.3  # RMS of a block's attention output, against a residual RMS of about 1
    ffn_output_gain: float = 0.3
    logit_std: float = 3.0
    calibration_tokens: int = 1024
    held_out_tokens: int = 1024
    chunk_tokens: int = 256

    def token_subspace(self, d: int) -> int:
        return max(4, d // 32)


class ShardWriter:
    """Tensors written as fp16 safetensors shards of about SHARD_ELEMENTS values, with the index file."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.weight_map: dict[str, str] = {}
        self.shard: dict[str, torch.Tensor] = {}
        self.shard_count = 0
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.shard[name] = tensor.half().contiguous()
        self.total += tensor.numel()
        if sum(t.numel() for t in self.shard.values()) > SHARD_ELEMENTS:
            self._flush()

    def _flush(self) -> None:
        name = f"model-{self.shard_count:05d}.safetensors"
        save_file(self.shard, str(self.directory / name), metadata={"format": "pt"})
        self.weight_map.update(dict.fromkeys(self.shard, name))
        self.shard, self.shard_count = {}, self.shard_count + 1

    def close(self) -> None:
        if self.shard:
            self._flush()
        index = {"metadata": {"total_size": self.total * 2}, "weight_map": self.weight_map}
        (self.directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_random(shapes: dict[str, tuple[int, ...]], writer: ShardWriter, generator: torch.Generator) -> None:
    for name, shape in shapes.items():
        scale = 1.0 if name.endswith("norm.weight") else 0.02
        writer.add(name, torch.randn(shape, generator=generator) * scale)


def firing_rates(ffn: int, design: SparseDesign, generator: torch.Generator) -> torch.Tensor:
    """Per-neuron firing probabilities [ffn]: c * rank^-exponent over a random ranking, capped, mean 1 - sparsity."""
    rank = torch.randperm(ffn, generator=generator).double() + 1
    shape = rank.pow(-design.firing_rate_exponent)
    low, high = 0.0, 1e6  # bisection on c: the capped mean rises with it
    for _ in range(100):
        scale = (low + high) / 2
        if (scale * shape).clamp(max=design.max_firing_rate).mean() < 1 - design.target_sparsity:
            low = scale
        else:
            high = scale
    return (low * shape).clamp(min=1e-5, max=design.max_firing_rate).float()


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def fp16(tensor: torch.Tensor) -> torch.Tensor:
    """What the checkpoint stores: the forward passes below run on exactly these values."""
    return tensor.half().float()


class SparseModelBuilder:
    """Generates the sparse ReLU model layer by layer, running the calibration and held-out texts through it."""

    def __init__(self, config: ModelConfig, design: SparseDesign, generator: torch.Generator):
        self.config, self.design, self.generator = config, design, generator
        d = config.hidden_size
        basis, _ = torch.linalg.qr(torch.randn(d, design.token_subspace(d) + 1, generator=generator))
        self.offset_direction = basis[:, 0]  # u: [d]
        self.token_subspace = basis[:, 1:]  # [d, k], orthonormal columns orthogonal to u
        self.cos, self.sin = rope_tables(config.rope, config.head_dim, design.chunk_tokens)
        self.layer_sparsity: list[dict[str, Any]] = []

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator)

    def embeddings(self) -> torch.Tensor:
        """[vocab, d]: sqrt(d) * (offset * u + token part in the subspace + isotropic noise), RMS about 1."""
        design, d, k = self.design, self.config.hidden_size, self.token_subspace.shape[1]
        vocab = self.config.vocab_size
        token_part = self.randn(vocab, k) @ self.token_subspace.T / math.sqrt(k)
        noise = self.randn(vocab, d) / math.sqrt(d)
        rows = design.embedding_offset * self.offset_direction + design.embedding_token_part * token_part
        return math.sqrt(d) * (rows + design.embedding_noise * noise)

    def block(self) -> TransformerBlock:
        """One layer's attention and norms (gains of 1 for q, k, v; the output scaled down), FFN left empty."""
        config, d = self.config, self.config.hidden_size
        block = TransformerBlock(config)
        attention = block.self_attn
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.weight.data = fp16(self.randn(*projection.weight.shape) / math.sqrt(d))
        inner = attention.o_proj.weight.shape[1]
        attention.o_proj.weight.data = fp16(self.randn(d, inner) / math.sqrt(inner))
        block.input_layernorm.weight.data.fill_(1.0)
        block.post_attention_layernorm.weight.data.fill_(1.0)
        return block

    def ffn_weights(self, ffn_input: torch.Tensor) -> dict[str, torch.Tensor]:
        """gate, up, down [D, d] / [D, d] / [d, D] for this layer, given the calibration text's x_norm [T, d]."""
        design, d, ffn = self.design, self.config.hidden_size, self.config.intermediate_size
        k = self.token_subspace.shape[1]
        directions = self.randn(ffn, k) @ self.token_subspace.T / math.sqrt(k)
        directions += design.gate_noise * self.randn(ffn, d) / math.sqrt(d)  # r_i: [D, d], norm about 1
        along_offset = ffn_input @ self.offset_direction  # u . x_norm: [T], about the same for every token
        ratio = (ffn_input @ directions.T) / along_offset[:, None]  # [T, D]: neuron i fires when ratio_i > beta_i
        quantile = torch.distributions.Normal(0.0, 1.0).icdf(1 - firing_rates(ffn, design, self.generator))
        beta = ratio.mean(0) + ratio.std(0) * quantile  # [D]
        gate = directions - beta[:, None] * self.offset_direction
        gate /= (ffn_input @ gate.T).std()  # pre-activations of about unit spread
        up = self.randn(ffn, d) / math.sqrt(d)
        down = self.randn(d, ffn) / math.sqrt(ffn)
        activation = torch.relu(ffn_input @ gate.T) * (ffn_input @ up.T)
        down *= self.design.ffn_output_gain / (activation @ down.T).pow(2).mean().sqrt()
        return {"gate_proj": fp16(gate), "up_proj": fp16(up), "down_proj": fp16(down)}

    def layer(
        self, block: TransformerBlock, streams: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """This layer's FFN weights (fitted on the calibration stream) and every stream advanced through it."""
        eps = self.config.rms_norm_eps
        after_attention = {}
        for name, hidden in streams.items():
            with torch.inference_mode():
                out = block.self_attn(block.input_layernorm(hidden), self.cos, self.sin, 0)
            after_attention[name] = out
        scale = self.design.attention_output_gain / after_attention["calibration"].pow(2).mean().sqrt()
        block.self_attn.o_proj.weight.data = fp16(block.self_attn.o_proj.weight.data * scale)
        after_attention = {name: streams[name] + out * scale for name, out in after_attention.items()}
        ffn_input = {
            name: rms_norm(hidden, eps).reshape(-1, hidden.shape[-1]) for name, hidden in after_attention.items()
        }
        weights = self.ffn_weights(ffn_input["calibration"])
        self.layer_sparsity.append(
            {
                f"{name}_sparsity": round(float((x @ weights["gate_proj"].T <= 0).float().mean()), 4)
                for name, x in ffn_input.items()
            }
        )
        advanced = {}
        for name, hidden in after_attention.items():
            x = ffn_input[name]
            ffn_out = (torch.relu(x @ weights["gate_proj"].T) * (x @ weights["up_proj"].T)) @ weights["down_proj"].T
            advanced[name] = hidden + ffn_out.reshape(hidden.shape)
        return weights, advanced


def write_sparse(
    config: ModelConfig, design: SparseDesign, writer: ShardWriter, generator: torch.Generator
) -> dict[str, Any]:
    builder = SparseModelBuilder(config, design, generator)
    tokenizer = Tokenizer.from_dir(FIXTURE)
    texts = {
        "calibration": (FIXTURE / "calibration.txt", design.calibration_tokens),
        "held_out": (FIXTURE / "held_out.txt", design.held_out_tokens),
    }
    ids = {
        name: calibration_chunks(
            tokenizer, read_calibration_texts([file]), tokens, design.chunk_tokens, vocab_size=config.vocab_size
        )
        for name, (file, tokens) in texts.items()
    }
    embeddings = fp16(builder.embeddings())
    writer.add("model.embed_tokens.weight", embeddings)
    streams = {name: embeddings[chunk] for name, chunk in ids.items()}  # [chunks, L, d]
    for layer in range(config.num_layers):
        block = builder.block()
        weights, streams = builder.layer(block, streams)
        prefix = f"model.layers.{layer}"
        writer.add(f"{prefix}.input_layernorm.weight", block.input_layernorm.weight.data)
        writer.add(f"{prefix}.post_attention_layernorm.weight", block.post_attention_layernorm.weight.data)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            writer.add(f"{prefix}.self_attn.{name}.weight", getattr(block.self_attn, name).weight.data)
        for name, tensor in weights.items():
            writer.add(f"{prefix}.mlp.{name}.weight", tensor)
        print(f"layer {layer}: {builder.layer_sparsity[-1]}", flush=True)
    writer.add("model.norm.weight", torch.ones(config.hidden_size))
    final = rms_norm(streams["calibration"], config.rms_norm_eps).reshape(-1, config.hidden_size)
    head = builder.randn(config.vocab_size, config.hidden_size)
    head *= design.logit_std / (final @ head.T).std()
    writer.add("lm_head.weight", head)
    held_out = [entry["held_out_sparsity"] for entry in builder.layer_sparsity]
    return {
        "design": design.__dict__,
        "texts": {
            name: f"{file.relative_to(FIXTURE.parent.parent.parent)}, first {tokens} tokens"
            for name, (file, tokens) in texts.items()
        },
        "layers": builder.layer_sparsity,
        "held_out_sparsity": round(sum(held_out) / len(held_out), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b", help="Preset sizes.")
    for name in ("layers", "d", "ffn", "heads", "kv-heads", "vocab"):
        parser.add_argument(f"--{name}", type=int, default=None, help="Overrides the shape's value.")
    parser.add_argument(
        "--target-sparsity",
        type=float,
        default=None,
        help="Build a ReLU model with this fraction of FFN neurons inactive on its text (default: random weights).",
    )
    args = parser.parse_args()
    shape = {key: getattr(args, key) or value for key, value in SHAPES[args.shape].items()}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape["vocab"],
        "hidden_size": shape["d"],
        "intermediate_size": shape["ffn"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "hidden_act": "relu",
        "max_position_embeddings": 2048,
        "torch_dtype": "float16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    parsed = parse_config(config, args.out / "config.json")
    writer = ShardWriter(args.out)
    generator = torch.Generator().manual_seed(0)
    if args.target_sparsity is None:
        write_random(hf_tensor_shapes(parsed), writer, generator)
    else:
        summary = write_sparse(parsed, SparseDesign(args.target_sparsity), writer, generator)
        (args.out / "synthetic.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"realized sparsity on held-out text: {summary['held_out_sparsity']:.4f} (mean over layers)")
    writer.close()
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    # the fixture's tokenizer: its 2048 ids are valid in any larger vocabulary, so calibration text works
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / file, args.out / file)
    print(f"{writer.total:,} parameters, {writer.total * 2 / 1e9:.2f} GB in {writer.shard_count} shards at {args.out}")


if __name__ == "__main__":
    main()
