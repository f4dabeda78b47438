/* What every engine shares: the model config and sparsity settings read from the manifest, the internal
 * engine interface, and the structs behind the public handles. */
#ifndef EDGE_MODEL_H
#define EDGE_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "bundle.h"
#include "edge_sdk.h"
#include "error.h"
#include "sampler.h"

#define MAX_SPARSITY_LEVELS 64
#define MAX_EOS_TOKENS 16

/* manifest "model" (ModelConfig.to_dict) plus max_seq_len; validated when read. */
struct model_config {
  int vocab_size;
  int hidden_size;       /* d */
  int intermediate_size; /* D */
  int num_layers;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  float rms_norm_eps;
  int activation;       /* enum edge_activation of edge_cpu_kernels.h */
  float act_threshold;  /* fatrelu's t */
  int tie_word_embeddings;
  int qkv_bias;
  int o_bias;
  int sliding_window; /* 0: none */
  int bos_token_id;   /* -1: none */
  int32_t eos_token_ids[MAX_EOS_TOKENS];
  int n_eos_tokens;
  int bundle_max_seq_len; /* manifest max_seq_len: rows of the RoPE tables */
  int max_seq_len;        /* KV cache length of sessions (option, <= bundle_max_seq_len) */
};

enum predictor_kind { PREDICTOR_NONE, PREDICTOR_SVD, PREDICTOR_SIGNBIT, PREDICTOR_CORE, PREDICTOR_THRESHOLD };

/* manifest "sparsity" resolved against the options. */
struct sparsity_config {
  enum predictor_kind predictor;
  double levels[MAX_SPARSITY_LEVELS];
  int n_levels;
  int level_index; /* row of svd.biases / threshold.thresholds; -1 when the predictor has no levels */
  int dense;       /* decode with every neuron */
  double core_alpha, core_beta;
};

struct edge_options {
  char backend[16];
  int threads;
  double sparsity;
  int dense;
  int verify_checksums;
  int max_seq_len;
};

struct edge_model;

/* One engine behind the public API. A model holds one loaded engine; each session one engine state. */
struct engine_ops {
  const char *name;
  edge_status (*load)(struct edge_model *model, void **engine);
  void (*unload)(void *engine);
  edge_status (*session_create)(const struct edge_model *model, void **state);
  void (*session_destroy)(void *state);
  /* ids [n] at positions 0..n-1 (a new sequence); logits [vocab] of the last position. */
  edge_status (*prefill)(void *state, const int32_t *ids, int n, float *logits);
  /* token at `position` (the sequence so far fills 0..position-1); logits [vocab]. */
  edge_status (*decode)(void *state, int32_t token, int position, float *logits);
};

struct edge_model {
  struct bundle bundle;
  struct model_config config;
  struct sparsity_config sparsity;
  struct edge_options options;
  const struct engine_ops *ops;
  void *engine;
  pthread_mutex_t error_lock;
  char error[EDGE_MESSAGE_SIZE];
};

struct edge_session {
  struct edge_model *model;
  void *state;
  int position;   /* filled KV positions */
  int has_logits; /* a prefill happened since the last reset */
  float *logits;  /* [vocab] */
  struct sampler sampler;
  char error[EDGE_MESSAGE_SIZE];
};

/* Reads config and sparsity from the bundle's manifest and resolves them against the options. */
edge_status model_read_config(const struct bundle *bundle, const struct edge_options *options,
                              struct model_config *config, struct sparsity_config *sparsity);

extern const struct engine_ops cpu_engine_ops;

#endif
