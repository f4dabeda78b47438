/* Generated from edge_sdk/predictors by `python -m edge_sdk.predictors.c_table jetson/src`; do not edit. */
#ifndef EDGE_SDK_PREDICTOR_KINDS_H
#define EDGE_SDK_PREDICTOR_KINDS_H

#include <stdint.h>

#include "safetensors.h"

enum predictor_kind { PREDICTOR_SVD, PREDICTOR_SIGNBIT, PREDICTOR_CORE, PREDICTOR_THRESHOLD, PREDICTOR_NONE };
#define PREDICTOR_KINDS 5
#define PREDICTOR_MAX_TENSORS 4

/* A stored tensor's dimension: a fixed size, or one of the bundle's sizes (d, D, levels, the layer's svd rank,
 * words = ceil(d / 32)). */
enum predictor_dim { DIM_FIXED, DIM_HIDDEN, DIM_INTERMEDIATE, DIM_LEVELS, DIM_RANK, DIM_WORDS };

struct predictor_dim_spec {
  enum predictor_dim symbol;
  int64_t size; /* DIM_FIXED only */
};

/* One tensor a kind stores per layer, as "layers.{i}.{kind}.{name}". factor: a low-rank factor, stored in the
 * bundle's predictor factor dtype (F16 in bundles of format version 5 on whose weights are not fp32) instead of
 * dtype. */
struct predictor_tensor_spec {
  const char *name;
  enum tensor_dtype dtype;
  int factor;
  int rank;
  struct predictor_dim_spec shape[2];
};

struct predictor_kind_spec {
  const char *name;
  int has_levels; /* calibrated at several model-wide sparsity levels, one row per level */
  int n_tensors;
  struct predictor_tensor_spec tensors[PREDICTOR_MAX_TENSORS];
};

extern const struct predictor_kind_spec predictor_kind_specs[PREDICTOR_KINDS];

#endif
