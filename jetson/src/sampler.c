/* Sampling as edge_sdk/runtime/generator.py's Sampler does it (same filters, same orders), with PCG32
 * (O'Neill, pcg-random.org: 64-bit LCG state, XSH-RR output) instead of numpy's PCG64. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define PCG_MULTIPLIER 6364136223846793005ULL
#define PCG_STREAM 0xda3e39cb94b95bdbULL

static uint32_t pcg32_next(struct sampler *s) {
  uint64_t old = s->state;
  s->state = old * PCG_MULTIPLIER + s->increment;
  uint32_t xorshifted = (uint32_t)(((old >> 18) ^ old) >> 27);
  uint32_t rotation = (uint32_t)(old >> 59);
  return (xorshifted >> rotation) | (xorshifted << ((32 - rotation) & 31));
}

static void pcg32_seed(struct sampler *s, uint64_t seed) {
  s->state = 0;
  s->increment = (PCG_STREAM << 1) | 1u;
  pcg32_next(s);
  s->state += seed;
  pcg32_next(s);
}

double sampler_uniform(struct sampler *s) {
  uint64_t high = pcg32_next(s) >> 5, low = pcg32_next(s) >> 6; /* 27 + 26 bits */
  return (double)(high << 26 | low) / 9007199254740992.0;
}

void sampler_init(struct sampler *s) {
  memset(s, 0, sizeof *s);
  s->top_p = 1.0f;
  pcg32_seed(s, 0);
}

void sampler_free(struct sampler *s) {
  free(s->order);
  free(s->weights);
  s->order = NULL;
  s->weights = NULL;
  s->capacity = 0;
}

edge_status sampler_configure(struct sampler *s, float temperature, float top_p, int top_k, uint64_t seed) {
  if (!(temperature >= 0.0f) || isinf(temperature)) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "temperature: expected a finite number >= 0 (0 = greedy), found %g",
                     (double)temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "top_p: expected a number in (0, 1] (1 = off), found %g", (double)top_p);
  }
  if (top_k < 0) return edge_fail(EDGE_ERROR_INVALID_ARGUMENT, "top_k: expected an integer >= 0 (0 = off), found %d", top_k);
  s->temperature = temperature;
  s->top_p = top_p;
  s->top_k = top_k;
  pcg32_seed(s, seed);
  return EDGE_OK;
}

/* qsort context: the scaled logits (qsort has no context argument; samplers are per session, one thread). */
static _Thread_local const double *sort_values;

static int by_value_descending(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (sort_values[x] != sort_values[y]) return sort_values[x] > sort_values[y] ? -1 : 1;
  return (x > y) - (x < y);
}

static int by_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

edge_status sampler_sample(struct sampler *s, const float *logits, int vocab, int32_t *token) {
  if (s->temperature == 0.0f) {
    int best = 0;
    for (int i = 1; i < vocab; i++) {
      if (logits[i] > logits[best]) best = i;
    }
    *token = best;
    return EDGE_OK;
  }
  if (s->capacity < vocab) {
    int32_t *order = realloc(s->order, (size_t)vocab * sizeof *order);
    if (order != NULL) s->order = order;
    double *weights = realloc(s->weights, 2 * (size_t)vocab * sizeof *weights);
    if (weights != NULL) s->weights = weights;
    if (order == NULL || weights == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "sampling: out of memory");
    s->capacity = vocab;
  }
  double *scaled = s->weights, *probs = s->weights + vocab;
  int32_t *ids = s->order;
  for (int i = 0; i < vocab; i++) {
    scaled[i] = (double)logits[i] / (double)s->temperature;
    ids[i] = i;
  }
  int n = vocab;
  int filter_k = s->top_k > 0 && s->top_k < vocab, filter_p = s->top_p < 1.0f;
  if (filter_k || filter_p) {
    sort_values = scaled;
    qsort(ids, (size_t)vocab, sizeof *ids, by_value_descending); /* probability descending, ties lowest id */
    if (filter_k) n = s->top_k;
    if (!filter_p) qsort(ids, (size_t)n, sizeof *ids, by_id); /* top-k alone keeps ascending ids */
  }
  double max = scaled[ids[0]];
  for (int i = 1; i < n; i++) max = scaled[ids[i]] > max ? scaled[ids[i]] : max;
  double total = 0.0;
  for (int i = 0; i < n; i++) total += probs[i] = exp(scaled[ids[i]] - max);
  if (filter_p) {
    double cumulative = 0.0;
    int kept = n;
    for (int i = 0; i < n; i++) {
      cumulative += probs[i] / total;
      if (cumulative >= (double)s->top_p) {
        kept = i + 1;
        break;
      }
    }
    n = kept;
  }
  double cumulative = 0.0;
  for (int i = 0; i < n; i++) cumulative += probs[i];
  double target = sampler_uniform(s) * cumulative, running = 0.0;
  int chosen = n - 1;
  for (int i = 0; i < n; i++) {
    running += probs[i];
    if (running > target) {
      chosen = i;
      break;
    }
  }
  *token = ids[chosen];
  return EDGE_OK;
}
