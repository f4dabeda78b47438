/* Sparsity predictors for one decode token (DESIGN 3.2): which FFN neurons will fire.
 *
 * Both are small next to the FFN they gate (the SVD factors are ~2% of W_gate, the sign bits 1/32 of it),
 * so they are plain C that GCC vectorises; each output is computed by one thread, so masks do not depend
 * on the thread count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"
#include "edge_cpu_internal.h"

#define EDGE_BITS_PER_WORD 32
/* Sign-bit predictor: x's packed bits stay on the stack up to this many words (d = 65536). */
#define EDGE_SIGNBIT_STACK_WORDS 2048
/* Neurons whose SVD scores one pass accumulates, in L1 (4 KiB): each of A^T's rank rows is read as one run of
 * this many contiguous floats. */
#ifndef EDGE_SCORE_BLOCK
#define EDGE_SCORE_BLOCK 1024
#endif
/* A^T rows ahead of the one being added whose run is prefetched. */
#define EDGE_SCORE_AHEAD 2

/* Lane l accumulates elements l, l + 16, ...; a fixed-order pairwise sum of the lanes ends it (l + 8, l + 4,
 * l + 2, l + 1), on vectors: as float arrays GCC kept the lanes on the stack and summed them one by one. */
static float dot_f32(const float *restrict w, const float *restrict x, int n) {
  vec16 acc = {0};
  int j = 0;
  for (; j + 16 <= n; j += 16) acc += VEC16_AT(w + j) * VEC16_AT(x + j);
  for (int l = 0; j + l < n; l++) acc[l] += w[j + l] * x[j + l];
  vec8 low8, high8;
  memcpy(&low8, &acc, sizeof low8);
  memcpy(&high8, (const char *)&acc + sizeof low8, sizeof high8);
  vec8 sum8 = low8 + high8;
  vec4 low4, high4;
  memcpy(&low4, &sum8, sizeof low4);
  memcpy(&high4, (const char *)&sum8 + sizeof low4, sizeof high4);
  vec4 sum4 = low4 + high4;
  return (sum4[0] + sum4[2]) + (sum4[1] + sum4[3]);
}

/* mask[i0 : i0 + EDGE_SCORE_BLOCK) (fewer at the end) from scratch = x B^T: each neuron's score sums over the
 * rank in order, each step one vector operation per 16 neurons over the block's contiguous run of A^T's row r, the
 * run EDGE_SCORE_AHEAD rows later prefetched. With the scores of 128 neurons in registers, a block read 224 runs of
 * 512 bytes 44 KB apart (a 7B layer at rank 224), which the core's prefetchers did not follow: the predictor read
 * at 8 GB/s (benchmarks/README.md, section 3). */
static void svd_mask_block(int D, int rank, const float *a_t, const float *bias, const float *scratch, int i0,
                           uint8_t *mask) {
  int n = D - i0 < EDGE_SCORE_BLOCK ? D - i0 : EDGE_SCORE_BLOCK, vectors = n / 16;
  float score[EDGE_SCORE_BLOCK] __attribute__((aligned(64)));
  memset(score, 0, (size_t)n * sizeof(float));
  for (int r = 0; r < rank; r++) {
    const float *column = a_t + (size_t)r * (size_t)D + (size_t)i0;
    const char *ahead = (const char *)(a_t + (size_t)(r + EDGE_SCORE_AHEAD < rank ? r + EDGE_SCORE_AHEAD : r) *
                                                 (size_t)D + (size_t)i0);
    float z = scratch[r];
    for (int v = 0; v < vectors; v++) {
      __builtin_prefetch(ahead + (size_t)v * 64, 0, 3);
      VEC16_AT(score + 16 * v) += VEC16_AT(column + 16 * v) * z;
    }
    for (int l = 16 * vectors; l < n; l++) score[l] += column[l] * z;
  }
  for (int l = 0; l < n; l++) mask[i0 + l] = score[l] + (bias == NULL ? 0.0f : bias[i0 + l]) > 0.0f;
}

int edge_cpu_svd_predictor(const float *x, int d, int D, int rank, const float *a_t, const float *b, const float *bias,
                           uint8_t *mask, float *scratch) {
  if (x == NULL || a_t == NULL || b == NULL || mask == NULL || scratch == NULL) return EDGE_CPU_INVALID_ARGUMENT;
  if (d <= 0 || D <= 0 || rank <= 0) return EDGE_CPU_INVALID_ARGUMENT;
#ifdef _OPENMP
  if (edge_cpu_max_threads() > 1) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (int r = 0; r < rank; r++) scratch[r] = dot_f32(b + (size_t)r * (size_t)d, x, d);
      /* (the implicit barrier of the loop above makes scratch = x B^T complete here) */
#pragma omp for schedule(static)
      for (int i0 = 0; i0 < D; i0 += EDGE_SCORE_BLOCK) svd_mask_block(D, rank, a_t, bias, scratch, i0, mask);
    }
    return EDGE_CPU_OK;
  }
#endif
  /* one thread without an OpenMP region, whose cost per call is as large as a small layer's predictor */
  for (int r = 0; r < rank; r++) scratch[r] = dot_f32(b + (size_t)r * (size_t)d, x, d);
  for (int i0 = 0; i0 < D; i0 += EDGE_SCORE_BLOCK) svd_mask_block(D, rank, a_t, bias, scratch, i0, mask);
  return EDGE_CPU_OK;
}

/* words[k] bit j = x[32k + j] < 0, padding bits 0: the layout of signbit.py pack_sign_bits. */
static void pack_signs(const float *x, int d, uint32_t *words) {
  int n_words = (d + EDGE_BITS_PER_WORD - 1) / EDGE_BITS_PER_WORD;
  for (int k = 0; k < n_words; k++) {
    uint32_t word = 0;
    int base = k * EDGE_BITS_PER_WORD;
    int n_bits = d - base < EDGE_BITS_PER_WORD ? d - base : EDGE_BITS_PER_WORD;
    for (int j = 0; j < n_bits; j++) word |= (uint32_t)(x[base + j] < 0.0f) << j;
    words[k] = word;
  }
}

/* Inactive when alpha * N_pos < N_neg, in double as signbit.py compares (every count is exact). */
static inline uint8_t signbit_active(const uint32_t *row, const uint32_t *x_words, int n_words, int d, float alpha) {
  int n_negative = 0;
  for (int k = 0; k < n_words; k++) n_negative += __builtin_popcount(row[k] ^ x_words[k]);
  return !((double)alpha * (double)(d - n_negative) < (double)n_negative);
}

int edge_cpu_signbit_predictor(const float *x, int d, int D, const int32_t *packed, float alpha, uint8_t *mask) {
  if (x == NULL || packed == NULL || mask == NULL || d <= 0 || D <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  int n_words = (d + EDGE_BITS_PER_WORD - 1) / EDGE_BITS_PER_WORD;
  uint32_t stack_words[EDGE_SIGNBIT_STACK_WORDS];
  uint32_t *x_words = stack_words;
  if (n_words > EDGE_SIGNBIT_STACK_WORDS) {
    x_words = malloc((size_t)n_words * sizeof(uint32_t));
    if (x_words == NULL) return EDGE_CPU_OUT_OF_MEMORY;
  }
  pack_signs(x, d, x_words);
  const uint32_t *rows = (const uint32_t *)packed;
  size_t row_words = (size_t)n_words;
#ifdef _OPENMP
  if (edge_cpu_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < D; i++) mask[i] = signbit_active(rows + (size_t)i * row_words, x_words, n_words, d, alpha);
  } else
#endif
  {
    for (int i = 0; i < D; i++) mask[i] = signbit_active(rows + (size_t)i * row_words, x_words, n_words, d, alpha);
  }
  if (x_words != stack_words) free(x_words);
  return EDGE_CPU_OK;
}
