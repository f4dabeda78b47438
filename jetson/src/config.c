/* The model config and sparsity settings from manifest.json, validated so engines can size buffers from them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "edge_cpu_kernels.h"
#include "model.h"

#define MAX_DIM (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_LAYERS 1024

static edge_status read_activation(const cJSON *model, const char *where, struct model_config *config) {
  const cJSON *activation;
  const char *kind = NULL;
  edge_status status = json_object_field(model, "activation", where, &activation);
  if (status == EDGE_OK) status = json_string_field(activation, "kind", where, &kind);
  if (status != EDGE_OK) return status;
  static const char *kinds[] = {"relu", "fatrelu", "drelu", "silu"};
  static const int values[] = {EDGE_ACT_RELU, EDGE_ACT_FATRELU, EDGE_ACT_DRELU, EDGE_ACT_SILU};
  config->activation = -1;
  for (int i = 0; i < 4; i++) {
    if (strcmp(kind, kinds[i]) == 0) config->activation = values[i];
  }
  if (config->activation < 0) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: activation kind '%.32s' is not one of relu, fatrelu, drelu, silu",
                     where, kind);
  }
  double threshold = 0.0;
  if (cJSON_GetObjectItemCaseSensitive(activation, "threshold") != NULL &&
      json_number_field(activation, "threshold", where, &threshold) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  if (config->activation == EDGE_ACT_FATRELU && !(threshold >= 0.0)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: fatrelu threshold must be >= 0, found %g", where, threshold);
  }
  config->act_threshold = (float)threshold;
  return EDGE_OK;
}

static edge_status read_model(const cJSON *manifest, const char *where, struct model_config *config) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(manifest, "model");
  struct {
    const char *field;
    int *value;
    int64_t max;
  } ints[] = {
      {"vocab_size", &config->vocab_size, MAX_VOCAB},       {"hidden_size", &config->hidden_size, MAX_DIM},
      {"intermediate_size", &config->intermediate_size, MAX_DIM}, {"num_layers", &config->num_layers, MAX_LAYERS},
      {"num_heads", &config->num_heads, 4096},              {"num_kv_heads", &config->num_kv_heads, 4096},
      {"head_dim", &config->head_dim, 16384},
  };
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    int64_t value;
    if (json_int_field(model, ints[i].field, where, 1, ints[i].max, &value) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    *ints[i].value = (int)value;
  }
  if (config->num_heads % config->num_kv_heads != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: num_heads %d is not a multiple of num_kv_heads %d", where,
                     config->num_heads, config->num_kv_heads);
  }
  if (config->head_dim % 2 != 0) return edge_fail(EDGE_ERROR_BUNDLE, "%s: head_dim %d must be even (RoPE)", where, config->head_dim);
  if ((int64_t)config->num_heads * config->head_dim > MAX_DIM) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: num_heads * head_dim is larger than %d", where, MAX_DIM);
  }
  double eps;
  if (json_number_field(model, "rms_norm_eps", where, &eps) != EDGE_OK) return EDGE_ERROR_BUNDLE;
  if (!(eps > 0.0)) return edge_fail(EDGE_ERROR_BUNDLE, "%s: rms_norm_eps must be > 0, found %g", where, eps);
  config->rms_norm_eps = (float)eps;
  edge_status status = read_activation(model, where, config);
  if (status != EDGE_OK) return status;
  if (json_bool_field(model, "tie_word_embeddings", where, &config->tie_word_embeddings) != EDGE_OK ||
      json_bool_field(model, "qkv_bias", where, &config->qkv_bias) != EDGE_OK ||
      json_bool_field(model, "o_bias", where, &config->o_bias) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  config->sliding_window = 0;
  const cJSON *window = cJSON_GetObjectItemCaseSensitive(model, "sliding_window");
  if (window != NULL && !cJSON_IsNull(window)) {
    int64_t value;
    if (json_int_field(model, "sliding_window", where, 1, INT32_MAX, &value) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    config->sliding_window = (int)value;
  }
  config->bos_token_id = -1;
  const cJSON *bos = cJSON_GetObjectItemCaseSensitive(model, "bos_token_id");
  if (bos != NULL && !cJSON_IsNull(bos)) {
    int64_t value;
    if (json_int_field(model, "bos_token_id", where, 0, config->vocab_size - 1, &value) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    config->bos_token_id = (int)value;
  }
  const cJSON *eos = cJSON_GetObjectItemCaseSensitive(model, "eos_token_ids"), *item;
  if (!cJSON_IsArray(eos) || cJSON_GetArraySize(eos) > MAX_EOS_TOKENS) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'eos_token_ids' must be a list of at most %d token ids", where,
                     MAX_EOS_TOKENS);
  }
  config->n_eos_tokens = 0;
  cJSON_ArrayForEach(item, eos) {
    int64_t value;
    if (!json_integer(item, 0, config->vocab_size - 1, &value)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'eos_token_ids' has an entry outside [0, %d)", where,
                       config->vocab_size);
    }
    config->eos_token_ids[config->n_eos_tokens++] = (int32_t)value;
  }
  return EDGE_OK;
}

static int ratio_ok(double value) { return value > 0.0 && value <= 1.0; }

static edge_status read_sparsity(const cJSON *manifest, const char *where, const struct edge_options *options,
                                 struct sparsity_config *sparsity) {
  const cJSON *section = cJSON_GetObjectItemCaseSensitive(manifest, "sparsity");
  const char *predictor = NULL;
  if (json_string_field(section, "predictor", where, &predictor) != EDGE_OK) return EDGE_ERROR_BUNDLE;
  static const char *names[] = {"none", "svd", "signbit", "core", "threshold"};
  int kind = -1;
  for (int i = 0; i < 5; i++) {
    if (strcmp(predictor, names[i]) == 0) kind = i;
  }
  if (kind < 0) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s: sparsity predictor '%.32s' is not one of svd, signbit, core, "
                     "threshold, none", where, predictor);
  }
  sparsity->predictor = (enum predictor_kind)kind;
  const cJSON *levels = cJSON_GetObjectItemCaseSensitive(section, "levels"), *item;
  if (!cJSON_IsArray(levels) || cJSON_GetArraySize(levels) > MAX_SPARSITY_LEVELS) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'levels' must be a list of at most %d numbers", where,
                     MAX_SPARSITY_LEVELS);
  }
  sparsity->n_levels = 0;
  cJSON_ArrayForEach(item, levels) {
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'levels' has an entry that is not a number", where);
    }
    sparsity->levels[sparsity->n_levels++] = item->valuedouble;
  }
  int uses_levels = sparsity->predictor == PREDICTOR_SVD || sparsity->predictor == PREDICTOR_THRESHOLD;
  if (uses_levels && sparsity->n_levels == 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: predictor '%s' needs calibrated 'levels'", where, predictor);
  }
  sparsity->dense = options->dense != 0;
  sparsity->level_index = -1;
  if (sparsity->n_levels > 0) {
    double level = options->sparsity;
    if (level < 0.0 && json_number_field(section, "default_level", where, &level) != EDGE_OK) return EDGE_ERROR_BUNDLE;
    for (int i = 0; i < sparsity->n_levels; i++) {
      if (fabs(sparsity->levels[i] - level) < 1e-9) sparsity->level_index = i;
    }
    if (sparsity->level_index < 0) {
      char known[512] = "";
      for (int i = 0; i < sparsity->n_levels; i++) {
        size_t used = strlen(known);
        snprintf(known + used, sizeof known - used, "%s%g", i ? ", " : "", sparsity->levels[i]);
      }
      return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "sparsity level %g was not calibrated; calibrated levels: %s", level,
                       known);
    }
  } else if (options->sparsity >= 0.0 && !options->dense) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "sparsity level %g was not calibrated; calibrated levels: none (this "
                     "predictor has no levels)", options->sparsity);
  }
  sparsity->core_alpha = 0.4;
  sparsity->core_beta = 0.2;
  if (cJSON_GetObjectItemCaseSensitive(section, "core_alpha") != NULL &&
      json_number_field(section, "core_alpha", where, &sparsity->core_alpha) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  if (cJSON_GetObjectItemCaseSensitive(section, "core_beta") != NULL &&
      json_number_field(section, "core_beta", where, &sparsity->core_beta) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  if (sparsity->predictor == PREDICTOR_CORE && !(ratio_ok(sparsity->core_alpha) && ratio_ok(sparsity->core_beta))) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: core_alpha and core_beta must be fractions in (0, 1], found %g and %g",
                     where, sparsity->core_alpha, sparsity->core_beta);
  }
  return EDGE_OK;
}

edge_status model_read_config(const struct bundle *bundle, const struct edge_options *options,
                              struct model_config *config, struct sparsity_config *sparsity) {
  char where[1024];
  snprintf(where, sizeof where, "%s/%s: model", bundle->root, BUNDLE_MANIFEST_FILE);
  edge_status status = read_model(bundle->manifest, where, config);
  if (status != EDGE_OK) return status;
  int64_t max_seq_len;
  snprintf(where, sizeof where, "%s/%s", bundle->root, BUNDLE_MANIFEST_FILE);
  if (json_int_field(bundle->manifest, "max_seq_len", where, 1, 1 << 24, &max_seq_len) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  config->bundle_max_seq_len = (int)max_seq_len;
  if (options->max_seq_len > config->bundle_max_seq_len) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "max_seq_len: expected at most the bundle's %d, found %d",
                     config->bundle_max_seq_len, options->max_seq_len);
  }
  config->max_seq_len = options->max_seq_len > 0 ? options->max_seq_len : config->bundle_max_seq_len;
  snprintf(where, sizeof where, "%s/%s: sparsity", bundle->root, BUNDLE_MANIFEST_FILE);
  return read_sparsity(bundle->manifest, where, options, sparsity);
}
