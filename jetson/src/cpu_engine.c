/* The CPU engine: the whole decoder in C (llama2.c layout); the FFN, the projections, the predictors and the attention
 * in the shared CPU kernels (kernels/cpu), which a package's library holds for each instruction set.
 *
 *   Config   struct model_config (model.h), read from the manifest
 *   Weights  struct cpu_weights: pointers into the read-only mapping of weights.safetensors, never copied.
 *            Matrices are F32 or F16 as stored, or int8 / int4 codes with fp16 group scales (quantized bundles, read
 *            by edge_cpu_matvec_q and edge_cpu_sparse_ffn_q, the dense FFN as the latter with mask NULL; a tied
 *            embedding is quantized too, and its lookup dequantizes the token's row); otherwise the kernels
 *            (edge_cpu_matvec for the attention projections and lm_head, the FFN kernels) widen F16 rows to fp32 on
 *            the fly, as does the embedding lookup.
 *   RunState struct run_state: activation buffers and the preallocated KV cache of one session.
 *
 * Math of edge_sdk/model/decoder.py and edge_sdk/sparsity/sparse_model.py: RMSNorm x * rsqrt(mean(x^2) + eps)
 * * weight; RoPE (rotate-half) from the bundle's rope.cos / rope.sin tables, so positions rotate exactly as
 * in Python; GQA attention (query head h reads KV head h / (num_heads / num_kv_heads)), scale 1/sqrt(head_dim),
 * causal and within the sliding window when the model has one; fp32 activations and logits.
 * Prefill runs the prompt with dense FFNs (edge_cpu_sparse_ffn with mask NULL) in blocks of PREFILL_TOKENS tokens
 * that go through each layer together: the projections and the FFN in the kernels of a block of tokens
 * (edge_cpu_matmuls, edge_cpu_ffn_tokens), which read each weight row once per block and give every token the bits
 * of the one-token kernels, and the block's attentions side by side, a token per thread; so the logits are those of
 * token-by-token prefill. Decode runs the bundle's predictor (svd, signbit, core mask from the prefill, threshold,
 * none) and the sparse FFN. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS (the KV caches' pages), which POSIX 2008 lacks */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "edge_cpu_kernels.h"
#include "edge_cpu_internal.h"
#include "model.h"

/* Below this many multiply-adds a matrix-vector product runs on one thread (thread start-up costs more). */
#define PARALLEL_MIN_WORK (1 << 16)
/* Tokens of a prompt that go through the layers together: each weight row read from memory once per block
 * (benchmarks/README.md, "Prefill in blocks of tokens"). */
#define PREFILL_TOKENS 32

struct matrix {
  const void *data; /* [rows, cols] row-major: dtype EDGE_F32 or EDGE_F16, or the codes of EDGE_Q8 / EDGE_Q4 */
  int dtype;
  int rows, cols;
  const uint16_t *scales; /* EDGE_Q8 / EDGE_Q4: fp16 [rows, cols / group_size]; NULL otherwise */
  const uint16_t *mins;   /* asymmetric EDGE_Q4: fp16 [rows, cols / group_size] group minimums; NULL otherwise */
  int group_size;
};

struct layer_weights {
  const float *input_norm; /* [d] */
  const float *post_norm;  /* [d] */
  struct matrix wq;        /* [H * hd, d] */
  struct matrix wk, wv;    /* [KV * hd, d] */
  struct matrix wo;        /* [d, H * hd] */
  const float *bq;         /* [H * hd] or NULL */
  const float *bk, *bv;    /* [KV * hd] or NULL */
  const float *bo;         /* [d] or NULL */
  const void *w_gate;      /* [D, d] ffn_dtype */
  const void *w_up;        /* [D, d] ffn_dtype */
  const void *w_down_t;    /* [D, d] ffn_dtype (EDGE_Q8 under EDGE_Q4: down_t.dtype), W_down transposed */
  int ffn_dtype;           /* of gate and up: EDGE_F32, EDGE_F16, or EDGE_Q8 / EDGE_Q4 with the scales below */
  struct matrix gate, up, down_t; /* the same three matrices with their scales (quantized bundles) */
  void *svd_a_t;           /* [svd_rank, D]: the bundle's svd.a transposed at load (owned), as the kernel reads it */
  const void *svd_b;       /* [svd_rank, d] */
  int svd_half;            /* svd_a_t and svd_b hold fp16 (the bundle's F16 factors), else fp32 */
  const float *svd_bias;   /* [D]: the chosen level's row of svd.biases */
  int svd_rank;
  const int32_t *signbit_packed; /* [D, ceil(d / 32)] sign bits of W_gate */
  float signbit_alpha;
  const float *thresholds; /* [D]: the chosen level's row of threshold.thresholds */
};

struct cpu_weights {
  struct matrix embed;     /* [V, d] */
  struct matrix lm_head;   /* [V, d], the embedding when tied */
  const float *final_norm; /* [d] */
  const float *rope_cos;   /* [bundle_max_seq_len, hd] */
  const float *rope_sin;   /* [bundle_max_seq_len, hd] */
  struct layer_weights *layers; /* [L] */
  int max_svd_rank;
};

struct cpu_engine {
  const struct model_config *config;
  const struct sparsity_config *sparsity;
  struct cpu_weights weights;
  int threads;
};

/* What one token needs on its way through the layers. */
struct token_buffers {
  float *x;            /* [d] residual stream */
  float *xb;           /* [d] normalized input of attention / FFN */
  float *out;          /* [d] attention projection or FFN output */
  float *q;            /* [H * hd] */
  float *attn;         /* [H * hd] attention output before o_proj */
  float *scores;       /* [H, max_seq_len] */
  float *key;          /* [KV * hd] the token's key, before it goes into the cache */
  void *ffn_workspace; /* edge_cpu_sparse_ffn_workspace_size(d, D, threads) for the threads it runs the FFN on */
  int threads;         /* the kernels' threads for this token */
};

/* What a block of up to PREFILL_TOKENS prompt tokens needs: each array holds the tokens' vectors one after another. */
struct prompt_block {
  float *x, *xb, *out;  /* [PREFILL_TOKENS, d] residual streams, normalized inputs, projection / FFN outputs */
  float *q, *attn;      /* [PREFILL_TOKENS, H * hd] */
  float *key;           /* [PREFILL_TOKENS, KV * hd] keys before they go into the cache */
  float *scores;        /* [threads, H, max_seq_len]: one attention's scores per thread */
  void *ffn_workspace;  /* edge_cpu_ffn_tokens_workspace_size(d, D, PREFILL_TOKENS) */
};

struct run_state {
  const struct cpu_engine *engine;
  struct token_buffers token; /* decode: the engine's threads */
  struct prompt_block prompt;  /* prefill */
  float *key_cache;   /* [L, KV, key_tiles, hd, 16]: tiles of 16 positions, so the scores run over positions in
                         vectors and the cache's pages are touched as positions come (edge_cpu_attention) */
  size_t key_tiles;   /* max_seq_len / 16, rounded up */
  float *value_cache; /* [L, max_seq_len, KV * hd] */
  size_t cache_bytes; /* of each cache's mapping (allocate_pages) */
  uint8_t *mask;      /* [D] predictor output */
  float *svd_scratch; /* [max_svd_rank] */
  /* core predictor: counted over the prompt at prefill, masks fixed for the decode */
  float *gate;          /* [D] act.gate(W_gate x) of one prompt token */
  int32_t *order;       /* [D] */
  int64_t *core_counts; /* [L, D] */
  double *core_sums;    /* [L, D] */
  uint8_t *core_masks;  /* [L, D] */
  int core_ready;
};

/* ---- Weights ------------------------------------------------------------------------------------------ */

static edge_status find_tensor(const struct bundle *bundle, const char *name, int float_weights, int rank,
                               const int64_t *shape, const struct tensor **out) {
  const struct tensor *tensor = bundle_tensor(bundle, name);
  if (tensor == NULL) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' is missing", bundle->root, BUNDLE_WEIGHTS_FILE, name);
  }
  if (float_weights && tensor->dtype == DTYPE_BF16) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED, "%s/%s: tensor '%s' is BF16; the C runtime reads F32 and F16 weights: "
                     "re-export the bundle with --dtype fp16 or --dtype fp32", bundle->root, BUNDLE_WEIGHTS_FILE, name);
  }
  int shape_ok = tensor->rank == rank;
  for (int i = 0; shape_ok && i < rank; i++) shape_ok = shape[i] < 0 || tensor->shape[i] == shape[i];
  if (!shape_ok) {
    char expected[128] = "", found[128] = "";
    for (int i = 0; i < rank; i++) {
      size_t used = strlen(expected);
      snprintf(expected + used, sizeof expected - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    for (int i = 0; i < tensor->rank; i++) {
      size_t used = strlen(found);
      snprintf(found + used, sizeof found - used, i ? ", %lld" : "%lld", (long long)tensor->shape[i]);
    }
    return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' has shape [%s], the model config needs [%s] (-1: any)",
                     bundle->root, BUNDLE_WEIGHTS_FILE, name, found, expected);
  }
  *out = tensor;
  return EDGE_OK;
}

static edge_status need_dtype(const struct bundle *bundle, const struct tensor *tensor, enum tensor_dtype dtype) {
  if (tensor->dtype == dtype) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' is %s, expected %s", bundle->root, BUNDLE_WEIGHTS_FILE,
                   tensor->name, tensor_dtype_name(tensor->dtype), tensor_dtype_name(dtype));
}

/* The codes of a quantized [rows, cols] matrix (I8 [rows, cols] or U8 [rows, cols / 2]) and its F16 <name>.scales
 * [rows, cols / group_size], and in an asymmetric int4 bundle an int4 matrix's F16 <name>.mins of the same shape;
 * the manifest's validation fixed the group size, read back from the scales' shape. */
static edge_status load_quantized(const struct bundle *bundle, const char *name, int rows, int cols, struct matrix *m) {
  const struct tensor *codes, *scales, *mins = NULL;
  int q4 = bundle_tensor(bundle, name) != NULL && bundle_tensor(bundle, name)->dtype == DTYPE_U8;
  int64_t shape[2] = {rows, q4 ? cols / 2 : cols}, scales_shape[2] = {rows, -1};
  char scales_name[160], mins_name[160];
  snprintf(scales_name, sizeof scales_name, "%s.scales", name);
  snprintf(mins_name, sizeof mins_name, "%s.mins", name);
  edge_status status = find_tensor(bundle, name, 0, 2, shape, &codes);
  if (status == EDGE_OK) status = find_tensor(bundle, scales_name, 0, 2, scales_shape, &scales);
  if (status == EDGE_OK) status = need_dtype(bundle, scales, DTYPE_F16);
  if (status != EDGE_OK) return status;
  int64_t groups = scales->shape[1];
  if (groups < 1 || cols % groups != 0 || (cols / groups != 32 && cols / groups != 64 && cols / groups != 128)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' has %lld groups per row of %d values, expected a group "
                     "size of 32, 64 or 128", bundle->root, BUNDLE_WEIGHTS_FILE, scales_name, (long long)groups, cols);
  }
  if (q4 && bundle->info.asymmetric) {
    int64_t mins_shape[2] = {rows, groups};
    status = find_tensor(bundle, mins_name, 0, 2, mins_shape, &mins);
    if (status == EDGE_OK) status = need_dtype(bundle, mins, DTYPE_F16);
    if (status != EDGE_OK) return status;
  }
  m->data = codes->data;
  m->dtype = q4 ? EDGE_Q4 : EDGE_Q8;
  m->rows = rows;
  m->cols = cols;
  m->scales = scales->data;
  m->mins = mins != NULL ? mins->data : NULL;
  m->group_size = (int)(cols / groups);
  return EDGE_OK;
}

/* A [rows, cols] F32 or F16 matrix, or quantized codes with their scales (I8 or U8 codes). */
static edge_status load_matrix(const struct bundle *bundle, const char *name, int rows, int cols, struct matrix *m) {
  const struct tensor *tensor = bundle_tensor(bundle, name);
  if (tensor != NULL && (tensor->dtype == DTYPE_I8 || tensor->dtype == DTYPE_U8)) {
    return load_quantized(bundle, name, rows, cols, m);
  }
  int64_t shape[2] = {rows, cols};
  edge_status status = find_tensor(bundle, name, 1, 2, shape, &tensor);
  if (status != EDGE_OK) return status;
  if (tensor->dtype != DTYPE_F32 && tensor->dtype != DTYPE_F16) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' is %s, expected F32 or F16", bundle->root,
                     BUNDLE_WEIGHTS_FILE, name, tensor_dtype_name(tensor->dtype));
  }
  m->data = tensor->data;
  m->dtype = tensor->dtype == DTYPE_F16 ? EDGE_F16 : EDGE_F32;
  m->rows = rows;
  m->cols = cols;
  m->scales = NULL;
  m->mins = NULL;
  m->group_size = 0;
  return EDGE_OK;
}

/* An F32 tensor of the given shape (-1 entries: any size); NULL-safe name building by the caller. */
static edge_status load_f32(const struct bundle *bundle, const char *name, int rank, const int64_t *shape,
                            const struct tensor **out) {
  edge_status status = find_tensor(bundle, name, 0, rank, shape, out);
  return status == EDGE_OK ? need_dtype(bundle, *out, DTYPE_F32) : status;
}

static edge_status load_vector(const struct bundle *bundle, const char *name, int size, const float **out) {
  const struct tensor *tensor;
  int64_t shape[1] = {size};
  edge_status status = load_f32(bundle, name, 1, shape, &tensor);
  if (status == EDGE_OK) *out = tensor->data;
  return status;
}

static edge_status load_predictor(const struct bundle *bundle, const struct model_config *c,
                                  const struct sparsity_config *sparsity, int layer, struct layer_weights *w,
                                  int *max_rank) {
  char name[128];
  const struct tensor *tensor;
  edge_status status = EDGE_OK;
  int d = c->hidden_size, D = c->intermediate_size;
  switch (sparsity->predictor) {
    case PREDICTOR_SVD: {
      /* the factors in the manifest's factor dtype (F16 in bundles of format version 5 whose weights are not fp32) */
      enum tensor_dtype factor_dtype = bundle->info.factor_dtype;
      size_t element = tensor_dtype_size(factor_dtype);
      snprintf(name, sizeof name, "layers.%d.svd.a", layer);
      int64_t a_shape[2] = {D, -1};
      status = find_tensor(bundle, name, 0, 2, a_shape, &tensor);
      if (status == EDGE_OK) status = need_dtype(bundle, tensor, factor_dtype);
      if (status != EDGE_OK) return status;
      if (tensor->shape[1] < 1 || tensor->shape[1] > d) {
        return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' has rank %lld, expected 1..%d", bundle->root,
                         BUNDLE_WEIGHTS_FILE, name, (long long)tensor->shape[1], d);
      }
      w->svd_rank = (int)tensor->shape[1];
      w->svd_half = factor_dtype == DTYPE_F16;
      w->svd_a_t = malloc((size_t)D * (size_t)w->svd_rank * element);
      if (w->svd_a_t == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "CPU engine: out of memory for '%s'", name);
      const char *a = tensor->data;
      char *a_t = w->svd_a_t;
      for (int i = 0; i < D; i++) {
        for (int r = 0; r < w->svd_rank; r++) {
          memcpy(a_t + ((size_t)r * (size_t)D + (size_t)i) * element, a + ((size_t)i * w->svd_rank + r) * element,
                 element);
        }
      }
      *max_rank = w->svd_rank > *max_rank ? w->svd_rank : *max_rank;
      snprintf(name, sizeof name, "layers.%d.svd.b", layer);
      int64_t b_shape[2] = {w->svd_rank, d};
      status = find_tensor(bundle, name, 0, 2, b_shape, &tensor);
      if (status == EDGE_OK) status = need_dtype(bundle, tensor, factor_dtype);
      if (status != EDGE_OK) return status;
      w->svd_b = tensor->data;
      snprintf(name, sizeof name, "layers.%d.svd.biases", layer);
      int64_t bias_shape[2] = {sparsity->n_levels, D};
      status = load_f32(bundle, name, 2, bias_shape, &tensor);
      if (status != EDGE_OK) return status;
      w->svd_bias = (const float *)tensor->data + (size_t)sparsity->level_index * (size_t)D;
      return EDGE_OK;
    }
    case PREDICTOR_SIGNBIT: {
      snprintf(name, sizeof name, "layers.%d.signbit.packed", layer);
      int64_t packed_shape[2] = {D, (d + 31) / 32};
      status = find_tensor(bundle, name, 0, 2, packed_shape, &tensor);
      if (status == EDGE_OK) status = need_dtype(bundle, tensor, DTYPE_I32);
      if (status != EDGE_OK) return status;
      w->signbit_packed = tensor->data;
      snprintf(name, sizeof name, "layers.%d.signbit.alpha", layer);
      int64_t alpha_shape[1] = {1};
      status = load_f32(bundle, name, 1, alpha_shape, &tensor);
      if (status != EDGE_OK) return status;
      w->signbit_alpha = *(const float *)tensor->data;
      if (!isfinite(w->signbit_alpha)) {
        return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%s' is not finite", bundle->root, BUNDLE_WEIGHTS_FILE, name);
      }
      return EDGE_OK;
    }
    case PREDICTOR_THRESHOLD: {
      snprintf(name, sizeof name, "layers.%d.threshold.thresholds", layer);
      int64_t shape[2] = {sparsity->n_levels, D};
      status = load_f32(bundle, name, 2, shape, &tensor);
      if (status != EDGE_OK) return status;
      w->thresholds = (const float *)tensor->data + (size_t)sparsity->level_index * (size_t)D;
      return EDGE_OK;
    }
    case PREDICTOR_CORE:
    case PREDICTOR_NONE:
      return EDGE_OK;
  }
  return EDGE_OK;
}

static edge_status load_layer(const struct bundle *bundle, const struct model_config *c,
                              const struct sparsity_config *sparsity, int layer, struct layer_weights *w,
                              int *max_rank) {
  char name[128];
  int d = c->hidden_size, D = c->intermediate_size;
  int q_dim = c->num_heads * c->head_dim, kv_dim = c->num_kv_heads * c->head_dim;
  edge_status status;
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "layers.%d.%s", layer, suffix), name)
  if ((status = load_vector(bundle, LAYER_NAME("input_layernorm.weight"), d, &w->input_norm)) != EDGE_OK ||
      (status = load_vector(bundle, LAYER_NAME("post_attention_layernorm.weight"), d, &w->post_norm)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("self_attn.q_proj.weight"), q_dim, d, &w->wq)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("self_attn.k_proj.weight"), kv_dim, d, &w->wk)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("self_attn.v_proj.weight"), kv_dim, d, &w->wv)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("self_attn.o_proj.weight"), d, q_dim, &w->wo)) != EDGE_OK) {
    return status;
  }
  if (c->qkv_bias &&
      ((status = load_vector(bundle, LAYER_NAME("self_attn.q_proj.bias"), q_dim, &w->bq)) != EDGE_OK ||
       (status = load_vector(bundle, LAYER_NAME("self_attn.k_proj.bias"), kv_dim, &w->bk)) != EDGE_OK ||
       (status = load_vector(bundle, LAYER_NAME("self_attn.v_proj.bias"), kv_dim, &w->bv)) != EDGE_OK)) {
    return status;
  }
  if (c->o_bias && (status = load_vector(bundle, LAYER_NAME("self_attn.o_proj.bias"), d, &w->bo)) != EDGE_OK) {
    return status;
  }
  struct matrix gate = {0}, up = {0}, down_t = {0};
  if ((status = load_matrix(bundle, LAYER_NAME("mlp.gate_proj.weight"), D, d, &gate)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("mlp.up_proj.weight"), D, d, &up)) != EDGE_OK ||
      (status = load_matrix(bundle, LAYER_NAME("mlp.down_proj.weight_t"), D, d, &down_t)) != EDGE_OK) {
    return status;
  }
#undef LAYER_NAME
  /* one dtype and group size, except int8 down rows under int4 gate and up (a bundle of down_dtype int8) */
  int int8_down = gate.dtype == EDGE_Q4 && down_t.dtype == EDGE_Q8;
  if (up.dtype != gate.dtype || (down_t.dtype != gate.dtype && !int8_down) || up.group_size != gate.group_size ||
      down_t.group_size != gate.group_size) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: layer %d's gate, up and down FFN weights must share one dtype and "
                     "group size (or be int4 gate and up with int8 down of that group size)", bundle->root,
                     BUNDLE_WEIGHTS_FILE, layer);
  }
  w->gate = gate, w->up = up, w->down_t = down_t;
  w->w_gate = gate.data;
  w->w_up = up.data;
  w->w_down_t = down_t.data;
  w->ffn_dtype = gate.dtype;
  return load_predictor(bundle, c, sparsity, layer, w, max_rank);
}

static void free_weights(struct cpu_weights *weights, int n_layers) {
  for (int layer = 0; weights->layers != NULL && layer < n_layers; layer++) free(weights->layers[layer].svd_a_t);
  free(weights->layers);
  memset(weights, 0, sizeof *weights);
}

static edge_status build_weights(const struct bundle *bundle, const struct model_config *c,
                                 const struct sparsity_config *sparsity, struct cpu_weights *weights) {
  memset(weights, 0, sizeof *weights);
  int d = c->hidden_size;
  edge_status status = load_matrix(bundle, "embed_tokens.weight", c->vocab_size, d, &weights->embed);
  if (status != EDGE_OK) return status;
  weights->lm_head = weights->embed;
  if (!c->tie_word_embeddings) {
    status = load_matrix(bundle, "lm_head.weight", c->vocab_size, d, &weights->lm_head);
    if (status != EDGE_OK) return status;
  }
  if ((status = load_vector(bundle, "norm.weight", d, &weights->final_norm)) != EDGE_OK) return status;
  const struct tensor *tensor;
  int64_t rope_shape[2] = {c->bundle_max_seq_len, c->head_dim};
  if ((status = load_f32(bundle, "rope.cos", 2, rope_shape, &tensor)) != EDGE_OK) return status;
  weights->rope_cos = tensor->data;
  if ((status = load_f32(bundle, "rope.sin", 2, rope_shape, &tensor)) != EDGE_OK) return status;
  weights->rope_sin = tensor->data;
  weights->layers = calloc((size_t)c->num_layers, sizeof *weights->layers);
  if (weights->layers == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "CPU engine: out of memory for layer weights");
  for (int layer = 0; layer < c->num_layers; layer++) {
    status = load_layer(bundle, c, sparsity, layer, &weights->layers[layer], &weights->max_svd_rank);
    if (status != EDGE_OK) {
      free_weights(weights, c->num_layers);
      return status;
    }
  }
  return EDGE_OK;
}

static edge_status cpu_load(struct edge_model *model, void **out) {
  struct cpu_engine *engine = calloc(1, sizeof *engine);
  if (engine == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "CPU engine: out of memory");
  engine->config = &model->config;
  engine->sparsity = &model->sparsity;
  engine->threads = model->options.threads > 0 ? model->options.threads : edge_cpu_max_threads();
  edge_status status = build_weights(&model->bundle, &model->config, &model->sparsity, &engine->weights);
  if (status != EDGE_OK) {
    free(engine);
    return status;
  }
  *out = engine;
  return EDGE_OK;
}

static void cpu_unload(void *engine) {
  if (engine == NULL) return;
  struct cpu_engine *cpu = engine;
  free_weights(&cpu->weights, cpu->config->num_layers);
  free(engine);
}

/* ---- RunState ------------------------------------------------------------------------------------------ */

static void free_token_buffers(struct token_buffers *t) {
  free(t->x);
  free(t->xb);
  free(t->out);
  free(t->q);
  free(t->attn);
  free(t->scores);
  free(t->key);
  free(t->ffn_workspace);
}

static void free_prompt_block(struct prompt_block *b) {
  free(b->x);
  free(b->xb);
  free(b->out);
  free(b->q);
  free(b->attn);
  free(b->key);
  free(b->scores);
  free(b->ffn_workspace);
}

static void free_run_state(struct run_state *s) {
  if (s == NULL) return;
  free_token_buffers(&s->token);
  free_prompt_block(&s->prompt);
  if (s->key_cache != NULL) munmap(s->key_cache, s->cache_bytes);
  if (s->value_cache != NULL) munmap(s->value_cache, s->cache_bytes);
  free(s->mask);
  free(s->svd_scratch);
  free(s->gate);
  free(s->order);
  free(s->core_counts);
  free(s->core_sums);
  free(s->core_masks);
  free(s);
}

static void *allocate(size_t count, size_t size, int *failed) {
  void *memory = count == 0 ? NULL : calloc(count, size);
  if (count != 0 && memory == NULL) *failed = 1;
  return memory;
}

/* count floats of zero pages that take memory only where written: the KV caches, whose positions fill as a
 * generation goes. From calloc they could be carved out of heap pages the tokenizer's parse had freed, which calloc
 * then zeroed, i.e. touched, whole (12 MB of SmolLM2-135M's session at 512 positions). */
static float *allocate_pages(size_t count, int *failed) {
  if (count == 0) return NULL;
  void *memory = count > SIZE_MAX / sizeof(float) ? MAP_FAILED
                                                  : mmap(NULL, count * sizeof(float), PROT_READ | PROT_WRITE,
                                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory != MAP_FAILED) return memory;
  *failed = 1;
  return NULL;
}

static void allocate_token_buffers(const struct model_config *c, int threads, struct token_buffers *t, int *failed) {
  size_t d = (size_t)c->hidden_size;
  size_t q_dim = (size_t)c->num_heads * (size_t)c->head_dim, kv_dim = (size_t)c->num_kv_heads * (size_t)c->head_dim;
  t->x = allocate(d, sizeof(float), failed);
  t->xb = allocate(d, sizeof(float), failed);
  t->out = allocate(d, sizeof(float), failed);
  t->q = allocate(q_dim, sizeof(float), failed);
  t->attn = allocate(q_dim, sizeof(float), failed);
  t->scores = allocate((size_t)c->num_heads * (size_t)c->max_seq_len, sizeof(float), failed);
  t->key = allocate(kv_dim, sizeof(float), failed);
  t->ffn_workspace = allocate(edge_cpu_sparse_ffn_workspace_size(c->hidden_size, c->intermediate_size, threads), 1,
                              failed);
  t->threads = threads;
}

static void allocate_prompt_block(const struct model_config *c, int threads, struct prompt_block *b, int *failed) {
  size_t d = (size_t)c->hidden_size, tokens = PREFILL_TOKENS;
  size_t q_dim = (size_t)c->num_heads * (size_t)c->head_dim, kv_dim = (size_t)c->num_kv_heads * (size_t)c->head_dim;
  b->x = allocate(tokens * d, sizeof(float), failed);
  b->xb = allocate(tokens * d, sizeof(float), failed);
  b->out = allocate(tokens * d, sizeof(float), failed);
  b->q = allocate(tokens * q_dim, sizeof(float), failed);
  b->attn = allocate(tokens * q_dim, sizeof(float), failed);
  b->key = allocate(tokens * kv_dim, sizeof(float), failed);
  b->scores = allocate((size_t)threads * (size_t)c->num_heads * (size_t)c->max_seq_len, sizeof(float), failed);
  b->ffn_workspace = allocate(edge_cpu_ffn_tokens_workspace_size(c->hidden_size, c->intermediate_size,
                                                                 PREFILL_TOKENS), 1, failed);
}

static edge_status cpu_session_create(const struct edge_model *model, void **out) {
  const struct cpu_engine *engine = model->engine;
  const struct model_config *c = engine->config;
  struct run_state *s = calloc(1, sizeof *s);
  if (s == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "session: out of memory");
  s->engine = engine;
  size_t D = (size_t)c->intermediate_size, L = (size_t)c->num_layers;
  size_t kv_dim = (size_t)c->num_kv_heads * (size_t)c->head_dim;
  size_t seq = (size_t)c->max_seq_len;
  int failed = 0;
  allocate_token_buffers(c, engine->threads, &s->token, &failed);
  allocate_prompt_block(c, engine->threads, &s->prompt, &failed);
  s->key_tiles = (seq + 15) / 16;
  s->cache_bytes = L * kv_dim * s->key_tiles * 16 * sizeof(float); /* the value cache's seq, rounded up to tiles */
  s->key_cache = allocate_pages(L * kv_dim * s->key_tiles * 16, &failed);
  s->value_cache = allocate_pages(L * kv_dim * s->key_tiles * 16, &failed);
  s->mask = allocate(D, 1, &failed);
  s->svd_scratch = allocate((size_t)engine->weights.max_svd_rank, sizeof(float), &failed);
  if (engine->sparsity->predictor == PREDICTOR_CORE) {
    s->gate = allocate(D, sizeof(float), &failed);
    s->order = allocate(D, sizeof(int32_t), &failed);
    s->core_counts = allocate(L * D, sizeof(int64_t), &failed);
    s->core_sums = allocate(L * D, sizeof(double), &failed);
    s->core_masks = allocate(L * D, 1, &failed);
  }
  if (failed) {
    free_run_state(s);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "session: out of memory for the KV cache (%zu MiB for %zu positions) "
                     "and buffers; lower max_seq_len", 2 * L * seq * kv_dim * sizeof(float) >> 20, seq);
  }
  *out = s;
  return EDGE_OK;
}

static void cpu_session_destroy(void *state) { free_run_state(state); }

/* ---- Math -------------------------------------------------------------------------------------------- */

/* y[rows] = m x (+ bias): the kernels' matvec, rows split over threads. */
static void matvec(const struct matrix *m, const float *x, const float *bias, float *y, int threads) {
  int parallel = (int64_t)m->rows * m->cols >= PARALLEL_MIN_WORK && threads > 1;
  if (m->scales != NULL) {
    edge_cpu_matvec_q(x, m->cols, m->rows, m->data, m->scales, m->mins, m->dtype, m->group_size, bias, y,
                      parallel ? threads : 1);
    return;
  }
  edge_cpu_matvec(x, m->cols, m->rows, m->data, m->dtype, bias, y, parallel ? threads : 1);
}

/* m as the kernels' struct edge_cpu_matrix, with its bias and output. */
static struct edge_cpu_matrix kernel_matrix(const struct matrix *m, const float *bias, float *y) {
  return (struct edge_cpu_matrix){m->data, m->scales, m->mins, m->dtype, m->group_size, m->rows, bias, y};
}

/* Nonzero when the n matrices share one storage type and group size, so one kernel call takes them all. */
static int share_storage(const struct matrix *const *m, int n) {
  int shared = 1;
  for (int i = 1; i < n; i++) shared &= m[i]->dtype == m[0]->dtype && m[i]->group_size == m[0]->group_size;
  return shared;
}

/* q, k and v of one token from the same x: one kernel call (x quantized once, one parallel region) where the three
 * matrices share their storage, as in every bundle the exporter writes; three calls otherwise. */
static void project_qkv(const struct layer_weights *w, const float *x, float *q, float *k, float *v, int threads) {
  const struct matrix *m[3] = {&w->wq, &w->wk, &w->wv};
  const float *bias[3] = {w->bq, w->bk, w->bv};
  float *y[3] = {q, k, v};
  struct edge_cpu_matrix matrices[3];
  int64_t work = 0;
  for (int i = 0; i < 3; i++) {
    matrices[i] = kernel_matrix(m[i], bias[i], y[i]);
    work += (int64_t)m[i]->rows * m[i]->cols;
  }
  if (!share_storage(m, 3)) {
    for (int i = 0; i < 3; i++) matvec(m[i], x, bias[i], y[i], threads);
    return;
  }
  edge_cpu_matvecs(x, m[0]->cols, matrices, 3, work >= PARALLEL_MIN_WORK && threads > 1 ? threads : 1);
}

/* x = one row of a quantized [rows, cols] matrix: code * scale, exact in fp32, or for asymmetric int4
 * (code + 8) * scale + min, the product exact and the sum rounded once (edge_sdk.quant.dequantize). Int4 value
 * 32 b + k (k < 16) is the low nibble of byte 16 b + k of the row, value 32 b + 16 + k its high nibble, each a 4-bit
 * two's complement code (QUANT.md). */
static void dequantized_row(const struct matrix *m, size_t row, float *x) {
  size_t groups = (size_t)(m->cols / m->group_size);
  const uint16_t *scales = m->scales + row * groups, *mins = m->mins != NULL ? m->mins + row * groups : NULL;
  if (m->dtype == EDGE_Q8) {
    const int8_t *codes = (const int8_t *)m->data + row * (size_t)m->cols;
    for (int i = 0; i < m->cols; i++) x[i] = (float)codes[i] * half_to_float(scales[i / m->group_size]);
    return;
  }
  const uint8_t *bytes = (const uint8_t *)m->data + row * (size_t)(m->cols / 2);
  for (int i = 0; i < m->cols; i++) {
    uint8_t byte = bytes[i / 32 * 16 + i % 16];
    int nibble = i % 32 < 16 ? byte & 0x0F : byte >> 4;
    int code = nibble < 8 ? nibble : nibble - 16;
    if (mins != NULL) {
      x[i] = (float)(code + 8) * half_to_float(scales[i / m->group_size]) + half_to_float(mins[i / m->group_size]);
    } else {
      x[i] = (float)code * half_to_float(scales[i / m->group_size]);
    }
  }
}

/* x = the token's embedding; a quantized embedding (the LM head of a tied model) dequantizes that one row. */
static void embedding_row(const struct matrix *embed, int token, float *x) {
  size_t offset = (size_t)token * (size_t)embed->cols;
  if (embed->scales != NULL) {
    dequantized_row(embed, (size_t)token, x);
  } else if (embed->dtype == EDGE_F16) {
    const uint16_t *row = (const uint16_t *)embed->data + offset;
    for (int i = 0; i < embed->cols; i++) x[i] = half_to_float(row[i]);
  } else {
    memcpy(x, (const float *)embed->data + offset, (size_t)embed->cols * sizeof(float));
  }
}

/* out = weight * (x * rsqrt(mean(x^2) + eps)) */
static void rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
  float sum = 0.0f;
  for (int i = 0; i < n; i++) sum += x[i] * x[i];
  float scale = 1.0f / sqrtf(sum / (float)n + eps);
  for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * scale);
}

/* Rotate-half RoPE of n_heads heads of v in place with one position's cos / sin rows [hd]. */
static void rope(float *v, int n_heads, int hd, const float *cos_row, const float *sin_row) {
  int half = hd / 2;
  for (int h = 0; h < n_heads; h++) {
    float *head = v + (size_t)h * (size_t)hd;
    for (int i = 0; i < half; i++) {
      float x1 = head[i], x2 = head[i + half];
      head[i] = x1 * cos_row[i] - x2 * sin_row[i];
      head[i + half] = x2 * cos_row[i + half] + x1 * sin_row[i + half];
    }
  }
}

/* Attention of the query q of the token at pos over one layer's cache (within the sliding window when the model has
 * one), every head, into attn: the attention kernel, on `threads` threads when there is enough work. */
static void attention(const struct run_state *s, const float *q, int layer, int pos, float *scores, float *attn,
                      int threads) {
  const struct model_config *c = s->engine->config;
  int first = c->sliding_window > 0 && pos - c->sliding_window + 1 > 0 ? pos - c->sliding_window + 1 : 0;
  size_t kv_dim = (size_t)c->num_kv_heads * (size_t)c->head_dim, seq = (size_t)c->max_seq_len;
  const float *layer_keys = s->key_cache + (size_t)layer * kv_dim * s->key_tiles * 16;
  const float *layer_values = s->value_cache + (size_t)layer * seq * kv_dim;
  edge_cpu_attention(q, c->num_heads, c->num_kv_heads, c->head_dim, layer_keys, s->key_tiles, layer_values, first,
                     pos, scores, seq, attn, threads);
}

/* Writes the (rotated) key of position pos into its tile of the layer's key cache, each KV head's dimension i at
 * ((head * key_tiles + pos / 16) * hd + i) * 16 + pos % 16. */
static void store_key(struct run_state *s, const float *key, int layer, int pos) {
  const struct model_config *c = s->engine->config;
  size_t hd = (size_t)c->head_dim, tile_floats = hd * 16;
  float *layer_keys = s->key_cache + (size_t)layer * (size_t)c->num_kv_heads * s->key_tiles * tile_floats;
  for (size_t g = 0; g < (size_t)c->num_kv_heads; g++) {
    float *tile = layer_keys + (g * s->key_tiles + (size_t)pos / 16) * tile_floats + (size_t)pos % 16;
    for (size_t i = 0; i < hd; i++) tile[i * 16] = key[g * hd + i];
  }
}

/* ---- Core predictor (edge_sdk/sparsity/core.py) -------------------------------------------------------- */

/* ceil(ratio * n) with ratio read as the shortest decimal that round-trips (0.4 is 4/10, not the double
 * nearest 0.4), in exact integer arithmetic, as core.py does with Fraction(repr(ratio)). ratio in (0, 1]. */
static int64_t ceil_ratio_times(double ratio, int64_t n) {
  char text[40];
  int precision = 1;
  for (; precision <= 17; precision++) {
    snprintf(text, sizeof text, "%.*e", precision - 1, ratio);
    if (strtod(text, NULL) == ratio) break;
  }
  /* text = D.DDDDe[+-]XX: mantissa digits and a decimal exponent */
  unsigned __int128 mantissa = 0;
  int digits = 0;
  char *p = text;
  for (; *p != 'e' && *p != '\0'; p++) {
    if (*p >= '0' && *p <= '9') mantissa = mantissa * 10 + (unsigned)(*p - '0'), digits++;
  }
  int exponent = (*p == 'e' ? atoi(p + 1) : 0) - (digits - 1); /* ratio = mantissa * 10^exponent */
  unsigned __int128 numerator = mantissa * (unsigned __int128)n;
  if (exponent >= 0) return (int64_t)n; /* ratio = 1 (ratios are at most 1) */
  if (exponent < -36) return numerator > 0 ? 1 : 0; /* numerator < 10^24, so 0 < ratio * n < 1 */
  unsigned __int128 denominator = 1;
  for (int i = 0; i < -exponent; i++) denominator *= 10;
  return (int64_t)((numerator + denominator - 1) / denominator);
}

/* qsort contexts (sessions are used by one thread at a time; thread-local keeps sessions on different threads
 * apart). */
static _Thread_local const float *sort_activations;
static _Thread_local const int64_t *sort_counts;
static _Thread_local const double *sort_sums;

static int by_activation(const void *a, const void *b) {
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (sort_activations[i] != sort_activations[j]) return sort_activations[i] > sort_activations[j] ? -1 : 1;
  return (i > j) - (i < j);
}

static int by_count_then_sum(const void *a, const void *b) {
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (sort_counts[i] != sort_counts[j]) return sort_counts[i] > sort_counts[j] ? -1 : 1;
  if (sort_sums[i] != sort_sums[j]) return sort_sums[i] > sort_sums[j] ? -1 : 1;
  return (i > j) - (i < j);
}

/* One prompt token, the FFN's input xb: its ceil(alpha * n_pos) largest positive gate activations (ties: lower
 * index) count. */
static void core_count_token(struct run_state *s, int layer, const struct layer_weights *w, const float *xb) {
  const struct model_config *c = s->engine->config;
  int D = c->intermediate_size;
  matvec(&w->gate, xb, NULL, s->gate, s->engine->threads);
  int n_positive = 0;
  for (int i = 0; i < D; i++) {
    s->gate[i] = gate_activation(c->activation, s->gate[i], c->act_threshold);
    if (s->gate[i] > 0.0f) s->order[n_positive++] = i;
  }
  int64_t k = ceil_ratio_times(s->engine->sparsity->core_alpha, n_positive);
  sort_activations = s->gate;
  qsort(s->order, (size_t)n_positive, sizeof *s->order, by_activation);
  int64_t *counts = s->core_counts + (size_t)layer * (size_t)D;
  double *sums = s->core_sums + (size_t)layer * (size_t)D;
  for (int64_t r = 0; r < k; r++) {
    counts[s->order[r]] += 1;
    sums[s->order[r]] += (double)s->gate[s->order[r]];
  }
}

/* The ceil(beta * D) neurons by (count desc, sum desc, index asc), leaving out count 0. */
static void core_build_masks(struct run_state *s) {
  const struct model_config *c = s->engine->config;
  int D = c->intermediate_size;
  int64_t keep = ceil_ratio_times(s->engine->sparsity->core_beta, D);
  for (int layer = 0; layer < c->num_layers; layer++) {
    const int64_t *counts = s->core_counts + (size_t)layer * (size_t)D;
    uint8_t *mask = s->core_masks + (size_t)layer * (size_t)D;
    for (int i = 0; i < D; i++) s->order[i] = i;
    sort_counts = counts;
    sort_sums = s->core_sums + (size_t)layer * (size_t)D;
    qsort(s->order, (size_t)D, sizeof *s->order, by_count_then_sum);
    memset(mask, 0, (size_t)D);
    for (int64_t r = 0; r < keep; r++) {
      if (counts[s->order[r]] > 0) mask[s->order[r]] = 1;
    }
  }
  s->core_ready = 1;
}

/* ---- Forward ------------------------------------------------------------------------------------------ */

/* The FFN of one decoded token's layer on t->xb into t->out, through the bundle's predictor. */
static edge_status feed_forward(struct run_state *s, struct token_buffers *t, int layer) {
  const struct cpu_engine *e = s->engine;
  const struct model_config *c = e->config;
  const struct sparsity_config *sparsity = e->sparsity;
  const struct layer_weights *w = &e->weights.layers[layer];
  int d = c->hidden_size, D = c->intermediate_size;
  const uint8_t *mask = NULL;
  const float *thresholds = NULL;
  int status = EDGE_CPU_OK;
  if (!sparsity->dense) {
    switch (sparsity->predictor) {
      case PREDICTOR_SVD:
        if (w->svd_half) {
          status = edge_cpu_svd_predictor_f16(t->xb, d, D, w->svd_rank, w->svd_a_t, w->svd_b, w->svd_bias, s->mask,
                                              s->svd_scratch);
        } else {
          status = edge_cpu_svd_predictor(t->xb, d, D, w->svd_rank, w->svd_a_t, w->svd_b, w->svd_bias, s->mask,
                                          s->svd_scratch);
        }
        mask = s->mask;
        break;
      case PREDICTOR_SIGNBIT:
        status = edge_cpu_signbit_predictor(t->xb, d, D, w->signbit_packed, w->signbit_alpha, s->mask);
        mask = s->mask;
        break;
      case PREDICTOR_CORE:
        if (!s->core_ready) return edge_fail(EDGE_ERROR_STATE, "decode: the core predictor needs a prefill first");
        mask = s->core_masks + (size_t)layer * (size_t)D;
        break;
      case PREDICTOR_THRESHOLD:
        thresholds = w->thresholds;
        break;
      case PREDICTOR_NONE:
        break;
    }
  }
  if (status == EDGE_CPU_OK && w->gate.scales != NULL) {
    /* quantized rows: one kernel for every case, dense being mask NULL (all candidates; a zero activation adds
     * exactly nothing, so this is the dense FFN's value) */
    status = edge_cpu_sparse_ffn_q(t->xb, d, D, w->gate.data, w->gate.scales, w->gate.mins, w->up.data,
                                   w->up.scales, w->up.mins, w->down_t.data, w->down_t.scales, w->down_t.mins,
                                   w->gate.dtype, w->down_t.dtype, w->gate.group_size, mask,
                                   thresholds, c->activation, c->act_threshold, t->out, t->ffn_workspace, t->threads,
                                   NULL);
  } else if (status == EDGE_CPU_OK && sparsity->dense) {
    status = edge_cpu_dense_ffn(t->xb, d, D, w->w_gate, w->w_up, w->w_down_t, w->ffn_dtype, c->activation,
                                c->act_threshold, t->out, t->ffn_workspace, t->threads);
  } else if (status == EDGE_CPU_OK) {
    status = edge_cpu_sparse_ffn(t->xb, d, D, w->w_gate, w->w_up, w->w_down_t, w->ffn_dtype, mask, thresholds,
                                 c->activation, c->act_threshold, t->out, t->ffn_workspace, t->threads, NULL);
  }
  if (status == EDGE_CPU_OUT_OF_MEMORY) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "layer %d FFN: out of memory", layer);
  if (status != EDGE_CPU_OK) {
    return edge_fail(EDGE_ERROR_INTERNAL, "layer %d FFN: the CPU kernels rejected their arguments (status %d)", layer,
                     status);
  }
  return EDGE_OK;
}

/* The first part of a layer for the token at pos, in t->x: its norm, q, k and v, RoPE, and its key and value
 * stored in the layer's caches. */
static void layer_keys_values(struct run_state *s, struct token_buffers *t, int layer, int pos) {
  const struct model_config *c = s->engine->config;
  const struct layer_weights *w = &s->engine->weights.layers[layer];
  int hd = c->head_dim;
  size_t kv_dim = (size_t)c->num_kv_heads * (size_t)hd, seq = (size_t)c->max_seq_len;
  const float *cos_row = s->engine->weights.rope_cos + (size_t)pos * (size_t)hd;
  const float *sin_row = s->engine->weights.rope_sin + (size_t)pos * (size_t)hd;
  float *value = s->value_cache + ((size_t)layer * seq + (size_t)pos) * kv_dim;
  rmsnorm(t->xb, t->x, w->input_norm, c->hidden_size, c->rms_norm_eps);
  project_qkv(w, t->xb, t->q, t->key, value, t->threads);
  rope(t->q, c->num_heads, hd, cos_row, sin_row);
  rope(t->key, c->num_kv_heads, hd, cos_row, sin_row);
  store_key(s, t->key, layer, pos);
}

/* The rest of the layer, once the keys and values of positions up to pos are in the caches: attention, o_proj and
 * the FFN, each added to t->x. */
static edge_status layer_attention_ffn(struct run_state *s, struct token_buffers *t, int layer, int pos) {
  const struct model_config *c = s->engine->config;
  const struct layer_weights *w = &s->engine->weights.layers[layer];
  int d = c->hidden_size;
  attention(s, t->q, layer, pos, t->scores, t->attn, t->threads);
  matvec(&w->wo, t->attn, w->bo, t->out, t->threads);
  for (int i = 0; i < d; i++) t->x[i] += t->out[i];
  rmsnorm(t->xb, t->x, w->post_norm, d, c->rms_norm_eps);
  edge_status status = feed_forward(s, t, layer);
  if (status != EDGE_OK) return status;
  for (int i = 0; i < d; i++) t->x[i] += t->out[i];
  return EDGE_OK;
}

/* logits from the residual stream x (xb: room for its norm): the final norm and lm_head, on the engine's threads. */
static void final_logits(const struct run_state *s, const float *x, float *xb, float *logits) {
  const struct model_config *c = s->engine->config;
  rmsnorm(xb, x, s->engine->weights.final_norm, c->hidden_size, c->rms_norm_eps);
  matvec(&s->engine->weights.lm_head, xb, NULL, logits, s->engine->threads);
}

/* One token at pos through every layer on the session's token buffers; logits when not NULL. */
static edge_status forward(struct run_state *s, int32_t token, int pos, float *logits) {
  struct token_buffers *t = &s->token;
  embedding_row(&s->engine->weights.embed, token, t->x);
  for (int layer = 0; layer < s->engine->config->num_layers; layer++) {
    layer_keys_values(s, t, layer, pos);
    edge_status status = layer_attention_ffn(s, t, layer, pos);
    if (status != EDGE_OK) return status;
  }
  if (logits != NULL) final_logits(s, t->x, t->xb, logits);
  return EDGE_OK;
}

/* y_i[tokens, rows_i] = W_i x_t for the block's tokens x [tokens, cols] (edge_cpu_matmuls): n matrices of one
 * storage type in one call; EDGE_ERROR_OUT_OF_MEMORY if the kernel cannot allocate the tokens' quantized x. */
static edge_status matmuls(const struct matrix *const *m, const float *const *bias, float *const *y, int n,
                           const float *x, int tokens, int threads) {
  struct edge_cpu_matrix matrices[3];
  int64_t work = 0;
  for (int i = 0; i < n; i++) {
    matrices[i] = kernel_matrix(m[i], bias[i], y[i]);
    work += (int64_t)m[i]->rows * m[i]->cols * tokens;
  }
  int status = edge_cpu_matmuls(x, tokens, m[0]->cols, matrices, n, work >= PARALLEL_MIN_WORK ? threads : 1);
  if (status == EDGE_CPU_OUT_OF_MEMORY) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "prefill: out of memory");
  if (status != EDGE_CPU_OK) {
    return edge_fail(EDGE_ERROR_INTERNAL, "prefill: the CPU kernels rejected a projection (status %d)", status);
  }
  return EDGE_OK;
}

/* q, k and v of the block's tokens: one call where the three matrices share their storage, three otherwise. The
 * values go straight into the cache (positions start.. follow each other there). */
static edge_status project_qkv_tokens(struct run_state *s, const struct layer_weights *w, int layer, int start,
                                      int tokens) {
  const struct model_config *c = s->engine->config;
  struct prompt_block *b = &s->prompt;
  size_t kv_dim = (size_t)c->num_kv_heads * (size_t)c->head_dim;
  float *values = s->value_cache + ((size_t)layer * (size_t)c->max_seq_len + (size_t)start) * kv_dim;
  const struct matrix *m[3] = {&w->wq, &w->wk, &w->wv};
  const float *bias[3] = {w->bq, w->bk, w->bv};
  float *y[3] = {b->q, b->key, values};
  if (share_storage(m, 3)) return matmuls(m, bias, y, 3, b->xb, tokens, s->engine->threads);
  edge_status status = EDGE_OK;
  for (int i = 0; i < 3 && status == EDGE_OK; i++) {
    status = matmuls(m + i, bias + i, y + i, 1, b->xb, tokens, s->engine->threads);
  }
  return status;
}

/* Every token's attention in the block, once its keys and values are in the caches: a token per thread, each
 * attention on one thread (whose bits the kernel gives at any thread count). */
static void attend_tokens(struct run_state *s, int layer, int start, int tokens) {
  const struct model_config *c = s->engine->config;
  struct prompt_block *b = &s->prompt;
  size_t q_dim = (size_t)c->num_heads * (size_t)c->head_dim;
  size_t scores_size = (size_t)c->num_heads * (size_t)c->max_seq_len;
#ifdef _OPENMP
  int threads = s->engine->threads < tokens ? s->engine->threads : tokens;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
#endif
  for (int t = 0; t < tokens; t++) {
    int thread = 0;
#ifdef _OPENMP
    thread = omp_get_thread_num();
#endif
    attention(s, b->q + (size_t)t * q_dim, layer, start + t, b->scores + (size_t)thread * scores_size,
              b->attn + (size_t)t * q_dim, 1);
  }
}

/* The block's prompt tokens ids[0, tokens) at positions start.. through every layer, leaving each token's residual
 * stream in the block's x: the operations of `forward` with a dense FFN, every token's in the order decode gives
 * them, so each token's values are those of token-by-token prefill; the core predictor counts the tokens in order. */
static edge_status prompt_block(struct run_state *s, const int32_t *ids, int start, int tokens) {
  const struct cpu_engine *e = s->engine;
  const struct model_config *c = e->config;
  struct prompt_block *b = &s->prompt;
  int d = c->hidden_size, hd = c->head_dim;
  size_t q_dim = (size_t)c->num_heads * (size_t)hd, kv_dim = (size_t)c->num_kv_heads * (size_t)hd;
  for (int t = 0; t < tokens; t++) embedding_row(&e->weights.embed, ids[t], b->x + (size_t)t * (size_t)d);
  for (int layer = 0; layer < c->num_layers; layer++) {
    const struct layer_weights *w = &e->weights.layers[layer];
    for (int t = 0; t < tokens; t++) {
      rmsnorm(b->xb + (size_t)t * (size_t)d, b->x + (size_t)t * (size_t)d, w->input_norm, d, c->rms_norm_eps);
    }
    edge_status status = project_qkv_tokens(s, w, layer, start, tokens);
    if (status != EDGE_OK) return status;
    for (int t = 0; t < tokens; t++) {
      const float *cos_row = e->weights.rope_cos + (size_t)(start + t) * (size_t)hd;
      const float *sin_row = e->weights.rope_sin + (size_t)(start + t) * (size_t)hd;
      rope(b->q + (size_t)t * q_dim, c->num_heads, hd, cos_row, sin_row);
      rope(b->key + (size_t)t * kv_dim, c->num_kv_heads, hd, cos_row, sin_row);
      store_key(s, b->key + (size_t)t * kv_dim, layer, start + t);
    }
    attend_tokens(s, layer, start, tokens);
    const struct matrix *wo = &w->wo;
    float *out = b->out;
    status = matmuls(&wo, &w->bo, &out, 1, b->attn, tokens, e->threads);
    if (status != EDGE_OK) return status;
    for (size_t i = 0; i < (size_t)tokens * (size_t)d; i++) b->x[i] += b->out[i];
    for (int t = 0; t < tokens; t++) {
      float *xb = b->xb + (size_t)t * (size_t)d;
      rmsnorm(xb, b->x + (size_t)t * (size_t)d, w->post_norm, d, c->rms_norm_eps);
      if (e->sparsity->predictor == PREDICTOR_CORE) core_count_token(s, layer, w, xb);
    }
    const struct matrix *gate = &w->gate, *up = &w->up, *down = &w->down_t;
    int threads = (int64_t)3 * d * c->intermediate_size * tokens >= PARALLEL_MIN_WORK ? e->threads : 1;
    int kernel_status = edge_cpu_ffn_tokens(b->xb, tokens, d, c->intermediate_size, w->w_gate, gate->scales,
                                            gate->mins, w->w_up, up->scales, up->mins, w->w_down_t, down->scales,
                                            down->mins, w->ffn_dtype, down->dtype, gate->group_size, c->activation,
                                            c->act_threshold, b->out, b->ffn_workspace, threads);
    if (kernel_status == EDGE_CPU_OUT_OF_MEMORY) {
      return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "prefill position %d, layer %d FFN: out of memory", start, layer);
    }
    if (kernel_status != EDGE_CPU_OK) {
      return edge_fail(EDGE_ERROR_INTERNAL, "prefill position %d, layer %d FFN: the CPU kernels rejected their "
                       "arguments (status %d)", start, layer, kernel_status);
    }
    for (size_t i = 0; i < (size_t)tokens * (size_t)d; i++) b->x[i] += b->out[i];
  }
  return EDGE_OK;
}
/* The kernels' predictors use OpenMP's default team size: set it to the engine's threads for the call. */
struct thread_scope {
  int previous;
};

static struct thread_scope enter_threads(int threads) {
  struct thread_scope scope = {0};
#ifdef _OPENMP
  scope.previous = omp_get_max_threads();
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
  return scope;
}

static void leave_threads(struct thread_scope scope) {
#ifdef _OPENMP
  omp_set_num_threads(scope.previous);
#else
  (void)scope;
#endif
}

static edge_status cpu_prefill(void *state, const int32_t *ids, int n, float *logits) {
  struct run_state *s = state;
  const struct model_config *c = s->engine->config;
  struct thread_scope scope = enter_threads(s->engine->threads);
  int core = s->engine->sparsity->predictor == PREDICTOR_CORE;
  s->core_ready = 0;
  if (core) {
    size_t cells = (size_t)c->num_layers * (size_t)c->intermediate_size;
    memset(s->core_counts, 0, cells * sizeof *s->core_counts);
    memset(s->core_sums, 0, cells * sizeof *s->core_sums);
  }
  edge_status status = EDGE_OK;
  for (int start = 0; start < n && status == EDGE_OK; start += PREFILL_TOKENS) {
    int tokens = n - start < PREFILL_TOKENS ? n - start : PREFILL_TOKENS;
    status = prompt_block(s, ids + start, start, tokens);
  }
  if (status == EDGE_OK && logits != NULL) {
    struct prompt_block *b = &s->prompt;
    size_t last = (size_t)((n - 1) % PREFILL_TOKENS) * (size_t)c->hidden_size;
    final_logits(s, b->x + last, b->xb + last, logits);
  }
  if (status == EDGE_OK && core) core_build_masks(s);
  leave_threads(scope);
  return status;
}

static edge_status cpu_decode(void *state, int32_t token, int position, float *logits) {
  struct run_state *s = state;
  struct thread_scope scope = enter_threads(s->engine->threads);
  edge_status status = forward(s, token, position, logits);
  leave_threads(scope);
  return status;
}

const struct engine_ops cpu_engine_ops = {
    .name = "cpu",
    .load = cpu_load,
    .unload = cpu_unload,
    .session_create = cpu_session_create,
    .session_destroy = cpu_session_destroy,
    .prefill = cpu_prefill,
    .decode = cpu_decode,
};
