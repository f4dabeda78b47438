/* manifest.json, field by field, in the order of bundle/manifest.py validate. */
#include "manifest.h"

#include <stdio.h>
#include <string.h>

#include "error.h"
#include "json_canonical.h"
#include "json_fields.h"
#include "json_strict.h"
#include "edge_cpu_kernels.h"
#include "layout.h"

#define MAX_FILE_NAME_BYTES 255
#define MAX_FILE_SIZE (INT64_C(1) << 53)
#define SHOWN_NAME_BYTES 200

int bundle_file_name_ok(const char *name) {
  size_t length = strlen(name);
  if (length == 0 || length > MAX_FILE_NAME_BYTES) return 0;
  for (size_t i = 0; i < length; i++) {
    char c = name[i];
    int alphanumeric = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alphanumeric && (i == 0 || (c != '.' && c != '_' && c != '-'))) return 0;
  }
  return 1;
}

/* A field's object with its own `where` ("PATH: model"). */
static edge_status section(const cJSON *manifest, const char *field, const char *where, const cJSON **out,
                           char *inner, size_t inner_size) {
  snprintf(inner, inner_size, "%s: %s", where, field);
  return json_object_field(manifest, field, where, out);
}

static edge_status check_format(const cJSON *manifest, const char *text, size_t size, const char *where,
                                int64_t *version_out) {
  static const char *const formats[] = {BUNDLE_FORMAT};
  int format;
  int64_t version;
  edge_status status = json_choice_field(manifest, "format", where, formats, 1, &format);
  if (status == EDGE_OK) status = json_int_field(manifest, "format_version", where, 1, INT32_MAX, &version);
  if (status != EDGE_OK) return status;
  if (version > BUNDLE_FORMAT_VERSION) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: bundle format version %lld is newer than this edge-sdk supports (%d); "
                     "upgrade libedge_sdk or re-export the bundle", where, (long long)version, BUNDLE_FORMAT_VERSION);
  }
  *version_out = version;
  const char *recorded;
  char digest[65];
  if ((status = json_string_field(manifest, BUNDLE_MANIFEST_DIGEST_FIELD, where, &recorded)) != EDGE_OK ||
      (status = json_canonical_digest(text, size, BUNDLE_MANIFEST_DIGEST_FIELD, where, digest)) != EDGE_OK) {
    return status;
  }
  if (strcmp(recorded, digest) != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' does not match the manifest's content (the manifest changed)",
                     where, BUNDLE_MANIFEST_DIGEST_FIELD);
  }
  return EDGE_OK;
}

/* exporter: optional; when present an object with string name and version. */
static edge_status check_exporter(const cJSON *manifest, const char *where) {
  if (cJSON_GetObjectItemCaseSensitive(manifest, "exporter") == NULL) return EDGE_OK;
  const cJSON *exporter;
  const char *text;
  char inner[4096 + 16];
  edge_status status = section(manifest, "exporter", where, &exporter, inner, sizeof inner);
  if (status == EDGE_OK) status = json_string_field(exporter, "name", inner, &text);
  if (status == EDGE_OK) status = json_string_field(exporter, "version", inner, &text);
  return status;
}

static edge_status read_graphs(const cJSON *manifest, const char *where, struct manifest *out) {
  static const char *const phases[BUNDLE_GRAPH_PHASES] = {"prefill", "decode"};
  const cJSON *graphs;
  char inner[4096 + 16];
  edge_status status = section(manifest, "graphs", where, &graphs, inner, sizeof inner);
  for (int i = 0; status == EDGE_OK && i < BUNDLE_GRAPH_PHASES; i++) {
    status = json_string_field(graphs, phases[i], inner, &out->graphs[i]);
    if (status == EDGE_OK && !bundle_file_name_ok(out->graphs[i])) {
      status = json_field_fail(graphs, phases[i], inner, "a plain file name of the bundle directory");
    }
  }
  return status;
}

/* One entry of files: {size: [0, 2^53], sha256: 64 lowercase hexadecimal digits}. */
static edge_status check_file_entry(const cJSON *entry, const char *where) {
  char shown[SHOWN_NAME_BYTES], inner[4096 + 2 * SHOWN_NAME_BYTES];
  snprintf(inner, sizeof inner, "%s['%s']", where, json_shown(entry->string, shown, sizeof shown));
  if (!bundle_file_name_ok(entry->string) || strcmp(entry->string, BUNDLE_MANIFEST_FILE) == 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: file name '%s' is not allowed: a bundle lists plain file names of its "
                     "own directory (letters, digits, '.', '_', '-', not starting with '.'), never manifest.json itself",
                     where, shown);
  }
  if (!cJSON_IsObject(entry)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object, found %s", inner, json_type_name(entry));
  }
  int64_t size;
  const char *digest;
  edge_status status = json_int_field(entry, "size", inner, 0, MAX_FILE_SIZE, &size);
  if (status == EDGE_OK) status = json_string_field(entry, "sha256", inner, &digest);
  if (status != EDGE_OK) return status;
  int hex = strlen(digest) == 64;
  for (int i = 0; hex && i < 64; i++) hex = (digest[i] >= '0' && digest[i] <= '9') || (digest[i] >= 'a' && digest[i] <= 'f');
  return hex ? EDGE_OK : json_field_fail(entry, "sha256", inner, "64 lowercase hexadecimal digits");
}

static edge_status check_files(const cJSON *manifest, const char *where, const struct manifest *out) {
  const cJSON *files, *entry;
  char inner[4096 + 16];
  edge_status status = section(manifest, "files", where, &files, inner, sizeof inner);
  if (status != EDGE_OK) return status;
  cJSON_ArrayForEach(entry, files) {
    if ((status = check_file_entry(entry, inner)) != EDGE_OK) return status;
  }
  const char *required[] = {BUNDLE_WEIGHTS_FILE, BUNDLE_TOKENIZER_FILE, out->graphs[0], out->graphs[1]};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
    if (cJSON_GetObjectItemCaseSensitive(files, required[i]) == NULL) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: does not list %s, which every bundle needs", inner, required[i]);
    }
  }
  return EDGE_OK;
}

/* group_size: for int8 / int4 one of 32, 64, 128 dividing hidden_size and num_heads * head_dim (the columns of
 * every quantized matrix); null or absent for the float dtypes. */
static edge_status read_group_size(const cJSON *manifest, const char *where, struct manifest *out) {
  const cJSON *field = cJSON_GetObjectItemCaseSensitive(manifest, "group_size");
  int present = field != NULL && !cJSON_IsNull(field);
  if (out->quant_format == 0) {
    return present ? json_field_fail(manifest, "group_size", where, "null or absent for a dtype that is not quantized")
                   : EDGE_OK;
  }
  int64_t value = 0;
  if (!present || !(json_integer(field, 32, 32, &value) || json_integer(field, 64, 64, &value) ||
                    json_integer(field, 128, 128, &value))) {
    return json_field_fail(manifest, "group_size", where, "one of 32, 64, 128 for a quantized dtype");
  }
  const struct model_config *c = &out->model;
  if (c->hidden_size % value != 0) {
    return json_field_fail(manifest, "group_size", where, "a divisor of model hidden_size (each quantized row is whole groups)");
  }
  if (((int64_t)c->num_heads * c->head_dim) % value != 0) {
    return json_field_fail(manifest, "group_size", where,
                           "a divisor of model num_heads * head_dim (each quantized row is whole groups)");
  }
  out->group_size = (int)value;
  return EDGE_OK;
}

/* head_dtype (format version 4 on) or down_dtype (7 on), `name`, read from version `since` on (older versions do not
 * read it): null or absent, the LM head / the FFN down projections are stored in the bundle's dtype; otherwise a
 * quantized dtype wider than it: int8 (I8 codes, symmetric) in an int4 bundle. */
static edge_status read_wider_dtype(const cJSON *manifest, const char *where, int64_t version, int64_t since,
                                    const char *name, const struct manifest *bundle, enum tensor_dtype *out) {
  static const char *const wider_than_int4[] = {"int8"};
  const cJSON *field = cJSON_GetObjectItemCaseSensitive(manifest, name);
  *out = bundle->weight_dtype;
  if (version < since || field == NULL || cJSON_IsNull(field)) return EDGE_OK;
  if (bundle->quant_format != EDGE_Q4) {
    return json_field_fail(manifest, name, where, "null or absent for a dtype other than int4");
  }
  int choice;
  edge_status status = json_choice_field(manifest, name, where, wider_than_int4, 1, &choice);
  if (status == EDGE_OK) *out = DTYPE_I8;
  return status;
}

/* int4_scheme (format version 6 on; older versions do not read it): for int4, null, absent or "symmetric", or
 * "asymmetric" (group minimums); null or absent for every other dtype. */
static edge_status read_int4_scheme(const cJSON *manifest, const char *where, int64_t version, struct manifest *out) {
  static const char *const schemes[] = {"symmetric", "asymmetric"};
  const cJSON *field = cJSON_GetObjectItemCaseSensitive(manifest, "int4_scheme");
  out->asymmetric = 0;
  if (version < BUNDLE_ASYMMETRIC_INT4_FORMAT_VERSION || field == NULL || cJSON_IsNull(field)) return EDGE_OK;
  if (out->quant_format != EDGE_Q4) {
    return json_field_fail(manifest, "int4_scheme", where, "null or absent for a dtype other than int4");
  }
  int choice;
  edge_status status = json_choice_field(manifest, "int4_scheme", where, schemes, 2, &choice);
  if (status == EDGE_OK) out->asymmetric = choice == 1;
  return status;
}

/* model, dtype (group_size, head_dtype, down_dtype and int4_scheme) and max_seq_len; version: the manifest's
 * format_version. */
static edge_status read_model(const cJSON *manifest, const char *where, int64_t version, struct manifest *out) {
  static const char *const dtypes[] = {"fp32", "fp16", "bf16", "int8", "int4"};
  static const enum tensor_dtype weight_dtypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_I8, DTYPE_U8};
  static const int quant_formats[] = {0, 0, 0, EDGE_Q8, EDGE_Q4};
  const cJSON *model;
  char inner[4096 + 16];
  int dtype, max_seq_len;
  int64_t value;
  edge_status status = section(manifest, "model", where, &model, inner, sizeof inner);
  if (status == EDGE_OK) status = config_read_model(model, inner, &out->model);
  if (status == EDGE_OK) status = json_choice_field(manifest, "dtype", where, dtypes, 5, &dtype);
  if (status == EDGE_OK && quant_formats[dtype] == EDGE_Q4 && version < BUNDLE_SIGNED_INT4_FORMAT_VERSION) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: an int4 bundle of format version %lld stores its codes as code + 8, "
                     "which this edge-sdk no longer reads (signed codes since format version %d); re-export the bundle",
                     where, (long long)version, BUNDLE_SIGNED_INT4_FORMAT_VERSION);
  }
  if (status == EDGE_OK && quant_formats[dtype] != 0 && out->model.tie_word_embeddings &&
      version < BUNDLE_QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: an %s bundle of format version %lld of a model with tied embeddings "
                     "stores the embedding (its LM head) in F16, which this edge-sdk no longer reads (quantized since "
                     "format version %d); re-export the bundle",
                     where, dtypes[dtype], (long long)version, BUNDLE_QUANTIZED_TIED_EMBEDDING_FORMAT_VERSION);
  }
  if (status == EDGE_OK) {
    out->quant_format = quant_formats[dtype];
    out->weight_dtype = weight_dtypes[dtype];
    status = read_group_size(manifest, where, out);
  }
  if (status == EDGE_OK) {
    status = read_wider_dtype(manifest, where, version, BUNDLE_HEAD_DTYPE_FORMAT_VERSION, "head_dtype", out,
                              &out->head_dtype);
  }
  if (status == EDGE_OK) {
    status = read_wider_dtype(manifest, where, version, BUNDLE_DOWN_DTYPE_FORMAT_VERSION, "down_dtype", out,
                              &out->down_dtype);
  }
  if (status == EDGE_OK) status = read_int4_scheme(manifest, where, version, out);
  if (status == EDGE_OK) {
    status = json_int_field(manifest, "max_seq_len", where, 2, out->model.max_position_embeddings, &value);
  }
  if (status != EDGE_OK) return status;
  max_seq_len = (int)value;
  out->max_seq_len = max_seq_len;
  int half_factors = version >= BUNDLE_HALF_PREDICTOR_FACTORS_FORMAT_VERSION && weight_dtypes[dtype] != DTYPE_F32;
  out->factor_dtype = half_factors ? DTYPE_F16 : DTYPE_F32;
  /* why the factors have that dtype, as bundle/manifest.py factor_rule says it */
  if (weight_dtypes[dtype] == DTYPE_F32) {
    snprintf(out->factor_rule, sizeof out->factor_rule, "fp32 bundles store their predictor factors in F32");
  } else if (!half_factors) {
    snprintf(out->factor_rule, sizeof out->factor_rule,
             "format version %lld stores predictor factors in F32 (F16 since version %d)", (long long)version,
             BUNDLE_HALF_PREDICTOR_FACTORS_FORMAT_VERSION);
  } else {
    snprintf(out->factor_rule, sizeof out->factor_rule,
             "format version %lld stores the predictor factors of %s bundles in F16", (long long)version, dtypes[dtype]);
  }
  return EDGE_OK;
}

edge_status manifest_validate(const cJSON *manifest, const char *text, size_t size, const char *where,
                              struct manifest *out) {
  memset(out, 0, sizeof *out);
  if (!cJSON_IsObject(manifest)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object, found %s", where, json_type_name(manifest));
  }
  const cJSON *sparsity, *tensors;
  char inner[4096 + 16];
  edge_status status;
  int64_t version = 0; /* set by check_format when it succeeds */
  if ((status = check_format(manifest, text, size, where, &version)) != EDGE_OK ||
      (status = check_exporter(manifest, where)) != EDGE_OK ||
      (status = read_model(manifest, where, version, out)) != EDGE_OK ||
      (status = section(manifest, "sparsity", where, &sparsity, inner, sizeof inner)) != EDGE_OK ||
      (status = config_read_sparsity(sparsity, out->model.num_layers, inner, &out->sparsity)) != EDGE_OK ||
      (status = read_graphs(manifest, where, out)) != EDGE_OK ||
      (status = section(manifest, "tensors", where, &tensors, inner, sizeof inner)) != EDGE_OK ||
      (status = layout_check_tensors(tensors, &out->model, out->weight_dtype, out->head_dtype, out->down_dtype,
                                     out->group_size, out->asymmetric, out->max_seq_len, &out->sparsity,
                                     out->factor_dtype, out->factor_rule, inner)) != EDGE_OK) {
    return status;
  }
  return check_files(manifest, where, out);
}
