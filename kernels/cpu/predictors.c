/* Sparsity predictors for one decode token (DESIGN 3.2): which FFN neurons will fire.
 *
 * Both are small next to the FFN they gate (the SVD factors are ~2% of W_gate, the sign bits 1/32 of it),
 * so they are plain C that GCC vectorises (on aarch64 the SVD loops are written for q registers, where GCC's
 * 64-byte vectors went through the stack); each output is computed by one thread, so masks do not depend
 * on the thread count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_isa.h" /* first: the kernels under this build's names */
#include "edge_cpu_kernels.h"
#include "edge_cpu_internal.h"

#if defined(__F16C__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define EDGE_BITS_PER_WORD 32
/* Sign-bit predictor: x's packed bits stay on the stack up to this many words (d = 65536). */
#define EDGE_SIGNBIT_STACK_WORDS 2048

/* The SVD predictor reads its factors once per token, a 7B layer's 6.8 MB of fp16 at rank 224: it runs at the
 * speed of the core's reads, and those are fast only on long contiguous runs (benchmarks/README.md, section 3).
 * So every factor row is read whole and in order, several rows at once, each a stream of its own:
 * - x B^T: EDGE_FACTOR_ROWS rows of B dotted with x at once, each with its own accumulator (one row's chain of
 *   dependent multiply-adds left the core waiting on its latency);
 * - the scores: EDGE_SCORE_ROWS rows of A^T added into a block of up to EDGE_SCORE_BLOCK scores at once, so
 *   each score is loaded and stored once per EDGE_SCORE_ROWS rank terms (a block of D's 11008 scores lives in
 *   L2); a block per thread.
 * Each stream prefetches EDGE_FACTOR_AHEAD bytes ahead of itself into L2. */
#if defined(__AVX512F__)
#define EDGE_FACTOR_ROWS 8 /* 8 accumulators of one register each */
#else
#define EDGE_FACTOR_ROWS 4 /* 4 of two (AVX2) or four (NEON) registers */
#endif
#define EDGE_SCORE_ROWS 8
#define EDGE_SCORE_BLOCK 16384 /* 64 KiB of scores on the stack */
#define EDGE_FACTOR_AHEAD 2048

/* The 16 halves at h as floats, exactly, in registers once inlined: one conversion instruction per 16 (AVX-512), 8
 * (F16C) or 4 (aarch64) halves, half_to_float's integer operations elsewhere. (Vectors go by pointer, as in
 * VEC16_AT: by value they would change the calling convention between builds, -Wpsabi.) */
EDGE_ALWAYS_INLINE void widen16(const uint16_t *h, vec16 *out) {
#if defined(__AVX512F__)
  __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
  memcpy(out, &wide, sizeof *out);
#elif defined(__F16C__)
  vec8 low = (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
  vec8 high = (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8)));
  *out = __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#elif defined(__aarch64__)
  vec4 q[4];
  for (int k = 0; k < 4; k++) q[k] = (vec4)vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * k)));
  vec8 low = __builtin_shufflevector(q[0], q[1], 0, 1, 2, 3, 4, 5, 6, 7);
  vec8 high = __builtin_shufflevector(q[2], q[3], 0, 1, 2, 3, 4, 5, 6, 7);
  *out = __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  for (int l = 0; l < 16; l++) (*out)[l] = half_to_float(h[l]);
#endif
}

/* Factors are fp32, or fp16 (half) widened exactly: the same operations on the same values either way. */
EDGE_ALWAYS_INLINE void factors16(const void *w, size_t i, int half, vec16 *out) {
  if (half) {
    widen16((const uint16_t *)w + i, out);
  } else {
    *out = VEC16_AT((const float *)w + i);
  }
}

EDGE_ALWAYS_INLINE float factor_at(const void *w, size_t i, int half) {
  return half ? half_to_float(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

EDGE_ALWAYS_INLINE void prefetch_ahead(const void *w, size_t i, int half) {
  __builtin_prefetch((const char *)w + i * (half ? 2 : 4) + EDGE_FACTOR_AHEAD, 0, 2);
}

#if defined(__aarch64__)
/* The NEON forms of factor_rows_dot and add_rank_rows below: each 16-lane vector as four q registers, where the vec16
 * code went through the stack (counted under qemu: benchmarks/README.md, section 3, "The NEON build"); the same
 * operations lane by lane, a multiply and an add, so the same masks as every other build. */
EDGE_ALWAYS_INLINE void factor_quarters(const void *w, size_t i, int half, float32x4_t out[4]) {
  for (int q = 0; q < 4; q++) {
    out[q] = half ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)w + i + 4 * q)))
                  : vld1q_f32((const float *)w + i + 4 * q);
  }
}

EDGE_ALWAYS_INLINE void factor_rows_dot(const void *w, int half, int r, int rows, const float *x, int n, float *out) {
  float32x4_t acc[EDGE_FACTOR_ROWS][4];
  for (int k = 0; k < rows; k++) {
    for (int q = 0; q < 4; q++) acc[k][q] = vdupq_n_f32(0);
  }
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    float32x4_t xv[4];
    for (int q = 0; q < 4; q++) xv[q] = vld1q_f32(x + j + 4 * q);
    for (int k = 0; k < rows; k++) {
      size_t at = (size_t)(r + k) * (size_t)n + (size_t)j;
      if (j % 32 == 0) prefetch_ahead(w, at, half); /* a cache line holds 32 halves: once per line of fp16 */
      float32x4_t factors[4];
      factor_quarters(w, at, half, factors);
      for (int q = 0; q < 4; q++) acc[k][q] = vaddq_f32(acc[k][q], vmulq_f32(factors[q], xv[q]));
    }
  }
  for (int k = 0; k < rows; k++) {
    float lanes[16];
    for (int q = 0; q < 4; q++) vst1q_f32(lanes + 4 * q, acc[k][q]);
    size_t row = (size_t)(r + k) * (size_t)n;
    for (int l = 0; j + l < n; l++) lanes[l] += factor_at(w, row + (size_t)(j + l), half) * x[j + l];
    vec16 all;
    memcpy(&all, lanes, sizeof all);
    out[k] = sum_lanes(&all);
  }
}

EDGE_ALWAYS_INLINE void add_rank_rows(float *score, const void *a_t, int half, int D, int c0, int c1, int r, int rows,
                                      const float *z) {
  int n = c1 - c0, vectors = n / 16;
  size_t first = (size_t)r * (size_t)D + (size_t)c0;
  for (int v = 0; v < vectors; v++) {
    float32x4_t acc[4];
    for (int q = 0; q < 4; q++) acc[q] = vld1q_f32(score + 16 * v + 4 * q);
    for (int k = 0; k < rows; k++) {
      size_t at = first + (size_t)k * (size_t)D + (size_t)(16 * v);
      if (!half || v % 2 == 0) prefetch_ahead(a_t, at, half);
      float32x4_t factors[4];
      factor_quarters(a_t, at, half, factors);
      for (int q = 0; q < 4; q++) acc[q] = vaddq_f32(acc[q], vmulq_n_f32(factors[q], z[r + k]));
    }
    for (int q = 0; q < 4; q++) vst1q_f32(score + 16 * v + 4 * q, acc[q]);
  }
  for (int l = 16 * vectors; l < n; l++) {
    for (int k = 0; k < rows; k++) {
      score[l] += factor_at(a_t, first + (size_t)k * (size_t)D + (size_t)l, half) * z[r + k];
    }
  }
}

#else
/* out[k] = row r + k of w [., n] . x for k < rows (a constant once inlined): lane l of a row's accumulator adds
 * elements l, l + 16, ... in order, then sum_lanes. */
EDGE_ALWAYS_INLINE void factor_rows_dot(const void *w, int half, int r, int rows, const float *x, int n, float *out) {
  vec16 acc[EDGE_FACTOR_ROWS] = {{0}};
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    vec16 xv = VEC16_AT(x + j);
    for (int k = 0; k < rows; k++) {
      size_t at = (size_t)(r + k) * (size_t)n + (size_t)j;
      if (j % 32 == 0) prefetch_ahead(w, at, half); /* a cache line holds 32 halves: once per line of fp16 */
      vec16 factors;
      factors16(w, at, half, &factors);
      acc[k] += factors * xv;
    }
  }
  for (int k = 0; k < rows; k++) {
    size_t row = (size_t)(r + k) * (size_t)n;
    for (int l = 0; j + l < n; l++) acc[k][l] += factor_at(w, row + (size_t)(j + l), half) * x[j + l];
    out[k] = sum_lanes(&acc[k]);
  }
}

/* score[0 : c1 - c0) += rows r .. r + rows - 1 of A^T [rank, D] at columns [c0, c1) times z[r ..], each score
 * adding its terms in the order of r (rows a constant once inlined). */
EDGE_ALWAYS_INLINE void add_rank_rows(float *score, const void *a_t, int half, int D, int c0, int c1, int r, int rows,
                                      const float *z) {
  int n = c1 - c0, vectors = n / 16;
  size_t first = (size_t)r * (size_t)D + (size_t)c0;
  for (int v = 0; v < vectors; v++) {
    vec16 acc = VEC16_AT(score + 16 * v);
    for (int k = 0; k < rows; k++) {
      size_t at = first + (size_t)k * (size_t)D + (size_t)(16 * v);
      if (!half || v % 2 == 0) prefetch_ahead(a_t, at, half);
      vec16 factors;
      factors16(a_t, at, half, &factors);
      acc += factors * z[r + k];
    }
    VEC16_AT(score + 16 * v) = acc;
  }
  for (int l = 16 * vectors; l < n; l++) {
    for (int k = 0; k < rows; k++) {
      score[l] += factor_at(a_t, first + (size_t)k * (size_t)D + (size_t)l, half) * z[r + k];
    }
  }
}

#endif

/* scratch[r] = row r of B . x for the rows of group g (EDGE_FACTOR_ROWS per group). */
EDGE_ALWAYS_INLINE void svd_projection_group(const void *b, int half, int rank, const float *x, int d, int g,
                                             float *scratch) {
  int r = g * EDGE_FACTOR_ROWS;
  if (r + EDGE_FACTOR_ROWS <= rank) {
    factor_rows_dot(b, half, r, EDGE_FACTOR_ROWS, x, d, scratch + r);
    return;
  }
  for (; r < rank; r++) factor_rows_dot(b, half, r, 1, x, d, scratch + r);
}

/* mask[c0 : c1) from scratch = x B^T and A^T. */
EDGE_ALWAYS_INLINE void svd_mask_block(int D, int rank, const void *a_t, int half, const float *bias,
                                       const float *scratch, int c0, int c1, uint8_t *mask) {
  float score[EDGE_SCORE_BLOCK] __attribute__((aligned(64)));
  memset(score, 0, (size_t)(c1 - c0) * sizeof(float));
  int r = 0;
  for (; r + EDGE_SCORE_ROWS <= rank; r += EDGE_SCORE_ROWS) {
    add_rank_rows(score, a_t, half, D, c0, c1, r, EDGE_SCORE_ROWS, scratch);
  }
  for (; r < rank; r++) add_rank_rows(score, a_t, half, D, c0, c1, r, 1, scratch);
  for (int i = c0; i < c1; i++) mask[i] = score[i - c0] + (bias == NULL ? 0.0f : bias[i]) > 0.0f;
}

/* Column c of block k of n_blocks over D: whole vectors of 16 scores, the last block taking the rest. */
static inline int block_start(int D, int n_blocks, int k) {
  if (k >= n_blocks) return D;
  return split_point(ceil_div(D, 16), n_blocks, k) * 16;
}

EDGE_ALWAYS_INLINE int svd_predictor(const float *x, int d, int D, int rank, const void *a_t, const void *b, int half,
                                     const float *bias, uint8_t *mask, float *scratch) {
  if (x == NULL || a_t == NULL || b == NULL || mask == NULL || scratch == NULL) return EDGE_CPU_INVALID_ARGUMENT;
  if (d <= 0 || D <= 0 || rank <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  int threads = edge_cpu_max_threads(), groups = ceil_div(rank, EDGE_FACTOR_ROWS);
  int n_blocks = ceil_div(D, EDGE_SCORE_BLOCK);
  if (n_blocks < threads) n_blocks = threads < ceil_div(D, 16) ? threads : ceil_div(D, 16);
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (int g = 0; g < groups; g++) svd_projection_group(b, half, rank, x, d, g, scratch);
      /* (the implicit barrier of the loop above makes scratch = x B^T complete here) */
#pragma omp for schedule(static)
      for (int k = 0; k < n_blocks; k++) {
        svd_mask_block(D, rank, a_t, half, bias, scratch, block_start(D, n_blocks, k),
                       block_start(D, n_blocks, k + 1), mask);
      }
    }
    return EDGE_CPU_OK;
  }
#endif
  /* one thread without an OpenMP region, whose cost per call is as large as a small layer's predictor */
  for (int g = 0; g < groups; g++) svd_projection_group(b, half, rank, x, d, g, scratch);
  for (int k = 0; k < n_blocks; k++) {
    svd_mask_block(D, rank, a_t, half, bias, scratch, block_start(D, n_blocks, k), block_start(D, n_blocks, k + 1),
                   mask);
  }
  return EDGE_CPU_OK;
}

int edge_cpu_svd_predictor_f16(const float *x, int d, int D, int rank, const uint16_t *a_t, const uint16_t *b,
                               const float *bias, uint8_t *mask, float *scratch) {
  return svd_predictor(x, d, D, rank, a_t, b, 1, bias, mask, scratch);
}

int edge_cpu_svd_predictor(const float *x, int d, int D, int rank, const float *a_t, const float *b, const float *bias,
                           uint8_t *mask, float *scratch) {
  return svd_predictor(x, d, D, rank, a_t, b, 0, bias, mask, scratch);
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
