/* The model config and sparsity settings of manifest.json (bundle/manifest.py _model, _sparsity), and the options
 * resolved against them. */
#include "config.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "edge_cpu_kernels.h"
#include "error.h"
#include "json_fields.h"
#include "json_strict.h"
#include "model.h"

const char *predictor_name(enum predictor_kind kind) {
  return (unsigned)kind < PREDICTOR_KINDS ? predictor_kind_specs[kind].name : "?";
}

int predictor_has_levels(enum predictor_kind kind) {
  return (unsigned)kind < PREDICTOR_KINDS && predictor_kind_specs[kind].has_levels;
}

int predictor_fixed_at_prefill(enum predictor_kind kind) { return kind == PREDICTOR_CORE; }

/* ---- Typed reads ------------------------------------------------------------------------------------------ */

static edge_status read_int(const cJSON *object, const char *field, const char *where, int64_t min, int64_t max,
                            int *out) {
  int64_t value;
  edge_status status = json_int_field(object, field, where, min, max, &value);
  if (status == EDGE_OK) *out = (int)value;
  return status;
}

/* A finite number > 0. */
static edge_status read_positive(const cJSON *object, const char *field, const char *where, double *out) {
  if (json_number_field(object, field, where, out) != EDGE_OK || !(*out > 0.0)) {
    return json_field_fail(object, field, where, "a finite number > 0");
  }
  return EDGE_OK;
}

/* A finite number > 0 that float32 holds: cast to float it neither overflows to inf nor underflows to 0
 * (model/config.py fits_float32). */
static edge_status read_positive_float32(const cJSON *object, const char *field, const char *where, double *out) {
  edge_status status = read_positive(object, field, where, out);
  if (status == EDGE_OK && !(*out >= FLT_TRUE_MIN && *out <= FLT_MAX)) {
    return json_field_fail(object, field, where,
                           "a finite number > 0 that float32 holds (from 1.4013e-45 to 3.40282e+38)");
  }
  return status;
}

/* A finite number >= 0. */
static edge_status read_non_negative(const cJSON *object, const char *field, const char *where, double *out) {
  if (json_number_field(object, field, where, out) != EDGE_OK || !(*out >= 0.0)) {
    return json_field_fail(object, field, where, "a finite number >= 0");
  }
  return EDGE_OK;
}

/* A finite number >= 0 that float32 holds: cast to float it does not overflow to inf (model/config.py
 * fits_float32). */
static edge_status read_non_negative_float32(const cJSON *object, const char *field, const char *where, double *out) {
  edge_status status = read_non_negative(object, field, where, out);
  if (status == EDGE_OK && !(*out <= FLT_MAX)) {
    return json_field_fail(object, field, where, "a finite number >= 0 that float32 holds (at most 3.40282e+38)");
  }
  return status;
}

/* A number in [0, 1], or (low_open) in (0, 1]. */
static edge_status read_fraction(const cJSON *object, const char *field, const char *where, int low_open, double *out) {
  edge_status status = read_non_negative(object, field, where, out);
  if (status != EDGE_OK) return status;
  if (*out > 1.0 || (low_open && *out == 0.0)) {
    return json_field_fail(object, field, where, low_open ? "a number in (0, 1]" : "a number in [0, 1]");
  }
  return EDGE_OK;
}

/* ---- Model ------------------------------------------------------------------------------------------------ */

static edge_status read_architecture(const cJSON *model, const char *where) {
  static const char *const types[] = {"llama", "mistral", "qwen2"};
  static const char *const classes[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
  int type;
  const char *architecture;
  edge_status status = json_choice_field(model, "model_type", where, types, 3, &type);
  if (status == EDGE_OK) status = json_string_field(model, "architecture", where, &architecture);
  if (status != EDGE_OK) return status;
  if (strcmp(architecture, classes[type]) != 0) {
    char expected[96];
    snprintf(expected, sizeof expected, "'%s' for %s", classes[type], types[type]);
    return json_field_fail(model, "architecture", where, expected);
  }
  return EDGE_OK;
}

/* vocab_size, hidden_size and the attention shape. */
static edge_status read_sizes(const cJSON *model, const char *where, struct model_config *config) {
  edge_status status;
  if ((status = read_int(model, "vocab_size", where, 1, MAX_VOCAB_SIZE, &config->vocab_size)) != EDGE_OK ||
      (status = read_int(model, "hidden_size", where, 1, MAX_HIDDEN_SIZE, &config->hidden_size)) != EDGE_OK ||
      (status = read_int(model, "num_heads", where, 1, MAX_HEADS, &config->num_heads)) != EDGE_OK ||
      (status = read_int(model, "num_kv_heads", where, 1, MAX_HEADS, &config->num_kv_heads)) != EDGE_OK ||
      (status = read_int(model, "head_dim", where, 1, MAX_HEAD_DIM, &config->head_dim)) != EDGE_OK) {
    return status;
  }
  if (config->num_heads % config->num_kv_heads != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: num_heads %d is not a multiple of num_kv_heads %d", where,
                     config->num_heads, config->num_kv_heads);
  }
  if (config->head_dim % 2 != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: head_dim %d must be even (RoPE rotates pairs)", where, config->head_dim);
  }
  if ((int64_t)config->num_heads * config->head_dim > MAX_HIDDEN_SIZE) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: num_heads * head_dim is larger than %d", where, MAX_HIDDEN_SIZE);
  }
  return EDGE_OK;
}

static edge_status read_activation(const cJSON *model, const char *where, struct model_config *config) {
  static const char *const kinds[] = {"relu", "fatrelu", "drelu", "silu"};
  static const int values[] = {EDGE_ACT_RELU, EDGE_ACT_FATRELU, EDGE_ACT_DRELU, EDGE_ACT_SILU};
  const cJSON *activation;
  edge_status status = json_object_field(model, "activation", where, &activation);
  if (status != EDGE_OK) return status;
  char inner[1024];
  snprintf(inner, sizeof inner, "%s: activation", where);
  int kind;
  double threshold;
  if ((status = json_choice_field(activation, "kind", inner, kinds, 4, &kind)) != EDGE_OK ||
      (status = read_non_negative_float32(activation, "threshold", inner, &threshold)) != EDGE_OK) {
    return status;
  }
  config->activation = values[kind];
  config->act_threshold = (float)threshold;
  return EDGE_OK;
}

/* The RoPE settings: checked only, since the bundle's rope.cos / rope.sin tables hold the rotation. */
static edge_status check_rope(const cJSON *model, const char *where) {
  static const char *const types[] = {"default", "linear", "llama3"};
  const cJSON *rope;
  edge_status status = json_object_field(model, "rope", where, &rope);
  if (status != EDGE_OK) return status;
  char inner[1024];
  snprintf(inner, sizeof inner, "%s: rope", where);
  double value;
  int type, positions;
  if ((status = read_positive(rope, "theta", inner, &value)) != EDGE_OK ||
      (status = json_choice_field(rope, "rope_type", inner, types, 3, &type)) != EDGE_OK ||
      (status = read_positive(rope, "factor", inner, &value)) != EDGE_OK ||
      (status = read_positive(rope, "low_freq_factor", inner, &value)) != EDGE_OK ||
      (status = read_positive(rope, "high_freq_factor", inner, &value)) != EDGE_OK) {
    return status;
  }
  return read_int(rope, "original_max_position_embeddings", inner, 1, MAX_POSITIONS, &positions);
}

static edge_status read_special_tokens(const cJSON *model, const char *where, struct model_config *config) {
  edge_status status;
  config->sliding_window = 0;
  if (json_has(model, "sliding_window") &&
      (status = read_int(model, "sliding_window", where, 1, INT32_MAX, &config->sliding_window)) != EDGE_OK) {
    return status;
  }
  config->bos_token_id = -1;
  if (json_has(model, "bos_token_id") &&
      (status = read_int(model, "bos_token_id", where, 0, config->vocab_size - 1, &config->bos_token_id)) != EDGE_OK) {
    return status;
  }
  const cJSON *eos, *item;
  if ((status = json_list_field(model, "eos_token_ids", where, MAX_EOS_TOKENS, &eos)) != EDGE_OK) return status;
  config->n_eos_tokens = 0;
  cJSON_ArrayForEach(item, eos) {
    int64_t value;
    if (!json_integer(item, 0, config->vocab_size - 1, &value)) {
      char expected[96];
      snprintf(expected, sizeof expected, "a list of at most %d integers in [0, %d]", MAX_EOS_TOKENS,
               config->vocab_size - 1);
      return json_field_fail(model, "eos_token_ids", where, expected);
    }
    config->eos_token_ids[config->n_eos_tokens++] = (int32_t)value;
  }
  return EDGE_OK;
}

edge_status config_read_model(const cJSON *model, const char *where, struct model_config *config) {
  memset(config, 0, sizeof *config);
  edge_status status;
  if ((status = read_architecture(model, where)) != EDGE_OK || (status = read_sizes(model, where, config)) != EDGE_OK ||
      (status = read_activation(model, where, config)) != EDGE_OK || (status = check_rope(model, where)) != EDGE_OK ||
      (status = read_special_tokens(model, where, config)) != EDGE_OK) {
    return status;
  }
  double eps;
  const char *torch_dtype;
  if ((status = read_int(model, "intermediate_size", where, 1, MAX_HIDDEN_SIZE, &config->intermediate_size)) != EDGE_OK ||
      (status = read_int(model, "num_layers", where, 1, MAX_LAYERS, &config->num_layers)) != EDGE_OK ||
      (status = read_positive_float32(model, "rms_norm_eps", where, &eps)) != EDGE_OK ||
      (status = read_int(model, "max_position_embeddings", where, 2, MAX_POSITIONS,
                         &config->max_position_embeddings)) != EDGE_OK ||
      (status = json_bool_field(model, "tie_word_embeddings", where, &config->tie_word_embeddings)) != EDGE_OK ||
      (status = json_bool_field(model, "qkv_bias", where, &config->qkv_bias)) != EDGE_OK ||
      (status = json_bool_field(model, "o_bias", where, &config->o_bias)) != EDGE_OK ||
      (status = json_string_field(model, "torch_dtype", where, &torch_dtype)) != EDGE_OK) {
    return status;
  }
  config->rms_norm_eps = (float)eps;
  return EDGE_OK;
}

/* ---- Sparsity --------------------------------------------------------------------------------------------- */

static edge_status read_levels(const cJSON *section, const char *where, struct sparsity_settings *settings) {
  const cJSON *levels, *item;
  edge_status status = json_list_field(section, "levels", where, MAX_SPARSITY_LEVELS, &levels);
  if (status != EDGE_OK) return status;
  settings->n_levels = 0;
  cJSON_ArrayForEach(item, levels) {
    double level = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    int previous = settings->n_levels - 1;
    if (!(level >= 0.0 && level <= 1.0) || (previous >= 0 && !(level > settings->levels[previous]))) {
      return json_field_fail(section, "levels", where, "a strictly increasing list of at most 64 numbers in [0, 1]");
    }
    settings->levels[settings->n_levels++] = level;
  }
  const char *name = predictor_name(settings->predictor);
  char expected[96];
  if (predictor_has_levels(settings->predictor) && settings->n_levels == 0) {
    snprintf(expected, sizeof expected, "at least one calibrated level for predictor '%s'", name);
    return json_field_fail(section, "levels", where, expected);
  }
  if (!predictor_has_levels(settings->predictor) && settings->n_levels > 0) {
    snprintf(expected, sizeof expected, "empty for predictor '%s', which has no levels", name);
    return json_field_fail(section, "levels", where, expected);
  }
  return EDGE_OK;
}

static edge_status read_default_level(const cJSON *section, const char *where, struct sparsity_settings *settings) {
  if (settings->n_levels == 0) {
    if (!json_has(section, "default_level")) return EDGE_OK;
    char expected[96];
    snprintf(expected, sizeof expected, "null for predictor '%s', which has no levels",
             predictor_name(settings->predictor));
    return json_field_fail(section, "default_level", where, expected);
  }
  /* present and null: no level was within the export's perplexity budget, so the bundle decodes densely */
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(section, "default_level");
  if (cJSON_IsNull(item)) {
    settings->default_level = DEFAULT_LEVEL_DENSE;
    return EDGE_OK;
  }
  edge_status status = read_fraction(section, "default_level", where, 0, &settings->default_level);
  if (status != EDGE_OK) return status;
  for (int i = 0; i < settings->n_levels; i++) {
    if (settings->levels[i] == settings->default_level) return EDGE_OK;
  }
  return json_field_fail(section, "default_level", where, "one of the calibrated levels, or null for dense");
}

/* settings: present, an object or null (the exporter's record of how the predictor was calibrated). */
static edge_status check_settings(const cJSON *section, const char *where) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(section, "settings");
  if (cJSON_IsNull(item) || cJSON_IsObject(item)) return EDGE_OK;
  return json_field_fail(section, "settings", where, "a JSON object or null");
}

/* layers: one {"layer": i, "kind": predictor} per model layer. */
static edge_status check_layers(const cJSON *section, int num_layers, const char *where,
                                const struct sparsity_settings *settings) {
  const cJSON *layers, *entry;
  edge_status status = json_list_field(section, "layers", where, MAX_LAYERS, &layers);
  if (status != EDGE_OK) return status;
  if (cJSON_GetArraySize(layers) != num_layers) {
    char expected[64];
    snprintf(expected, sizeof expected, "a list of %d entries, one per layer", num_layers);
    return json_field_fail(section, "layers", where, expected);
  }
  int index = 0, layer, kind;
  const char *const predictor = predictor_name(settings->predictor);
  cJSON_ArrayForEach(entry, layers) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s: layers[%d]", where, index);
    if (!cJSON_IsObject(entry)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object, found %s", inner, json_type_name(entry));
    }
    if ((status = read_int(entry, "layer", inner, index, index, &layer)) != EDGE_OK ||
        (status = json_choice_field(entry, "kind", inner, &predictor, 1, &kind)) != EDGE_OK) {
      return status;
    }
    index++;
  }
  return EDGE_OK;
}

edge_status config_read_sparsity(const cJSON *section, int num_layers, const char *where,
                                 struct sparsity_settings *settings) {
  memset(settings, 0, sizeof *settings);
  int kind;
  const char *predictor_names[PREDICTOR_KINDS];
  for (int i = 0; i < PREDICTOR_KINDS; i++) predictor_names[i] = predictor_kind_specs[i].name;
  edge_status status = json_choice_field(section, "predictor", where, predictor_names, PREDICTOR_KINDS, &kind);
  if (status != EDGE_OK) return status;
  settings->predictor = (enum predictor_kind)kind;
  if ((status = read_levels(section, where, settings)) != EDGE_OK ||
      (status = read_default_level(section, where, settings)) != EDGE_OK ||
      (status = read_fraction(section, "core_alpha", where, 1, &settings->core_alpha)) != EDGE_OK ||
      (status = read_fraction(section, "core_beta", where, 1, &settings->core_beta)) != EDGE_OK ||
      (status = check_settings(section, where)) != EDGE_OK) {
    return status;
  }
  return check_layers(section, num_layers, where, settings);
}

/* ---- Options ---------------------------------------------------------------------------------------------- */

/* The row of the level tensors for the requested level (negative: the bundle's default). */
static edge_status resolve_level(const struct sparsity_settings *settings, const struct edge_options *options,
                                 struct sparsity_config *sparsity) {
  sparsity->level_index = -1;
  if (settings->n_levels == 0) {
    if (options->sparsity >= 0.0 && !options->dense) {
      return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "sparsity level %g was not calibrated; calibrated levels: none "
                       "(this predictor has no levels)", options->sparsity);
    }
    return EDGE_OK;
  }
  if (options->sparsity < 0.0 && settings->default_level == DEFAULT_LEVEL_DENSE) {
    sparsity->dense = 1;
    sparsity->level_index = 0; /* a valid row, never read while dense */
    return EDGE_OK;
  }
  double level = options->sparsity >= 0.0 ? options->sparsity : settings->default_level;
  for (int i = 0; i < settings->n_levels; i++) {
    if (fabs(settings->levels[i] - level) < 1e-9) sparsity->level_index = i;
  }
  if (sparsity->level_index >= 0) return EDGE_OK;
  char known[512] = "";
  for (int i = 0; i < settings->n_levels; i++) {
    size_t used = strlen(known);
    snprintf(known + used, sizeof known - used, "%s%g", i ? ", " : "", settings->levels[i]);
  }
  return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "sparsity level %g was not calibrated; calibrated levels: %s", level,
                   known);
}

edge_status model_read_config(const struct bundle *bundle, const struct edge_options *options,
                              struct model_config *config, struct sparsity_config *sparsity) {
  const struct manifest *manifest = &bundle->info;
  *config = manifest->model;
  config->bundle_max_seq_len = manifest->max_seq_len;
  if (options->max_seq_len > config->bundle_max_seq_len) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "max_seq_len: expected at most the bundle's %d, found %d",
                     config->bundle_max_seq_len, options->max_seq_len);
  }
  config->max_seq_len = options->max_seq_len > 0 ? options->max_seq_len : config->bundle_max_seq_len;
  const struct sparsity_settings *settings = &manifest->sparsity;
  sparsity->predictor = settings->predictor;
  sparsity->n_levels = settings->n_levels;
  memcpy(sparsity->levels, settings->levels, sizeof sparsity->levels);
  sparsity->dense = options->dense != 0;
  sparsity->core_alpha = settings->core_alpha;
  sparsity->core_beta = settings->core_beta;
  return resolve_level(settings, options, sparsity);
}
