/* Token sampling from logits: greedy, or temperature + top-k + top-p with a seeded PCG32 generator. */
#ifndef EDGE_SAMPLER_H
#define EDGE_SAMPLER_H

#include <stdint.h>

#include "edge_sdk.h"

struct sampler {
  float temperature; /* 0: greedy */
  float top_p;       /* (0, 1]; 1: off */
  int top_k;         /* 0: off */
  uint64_t state, increment; /* PCG32 */
  /* scratch of vocab entries, allocated on first use */
  int32_t *order;
  double *weights;
  int capacity;
};

void sampler_init(struct sampler *sampler);
void sampler_free(struct sampler *sampler);
/* Validates and sets the settings; resets the generator to `seed`. */
edge_status sampler_configure(struct sampler *sampler, float temperature, float top_p, int top_k, uint64_t seed);
/* A token from logits [vocab]. */
edge_status sampler_sample(struct sampler *sampler, const float *logits, int vocab, int32_t *token);
/* Uniform double in [0, 1) from the generator (53 random bits). */
double sampler_uniform(struct sampler *sampler);

#endif
