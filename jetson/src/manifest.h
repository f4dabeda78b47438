/* manifest.json, validated field by field (edge_sdk/bundle/manifest.py, the table of edge_sdk/bundle/README.md):
 * format and format_version, manifest_sha256 (json_canonical.h), exporter, the model config and sparsity
 * settings (config.h), dtype, max_seq_len, graphs, exactly the tensors of the model (layout.h), and files. */
#ifndef EDGE_MANIFEST_H
#define EDGE_MANIFEST_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "config.h"
#include "edge_sdk.h"
#include "safetensors.h"

#define BUNDLE_FORMAT "edge-sdk-bundle"
#define BUNDLE_FORMAT_VERSION 7
/* int4 codes are signed nibbles from this format version on; version 1 stored code + 8 and is refused for int4 */
#define BUNDLE_SIGNED_INT4_FORMAT_VERSION 2
/* an int8 / int4 bundle of a tied model stores the embedding quantized from this version on (F16 before: refused) */
#define BUNDLE_QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION 3
/* an int4 bundle may store its LM head as int8 codes (manifest head_dtype) from this version on; older versions
 * do not read the field */
#define BUNDLE_HEAD_DTYPE_FORMAT_VERSION 4
/* the svd predictor's factors are F16 from this version on in bundles whose weights are not fp32 (F32 before) */
#define BUNDLE_HALF_PREDICTOR_FACTORS_FORMAT_VERSION 5
/* an int4 bundle may store asymmetric int4 (manifest int4_scheme "asymmetric": each int4 matrix with F16 <name>.mins,
 * value (code + 8) * scale + min) from this version on; older versions do not read the field */
#define BUNDLE_ASYMMETRIC_INT4_FORMAT_VERSION 6
/* an int4 bundle may store its FFN down projections as int8 codes (manifest down_dtype: I8 mlp.down_proj.weight_t
 * with F16 scales, no mins) from this version on; older versions do not read the field */
#define BUNDLE_DOWN_DTYPE_FORMAT_VERSION 7
#define BUNDLE_MANIFEST_FILE "manifest.json"
#define BUNDLE_MANIFEST_DIGEST_FIELD "manifest_sha256"
#define BUNDLE_WEIGHTS_FILE "weights.safetensors"
#define BUNDLE_TOKENIZER_FILE "tokenizer.json"
#define BUNDLE_TOKENIZER_CONFIG_FILE "tokenizer_config.json"
#define BUNDLE_GRAPH_PHASES 2 /* prefill, decode */

struct manifest {
  struct model_config model;     /* bundle_max_seq_len and max_seq_len are 0: the options set them */
  enum tensor_dtype weight_dtype; /* of the matrices: F32, F16 or BF16 (dtype fp32, fp16, bf16); I8 / U8: the codes
                                   * of int8 / int4 (each matrix with F16 <name>.scales; an untied embedding F16) */
  enum tensor_dtype head_dtype;   /* of the LM head (a tied model's embedding): weight_dtype, or I8 in an int4
                                   * bundle whose head_dtype is int8 */
  enum tensor_dtype down_dtype;   /* of the FFN down projections (mlp.down_proj.weight_t): weight_dtype, or I8 in
                                   * an int4 bundle whose down_dtype is int8 (symmetric, no mins) */
  int quant_format;               /* 0, or EDGE_Q8 / EDGE_Q4 (edge_cpu_kernels.h) for dtype int8 / int4 */
  int group_size;                 /* int8 / int4: 32, 64 or 128, dividing every quantized row; 0 otherwise */
  int asymmetric;                 /* int4 with int4_scheme "asymmetric": every int4 matrix has <name>.mins (an int8
                                   * head or down projection has none) */
  enum tensor_dtype factor_dtype; /* of the predictor's low-rank factors (svd.a, svd.b): F16 from format version 5
                                   * on unless the weights are fp32, F32 otherwise */
  char factor_rule[128];          /* why, as the refusal of a factor declared otherwise says it */
  int max_seq_len;               /* in [2, model.max_position_embeddings] */
  struct sparsity_settings sparsity;
  const char *graphs[BUNDLE_GRAPH_PHASES]; /* prefill, decode: file names the manifest lists (in its tree) */
};

/* Checks the parsed manifest (text[0:size], for its digest; where: its path) and fills *out. EDGE_ERROR_BUNDLE
 * naming the field, EDGE_ERROR_UNSUPPORTED for a newer format_version, an int4 bundle of a format version before
 * BUNDLE_SIGNED_INT4_FORMAT_VERSION or an int8 / int4 bundle of a tied model before
 * BUNDLE_QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION. */
edge_status manifest_validate(const cJSON *manifest, const char *text, size_t size, const char *where,
                              struct manifest *out);

/* A plain file name of the bundle directory: [A-Za-z0-9][A-Za-z0-9._-]{0,254}. */
int bundle_file_name_ok(const char *name);

#endif
