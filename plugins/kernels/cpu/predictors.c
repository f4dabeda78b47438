/* Sparsity predictors for one decode token (DESIGN 3.2): which FFN neurons will fire.
 *
 * Both are small next to the FFN they gate (the SVD factors are ~2% of W_gate, the sign bits 1/32 of it),
 * so they are plain C that GCC vectorises; each output is computed by one thread, so masks do not depend
 * on the thread count. */
#include <stdint.h>
#include <stdlib.h>

#include "edge_cpu_kernels.h"

#define EDGE_LANES 16
#define EDGE_BITS_PER_WORD 32
/* Sign-bit predictor: x's packed bits stay on the stack up to this many words (d = 65536). */
#define EDGE_SIGNBIT_STACK_WORDS 2048
/* Neurons whose SVD scores one thread accumulates together (in registers and L1). */
#define EDGE_SCORE_BLOCK 256

/* Lane l accumulates elements l, l + 16, ...; a fixed-order pairwise sum ends it. */
static float dot_f32(const float *restrict w, const float *restrict x, int n) {
  float acc[EDGE_LANES] = {0};
  int j = 0;
  for (; j + EDGE_LANES <= n; j += EDGE_LANES) {
    for (int l = 0; l < EDGE_LANES; l++) acc[l] += w[j + l] * x[j + l];
  }
  for (int l = 0; j + l < n; l++) acc[l] += w[j + l] * x[j + l];
  for (int half = EDGE_LANES / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; l++) acc[l] += acc[l + half];
  }
  return acc[0];
}

int edge_cpu_svd_predictor(const float *x, int d, int D, int rank, const float *a_t, const float *b, const float *bias,
                           uint8_t *mask, float *scratch) {
  if (x == NULL || a_t == NULL || b == NULL || mask == NULL || scratch == NULL) return EDGE_CPU_INVALID_ARGUMENT;
  if (d <= 0 || D <= 0 || rank <= 0) return EDGE_CPU_INVALID_ARGUMENT;
#ifdef _OPENMP
#pragma omp parallel
#endif
  {
    /* scratch = x B^T: [rank] */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int r = 0; r < rank; r++) scratch[r] = dot_f32(b + (size_t)r * (size_t)d, x, d);
    /* (the implicit barrier of the loop above makes scratch complete here) Scores of a block of neurons,
     * summed over the rank in order: each step is one vector operation over the block's contiguous run of
     * A^T's row r. */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int i0 = 0; i0 < D; i0 += EDGE_SCORE_BLOCK) {
      int n = D - i0 < EDGE_SCORE_BLOCK ? D - i0 : EDGE_SCORE_BLOCK;
      float score[EDGE_SCORE_BLOCK] = {0};
      for (int r = 0; r < rank; r++) {
        const float *column = a_t + (size_t)r * (size_t)D + (size_t)i0;
        float z = scratch[r];
        for (int l = 0; l < n; l++) score[l] += column[l] * z;
      }
      for (int l = 0; l < n; l++) mask[i0 + l] = score[l] + (bias == NULL ? 0.0f : bias[i0 + l]) > 0.0f;
    }
  }
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
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int i = 0; i < D; i++) {
    const uint32_t *row = rows + (size_t)i * (size_t)n_words;
    int n_negative = 0;
    for (int k = 0; k < n_words; k++) n_negative += __builtin_popcount(row[k] ^ x_words[k]);
    /* Inactive when alpha * N_pos < N_neg, in double as signbit.py compares (every count is exact). */
    mask[i] = !((double)alpha * (double)(d - n_negative) < (double)n_negative);
  }
  if (x_words != stack_words) free(x_words);
  return EDGE_CPU_OK;
}
