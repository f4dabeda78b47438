"""manifest.json, validated field by field: the model config, the sparsity settings, the tensors and the files.

Every field has one rule, applied by this module and by the C runtime (jetson/src/config.c, bundle.c), so that
one manifest gets one verdict everywhere. Integers are JSON numbers with an integral value in their range (1 and
1.0 alike, as cJSON reads them); unknown fields are ignored (the digest still covers them).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from edge_sdk import predictors
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle.layout import (
    BUNDLE_DTYPES,
    GROUP_SIZES,
    QUANTIZED_DTYPES,
    WIDER_DOWN_DTYPES,
    WIDER_HEAD_DTYPES,
    ExpectedTensor,
    model_tensors,
    predictor_tensors,
)
from edge_sdk.errors import EdgeSdkError
from edge_sdk.formats import safetensors, strict_json
from edge_sdk.model import config as model_config
from edge_sdk.model.activation import SUPPORTED_ACTIVATIONS, Activation
from edge_sdk.model.config import ModelConfig, RopeConfig
from edge_sdk.predictors.core import CoreSettings
from edge_sdk.quant import INT4_SCHEMES

MAX_LEVELS = 64
SHA256_HEX = frozenset("0123456789abcdef")


class BundleError(EdgeSdkError):
    """A bundle is missing, corrupt, from a newer format, or inconsistent with its manifest."""


def _is_integer_in(value: Any, low: int, high: int) -> bool:
    """An integral JSON number in [low, high] (1 and 1.0 alike)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        return False
    return low <= value <= high


def _is_fraction(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= 1


class Fields:
    """Typed reads of one JSON object's fields; every failure is a BundleError naming `where` and the field."""

    def __init__(self, value: Any, where: str):
        if not isinstance(value, dict):
            raise BundleError(f"{where}: expected a JSON object, found {strict_json.json_type(value)}")
        self.value, self.where = value, where

    def _fail(self, key: str, expected: str) -> BundleError:
        found = self.value.get(key, "nothing")
        shown = repr(found) if len(repr(found)) <= 64 else repr(found)[:61] + "..."
        return BundleError(f"{self.where}: field '{key}' must be {expected}, found {shown}")

    def has(self, key: str) -> bool:
        return key in self.value and self.value[key] is not None

    def has_null(self, key: str) -> bool:
        """Present and null, which is not the same as missing."""
        return key in self.value and self.value[key] is None

    def object(self, key: str) -> Fields:
        if not isinstance(self.value.get(key), dict):
            raise self._fail(key, "a JSON object")
        return Fields(self.value[key], f"{self.where}: {key}")

    def integer(self, key: str, low: int, high: int) -> int:
        value = self.value.get(key)
        if not _is_integer_in(value, low, high):
            raise self._fail(key, f"an integer in [{low}, {high}]")
        return int(value)

    def integer_list(self, key: str, low: int, high: int, max_length: int) -> list[int]:
        values = self.list(key, max_length)
        if not all(_is_integer_in(value, low, high) for value in values):
            raise self._fail(key, f"a list of at most {max_length} integers in [{low}, {high}]")
        return [int(value) for value in values]

    def optional_integer(self, key: str, low: int, high: int) -> int | None:
        return self.integer(key, low, high) if self.has(key) else None

    def number(
        self, key: str, *, above: float | None = None, at_least: float | None = None, float32: bool = False
    ) -> float:
        """A finite number beyond the given limit; with float32, also one float32 holds (model_config.fits_float32)."""
        value = self.value.get(key)
        limits = []
        if above is not None:
            limits.append(f"> {above:g}")
        if at_least is not None:
            limits.append(f">= {at_least:g}")
        expected = "a finite number" + (" " + " and ".join(limits) if limits else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._fail(key, expected)
        if (above is not None and not value > above) or (at_least is not None and not value >= at_least):
            raise self._fail(key, expected)
        if float32 and not model_config.fits_float32(value, positive=above is not None):
            raise self._fail(key, expected + model_config.float32_range(positive=above is not None))
        return float(value)

    def fraction(self, key: str, *, low_open: bool = False) -> float:
        value = self.number(key, at_least=0.0)
        if value > 1 or (low_open and value == 0):
            raise self._fail(key, "a number in (0, 1]" if low_open else "a number in [0, 1]")
        return value

    def boolean(self, key: str) -> bool:
        value = self.value.get(key)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def string(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        value = self.value.get(key)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self._fail(key, "one of " + ", ".join(choices) if choices else "a string")
        return value

    def list(self, key: str, max_length: int) -> list[Any]:
        value = self.value.get(key)
        if not isinstance(value, list) or len(value) > max_length:
            raise self._fail(key, f"a list of at most {max_length} entries")
        return value


def _model(fields: Fields) -> ModelConfig:
    limits = model_config
    model_type = fields.string("model_type", tuple(model_config.ARCHITECTURES))
    architecture = fields.string("architecture")
    if architecture != model_config.ARCHITECTURES[model_type]:
        raise fields._fail("architecture", repr(model_config.ARCHITECTURES[model_type]) + f" for {model_type}")
    vocab_size = fields.integer("vocab_size", 1, limits.MAX_VOCAB_SIZE)
    hidden_size = fields.integer("hidden_size", 1, limits.MAX_HIDDEN_SIZE)
    num_heads = fields.integer("num_heads", 1, limits.MAX_HEADS)
    num_kv_heads = fields.integer("num_kv_heads", 1, limits.MAX_HEADS)
    head_dim = fields.integer("head_dim", 1, limits.MAX_HEAD_DIM)
    if num_heads % num_kv_heads:
        raise BundleError(f"{fields.where}: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if head_dim % 2:
        raise BundleError(f"{fields.where}: head_dim {head_dim} must be even (RoPE rotates pairs)")
    if num_heads * head_dim > limits.MAX_HIDDEN_SIZE:
        raise BundleError(f"{fields.where}: num_heads * head_dim is larger than {limits.MAX_HIDDEN_SIZE}")
    activation = fields.object("activation")
    kind = activation.string("kind", SUPPORTED_ACTIVATIONS)
    threshold = activation.number("threshold", at_least=0.0, float32=True)
    rope = fields.object("rope")
    if rope.string("rope_type", model_config.ROPE_TYPES) == "llama3" and not (
        rope.number("high_freq_factor", above=0.0) > rope.number("low_freq_factor", above=0.0)
    ):
        raise rope._fail("high_freq_factor", "greater than low_freq_factor for rope_type llama3")
    sliding_window = fields.optional_integer("sliding_window", 1, 2**31 - 1)
    bos_token_id = fields.optional_integer("bos_token_id", 0, vocab_size - 1)
    eos = fields.integer_list("eos_token_ids", 0, vocab_size - 1, limits.MAX_EOS_TOKENS)
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=fields.integer("intermediate_size", 1, limits.MAX_HIDDEN_SIZE),
        num_layers=fields.integer("num_layers", 1, limits.MAX_LAYERS),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=fields.number("rms_norm_eps", above=0.0, float32=True),
        max_position_embeddings=fields.integer("max_position_embeddings", 2, limits.MAX_POSITIONS),
        activation=Activation(kind, threshold),
        rope=RopeConfig(
            theta=rope.number("theta", above=0.0),
            rope_type=rope.string("rope_type", model_config.ROPE_TYPES),
            factor=rope.number("factor", above=0.0),
            low_freq_factor=rope.number("low_freq_factor", above=0.0),
            high_freq_factor=rope.number("high_freq_factor", above=0.0),
            original_max_position_embeddings=rope.integer("original_max_position_embeddings", 1, limits.MAX_POSITIONS),
        ),
        tie_word_embeddings=fields.boolean("tie_word_embeddings"),
        qkv_bias=fields.boolean("qkv_bias"),
        o_bias=fields.boolean("o_bias"),
        sliding_window=sliding_window,
        torch_dtype=fields.string("torch_dtype"),
        bos_token_id=bos_token_id,
        eos_token_ids=tuple(eos),
    )


@dataclass(frozen=True)
class LevelChoice:
    """A resolved operating point: the row of the level tensors to use (None: the predictor has no levels), the
    level itself, and whether every neuron is computed (dense decoding, the speedups' baseline)."""

    index: int | None
    level: float | None
    dense: bool

    @property
    def reported(self) -> float | str | None:
        """The `sparsity_level` of the reports (`run`'s, `eval`'s, `bench e2e`'s): "dense", the level, or None
        (a predictor without levels)."""
        return "dense" if self.dense else self.level


def operating_point_text(predictor: str, reported: float | str | None) -> str:
    """How a run decoded, in the words `run`, `eval` and `bench e2e` print, from its predictor and its reported level
    (LevelChoice.reported)."""
    if reported == "dense":
        return "dense"
    if reported is not None:
        return f"sparsity {reported:g}"
    return "no predictor" if predictor == predictors.NO_PREDICTOR else f"{predictor} predictor"


@dataclass(frozen=True)
class SparsityConfig:
    """The bundle's predictor: kind, calibrated levels, default level and per-layer settings."""

    predictor: str
    levels: tuple[float, ...]
    default_level: float | None  # None: dense by default (no level was within the export's perplexity budget)
    layers: tuple[dict[str, Any], ...]
    core_alpha: float = CoreSettings.alpha
    core_beta: float = CoreSettings.beta

    def level_index(self, level: float | None) -> int:
        """Index of a calibrated level in the weights' stacked biases/thresholds (None: the default level)."""
        if level is None:
            level = self.default_level
        for index, known in enumerate(self.levels):
            if level is not None and abs(known - level) < 1e-9:
                return index
        known_levels = ", ".join(f"{lv:g}" for lv in self.levels) or "none (this predictor has no levels)"
        shown = "the default" if level is None else f"{level:g}"
        raise BundleError(f"sparsity level {shown} was not calibrated; calibrated levels: {known_levels}")

    def resolve(self, level: float | None, dense: bool = False) -> LevelChoice:
        """The operating point for a requested level (None: the default) or dense decoding; BundleError names the
        calibrated levels when the request is not one of them."""
        if self.levels:
            if level is None and self.default_level is None:
                return LevelChoice(None, None, True)
            index = self.level_index(level)
            return LevelChoice(index, self.levels[index], dense)
        if level is not None and not dense:
            self.level_index(level)  # raises: this predictor has no levels
        return LevelChoice(None, None, dense)


def _sparsity(fields: Fields, num_layers: int) -> SparsityConfig:
    predictor = fields.string("predictor", tuple(predictors.KINDS))
    kind = predictors.KINDS[predictor]
    levels = fields.list("levels", MAX_LEVELS)
    if not all(_is_fraction(level) for level in levels) or levels != sorted(set(levels)):
        raise fields._fail("levels", f"a strictly increasing list of at most {MAX_LEVELS} numbers in [0, 1]")
    if kind.has_levels and not levels:
        raise fields._fail("levels", f"at least one calibrated level for predictor '{predictor}'")
    if not kind.has_levels and levels:
        raise fields._fail("levels", f"empty for predictor '{predictor}', which has no levels")
    default_level = None
    if levels and not fields.has_null("default_level"):
        default_level = fields.fraction("default_level")
        if default_level not in levels:
            raise fields._fail("default_level", "one of the calibrated levels, or null for dense")
    elif fields.has("default_level"):
        raise fields._fail("default_level", f"null for predictor '{predictor}', which has no levels")
    core_alpha = fields.fraction("core_alpha", low_open=True)
    core_beta = fields.fraction("core_beta", low_open=True)
    if "settings" not in fields.value or not (fields.value["settings"] is None or fields.has("settings")):
        raise fields._fail("settings", "a JSON object or null")
    if fields.has("settings"):
        fields.object("settings")
    layers = fields.list("layers", model_config.MAX_LAYERS)
    if len(layers) != num_layers:
        raise fields._fail("layers", f"a list of {num_layers} entries, one per layer")
    for index, layer in enumerate(layers):
        entry = Fields(layer, f"{fields.where}: layers[{index}]")
        entry.integer("layer", index, index)
        entry.string("kind", (predictor,))
    return SparsityConfig(
        predictor, tuple(float(level) for level in levels), default_level, tuple(layers), core_alpha, core_beta
    )


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


def _files(fields: Fields, graphs: dict[str, str]) -> dict[str, FileEntry]:
    files = {}
    for name, entry in fields.value.items():
        if not bundle_format.FILE_NAME.fullmatch(name) or name == bundle_format.MANIFEST_FILE:
            raise BundleError(
                f"{fields.where}: file name {name[:64]!r} is not allowed: a bundle lists plain file names of its own "
                f"directory (letters, digits, '.', '_', '-', not starting with '.'), never manifest.json itself"
            )
        record = Fields(entry, f"{fields.where}['{name}']")
        size = record.integer("size", 0, strict_json.MAX_SAFE_INTEGER)
        digest = record.string("sha256")
        if len(digest) != 64 or not set(digest) <= SHA256_HEX:
            raise record._fail("sha256", "64 lowercase hexadecimal digits")
        files[name] = FileEntry(size, digest)
    for required in (*bundle_format.REQUIRED_FILES, *graphs.values()):
        if required not in files:
            raise BundleError(f"{fields.where}: does not list {required}, which every bundle needs")
    return files


def _graphs(fields: Fields) -> dict[str, str]:
    graphs = {}
    for phase in bundle_format.GRAPH_PHASES:
        name = fields.string(phase)
        if not bundle_format.FILE_NAME.fullmatch(name):
            raise fields._fail(phase, "a plain file name of the bundle directory")
        graphs[phase] = name
    return graphs


def _declared_tensors(fields: Fields) -> dict[str, ExpectedTensor]:
    declared = {}
    for name, entry in fields.value.items():
        record = Fields(entry, f"{fields.where}['{name[:200]}']")
        dtype = record.string("dtype", tuple(safetensors.DTYPE_SIZES))
        shape = record.integer_list("shape", 0, safetensors.MAX_DIMENSION, safetensors.MAX_RANK)
        declared[name] = ExpectedTensor(dtype, tuple(shape))
    return declared


def _ranks(
    declared: dict[str, ExpectedTensor], config: ModelConfig, kind: predictors.PredictorKind, where: str
) -> list[int] | None:
    """Each layer's rank, for a kind storing a tensor with a rank dimension (svd.a [D, rank]), read from its
    declared shape: 1 <= rank <= min(d, D); None for kinds without."""
    ranked = next((tensor for tensor in kind.tensors if "rank" in tensor.shape), None)
    if ranked is None:
        return None
    limit = min(config.hidden_size, config.intermediate_size)
    sizes = {"d": config.hidden_size, "D": config.intermediate_size}
    axis = ranked.shape.index("rank")
    wanted = ", ".join("rank" if size == "rank" else str(sizes.get(size, size)) for size in ranked.shape)
    ranks = []
    for layer in range(config.num_layers):
        name = predictors.tensor_name(layer, kind.name, ranked.name)
        entry = declared.get(name)
        if entry is None or len(entry.shape) != len(ranked.shape) or not 1 <= entry.shape[axis] <= limit:
            found = "missing" if entry is None else f"{entry.dtype} {list(entry.shape)}"
            raise BundleError(f"{where}: tensor '{name}' must be [{wanted}] with 1 <= rank <= {limit}, found {found}")
        ranks.append(entry.shape[axis])
    return ranks


def expected_tensors(
    config: ModelConfig,
    dtype: str,
    max_seq_len: int,
    sparsity: SparsityConfig,
    declared: dict[str, ExpectedTensor],
    where: str,
    group_size: int | None = None,
    head_dtype: str | None = None,
    factor_dtype: str = "F32",
    asymmetric: bool = False,
    down_dtype: str | None = None,
) -> dict[str, ExpectedTensor]:
    ranks = _ranks(declared, config, predictors.kind(sparsity.predictor), where)
    model = model_tensors(config, dtype, max_seq_len, group_size, head_dtype, asymmetric, down_dtype)
    return model | predictor_tensors(config, sparsity.predictor, len(sparsity.levels), ranks, factor_dtype)


def _is_predictor_factor(name: str) -> bool:
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "layers" or parts[2] not in predictors.KINDS:
        return False
    return any(tensor.factor and tensor.name == parts[3] for tensor in predictors.kind(parts[2]).tensors)


def _check_tensors(
    declared: dict[str, ExpectedTensor],
    expected: dict[str, ExpectedTensor],
    where: str,
    factor_rule: str = "",
) -> None:
    """declared must be exactly expected; factor_rule: why the predictor factors have their dtype (the message of a
    factor of the right shape in the wrong dtype)."""
    for name, want in expected.items():
        found = declared.get(name)
        if found is None:
            raise BundleError(f"{where}: tensor '{name}' is missing ({want.dtype} {list(want.shape)} expected)")
        if found.shape == want.shape and found.dtype != want.dtype and _is_predictor_factor(name):
            raise BundleError(
                f"{where}: tensor '{name}' is declared {found.dtype}, expected {want.dtype}: {factor_rule}"
            )
        if found != want:
            raise BundleError(
                f"{where}: tensor '{name}' is declared {found.dtype} {list(found.shape)}, the model config needs "
                f"{want.dtype} {list(want.shape)}"
            )
    extra = sorted(set(declared) - set(expected))
    if extra:
        raise BundleError(f"{where}: tensor '{extra[0][:200]}' belongs to no part of this model ({len(extra)} such)")


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.json."""

    raw: dict[str, Any]
    format_version: int
    config: ModelConfig
    dtype: str
    max_seq_len: int
    sparsity: SparsityConfig
    graphs: dict[str, str]
    tensors: dict[str, ExpectedTensor]
    files: dict[str, FileEntry]
    group_size: int | None = None  # int8 / int4 bundles: values per fp16 scale along each matrix row
    head_dtype: str | None = None  # the LM head's quantized dtype where it differs from dtype (format version 4)
    int4_scheme: str | None = None  # int4 bundles: "symmetric" or "asymmetric" (format version 6); None otherwise
    down_dtype: str | None = None  # the FFN down projections' dtype where it differs from dtype (format version 7)

    @property
    def asymmetric(self) -> bool:
        """Whether the int4 matrices carry group minimums (layout.py, int4_scheme "asymmetric")."""
        return self.int4_scheme == "asymmetric"

    @property
    def lm_head_dtype(self) -> str:
        """The dtype the LM head matrix is stored in."""
        return self.head_dtype or self.dtype

    @property
    def ffn_down_dtype(self) -> str:
        """The dtype the FFN down projections are stored in."""
        return self.down_dtype or self.dtype


def _group_size(fields: Fields, dtype: str, config: ModelConfig) -> int | None:
    """group_size: for int8 / int4 one of GROUP_SIZES dividing the columns of every quantized matrix (d, and
    num_heads * head_dim for o_proj); null or absent for the float dtypes."""
    if dtype not in QUANTIZED_DTYPES:
        if fields.has("group_size"):
            raise fields._fail("group_size", f"null or absent for dtype {dtype}, which is not quantized")
        return None
    value = fields.value.get("group_size")
    if not any(_is_integer_in(value, size, size) for size in GROUP_SIZES):
        raise fields._fail("group_size", f"one of {', '.join(map(str, GROUP_SIZES))} for dtype {dtype}")
    group_size = int(value)
    for what, cols in (
        ("hidden_size", config.hidden_size),
        ("num_heads * head_dim", config.num_heads * config.head_dim),
    ):
        if cols % group_size:
            raise fields._fail("group_size", f"a divisor of model {what} {cols} (each quantized row is whole groups)")
    return group_size


def _wider_dtype(
    fields: Fields, dtype: str, version: int, since: int, name: str, wider: dict[str, tuple[str, ...]]
) -> str | None:
    """head_dtype (format version 4 on) or down_dtype (7 on), `name`, read from version `since` on (older versions do
    not read it): absent or null, the LM head / the FFN down projections are stored in the bundle's dtype; else a
    quantized dtype wider than dtype (`wider`, WIDER_HEAD_DTYPES or WIDER_DOWN_DTYPES: int8 in an int4 bundle)."""
    if version < since or not fields.has(name):
        return None
    allowed = wider.get(dtype, ())
    if not allowed:
        raise fields._fail(name, f"null or absent for dtype {dtype} (a {name} of its own needs int4)")
    return fields.string(name, allowed)


def _int4_scheme(fields: Fields, dtype: str, version: int) -> str | None:
    """int4_scheme (format version 6 on; older versions do not read it): for int4, absent or "symmetric", or
    "asymmetric" (each int4 matrix has <name>.mins); null or absent for every other dtype."""
    present = version >= bundle_format.ASYMMETRIC_INT4_FORMAT_VERSION and fields.has("int4_scheme")
    if dtype != "int4":
        if present:
            raise fields._fail("int4_scheme", f"null or absent for dtype {dtype} (only int4 has a scheme)")
        return None
    return fields.string("int4_scheme", INT4_SCHEMES) if present else "symmetric"


def factor_rule(dtype: str, version: int) -> str:
    """Why the predictor factors of a bundle of weight dtype `dtype` and format version `version` have their dtype, as
    the readers say it when a bundle declares them otherwise."""
    half = bundle_format.HALF_PREDICTOR_FACTORS_FORMAT_VERSION
    if dtype == "fp32":
        return "fp32 bundles store their predictor factors in F32"
    if version < half:
        return f"format version {version} stores predictor factors in F32 (F16 since version {half})"
    return f"format version {version} stores the predictor factors of {dtype} bundles in F16"


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own digest field: a changed manifest is detected like any
    other changed file, while re-indenting it is not a change."""
    content = {key: value for key, value in manifest.items() if key != bundle_format.MANIFEST_DIGEST_FIELD}
    return hashlib.sha256(strict_json.canonical(content)).hexdigest()


def validate(raw: Any, where: str) -> Manifest:
    """Check every field of a parsed manifest.json; `where` (its path) starts every message."""
    fields = Fields(raw, where)
    fields.string("format", (bundle_format.FORMAT,))
    version = fields.integer("format_version", 1, 2**31 - 1)
    if version > bundle_format.FORMAT_VERSION:
        raise BundleError(
            f"{where}: bundle format version {version} is newer than this edge-sdk supports "
            f"({bundle_format.FORMAT_VERSION}); upgrade edge-sdk or re-export the bundle"
        )
    recorded = fields.string(bundle_format.MANIFEST_DIGEST_FIELD)
    if recorded != manifest_digest(raw):
        raise BundleError(
            f"{where}: field '{bundle_format.MANIFEST_DIGEST_FIELD}' does not match the manifest's content "
            f"(the manifest changed)"
        )
    if "exporter" in raw:
        exporter = fields.object("exporter")
        exporter.string("name")
        exporter.string("version")
    config = _model(fields.object("model"))
    dtype = fields.string("dtype", BUNDLE_DTYPES)
    if dtype == "int4" and version < bundle_format.SIGNED_INT4_FORMAT_VERSION:
        raise BundleError(
            f"{where}: an int4 bundle of format version {version} stores its codes as code + 8, which this edge-sdk "
            f"no longer reads (signed codes since format version {bundle_format.SIGNED_INT4_FORMAT_VERSION}); "
            f"re-export the bundle"
        )
    tied_layout = bundle_format.QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION
    if dtype in QUANTIZED_DTYPES and config.tie_word_embeddings and version < tied_layout:
        raise BundleError(
            f"{where}: an {dtype} bundle of format version {version} of a model with tied embeddings stores the "
            f"embedding (its LM head) in F16, which this edge-sdk no longer reads (quantized since format version "
            f"{tied_layout}); re-export the bundle"
        )
    group_size = _group_size(fields, dtype, config)
    head_dtype = _wider_dtype(
        fields, dtype, version, bundle_format.HEAD_DTYPE_FORMAT_VERSION, "head_dtype", WIDER_HEAD_DTYPES
    )
    int4_scheme = _int4_scheme(fields, dtype, version)
    down_dtype = _wider_dtype(
        fields, dtype, version, bundle_format.DOWN_DTYPE_FORMAT_VERSION, "down_dtype", WIDER_DOWN_DTYPES
    )
    max_seq_len = fields.integer("max_seq_len", 2, config.max_position_embeddings)
    sparsity = _sparsity(fields.object("sparsity"), config.num_layers)
    graphs = _graphs(fields.object("graphs"))
    declared = _declared_tensors(fields.object("tensors"))
    tensors_where = f"{where}: tensors"
    factor_dtype = bundle_format.predictor_factor_dtype(dtype, version)
    _check_tensors(
        declared,
        expected_tensors(
            config,
            dtype,
            max_seq_len,
            sparsity,
            declared,
            tensors_where,
            group_size,
            head_dtype,
            factor_dtype,
            int4_scheme == "asymmetric",
            down_dtype,
        ),
        tensors_where,
        factor_rule(dtype, version),
    )
    files = _files(fields.object("files"), graphs)
    return Manifest(
        raw,
        version,
        config,
        dtype,
        max_seq_len,
        sparsity,
        graphs,
        declared,
        files,
        group_size,
        head_dtype,
        int4_scheme,
        down_dtype,
    )
