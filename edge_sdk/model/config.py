"""ModelConfig: one dataclass for a Llama / Mistral / Qwen2-family decoder, read from config.json.

Real checkpoints write RoPE settings two ways: `rope_theta` + `rope_scaling` (transformers < 5 and
most published checkpoints) or `rope_parameters` (transformers >= 5). Both are accepted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edge_sdk.errors import CheckpointError
from edge_sdk.model.activation import Activation

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# hidden_act values as they appear in config.json, mapped to our activation kinds. ProSparse writes
# "fatrelu" with the threshold in hidden_act_param; TurboSparse / SparseQwen2 style dReLU is "drelu".
HIDDEN_ACTS = {"relu": "relu", "fatrelu": "fatrelu", "drelu": "drelu", "silu": "silu", "swish": "silu"}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings; scaling fields are used only by their rope_type."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # llama | mistral | qwen2
    vocab_size: int
    hidden_size: int  # d
    intermediate_size: int  # D
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    activation: Activation
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama when attention_bias
    o_bias: bool = False  # Llama's attention_bias also covers o_proj
    sliding_window: int | None = None  # Mistral
    torch_dtype: str = "float32"  # the dtype the checkpoint's weights are stored in
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.model_type]

    @property
    def kv_groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def parameter_count(self) -> int:
        d, ffn, heads, kv = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads
        attention = d * heads * self.head_dim * 2 + d * kv * self.head_dim * 2
        if self.qkv_bias:
            attention += (heads + 2 * kv) * self.head_dim
        if self.o_bias:
            attention += d
        layer = attention + 3 * d * ffn + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embeddings + d

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["architecture"] = self.architecture
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of to_dict (used by the bundle manifest)."""
        fields = dict(data)
        fields.pop("architecture", None)
        fields["activation"] = Activation(**fields["activation"])
        fields["rope"] = RopeConfig(**fields["rope"])
        fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
        return cls(**fields)


def _require(config: dict[str, Any], key: str, path: Path, kind: type = int) -> Any:
    if key not in config:
        raise CheckpointError(f"{path}: field '{key}' is missing")
    value = config[key]
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise CheckpointError(f"{path}: field '{key}' must be a positive integer, found {value!r}")
    if kind is float and not isinstance(value, (int, float)):
        raise CheckpointError(f"{path}: field '{key}' must be a number, found {value!r}")
    return value


def _model_type(config: dict[str, Any], path: Path) -> str:
    model_type = config.get("model_type")
    if model_type in ARCHITECTURES:
        return model_type
    for architecture in config.get("architectures") or []:
        for known_type, known_architecture in ARCHITECTURES.items():
            if architecture == known_architecture:
                return known_type
    supported = ", ".join(f"{t} ({a})" for t, a in ARCHITECTURES.items())
    raise CheckpointError(
        f"{path}: field 'model_type' is {model_type!r} (architectures {config.get('architectures')}); "
        f"supported: {supported}"
    )


def _activation(config: dict[str, Any], path: Path) -> Activation:
    hidden_act = config.get("hidden_act", "silu")
    if hidden_act not in HIDDEN_ACTS:
        raise CheckpointError(f"{path}: field 'hidden_act' is {hidden_act!r}; supported: {', '.join(HIDDEN_ACTS)}")
    kind = HIDDEN_ACTS[hidden_act]
    if kind != "fatrelu":
        return Activation(kind)
    threshold = config.get("hidden_act_param")
    if not isinstance(threshold, (int, float)) or threshold < 0:
        raise CheckpointError(
            f"{path}: hidden_act 'fatrelu' needs field 'hidden_act_param' (the ReLU threshold, a number >= 0), "
            f"found {threshold!r}"
        )
    return Activation("fatrelu", float(threshold))


def _rope(config: dict[str, Any], path: Path) -> RopeConfig:
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and "rope_theta" in parameters and not config.get("rope_scaling"):
        theta, scaling = parameters["rope_theta"], parameters
    else:
        theta, scaling = config.get("rope_theta", 10000.0), config.get("rope_scaling") or {}
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"{path}: field 'rope_theta' must be a positive number, found {theta!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{path}: rope scaling type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise CheckpointError(f"{path}: rope scaling '{rope_type}' needs a positive 'factor', found {factor!r}")
    if rope_type == "linear":
        return RopeConfig(theta=float(theta), rope_type="linear", factor=float(factor))
    return RopeConfig(
        theta=float(theta),
        rope_type="llama3",
        factor=float(factor),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def parse_config(config: dict[str, Any], path: Path) -> ModelConfig:
    """Validate a Hugging Face config.json dict; `path` names the file in error messages."""
    model_type = _model_type(config, path)
    hidden_size = _require(config, "hidden_size", path)
    num_heads = _require(config, "num_attention_heads", path)
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    if num_heads % num_kv_heads:
        raise CheckpointError(
            f"{path}: num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
        )
    head_dim = config.get("head_dim") or hidden_size // num_heads
    if config.get("mlp_bias"):
        raise CheckpointError(f"{path}: field 'mlp_bias' is true; the sparse FFN supports bias-free FFNs only")
    attention_bias = bool(config.get("attention_bias", False))
    sliding_window = config.get("sliding_window") if model_type == "mistral" else None
    if model_type == "qwen2" and config.get("use_sliding_window"):
        sliding_window = config.get("sliding_window")
    return ModelConfig(
        model_type=model_type,
        vocab_size=_require(config, "vocab_size", path),
        hidden_size=hidden_size,
        intermediate_size=_require(config, "intermediate_size", path),
        num_layers=_require(config, "num_hidden_layers", path),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        activation=_activation(config, path),
        rope=_rope(config, path),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        sliding_window=sliding_window,
        torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=_eos_ids(config.get("eos_token_id")),
    )


def load_config(model_dir: Path) -> ModelConfig:
    """Read and validate MODEL_DIR/config.json."""
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise CheckpointError(f"{model_dir}: model directory not found")
    if not path.is_file():
        raise CheckpointError(f"{path}: config.json is missing (expected a Hugging Face checkpoint directory)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(config).__name__}")
    return parse_config(config, path)
