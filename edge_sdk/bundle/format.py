"""The bundle format's names and limits (DESIGN.md 3.4), shared by the exporter, the readers and the archive.

The C runtime's copies (jetson/src/bundle.h, config.c) are checked against these by tests/bundle.
"""

from __future__ import annotations

import re

FORMAT = "edge-sdk-bundle"
FORMAT_VERSION = 7
# int4 codes are signed nibbles (4-bit two's complement, ONNX INT4) from format version 2 on; version 1 stored
# code + 8 (UINT4 with zero point 8), which this edge-sdk refuses rather than misread.
SIGNED_INT4_FORMAT_VERSION = 2
# an int8 / int4 bundle of a model with tied embeddings stores the shared matrix quantized from format version 3
# on; before, it stored it F16, a layout this edge-sdk refuses (re-export). Every other bundle reads the same in
# versions 2 and 3 (and in 1, but for int4).
QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION = 3
# an int4 bundle may store its LM head as int8 codes (export --head-dtype, the manifest's head_dtype) from format
# version 4 on; a reader of version 3 ignores that field and would refuse the head's codes as the wrong tensor, so such
# a bundle is version 4, which older readers refuse as newer. Every other bundle reads the same in versions 3 and 4.
HEAD_DTYPE_FORMAT_VERSION = 4
# the svd predictor's factors (svd.a, svd.b) are F16 in every bundle whose weights are not fp32 from format version 5
# on, F32 before (and in fp32 bundles); a reader of an older version would misread them, so such a bundle is version
# 5 and older readers refuse it as newer. Every other bundle reads the same in versions 3 and 5.
HALF_PREDICTOR_FACTORS_FORMAT_VERSION = 5
# an int4 bundle may store asymmetric int4 (llama.cpp's Q4_1 grid: value = (code + 8) * scale + min, manifest
# int4_scheme "asymmetric", each int4 matrix with F16 <name>.mins) from format version 6 on; an older reader would
# ignore the minimums and misread every value, so such a bundle is version 6. Every other bundle reads the same in
# versions 5 and 6.
ASYMMETRIC_INT4_FORMAT_VERSION = 6
# an int4 bundle may store its FFN down projections as int8 codes (export --down-dtype, the manifest's down_dtype)
# from format version 7 on; an older reader ignores that field and would refuse the down rows' codes as the wrong
# tensor, so such a bundle is version 7. Every other bundle reads the same in versions 6 and 7.
DOWN_DTYPE_FORMAT_VERSION = 7

MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "weights.safetensors"
PREFILL_GRAPH = "prefill.onnx"
DECODE_GRAPH = "decode.onnx"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
REPORT_FILE = "report.json"
PLOT_FILE = "report.png"
MANIFEST_DIGEST_FIELD = "manifest_sha256"
GRAPH_PHASES = ("prefill", "decode")
# every file a bundle must list besides its graphs
REQUIRED_FILES = (WEIGHTS_FILE, TOKENIZER_FILE)

MAX_MANIFEST_BYTES = 64 << 20
MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json of real models: 2-35 MB
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20
# a bundle is one flat directory; names never start with a dot (staging directories and editor files do)
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def written_format_version(
    quantized_tied_embedding: bool,
    head_dtype: bool = False,
    half_predictor_factors: bool = False,
    asymmetric_int4: bool = False,
    down_dtype: bool = False,
) -> int:
    """The format_version an export writes: the oldest version that reads its layout, so every bundle is
    byte-identical to what edge-sdk wrote before the newer versions and readable by the readers of its version (an
    older libedge_sdk on a device). 7 for a bundle with a down_dtype of its own (down_dtype: the manifest has one); 6
    for an asymmetric int4 bundle; 5 for a bundle with F16 predictor factors (an
    svd bundle whose weights are not fp32); 4 for a bundle with a head_dtype of its own (head_dtype: the manifest has
    one); 3 for an int8 / int4 bundle of a model with tied embeddings; 2 for every other bundle."""
    if down_dtype:
        return DOWN_DTYPE_FORMAT_VERSION
    if asymmetric_int4:
        return ASYMMETRIC_INT4_FORMAT_VERSION
    if half_predictor_factors:
        return HALF_PREDICTOR_FACTORS_FORMAT_VERSION
    if head_dtype:
        return HEAD_DTYPE_FORMAT_VERSION
    return QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION if quantized_tied_embedding else SIGNED_INT4_FORMAT_VERSION


def predictor_factor_dtype(dtype: str, format_version: int) -> str:
    """The safetensors dtype of the predictor factors (StoredTensor.factor: svd.a, svd.b) in a bundle of weight dtype
    `dtype` and format_version: F16 from HALF_PREDICTOR_FACTORS_FORMAT_VERSION on unless the weights are fp32, F32
    otherwise. The scores stay float32 arithmetic on every path (the factors are widened on load or in registers),
    and calibration rounds the factors to F16 before it fits the biases, so the stored factors are the calibrated
    ones."""
    if format_version >= HALF_PREDICTOR_FACTORS_FORMAT_VERSION and dtype != "fp32":
        return "F16"
    return "F32"
