"""Which tensors a bundle holds, with their dtypes and shapes: what the exporter writes and every reader expects.

Model tensors keep their Hugging Face names without the `model.` prefix; W_down is stored neuron-major as
`layers.{i}.mlp.down_proj.weight_t` [D, d], so one neuron's gate, up and down weights are one row each. Matrices
are stored in the bundle's weight dtype, vectors (norms, biases) in F32, and the RoPE tables `rope.cos` /
`rope.sin` [max_seq_len, head_dim] in F32. Predictor tensors follow edge_sdk.predictors.

Quantized bundles (dtype int8 | int4, kernels/cpu/QUANT.md): every matrix holds its codes under its own
name (I8 [rows, cols] for int8, U8 [rows, cols / 2] for packed int4) and its fp16 group scales as `<name>.scales`
F16 [rows, cols / group_size], except the token embedding of a model with an LM head of its own: a row lookup, not
a product, it stays F16. A tied embedding is the LM head too, a product over the whole matrix every token, so it is
stored once in the quantized format (since bundle format version 3) and the lookup dequantizes its one row.

The LM head (lm_head.weight, or the tied embedding, which is both) may be stored in a wider quantized dtype than the
bundle's other matrices (export --head-dtype, manifest head_dtype, since format version 4): int8 codes with fp16
scales of the same group size in an int4 bundle. The head is read in full every token and its error reaches every
logit, so it is the matrix whose precision buys the most quality per byte.

An asymmetric int4 bundle (export --int4-scheme asymmetric, manifest int4_scheme "asymmetric", since bundle format
version 6) stores llama.cpp's Q4_1 grid: every int4 matrix has, besides its codes and scales, its fp16 group minimums
as `<name>.mins` F16 [rows, cols / group_size], and a value is (code + 8) * scale + min (edge_sdk/quant.py). An int8
head of such a bundle (head_dtype) stays symmetric, without minimums.

The FFN down projections (`layers.{i}.mlp.down_proj.weight_t`) may be stored wider too (export --down-dtype, manifest
down_dtype, since bundle format version 7): int8 codes with fp16 scales of the same group size in an int4 bundle,
symmetric in an asymmetric one too, still neuron-major so that a skipped neuron skips one row of each matrix. Their
groups run along d where a GGUF groups ffn_down along the neurons, so re-rounding them to int4 costs the most of any
matrix (SmolLM2 from its Q4_1 file: +7% held-out perplexity at int4, under 1% at int8; benchmarks/README.md section 9).

The svd predictor's factors (svd.a, svd.b) are F16 in bundles whose weights are not fp32 (since bundle format version
5, bundle/format.py predictor_factor_dtype) and F32 otherwise; the predictors' other tensors keep their kinds' dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk import predictors
from edge_sdk.model.config import ModelConfig, hf_tensor_shapes

WEIGHT_DTYPES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}
# weight-only group-wise quantized dtypes: the safetensors dtype of their codes (int4 packs two per byte)
QUANTIZED_DTYPES = {"int8": "I8", "int4": "U8"}
BUNDLE_DTYPES = (*WEIGHT_DTYPES, *QUANTIZED_DTYPES)
GROUP_SIZES = (32, 64, 128)
EMBEDDING = "embed_tokens.weight"
LM_HEAD = "lm_head.weight"
# a bundle dtype's allowed head_dtype (and down_dtype) besides itself: the quantized dtypes wider than it
WIDER_HEAD_DTYPES = {"int4": ("int8",)}
WIDER_DOWN_DTYPES = WIDER_HEAD_DTYPES
UNTIED_EMBEDDING_DTYPE = "F16"  # a quantized bundle's embedding when the model has an LM head of its own
SCALES_SUFFIX = ".scales"
MINS_SUFFIX = ".mins"
TRANSPOSED_SUFFIX = "_t"


@dataclass(frozen=True)
class ExpectedTensor:
    dtype: str
    shape: tuple[int, ...]


def model_tensor_names(config: ModelConfig) -> list[tuple[str, str]]:
    """(bundle name, Hugging Face name) of every model tensor, in the checkpoint's order."""
    names = []
    for hf_name in hf_tensor_shapes(config):
        name = hf_name.removeprefix("model.")
        if name.endswith("mlp.down_proj.weight"):
            name += TRANSPOSED_SUFFIX
        names.append((name, hf_name))
    return names


def lm_head_tensor(tied_embeddings: bool) -> str:
    """The bundle tensor the LM head reads: the embedding of a model with tied embeddings, else lm_head.weight."""
    return EMBEDDING if tied_embeddings else LM_HEAD


def is_down_projection(name: str) -> bool:
    """Whether a bundle tensor name is a layer's (neuron-major) FFN down projection."""
    return name.endswith("mlp.down_proj.weight" + TRANSPOSED_SUFFIX)


def quantized_format(safetensors_dtype: str) -> str:
    """The quantized dtype (int8 | int4) whose codes a bundle stores in safetensors_dtype (I8 | U8)."""
    return next(name for name, stored in QUANTIZED_DTYPES.items() if stored == safetensors_dtype)


def is_quantized_matrix(name: str, shape: tuple[int, ...], tied_embeddings: bool) -> bool:
    """Whether a model tensor is stored as codes + scales in a quantized bundle: every matrix but the embedding of a
    model whose LM head is a matrix of its own (tied_embeddings: the model's tie_word_embeddings)."""
    return len(shape) == 2 and (name != EMBEDDING or tied_embeddings)


def quantized_tensors(
    name: str, shape: tuple[int, ...], dtype: str, group_size: int, asymmetric: bool = False
) -> dict[str, ExpectedTensor]:
    """The codes and the scales of a [rows, cols] matrix quantized to dtype (int8 | int4) in groups of group_size,
    and its minimums for asymmetric int4 (asymmetric: the bundle's int4 scheme; int8 matrices have none)."""
    rows, cols = shape
    width = cols // 2 if dtype == "int4" else cols
    groups = ExpectedTensor("F16", (rows, cols // group_size))
    tensors = {name: ExpectedTensor(QUANTIZED_DTYPES[dtype], (rows, width)), name + SCALES_SUFFIX: groups}
    if asymmetric and dtype == "int4":
        tensors[name + MINS_SUFFIX] = groups
    return tensors


def quantized_part(name: str) -> tuple[str, str]:
    """(matrix name, part) of a quantized matrix's tensor: part "" for its codes, SCALES_SUFFIX or MINS_SUFFIX."""
    for suffix in (SCALES_SUFFIX, MINS_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix), suffix
    return name, ""


def model_tensors(
    config: ModelConfig,
    dtype: str,
    max_seq_len: int,
    group_size: int | None = None,
    head_dtype: str | None = None,
    asymmetric: bool = False,
    down_dtype: str | None = None,
) -> dict[str, ExpectedTensor]:
    """Every model tensor of a bundle with weight dtype `dtype` (fp32 | fp16 | bf16 | int8 | int4) serving
    max_seq_len; group_size: the quantization group of int8 / int4 (it must divide every quantized matrix's cols);
    head_dtype: the LM head's quantized dtype when it differs from dtype (one of WIDER_HEAD_DTYPES[dtype]), else
    None; asymmetric: an int4 bundle's int4_scheme is "asymmetric" (its int4 matrices have minimums); down_dtype: the
    FFN down projections' quantized dtype when it differs from dtype (one of WIDER_DOWN_DTYPES[dtype]), else None."""
    hf_shapes = hf_tensor_shapes(config)
    head = lm_head_tensor(config.tie_word_embeddings)
    expected = {}
    for name, hf_name in model_tensor_names(config):
        shape = hf_shapes[hf_name]
        if name.endswith(TRANSPOSED_SUFFIX):
            shape = shape[::-1]
        if dtype in QUANTIZED_DTYPES and is_quantized_matrix(name, shape, config.tie_word_embeddings):
            matrix_dtype = matrix_storage(name, head, dtype, head_dtype, down_dtype)
            expected |= quantized_tensors(name, shape, matrix_dtype, group_size, asymmetric)
        elif dtype in QUANTIZED_DTYPES and len(shape) == 2:
            expected[name] = ExpectedTensor(UNTIED_EMBEDDING_DTYPE, shape)
        else:
            expected[name] = ExpectedTensor(WEIGHT_DTYPES[dtype] if len(shape) > 1 else "F32", shape)
    rope = ExpectedTensor("F32", (max_seq_len, config.head_dim))
    return expected | {"rope.cos": rope, "rope.sin": rope}


def matrix_storage(name: str, head: str, dtype: str, head_dtype: str | None, down_dtype: str | None) -> str:
    """The quantized dtype a bundle stores matrix `name` in: the head's own (head: lm_head_tensor) or the down
    projections' own where the manifest gives one, else the bundle's dtype."""
    if name == head and head_dtype is not None:
        return head_dtype
    if is_down_projection(name) and down_dtype is not None:
        return down_dtype
    return dtype


def predictor_tensors(
    config: ModelConfig, predictor: str, levels: int, ranks: list[int] | None = None, factor_dtype: str = "F32"
) -> dict[str, ExpectedTensor]:
    """Every predictor tensor of a bundle; ranks: each layer's rank (kinds storing a tensor with a rank dimension);
    factor_dtype: the dtype of the low-rank factors (StoredTensor.factor; bundle/format.py predictor_factor_dtype)."""
    kind = predictors.kind(predictor)
    d, n_neurons = config.hidden_size, config.intermediate_size
    expected = {}
    for layer in range(config.num_layers):
        sizes = {"d": d, "D": n_neurons, "levels": levels, "words": (d + 31) // 32}
        if ranks is not None:
            sizes["rank"] = ranks[layer]
        for tensor in kind.tensors:
            shape = tuple(sizes[size] if isinstance(size, str) else size for size in tensor.shape)
            dtype = factor_dtype if tensor.factor else tensor.dtype
            expected[predictors.tensor_name(layer, predictor, tensor.name)] = ExpectedTensor(dtype, shape)
    return expected


def is_predictor_tensor(name: str) -> bool:
    """layers.{i}.{kind}.{tensor} for a predictor kind, as opposed to the model's own tensors."""
    parts = name.split(".")
    return len(parts) > 3 and parts[0] == "layers" and parts[2] in predictors.KINDS
