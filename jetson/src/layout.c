/* The tensors of a bundle (layout.h): the expected table built from the model config, compared with the
 * manifest's declared tensors. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_fields.h"
#include "json_strict.h"

#define NAME_BYTES 64 /* "layers.1023.self_attn.q_proj.weight" and the like */
#define SCALES_SUFFIX ".scales"
#define MINS_SUFFIX ".mins"
/* a weight's name, or its scales' name: the name and the suffix */
#define ENTRY_NAME_BYTES (NAME_BYTES + sizeof SCALES_SUFFIX)
#define SHOWN_NAME_BYTES 200

struct expected_tensor {
  char name[ENTRY_NAME_BYTES];
  enum tensor_dtype dtype;
  int rank;
  int64_t shape[2];
  int factor; /* a predictor's low-rank factor (predictor_tensor_spec.factor) */
};

struct declared_tensor {
  const char *name; /* a key of the manifest's tensors object */
  enum tensor_dtype dtype;
  int rank;
  int64_t shape[SAFETENSORS_MAX_RANK];
  int matched;
};

struct table {
  struct expected_tensor *entries;
  size_t count, capacity;
  int failed;
  int group_size; /* > 0: matrices are quantized codes of the weight dtype (I8, or U8 packing two int4 values) */
  int asymmetric; /* int4 matrices (U8 codes) have <name>.mins besides <name>.scales */
  enum tensor_dtype factor_dtype; /* of the predictor's low-rank factors */
  const char *factor_rule;        /* why the factors have that dtype */
};

/* ---- The declared tensors ------------------------------------------------------------------------------------ */

static int compare_declared(const void *a, const void *b) {
  return strcmp(((const struct declared_tensor *)a)->name, ((const struct declared_tensor *)b)->name);
}

static struct declared_tensor *find_declared(struct declared_tensor *declared, size_t n, const char *name) {
  struct declared_tensor key = {.name = name};
  return n == 0 ? NULL : bsearch(&key, declared, n, sizeof key, compare_declared);
}

/* One entry {dtype, shape} of manifest "tensors" (where: "...: tensors['NAME']"). */
static edge_status read_declared_entry(const cJSON *entry, const char *where, struct declared_tensor *out) {
  const char *dtype_names[DTYPE_COUNT];
  for (int i = 0; i < DTYPE_COUNT; i++) dtype_names[i] = tensor_dtype_name((enum tensor_dtype)i);
  if (!cJSON_IsObject(entry)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object, found %s", where, json_type_name(entry));
  }
  int dtype;
  const cJSON *shape, *dim;
  edge_status status = json_choice_field(entry, "dtype", where, dtype_names, DTYPE_COUNT, &dtype);
  if (status == EDGE_OK) status = json_list_field(entry, "shape", where, SAFETENSORS_MAX_RANK, &shape);
  if (status != EDGE_OK) return status;
  out->name = entry->string;
  out->dtype = (enum tensor_dtype)dtype;
  out->rank = 0;
  cJSON_ArrayForEach(dim, shape) {
    if (!json_integer(dim, 0, SAFETENSORS_MAX_DIMENSION, &out->shape[out->rank++])) {
      return json_field_fail(entry, "shape", where, "a list of at most 8 integers in [0, 1099511627776]");
    }
  }
  return EDGE_OK;
}

static edge_status read_declared(const cJSON *tensors, const char *where, struct declared_tensor **out, size_t *n) {
  size_t count = (size_t)cJSON_GetArraySize(tensors);
  struct declared_tensor *declared = calloc(count + 1, sizeof *declared);
  if (declared == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  const cJSON *entry;
  size_t i = 0;
  cJSON_ArrayForEach(entry, tensors) {
    char inner[1024 + SHOWN_NAME_BYTES], shown[SHOWN_NAME_BYTES];
    snprintf(inner, sizeof inner, "%s['%s']", where, json_shown(entry->string, shown, sizeof shown));
    edge_status status = read_declared_entry(entry, inner, &declared[i++]);
    if (status != EDGE_OK) {
      free(declared);
      return status;
    }
  }
  qsort(declared, count, sizeof *declared, compare_declared);
  *out = declared;
  *n = count;
  return EDGE_OK;
}

/* ---- The expected table ------------------------------------------------------------------------------------ */

static void add(struct table *table, const char *name, enum tensor_dtype dtype, int rank, int64_t rows, int64_t cols) {
  if (table->failed) return;
  if (table->count == table->capacity) {
    size_t capacity = table->capacity ? 2 * table->capacity : 256;
    struct expected_tensor *grown = realloc(table->entries, capacity * sizeof *grown);
    if (grown == NULL) {
      table->failed = 1;
      return;
    }
    table->entries = grown, table->capacity = capacity;
  }
  struct expected_tensor *entry = &table->entries[table->count++];
  snprintf(entry->name, sizeof entry->name, "%s", name);
  entry->dtype = dtype;
  entry->rank = rank;
  entry->shape[0] = rows;
  entry->shape[1] = cols;
  entry->factor = 0;
}

/* A [rows, cols] matrix of weight dtype w: itself, or in a quantized bundle its codes and <name>.scales (and an
 * asymmetric int4 matrix's <name>.mins). */
static void add_matrix(struct table *table, const char *name, enum tensor_dtype w, int64_t rows, int64_t cols) {
  if (table->group_size == 0) {
    add(table, name, w, 2, rows, cols);
    return;
  }
  char scales[ENTRY_NAME_BYTES], mins[ENTRY_NAME_BYTES];
  snprintf(scales, sizeof scales, "%s" SCALES_SUFFIX, name);
  add(table, name, w, 2, rows, w == DTYPE_U8 ? cols / 2 : cols);
  add(table, scales, DTYPE_F16, 2, rows, cols / table->group_size);
  if (table->asymmetric && w == DTYPE_U8) {
    snprintf(mins, sizeof mins, "%s" MINS_SUFFIX, name);
    add(table, mins, DTYPE_F16, 2, rows, cols / table->group_size);
  }
}

/* A layer's model tensors, in the checkpoint's order (model/config.py hf_tensor_shapes); down: the down projection's
 * dtype (w, or I8 under int4: no mins, as add_matrix gives only U8 matrices theirs). */
static void add_layer(struct table *table, const struct model_config *c, enum tensor_dtype w, enum tensor_dtype down,
                      int layer) {
  int64_t d = c->hidden_size, D = c->intermediate_size;
  int64_t q = (int64_t)c->num_heads * c->head_dim, kv = (int64_t)c->num_kv_heads * c->head_dim;
  char name[NAME_BYTES];
#define LAYER(suffix) (snprintf(name, sizeof name, "layers.%d.%s", layer, suffix), name)
  add(table, LAYER("input_layernorm.weight"), DTYPE_F32, 1, d, 0);
  add(table, LAYER("post_attention_layernorm.weight"), DTYPE_F32, 1, d, 0);
  add_matrix(table, LAYER("self_attn.q_proj.weight"), w, q, d);
  add_matrix(table, LAYER("self_attn.k_proj.weight"), w, kv, d);
  add_matrix(table, LAYER("self_attn.v_proj.weight"), w, kv, d);
  add_matrix(table, LAYER("self_attn.o_proj.weight"), w, d, q);
  if (c->qkv_bias) {
    add(table, LAYER("self_attn.q_proj.bias"), DTYPE_F32, 1, q, 0);
    add(table, LAYER("self_attn.k_proj.bias"), DTYPE_F32, 1, kv, 0);
    add(table, LAYER("self_attn.v_proj.bias"), DTYPE_F32, 1, kv, 0);
  }
  if (c->o_bias) add(table, LAYER("self_attn.o_proj.bias"), DTYPE_F32, 1, d, 0);
  add_matrix(table, LAYER("mlp.gate_proj.weight"), w, D, d);
  add_matrix(table, LAYER("mlp.up_proj.weight"), w, D, d);
  add_matrix(table, LAYER("mlp.down_proj.weight_t"), down, D, d);
#undef LAYER
}

/* The size a generated predictor_dim stands for in this bundle; rank: the layer's svd rank. */
static int64_t predictor_dim_size(struct predictor_dim_spec dim, const struct model_config *c,
                                  const struct sparsity_settings *s, int64_t rank) {
  switch (dim.symbol) {
    case DIM_HIDDEN: return c->hidden_size;
    case DIM_INTERMEDIATE: return c->intermediate_size;
    case DIM_LEVELS: return s->n_levels;
    case DIM_RANK: return rank;
    case DIM_WORDS: return (c->hidden_size + 31) / 32;
    case DIM_FIXED: break;
  }
  return dim.size;
}

/* A layer's predictor tensors, as the registry (edge_sdk/predictors, generated into predictor_kinds.c) lists them. */
static void add_predictor(struct table *table, const struct model_config *c, const struct sparsity_settings *s,
                          int layer, int64_t rank) {
  const struct predictor_kind_spec *kind = &predictor_kind_specs[s->predictor];
  for (int t = 0; t < kind->n_tensors; t++) {
    const struct predictor_tensor_spec *tensor = &kind->tensors[t];
    char name[NAME_BYTES];
    snprintf(name, sizeof name, "layers.%d.%s.%s", layer, kind->name, tensor->name);
    int64_t rows = predictor_dim_size(tensor->shape[0], c, s, rank);
    int64_t cols = tensor->rank == 2 ? predictor_dim_size(tensor->shape[1], c, s, rank) : 0;
    add(table, name, tensor->factor ? table->factor_dtype : tensor->dtype, tensor->rank, rows, cols);
    if (!table->failed) table->entries[table->count - 1].factor = tensor->factor;
  }
}

/* Each layer's svd rank, from its declared svd.a [D, rank]: 1 <= rank <= min(d, D). */
static edge_status svd_ranks(struct declared_tensor *declared, size_t n, const struct model_config *c,
                             const char *where, int64_t *ranks) {
  int64_t limit = c->hidden_size < c->intermediate_size ? c->hidden_size : c->intermediate_size;
  for (int layer = 0; layer < c->num_layers; layer++) {
    char name[NAME_BYTES], found[160] = "missing", shape[128];
    snprintf(name, sizeof name, "layers.%d.svd.a", layer);
    const struct declared_tensor *entry = find_declared(declared, n, name);
    if (entry != NULL && entry->rank == 2 && entry->shape[1] >= 1 && entry->shape[1] <= limit) {
      ranks[layer] = entry->shape[1];
      continue;
    }
    if (entry != NULL) {
      snprintf(found, sizeof found, "%s %s", tensor_dtype_name(entry->dtype),
               tensor_shape_text(entry->shape, entry->rank, shape, sizeof shape));
    }
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' must be [%d, rank] with 1 <= rank <= %lld, found %s", where,
                     name, c->intermediate_size, (long long)limit, found);
  }
  return EDGE_OK;
}

static edge_status build_table(struct declared_tensor *declared, size_t n, const struct model_config *c,
                               enum tensor_dtype w, enum tensor_dtype head, enum tensor_dtype down, int max_seq_len,
                               const struct sparsity_settings *s, const char *where, struct table *table) {
  int64_t ranks[MAX_LAYERS] = {0};
  if (s->predictor == PREDICTOR_SVD) {
    edge_status status = svd_ranks(declared, n, c, where, ranks);
    if (status != EDGE_OK) return status;
  }
  /* a quantized bundle stores the embedding F16 (a row lookup), unless it is the LM head too (format version 3) */
  if (table->group_size && !c->tie_word_embeddings) {
    add(table, "embed_tokens.weight", DTYPE_F16, 2, c->vocab_size, c->hidden_size);
  } else {
    add_matrix(table, "embed_tokens.weight", c->tie_word_embeddings ? head : w, c->vocab_size, c->hidden_size);
  }
  add(table, "norm.weight", DTYPE_F32, 1, c->hidden_size, 0);
  if (!c->tie_word_embeddings) add_matrix(table, "lm_head.weight", head, c->vocab_size, c->hidden_size);
  for (int layer = 0; layer < c->num_layers; layer++) add_layer(table, c, w, down, layer);
  add(table, "rope.cos", DTYPE_F32, 2, max_seq_len, c->head_dim);
  add(table, "rope.sin", DTYPE_F32, 2, max_seq_len, c->head_dim);
  for (int layer = 0; layer < c->num_layers; layer++) add_predictor(table, c, s, layer, ranks[layer]);
  return table->failed ? edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where) : EDGE_OK;
}

/* ---- The comparison ----------------------------------------------------------------------------------------- */

static int same_shape(const struct declared_tensor *found, const struct expected_tensor *want) {
  if (found->rank != want->rank) return 0;
  for (int i = 0; i < want->rank; i++) {
    if (found->shape[i] != want->shape[i]) return 0;
  }
  return 1;
}

static edge_status compare(struct declared_tensor *declared, size_t n, const struct table *table, const char *where) {
  char want_shape[64], found_shape[160];
  for (size_t i = 0; i < table->count; i++) {
    const struct expected_tensor *want = &table->entries[i];
    struct declared_tensor *found = find_declared(declared, n, want->name);
    tensor_shape_text(want->shape, want->rank, want_shape, sizeof want_shape);
    if (found == NULL) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is missing (%s %s expected)", where, want->name,
                       tensor_dtype_name(want->dtype), want_shape);
    }
    if (want->factor && same_shape(found, want) && found->dtype != want->dtype) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is declared %s, expected %s: %s", where, want->name,
                       tensor_dtype_name(found->dtype), tensor_dtype_name(want->dtype), table->factor_rule);
    }
    if (!same_shape(found, want) || found->dtype != want->dtype) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is declared %s %s, the model config needs %s %s", where,
                       want->name, tensor_dtype_name(found->dtype),
                       tensor_shape_text(found->shape, found->rank, found_shape, sizeof found_shape),
                       tensor_dtype_name(want->dtype), want_shape);
    }
    found->matched = 1;
  }
  if (n == table->count) return EDGE_OK; /* names are unique on both sides */
  size_t extra = 0;
  const char *first = NULL;
  for (size_t i = 0; i < n; i++) {
    if (declared[i].matched) continue;
    if (first == NULL) first = declared[i].name;
    extra++;
  }
  char shown[SHOWN_NAME_BYTES];
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' belongs to no part of this model (%zu such)", where,
                   json_shown(first, shown, sizeof shown), extra);
}

edge_status layout_check_tensors(const cJSON *tensors, const struct model_config *config, enum tensor_dtype weight_dtype,
                                 enum tensor_dtype head_dtype, enum tensor_dtype down_dtype, int group_size,
                                 int asymmetric, int max_seq_len, const struct sparsity_settings *sparsity,
                                 enum tensor_dtype factor_dtype, const char *factor_rule, const char *where) {
  struct declared_tensor *declared;
  size_t n;
  edge_status status = read_declared(tensors, where, &declared, &n);
  if (status != EDGE_OK) return status;
  struct table table = {
      .group_size = group_size, .asymmetric = asymmetric, .factor_dtype = factor_dtype, .factor_rule = factor_rule};
  status = build_table(declared, n, config, weight_dtype, head_dtype, down_dtype, max_seq_len, sparsity, where,
                       &table);
  if (status == EDGE_OK) status = compare(declared, n, &table, where);
  free(table.entries);
  free(declared);
  return status;
}
