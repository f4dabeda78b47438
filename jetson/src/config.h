/* The model and sparsity sections of manifest.json (bundle/manifest.py _model and _sparsity), validated field by
 * field with the limits of edge_sdk/model/config.py, so engines can size buffers from them. */
#ifndef EDGE_CONFIG_H
#define EDGE_CONFIG_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "edge_sdk.h"
#include "predictor_kinds.h" /* the kinds of edge_sdk/predictors, generated from it */

#define MAX_VOCAB_SIZE (1 << 24)
#define MAX_HIDDEN_SIZE (1 << 20) /* hidden_size, intermediate_size and num_heads * head_dim */
#define MAX_LAYERS 1024
#define MAX_HEADS 4096
#define MAX_HEAD_DIM 16384
#define MAX_POSITIONS (1 << 24)
#define MAX_EOS_TOKENS 16
#define MAX_SPARSITY_LEVELS 64

/* manifest "model" (ModelConfig.to_dict) plus the sequence lengths; validated when read. */
struct model_config {
  int vocab_size;
  int hidden_size;       /* d */
  int intermediate_size; /* D */
  int num_layers;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  float rms_norm_eps;
  int max_position_embeddings;
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


/* default_level of a bundle whose manifest says null: decode densely unless a level is asked for. */
#define DEFAULT_LEVEL_DENSE (-1.0)

/* manifest "sparsity" as the bundle states it. */
struct sparsity_settings {
  enum predictor_kind predictor;
  double levels[MAX_SPARSITY_LEVELS]; /* strictly increasing, in [0, 1] */
  int n_levels;                       /* > 0 exactly for the kinds with levels */
  double default_level;               /* one of levels, or DEFAULT_LEVEL_DENSE; unused when there are none */
  double core_alpha, core_beta;       /* in (0, 1] */
};

const char *predictor_name(enum predictor_kind kind);
/* Calibrated at several model-wide sparsity levels (svd, threshold). */
int predictor_has_levels(enum predictor_kind kind);
/* The mask is chosen from the prompt and held for the whole decode (PredictorKind.fixed_at_prefill: core), so the
 * kind's decode graph takes inputs of its own (edge_sdk/bundle/graph_io.py). Written here by hand: the generated
 * table (predictor_kinds.h) does not carry the flag; tests/jetson/test_bundle_verdicts.py checks that it agrees. */
int predictor_fixed_at_prefill(enum predictor_kind kind);

/* manifest "model" (where: "BUNDLE/manifest.json: model"); bundle_max_seq_len and max_seq_len are left 0. */
edge_status config_read_model(const cJSON *model, const char *where, struct model_config *config);
/* manifest "sparsity" of a model with num_layers layers (where: "BUNDLE/manifest.json: sparsity"). */
edge_status config_read_sparsity(const cJSON *sparsity, int num_layers, const char *where,
                                 struct sparsity_settings *settings);

#endif
