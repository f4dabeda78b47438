"""ModelConfig: one dataclass for a Llama / Mistral / Qwen2-family decoder, read from config.json.

config.json comes from other tools and other people, so it is read like every other foreign JSON file: a regular
file (through symbolic links, as in a Hugging Face cache snapshot) of at most MAX_CONFIG_BYTES, under the strict
JSON rule (formats/strict_json.py). Every field the decoder uses is then checked against the rule the bundle
manifest applies to the same value (bundle/manifest.py `_model`, jetson/src/config.c), so a config.json that
passes here exports to a bundle that every reader accepts:

- a field set to null counts as absent (transformers writes null for unset fields); an absent field takes
  transformers' default where it has one and is an error where it has none;
- integers are integral JSON numbers (1 and 1.0 alike, as in the manifest) within the limits below; booleans are
  true or false; numbers are finite (rms_norm_eps and hidden_act_param also within float32's range); strings are
  strings;
- head_dim, when not given, is hidden_size / num_attention_heads and must divide exactly: a remainder is far more
  likely a typo than a model whose heads leave part of the hidden state out (such a model states head_dim);
- token ids lie in [0, vocab_size).

Real checkpoints write RoPE settings two ways: `rope_theta` + `rope_scaling` (transformers < 5 and
most published checkpoints) or `rope_parameters` (transformers >= 5). Both are accepted, with transformers'
precedence: the RoPE object is rope_scaling when it is a non-empty object, else rope_parameters; rope_theta comes
from that object when set there, else from the top level, else 10000.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edge_sdk.errors import CheckpointError
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import read_bounded
from edge_sdk.model.activation import Activation

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# hidden_act values as they appear in config.json, mapped to our activation kinds. ProSparse writes
# "fatrelu" with the threshold in hidden_act_param; TurboSparse / SparseQwen2 style dReLU is "drelu".
HIDDEN_ACTS = {"relu": "relu", "fatrelu": "fatrelu", "drelu": "drelu", "silu": "silu", "swish": "silu"}
ROPE_TYPES = ("default", "linear", "llama3")  # a bundle's
# config.json may also name dynamic NTK scaling, which is the default RoPE up to max_position_embeddings (_rope)
CONFIG_ROPE_TYPES = (*ROPE_TYPES, "dynamic")
# max_position_embeddings of a config.json without it: the default of each family's transformers config class
DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}
# Limits of every reader (jetson/src/config.c has the same): far above any real model, low enough that every size
# computed from them fits 64-bit arithmetic and a hostile file cannot ask for absurd allocations.
MAX_VOCAB_SIZE = 1 << 24
MAX_HIDDEN_SIZE = 1 << 20  # hidden_size, intermediate_size and num_heads * head_dim
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_HEAD_DIM = 16384
MAX_POSITIONS = 1 << 24
MAX_EOS_TOKENS = 16
MAX_SLIDING_WINDOW = 2**31 - 1  # an int32 in the C runtime
# rms_norm_eps and the fatrelu threshold are float32 in every graph and in the C runtime: a value float32 cannot hold
# would become inf (or an eps of 0) there, so every reader refuses it.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SMALLEST_POSITIVE = 1.401298464324817e-45  # the smallest subnormal; anything nearer 0 rounds to 0
# Real config.json files are a few KiB; the bound keeps a hostile one from filling memory before it is parsed.
MAX_CONFIG_BYTES = 16 << 20
CONFIG_FILE = "config.json"


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
    qkv_bias: bool = False  # Qwen2 always; Llama when attention_bias (Mistral never)
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


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config must hold, with its shape (Hugging Face names)."""
    d, ffn, heads, kv, hd = (
        config.hidden_size,
        config.intermediate_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
    )
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, d),
        "model.norm.weight": (d,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (d,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (d,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (heads * hd, d)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv * hd, d)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv * hd, d)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (d, heads * hd)
        if config.qkv_bias:
            shapes[f"{prefix}.self_attn.q_proj.bias"] = (heads * hd,)
            shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv * hd,)
            shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv * hd,)
        if config.o_bias:
            shapes[f"{prefix}.self_attn.o_proj.bias"] = (d,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (ffn, d)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (ffn, d)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (d, ffn)
    return shapes


_REQUIRED = object()  # default of the _Fields reads: the field must be present


def _shown(value: Any) -> str:
    """A found value as the user wrote it in config.json, on one line and shortened."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 64 else text[:61] + "..."


def fits_float32(value: float, *, positive: bool) -> bool:
    """Whether float32 holds value without overflowing to inf or (positive: a value that must stay > 0) to 0."""
    return abs(value) <= FLOAT32_MAX and (not positive or value >= FLOAT32_SMALLEST_POSITIVE)


def float32_range(*, positive: bool) -> str:
    """The range fits_float32 accepts, as the end of an 'expected' phrase."""
    if positive:
        return f" that float32 holds (from {FLOAT32_SMALLEST_POSITIVE:g} to {FLOAT32_MAX:g})"
    return f" that float32 holds (at most {FLOAT32_MAX:g})"


def _is_integer_in(value: Any, low: int, high: int) -> bool:
    """An integral JSON number in [low, high] (1 and 1.0 alike, as the bundle manifest reads them)."""
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return integral and not isinstance(value, bool) and low <= value <= high


class _Fields:
    """Typed reads of one JSON object of config.json; every failure names the file, the field, what it must be and
    what was found. `prefix` names the object's place for nested fields ("rope_scaling.")."""

    def __init__(self, value: dict[str, Any], where: str, prefix: str = ""):
        self.value, self.where, self.prefix = value, where, prefix

    def fail(self, key: str, expected: str) -> CheckpointError:
        if key not in self.value:
            return CheckpointError(f"{self.where}: field '{self.prefix}{key}' is missing; it must be {expected}")
        return CheckpointError(
            f"{self.where}: field '{self.prefix}{key}' must be {expected}, found {_shown(self.value[key])}"
        )

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    def integer(self, key: str, low: int, high: int, default: Any = _REQUIRED) -> Any:
        if default is not _REQUIRED and not self.has(key):
            return default
        value = self.value.get(key)
        if not _is_integer_in(value, low, high):
            raise self.fail(key, f"an integer in [{low}, {high}]")
        return int(value)

    def number(
        self,
        key: str,
        *,
        above: float | None = None,
        at_least: float | None = None,
        float32: bool = False,
        default: Any = _REQUIRED,
    ) -> Any:
        """A finite number beyond the given limit; with float32, also one that float32 holds (fits_float32)."""
        if default is not _REQUIRED and not self.has(key):
            return default
        value = self.value.get(key)
        limit = f" > {above:g}" if above is not None else f" >= {at_least:g}" if at_least is not None else ""
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not finite or (above is not None and not value > above) or (at_least is not None and not value >= at_least):
            raise self.fail(key, "a finite number" + limit)
        if float32 and not fits_float32(value, positive=above is not None):
            raise self.fail(key, "a finite number" + limit + float32_range(positive=above is not None))
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        if not isinstance(self.value[key], bool):
            raise self.fail(key, "true or false")
        return self.value[key]

    def string(self, key: str, choices: tuple[str, ...] | None = None, default: Any = _REQUIRED) -> Any:
        if default is not _REQUIRED and not self.has(key):
            return default
        value = self.value.get(key)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.fail(key, "one of " + ", ".join(choices) if choices else "a string")
        return value

    def object(self, key: str) -> _Fields:
        """The nested object at key (an empty one when absent)."""
        value = self.value.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.fail(key, "a JSON object")
        return _Fields(value or {}, self.where, f"{self.prefix}{key}.")


def _model_type(fields: _Fields) -> str:
    model_type = fields.string("model_type", default=None)
    if model_type in ARCHITECTURES:
        return model_type
    if fields.has("architectures"):
        architectures = fields.value["architectures"]
        if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
            raise fields.fail("architectures", "a list of strings")
        for known_type, known_architecture in ARCHITECTURES.items():
            if known_architecture in architectures:
                return known_type
    raise fields.fail(
        "model_type",
        f"one of {', '.join(ARCHITECTURES)} (or 'architectures' must name {', '.join(ARCHITECTURES.values())})",
    )


def _head_dim(fields: _Fields, hidden_size: int, num_heads: int) -> int:
    given = fields.has("head_dim")
    if given:
        head_dim = fields.integer("head_dim", 1, MAX_HEAD_DIM)
    elif hidden_size % num_heads:
        raise CheckpointError(
            f"{fields.where}: field 'hidden_size' ({hidden_size}) must be a multiple of num_attention_heads "
            f"({num_heads}) when field 'head_dim' is not given"
        )
    else:
        head_dim = hidden_size // num_heads
    if head_dim % 2:
        problem = "even (RoPE rotates pairs of dimensions)"
    elif head_dim > MAX_HEAD_DIM:
        problem = f"at most {MAX_HEAD_DIM}"
    elif num_heads * head_dim > MAX_HIDDEN_SIZE:
        problem = f"at most {MAX_HIDDEN_SIZE // num_heads}, so that num_attention_heads * head_dim <= {MAX_HIDDEN_SIZE}"
    else:
        return head_dim
    if given:
        raise fields.fail("head_dim", problem)
    raise CheckpointError(
        f"{fields.where}: head_dim, hidden_size / num_attention_heads when field 'head_dim' is not given, must be "
        f"{problem}, found {head_dim}"
    )


def _activation(fields: _Fields) -> Activation:
    kind = HIDDEN_ACTS[fields.string("hidden_act", tuple(HIDDEN_ACTS), default="silu")]
    if kind != "fatrelu":
        return Activation(kind)
    # ProSparse's fatrelu keeps g only above this threshold; there is no default to fall back on
    return Activation("fatrelu", fields.number("hidden_act_param", at_least=0.0, float32=True))


def _rope(fields: _Fields, max_position_embeddings: int) -> RopeConfig:
    # As transformers (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict / standardize_rope_params): rope_scaling,
    # when it is a non-empty object, replaces rope_parameters; rope_theta comes from that object, else from the top
    # level, else 10000; llama3's original_max_position_embeddings from the top level when set there, else from that
    # object, else max_position_embeddings.
    rope_scaling = fields.object("rope_scaling")
    scaling = rope_scaling if rope_scaling.value else fields.object("rope_parameters")
    theta = (scaling if scaling.has("rope_theta") else fields).number("rope_theta", above=0.0, default=10000.0)
    # "type" is what transformers wrote before it was renamed "rope_type"
    type_key = "type" if scaling.has("type") and not scaling.has("rope_type") else "rope_type"
    rope_type = scaling.string(type_key, CONFIG_ROPE_TYPES, default="default")
    if rope_type == "default":
        return RopeConfig(theta=theta)
    factor = scaling.number("factor", above=0.0)
    if rope_type == "dynamic":
        # transformers' dynamic NTK scaling raises theta only for a sequence longer than max_position_embeddings
        # (base * (factor * seq_len / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2)), seq_len clamped
        # up to max_position_embeddings): below it the tables are the default's, and nothing edge-sdk computes is
        # longer (a bundle's max_seq_len, calibration chunks and evaluation windows are bounded by it)
        return RopeConfig(theta=theta)
    if rope_type == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=factor)
    # llama3 interpolates between the two wavelengths by 1 / (high - low): equal factors divide by zero. Like
    # transformers, which refuses a llama3 config without them, both factors are required.
    low_freq_factor = scaling.number("low_freq_factor", above=0.0)
    high_freq_factor = scaling.number("high_freq_factor", above=0.0)
    if not high_freq_factor > low_freq_factor:
        raise scaling.fail("high_freq_factor", f"greater than low_freq_factor ({low_freq_factor:g})")
    original = fields if fields.has("original_max_position_embeddings") else scaling
    return RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=original.integer(
            "original_max_position_embeddings", 1, MAX_POSITIONS, default=max_position_embeddings
        ),
    )


QWEN2_MAX_WINDOW_LAYERS = 28  # transformers' Qwen2Config default
# transformers' MistralConfig, MinistralConfig and Qwen2Config default: a config.json without the key has this window
# (null: no window)
DEFAULT_SLIDING_WINDOW = 4096


def _window_size(fields: _Fields) -> int | None:
    if "sliding_window" not in fields.value:
        return DEFAULT_SLIDING_WINDOW
    return fields.integer("sliding_window", 1, MAX_SLIDING_WINDOW, default=None)


def _sliding_layers(fields: _Fields, num_layers: int) -> list[bool]:
    layer_types = fields.value["layer_types"]
    kinds = ("full_attention", "sliding_attention")
    if not isinstance(layer_types, list) or len(layer_types) != num_layers or any(k not in kinds for k in layer_types):
        expected = f"a list of {num_layers} entries, each 'full_attention' or 'sliding_attention'"
        raise fields.fail("layer_types", expected)
    return [kind == "sliding_attention" for kind in layer_types]


def _sliding_window(fields: _Fields, model_type: str, num_layers: int) -> int | None:
    # Llama has no window. Mistral attends within its window in every layer, unless config.json has a layer_types key:
    # transformers then reads it as a Ministral config (AutoConfig's mistral -> ministral remap), whose layers slide as
    # layer_types says (null: every layer). Qwen2 only with use_sliding_window, and then, as transformers' Qwen2Config
    # builds its layer_types, only in the layers from max_window_layers on (or the layers layer_types names): a Qwen2
    # of at most 28 layers attends over the whole context. An absent sliding_window is transformers' default, 4096; null
    # is none. The graphs and the C runtime hold one window for every layer, so a model whose layers mix full and
    # sliding attention is refused.
    if model_type == "llama" or (model_type == "qwen2" and not fields.boolean("use_sliding_window", False)):
        return None
    window = _window_size(fields)
    if fields.has("layer_types"):
        sliding = _sliding_layers(fields, num_layers)
        key = "layer_types"
    elif model_type == "mistral":
        return window
    else:
        first = fields.integer("max_window_layers", 0, MAX_LAYERS, default=QWEN2_MAX_WINDOW_LAYERS)
        sliding = [layer >= first for layer in range(num_layers)]
        key = "max_window_layers"
    if window is None or not any(sliding):
        return None
    if not all(sliding):
        raise fields.fail(
            key,
            f"such that every layer or none attends within the sliding window (edge-sdk runs one attention kind in "
            f"all layers; here {sum(sliding)} of the {num_layers} layers slide, from layer {sliding.index(True)})",
        )
    return window


def _eos_token_ids(fields: _Fields, vocab_size: int) -> tuple[int, ...]:
    value = fields.value.get("eos_token_id")
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if len(ids) > MAX_EOS_TOKENS or not all(_is_integer_in(token, 0, vocab_size - 1) for token in ids):
        raise fields.fail(
            "eos_token_id", f"a token id in [0, {vocab_size - 1}] or a list of at most {MAX_EOS_TOKENS} such ids"
        )
    return tuple(int(token) for token in ids)


def parse_config(config: dict[str, Any], path: Path) -> ModelConfig:
    """Validate a Hugging Face config.json dict (see the module docstring); `path` names the file in messages."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {strict_json.json_type(config)}")
    fields = _Fields(config, str(path))
    model_type = _model_type(fields)
    vocab_size = fields.integer("vocab_size", 1, MAX_VOCAB_SIZE)
    hidden_size = fields.integer("hidden_size", 1, MAX_HIDDEN_SIZE)
    num_heads = fields.integer("num_attention_heads", 1, MAX_HEADS)
    num_kv_heads = fields.integer("num_key_value_heads", 1, MAX_HEADS, default=num_heads)
    if num_heads % num_kv_heads:
        raise fields.fail("num_key_value_heads", f"a divisor of num_attention_heads ({num_heads})")
    # Only transformers' Llama reads attention_bias and mlp_bias: Mistral's projections never have biases, Qwen2's
    # always have q/k/v biases and no others; for those families the keys are checked but change nothing.
    mlp_bias = fields.boolean("mlp_bias", False)
    if mlp_bias and model_type == "llama":
        raise fields.fail("mlp_bias", "false (the sparse FFN supports bias-free FFNs only)")
    attention_bias = fields.boolean("attention_bias", False) and model_type == "llama"
    num_layers = fields.integer("num_hidden_layers", 1, MAX_LAYERS)
    max_position_embeddings = fields.integer(
        "max_position_embeddings", 2, MAX_POSITIONS, default=DEFAULT_MAX_POSITIONS[model_type]
    )
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=fields.integer("intermediate_size", 1, MAX_HIDDEN_SIZE),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=_head_dim(fields, hidden_size, num_heads),
        rms_norm_eps=fields.number("rms_norm_eps", above=0.0, float32=True, default=1e-6),
        max_position_embeddings=max_position_embeddings,
        activation=_activation(fields),
        rope=_rope(fields, max_position_embeddings),
        tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias,
        sliding_window=_sliding_window(fields, model_type, num_layers),
        # transformers >= 5 writes "dtype"
        torch_dtype=fields.string("torch_dtype", default=None) or fields.string("dtype", default="float32"),
        bos_token_id=fields.integer("bos_token_id", 0, vocab_size - 1, default=None),
        eos_token_ids=_eos_token_ids(fields, vocab_size),
    )


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate MODEL_DIR/config.json."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        problem = "is not a directory" if model_dir.exists() else "model directory not found"
        raise CheckpointError(f"{model_dir}: {problem} (expected a Hugging Face checkpoint directory)")
    path = model_dir / CONFIG_FILE
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: config.json is missing (expected a Hugging Face checkpoint directory)")
    data = read_bounded(path, MAX_CONFIG_BYTES, follow_symlinks=True, error=CheckpointError)
    return parse_config(strict_json.parse_object(data, str(path), error=CheckpointError), path)
