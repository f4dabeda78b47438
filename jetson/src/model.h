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
