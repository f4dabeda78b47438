/* Sequential SparseFFN for one decode token (DESIGN 3.1): read only the weight rows of the neurons that fire.
 * The rows are fp32, fp16, or INT8 / INT4 codes with fp16 group scales (QUANT.md); one pipeline serves them all.
 *
 * Decode is a GEMV, bound by memory bandwidth, so the kernel is organised around reading each needed weight
 * row once, in place, in long contiguous pieces, with every thread streaming:
 *   1. candidates = the mask's neurons in increasing order (D bytes read, no branches);
 *   2. gate and up, per chunk of candidates handed to one thread (32 of them with several threads, all of
 *      them as one chunk with one thread): first every candidate's gate row, g_i and a_i = act(g_i); then the
 *      up rows of the neurons that fired, u_i and h_i = a_i * act_up(u_i). Chunk c writes its active neurons
 *      (index, h) to its own segment starting at its first candidate, so the segments in chunk order list
 *      them in increasing order;
 *   3. down, after one barrier: y split into one column block per thread (whole cache lines); each block
 *      sums h_j * w_down_t[i_j] over the segments in order.
 * Every output value is computed by exactly one thread with an order that does not depend on which thread
 * or how many threads, so results are bit-identical for any thread count, without any cross-thread
 * reduction. Chunks and blocks are handed out dynamically, so a thread that starts late (its core was busy)
 * does not hold the others up until the barrier.
 *
 * Rows are picked sparsely, so the hardware prefetchers, which follow one sequential stream, would restart
 * at every row; instead each row primitive also prefetches a row that will be read later, cache line by
 * cache line as it reads its own: the gate or up row about 2 KiB of rows ahead (several rows ahead for the
 * short rows of small models, the next one for 7B rows), going on from a chunk's gate rows into its up rows
 * and from its up rows into the next chunk's gate rows; the next group of down rows while a group is summed
 * (the gain, measured: benchmarks/README.md, "Sparse FFN on the CPU").
 *
 * The row primitives below (dot products and row accumulation, fp32 and fp16 storage, fp32 arithmetic)
 * have three builds: AVX-512 and AVX2 intrinsics on x86-64, because GCC does not vectorise the fp16 -> fp32
 * conversion on its own, and a portable C path that GCC vectorises for any target. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, for the workspace's record of a call's duration */
#endif
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edge_cpu_isa.h" /* first: the kernels under this build's names */
#include "edge_cpu_kernels.h"
#include "edge_cpu_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define EDGE_ROWS_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EDGE_ROWS_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__)
#define EDGE_ROWS_NEON 1
#include <arm_neon.h>
#endif

/* Candidates per unit of gate/up work with several threads, each unit handed to one thread (32 fp32 rows of
 * d = 4096 are 512 KiB). One thread takes all candidates as one chunk: with chunks of 32, a chunk's up rows
 * (often a few) filled a partial group of the grouped fp16 dot product and every chunk paid its own passes.
 * Which chunk computes a row changes no value: each row's dot
 * product is its own, and the down sums run over the active neurons in increasing order whatever the chunks. */
#define EDGE_GATE_CHUNK 32
/* With several threads, chunks of at least a 1 / (threads * EDGE_CHUNKS_PER_THREAD) share of the candidates: each
 * a long run of rows, which a core streams (chunks of 32 dense rows, every other one a thread's, read like rows
 * scattered, benchmarks/README.md, section 3), and still four per thread for the dynamic schedule to balance. */
#define EDGE_CHUNKS_PER_THREAD 4
/* Column blocks of the down projection are made of whole units of this many floats (a cache line). */
#define EDGE_COLUMN_UNIT 16
/* Rows summed per pass over a block of y in the down projection: fewer loads and stores of y per weight
 * byte, and several weight streams in flight (8 beat 4 and 1 in the FFN benchmark). */
#define EDGE_DOWN_GROUP 8
/* Column blocks up to this many floats are summed 64 columns per step (see add_rows). */
#define EDGE_SHORT_BLOCK 512

/* Read prefetch. Callers with nothing to prefetch pass the row they read (a branch in the loop would keep GCC from
 * vectorising the portable path). Prefetches never fault. On x86-64 into L2 (prefetcht1), not L1: a prefetch into
 * L1 holds one of the core's few L1 miss buffers until its line arrives from memory, which capped a core's reads of
 * scattered rows well below its streaming rate (benchmarks/README.md, section 3); elsewhere into all levels. */
#if defined(__x86_64__)
#define EDGE_PREFETCH_LOCALITY 2
#else
#define EDGE_PREFETCH_LOCALITY 3
#endif
#define EDGE_PREFETCH(next, byte_offset) \
  __builtin_prefetch((const char *)(next) + (byte_offset), 0, EDGE_PREFETCH_LOCALITY)

/* ---- Row primitives ----------------------------------------------------------------------------------
 * dot_row(w, dtype, x, d, next): w . x over d elements, while prefetching the row `next` (the same byte length).
 * add_rows(y, n, w, dtype, rows, h, n_rows, next, n_next): y[0:n] += h[r] * w[rows[r] + 0:n] for r in order,
 * one FMA per row and element, so an element's value does not depend on where a block of y starts or ends;
 * meanwhile the rows at element offsets next[0:n_next] are prefetched over the same columns.
 * w holds fp32 or fp16 weights (dtype); both are always inlined into callers that pass dtype as a constant, so
 * each dtype gets its own loop without a branch in it. */

#define EDGE_CACHE_LINE 64

static inline size_t weight_bytes(int dtype) { return dtype == EDGE_F16 ? 2 : 4; }

/* Element i of w, widened to fp32 (exactly). */
static inline float weight_at(const void *w, size_t i, int dtype) {
  return dtype == EDGE_F16 ? half_to_float(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Prefetches the cache lines holding elements [i, i + count) of w, count * bytes a whole number of lines. */
static inline void prefetch_elements(const void *w, size_t i, size_t count, int dtype) {
  for (size_t byte = 0; byte < count * weight_bytes(dtype); byte += EDGE_CACHE_LINE) {
    EDGE_PREFETCH(w, i * weight_bytes(dtype) + byte);
  }
}

#if EDGE_ROWS_AVX512

static inline __mmask16 tail_mask(int count) { return (__mmask16)((1u << count) - 1u); }

/* 16 weights from element i, as fp32; fewer (count, the rest zero) at a ragged end. */
static inline __m512 load_weights(const void *w, size_t i, int dtype) {
  return dtype == EDGE_F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)))
                           : _mm512_loadu_ps((const float *)w + i);
}

static inline __m512 load_weights_tail(const void *w, size_t i, int count, int dtype) {
  return dtype == EDGE_F16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(count), (const uint16_t *)w + i))
                           : _mm512_maskz_loadu_ps(tail_mask(count), (const float *)w + i);
}

/* Four independent accumulators keep four FMAs in flight; lanes and the final sum have a fixed order. */
EDGE_ALWAYS_INLINE float dot_row(const void *w, int dtype, const float *x, int d, const char *next) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
  __m512 acc3 = _mm512_setzero_ps();
  int j = 0;
  for (; j + 64 <= d; j += 64) {
    prefetch_elements(next, (size_t)j, 64, dtype);
    acc0 = _mm512_fmadd_ps(load_weights(w, j, dtype), _mm512_loadu_ps(x + j), acc0);
    acc1 = _mm512_fmadd_ps(load_weights(w, j + 16, dtype), _mm512_loadu_ps(x + j + 16), acc1);
    acc2 = _mm512_fmadd_ps(load_weights(w, j + 32, dtype), _mm512_loadu_ps(x + j + 32), acc2);
    acc3 = _mm512_fmadd_ps(load_weights(w, j + 48, dtype), _mm512_loadu_ps(x + j + 48), acc3);
  }
  for (; j + 16 <= d; j += 16) acc0 = _mm512_fmadd_ps(load_weights(w, j, dtype), _mm512_loadu_ps(x + j), acc0);
  if (j < d) {
    __m512 xj = _mm512_maskz_loadu_ps(tail_mask(d - j), x + j);
    acc1 = _mm512_fmadd_ps(load_weights_tail(w, j, d - j, dtype), xj, acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

/* Rows per dot_rows_group call, and the longest fp16 rows rows_dot gives it (elements). */
#define EDGE_DOT_GROUP 16
#define EDGE_GROUP_MAX_D 512

/* out[r] = rows[r] . x for EDGE_DOT_GROUP fp16 rows of d elements. A short row is too few FMAs to hide its own
 * chain's latency and horizontal sum, so sixteen rows are dotted together (benchmarks/README.md has the figures).
 * Each row has one accumulator over its 16-column steps in order; then its 16 lanes are added by the pairwise
 * tree of _mm512_reduce_add_ps (lanes l and l + 8, then l + 4, l + 2, l + 1), sixteen rows at once by shuffles that
 * pair rows up, so a row's value does not depend on the other rows of its group. Without the look-ahead prefetches
 * of dot_row: issuing them for sixteen rows cost more than they saved on these short rows. fp32 rows keep
 * dot_row, which the grouped loop did not beat for them. */
EDGE_ALWAYS_INLINE void dot_rows_group(const uint16_t *const rows[EDGE_DOT_GROUP], const float *x, int d,
                                       float out[EDGE_DOT_GROUP]) {
  __m512 acc[EDGE_DOT_GROUP];
#pragma GCC unroll 16
  for (int r = 0; r < EDGE_DOT_GROUP; r++) acc[r] = _mm512_setzero_ps();
  int j = 0;
  for (; j + 16 <= d; j += 16) {
    __m512 xj = _mm512_loadu_ps(x + j);
#pragma GCC unroll 16
    for (int r = 0; r < EDGE_DOT_GROUP; r++) {
      acc[r] = _mm512_fmadd_ps(load_weights(rows[r], (size_t)j, EDGE_F16), xj, acc[r]);
    }
  }
  if (j < d) {
    __m512 xj = _mm512_maskz_loadu_ps(tail_mask(d - j), x + j);
#pragma GCC unroll 16
    for (int r = 0; r < EDGE_DOT_GROUP; r++) {
      acc[r] = _mm512_fmadd_ps(load_weights_tail(rows[r], (size_t)j, d - j, EDGE_F16), xj, acc[r]);
    }
  }
  /* 128-bit quarters Q0..Q3 of rows a, b: [a.Q0 a.Q1 b.Q0 b.Q1] + [a.Q2 a.Q3 b.Q2 b.Q3] (lanes l + 8) */
  __m512 eights[8], fours[4], twos[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    eights[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
  }
  /* [a.Q0 a.Q2 b.Q0 b.Q2] + [a.Q1 a.Q3 b.Q1 b.Q3] (l + 4): quarter k of fours[i] holds row 4i + k */
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    fours[i] = _mm512_add_ps(_mm512_shuffle_f32x4(eights[2 * i], eights[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(eights[2 * i], eights[2 * i + 1], 0xDD));
  }
  /* within each quarter, [a0 a1 b0 b1] + [a2 a3 b2 b3] (l + 2) */
#pragma GCC unroll 2
  for (int i = 0; i < 2; i++) {
    twos[i] = _mm512_add_ps(_mm512_shuffle_ps(fours[2 * i], fours[2 * i + 1], 0x44),
                            _mm512_shuffle_ps(fours[2 * i], fours[2 * i + 1], 0xEE));
  }
  /* [a0 a2 b0 b2] + [a1 a3 b1 b3] (l + 1): element 4k + m holds row 4m + k */
  __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(twos[0], twos[1], 0x88), _mm512_shuffle_ps(twos[0], twos[1], 0xDD));
  const __m512i row_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(row_order, sums));
}

/* In a short block, 64 columns per step keep four independent FMA chains in flight: one column vector at a
 * time waited on the latency of each row's FMA. A long block has enough independent column steps for the core
 * to overlap them, and 64 at a time was slower there. Then 16 at a time (prefetching whenever a new cache line of the rows starts), and the ragged
 * end with masked FMAs: the same rounding. */
EDGE_ALWAYS_INLINE void add_rows(float *y, int n, const void *w, int dtype, const size_t *rows, const float *h,
                                 int n_rows, const size_t *next, int n_next) {
  int c = 0;
  for (; n <= EDGE_SHORT_BLOCK && c + 64 <= n; c += 64) {
    for (int r = 0; r < n_next; r++) prefetch_elements(w, next[r] + c, 64, dtype);
    __m512 acc0 = _mm512_loadu_ps(y + c), acc1 = _mm512_loadu_ps(y + c + 16);
    __m512 acc2 = _mm512_loadu_ps(y + c + 32), acc3 = _mm512_loadu_ps(y + c + 48);
    for (int r = 0; r < n_rows; r++) {
      __m512 hr = _mm512_set1_ps(h[r]);
      size_t row = rows[r] + c;
      acc0 = _mm512_fmadd_ps(hr, load_weights(w, row, dtype), acc0);
      acc1 = _mm512_fmadd_ps(hr, load_weights(w, row + 16, dtype), acc1);
      acc2 = _mm512_fmadd_ps(hr, load_weights(w, row + 32, dtype), acc2);
      acc3 = _mm512_fmadd_ps(hr, load_weights(w, row + 48, dtype), acc3);
    }
    _mm512_storeu_ps(y + c, acc0);
    _mm512_storeu_ps(y + c + 16, acc1);
    _mm512_storeu_ps(y + c + 32, acc2);
    _mm512_storeu_ps(y + c + 48, acc3);
  }
  for (; c + 16 <= n; c += 16) {
    for (int r = 0; r < n_next && (c * weight_bytes(dtype)) % EDGE_CACHE_LINE == 0; r++) {
      EDGE_PREFETCH(w, (next[r] + c) * weight_bytes(dtype));
    }
    __m512 acc = _mm512_loadu_ps(y + c);
    for (int r = 0; r < n_rows; r++) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(h[r]), load_weights(w, rows[r] + c, dtype), acc);
    }
    _mm512_storeu_ps(y + c, acc);
  }
  if (c < n) {
    __mmask16 m = tail_mask(n - c);
    __m512 acc = _mm512_maskz_loadu_ps(m, y + c);
    for (int r = 0; r < n_rows; r++) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(h[r]), load_weights_tail(w, rows[r] + c, n - c, dtype), acc);
    }
    _mm512_mask_storeu_ps(y + c, m, acc);
  }
}

#elif EDGE_ROWS_AVX2

/* 8 weights from element i, as fp32. */
static inline __m256 load_weights(const void *w, size_t i, int dtype) {
  return dtype == EDGE_F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)))
                           : _mm256_loadu_ps((const float *)w + i);
}

/* The fp16 values p[0 .. n) (n <= 8) as fp32 lanes 0 .. n - 1, the other lanes 0, without reading past p[n - 1]. */
static inline __m256 load_halves(const uint16_t *p, int n) {
  if (n == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  uint16_t halves[8] = {0};
  for (int i = 0; i < n; i++) halves[i] = p[i];
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)halves));
}

/* The first n (<= 8) floats at p in lanes 0 .. n - 1, the other lanes 0. */
static inline __m256 load_floats(const float *p, int n) {
  if (n == 8) return _mm256_loadu_ps(p);
  __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, lanes);
}

/* Fixed-order horizontal sum of 8 lanes. */
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

EDGE_ALWAYS_INLINE float dot_row(const void *w, int dtype, const float *x, int d, const char *next) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
  __m256 acc3 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 32 <= d; j += 32) {
    prefetch_elements(next, (size_t)j, 32, dtype);
    acc0 = _mm256_fmadd_ps(load_weights(w, j, dtype), _mm256_loadu_ps(x + j), acc0);
    acc1 = _mm256_fmadd_ps(load_weights(w, j + 8, dtype), _mm256_loadu_ps(x + j + 8), acc1);
    acc2 = _mm256_fmadd_ps(load_weights(w, j + 16, dtype), _mm256_loadu_ps(x + j + 16), acc2);
    acc3 = _mm256_fmadd_ps(load_weights(w, j + 24, dtype), _mm256_loadu_ps(x + j + 24), acc3);
  }
  for (; j + 8 <= d; j += 8) acc0 = _mm256_fmadd_ps(load_weights(w, j, dtype), _mm256_loadu_ps(x + j), acc0);
  if (j < d) {
    float wt[8] = {0}, xt[8] = {0};
    for (int l = 0; j + l < d; l++) wt[l] = weight_at(w, (size_t)(j + l), dtype), xt[l] = x[j + l];
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(wt), _mm256_loadu_ps(xt), acc1);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

/* The ragged end uses scalar fmaf, which rounds exactly like a vector FMA lane (FMA is enabled here). */
EDGE_ALWAYS_INLINE void add_rows(float *y, int n, const void *w, int dtype, const size_t *rows, const float *h,
                                 int n_rows, const size_t *next, int n_next) {
  int c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int r = 0; r < n_next && (c * weight_bytes(dtype)) % EDGE_CACHE_LINE == 0; r++) {
      EDGE_PREFETCH(w, (next[r] + c) * weight_bytes(dtype));
    }
    __m256 acc = _mm256_loadu_ps(y + c);
    for (int r = 0; r < n_rows; r++) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(h[r]), load_weights(w, rows[r] + c, dtype), acc);
    }
    _mm256_storeu_ps(y + c, acc);
  }
  for (; c < n; c++) {
    for (int r = 0; r < n_rows; r++) y[c] = fmaf(h[r], weight_at(w, rows[r] + c, dtype), y[c]);
  }
}

#elif EDGE_ROWS_NEON

/* 4 weights from element i, as fp32: one fcvtl for fp16 rows, where the portable path's half_to_float took about
 * five instructions per value (counted under qemu: benchmarks/README.md, section 3, "The NEON build"). */
static inline float32x4_t load_weights(const void *w, size_t i, int dtype) {
  return dtype == EDGE_F16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)w + i)))
                           : vld1q_f32((const float *)w + i);
}

/* Eight independent accumulators (32 elements per step) keep eight FMAs in flight; the ragged end goes through a
 * zero-padded copy, and the lanes and the final sum have a fixed order. */
EDGE_ALWAYS_INLINE float dot_row(const void *w, int dtype, const float *x, int d, const char *next) {
  float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  int j = 0;
#define EDGE_FMA_AT(acc, k) acc = vfmaq_f32(acc, load_weights(w, (size_t)(j + (k)), dtype), vld1q_f32(x + j + (k)))
  for (; j + 32 <= d; j += 32) {
    prefetch_elements(next, (size_t)j, 32, dtype);
    EDGE_FMA_AT(a0, 0);
    EDGE_FMA_AT(a1, 4);
    EDGE_FMA_AT(a2, 8);
    EDGE_FMA_AT(a3, 12);
    EDGE_FMA_AT(a4, 16);
    EDGE_FMA_AT(a5, 20);
    EDGE_FMA_AT(a6, 24);
    EDGE_FMA_AT(a7, 28);
  }
  for (; j + 4 <= d; j += 4) EDGE_FMA_AT(a0, 0);
#undef EDGE_FMA_AT
  if (j < d) {
    float wt[4] = {0}, xt[4] = {0};
    for (int l = 0; j + l < d; l++) wt[l] = weight_at(w, (size_t)(j + l), dtype), xt[l] = x[j + l];
    a1 = vfmaq_f32(a1, vld1q_f32(wt), vld1q_f32(xt));
  }
  float32x4_t sum = vaddq_f32(vaddq_f32(vaddq_f32(a0, a4), vaddq_f32(a1, a5)),
                              vaddq_f32(vaddq_f32(a2, a6), vaddq_f32(a3, a7)));
  return (vgetq_lane_f32(sum, 0) + vgetq_lane_f32(sum, 2)) + (vgetq_lane_f32(sum, 1) + vgetq_lane_f32(sum, 3));
}

/* 16 columns per step (a cache line of fp32 y), one fused multiply-add per row and element; the ragged end with
 * scalar fmaf, which rounds as a vector FMA lane does. */
EDGE_ALWAYS_INLINE void add_rows(float *y, int n, const void *w, int dtype, const size_t *rows, const float *h,
                                 int n_rows, const size_t *next, int n_next) {
  int c = 0;
  for (; c + 16 <= n; c += 16) {
    for (int r = 0; r < n_next && (c * weight_bytes(dtype)) % EDGE_CACHE_LINE == 0; r++) {
      EDGE_PREFETCH(w, (next[r] + c) * weight_bytes(dtype));
    }
    float32x4_t acc[4];
    for (int q = 0; q < 4; q++) acc[q] = vld1q_f32(y + c + 4 * q);
    for (int r = 0; r < n_rows; r++) {
      for (int q = 0; q < 4; q++) {
        acc[q] = vfmaq_n_f32(acc[q], load_weights(w, rows[r] + (size_t)(c + 4 * q), dtype), h[r]);
      }
    }
    for (int q = 0; q < 4; q++) vst1q_f32(y + c + 4 * q, acc[q]);
  }
  for (; c < n; c++) {
    for (int r = 0; r < n_rows; r++) y[c] = fmaf(h[r], weight_at(w, rows[r] + (size_t)c, dtype), y[c]);
  }
}

#else /* portable C */

#define EDGE_LANES 16

/* Lane l accumulates elements l, l + 16, ...; GCC turns the fixed-size lane loops into vector code. */
EDGE_ALWAYS_INLINE float dot_row(const void *w, int dtype, const float *restrict x, int d, const char *next) {
  float acc[EDGE_LANES] = {0};
  int j = 0;
  for (; j + EDGE_LANES <= d; j += EDGE_LANES) {
    EDGE_PREFETCH(next, (size_t)j * weight_bytes(dtype));
    for (int l = 0; l < EDGE_LANES; l++) acc[l] += weight_at(w, (size_t)(j + l), dtype) * x[j + l];
  }
  for (int l = 0; j + l < d; l++) acc[l] += weight_at(w, (size_t)(j + l), dtype) * x[j + l];
  for (int half = EDGE_LANES / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; l++) acc[l] += acc[l + half];
  }
  return acc[0];
}

/* One row at a time (the same per-element operation sequence), prefetching the next group's row r. */
EDGE_ALWAYS_INLINE void add_rows(float *restrict y, int n, const void *w, int dtype, const size_t *rows,
                                 const float *h, int n_rows, const size_t *next, int n_next) {
  for (int r = 0; r < n_rows; r++) {
    size_t ahead = r < n_next ? next[r] : rows[r];
    int c = 0;
    for (; c + EDGE_LANES <= n; c += EDGE_LANES) {
      EDGE_PREFETCH(w, (ahead + (size_t)c) * weight_bytes(dtype));
      for (int l = 0; l < EDGE_LANES; l++) y[c + l] += h[r] * weight_at(w, rows[r] + (size_t)(c + l), dtype);
    }
    for (; c < n; c++) y[c] += h[r] * weight_at(w, rows[r] + (size_t)c, dtype);
  }
}

#endif

/* ---- Quantized row primitives (EDGE_Q8, EDGE_Q4; QUANT.md) ----------------------------------------------
 * The codes of a block of 32 values are widened to two 16-lane fp32 vectors in registers and multiplied in fp32,
 * so a row's bytes are read once and nothing is dequantized in memory. The widening has its own AVX-512, AVX2 and
 * NEON intrinsics and a portable C path: GCC 12 turns __builtin_convertvector from 16 int8 to 16 floats into
 * 16 scalar conversions on every target, several times slower than the fp16 path. The rest is written once with
 * GCC vectors, except on AVX2 and NEON, where GCC split each 64-byte vector into ymm halves or q quarters through
 * the stack (on AVX2 6-11x slower than the AVX-512 build on the same core): there the loops have their own ymm and
 * q-register forms, the same operations in the same order lane by lane. These serve the down rows, and the gate, up
 * and matvec rows when x is kept in fp32 (EDGE_SDK_QUANT_ACTIVATIONS=fp32); by default those are dotted through the
 * integer dot products further below.
 * quant_dot_row(row, scales, dtype, group_size, x, d, next, next_scales): row . x, prefetching the row `next`.
 * add_quant_rows(y, c0, n, codes, scales, ...): y[c0 + c] += (h[r] * scale) * code for c < n, r in order. */

/* Values per block: 32 bytes of INT8 or 16 of INT4; groups are whole blocks. */
#define EDGE_QUANT_BLOCK 32

/* INT4 codes are signed 4-bit nibbles (QUANT.md); low_nibbles / high_nibbles give the 16 codes of a block's low /
 * high nibbles as int8. */
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
typedef __m128i codes16; /* 16 int8 codes */
static inline codes16 load_codes16(const char *p) { return _mm_loadu_si128((const __m128i *)p); }
/* The codes of the low 4 bits of each byte, in two instructions (x86 has no byte shift to sign-extend a nibble):
 * AVX-512 masks the nibble and flips its sign bit in one vpternlogd (truth table 0x6a: (a & b) ^ c), which gives
 * code + 8 in 0..15, then subtracts 8; AVX2 looks the code up in a table by the masked nibble. */
static inline codes16 nibble_codes(codes16 bytes) {
#if EDGE_ROWS_AVX512
  return _mm_sub_epi8(_mm_ternarylogic_epi32(bytes, _mm_set1_epi8(0x0f), _mm_set1_epi8(8), 0x6a), _mm_set1_epi8(8));
#else
  const __m128i codes = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  return _mm_shuffle_epi8(codes, _mm_and_si128(bytes, _mm_set1_epi8(0x0f)));
#endif
}
static inline codes16 low_nibbles(codes16 bytes) { return nibble_codes(bytes); }
static inline codes16 high_nibbles(codes16 bytes) { return nibble_codes(_mm_srli_epi16(bytes, 4)); }
#if EDGE_ROWS_AVX512
EDGE_ALWAYS_INLINE void widen_codes(codes16 codes, vec16 *out) {
  *out = (vec16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
}
#endif

#elif defined(__ARM_NEON)
#include <arm_neon.h>
typedef int8x16_t codes16;
static inline codes16 load_codes16(const char *p) { return vld1q_s8((const int8_t *)p); }
/* sign-extended by shifts: left 4, then arithmetic right 4 */
static inline codes16 low_nibbles(codes16 bytes) { return vshrq_n_s8(vshlq_n_s8(bytes, 4), 4); }
static inline codes16 high_nibbles(codes16 bytes) { return vshrq_n_s8(bytes, 4); }

#else /* portable C */
typedef int8_t codes16 __attribute__((vector_size(16)));
typedef int8_t unaligned_codes16 __attribute__((vector_size(16), aligned(1), may_alias));
static inline codes16 load_codes16(const char *p) { return *(const unaligned_codes16 *)p; }
typedef uint8_t bytes16 __attribute__((vector_size(16)));
/* sign-extended by shifts: left 4 (unsigned, so defined), then arithmetic right 4 */
static inline codes16 low_nibbles(codes16 bytes) { return (codes16)((bytes16)bytes << 4) >> 4; }
static inline codes16 high_nibbles(codes16 bytes) { return bytes >> 4; }
EDGE_ALWAYS_INLINE void widen_codes(codes16 codes, vec16 *out) {
  float lanes[16];
  for (int l = 0; l < 16; l++) lanes[l] = (float)codes[l];
  memcpy(out, lanes, sizeof lanes);
}
#endif

static inline size_t block_bytes(int dtype) { return dtype == EDGE_Q8 ? 32 : 16; }

/* Scale i as fp32: one instruction with F16C or on aarch64, where half_to_float's dozen integer operations per
 * group were a fifth of an INT4 dot product's instructions at group size 32. */
static inline float scale_at(const uint16_t *scales, size_t i) {
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
  return _cvtsh_ss(scales[i]);
#elif defined(__aarch64__)
  __fp16 scale;
  memcpy(&scale, scales + i, sizeof scale);
  return (float)scale;
#else
  return half_to_float(scales[i]);
#endif
}

#if !EDGE_ROWS_AVX2 && !defined(__ARM_NEON)
/* The codes of values [32 block, 32 block + 16) into *low and of the next 16 into *high, as fp32 (exactly). (AVX2
 * and NEON: block_codes and codes_as_floats, into ymm halves or q quarters.) */
EDGE_ALWAYS_INLINE void load_codes(const char *row, int dtype, int block, vec16 *low, vec16 *high) {
  const char *start = row + (size_t)block * block_bytes(dtype);
  if (dtype == EDGE_Q8) {
    widen_codes(load_codes16(start), low);
    widen_codes(load_codes16(start + 16), high);
  } else {
    codes16 bytes = load_codes16(start);
    widen_codes(low_nibbles(bytes), low);
    widen_codes(high_nibbles(bytes), high);
  }
}
#endif

#if EDGE_ROWS_AVX2 || defined(__ARM_NEON)
/* The codes of a block's values 0..15 (*first) and 16..31 (*second), as int8. */
EDGE_ALWAYS_INLINE void block_codes(const char *block_start, int dtype, codes16 *first, codes16 *second) {
  if (dtype == EDGE_Q4) {
    codes16 bytes = load_codes16(block_start);
    *first = low_nibbles(bytes);
    *second = high_nibbles(bytes);
  } else {
    *first = load_codes16(block_start);
    *second = load_codes16(block_start + 16);
  }
}

#endif

#if EDGE_ROWS_AVX2
/* Codes 0..7 (half 0) or 8..15 (half 1) of 16, as fp32. */
static inline __m256 codes_as_floats(codes16 codes, int half) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(half == 0 ? codes : _mm_unpackhi_epi64(codes, codes)));
}
#elif defined(__ARM_NEON)
/* Table indices that move bytes 4q..4q + 3 of a vector to the top bytes of 32-bit lanes 0..3 (255: out of range,
 * a zero byte). */
static const uint8_t EDGE_TOP_BYTES[4][16] = {
    {255, 255, 255, 0, 255, 255, 255, 1, 255, 255, 255, 2, 255, 255, 255, 3},
    {255, 255, 255, 4, 255, 255, 255, 5, 255, 255, 255, 6, 255, 255, 255, 7},
    {255, 255, 255, 8, 255, 255, 255, 9, 255, 255, 255, 10, 255, 255, 255, 11},
    {255, 255, 255, 12, 255, 255, 255, 13, 255, 255, 255, 14, 255, 255, 255, 15},
};

/* The 16 codes as fp32, four per q register. */
EDGE_ALWAYS_INLINE void codes_as_floats(codes16 codes, float32x4_t out[4]) {
  int16x8_t low = vmovl_s8(vget_low_s8(codes)), high = vmovl_high_s8(codes);
  out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(low)));
  out[1] = vcvtq_f32_s32(vmovl_high_s16(low));
  out[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(high)));
  out[3] = vcvtq_f32_s32(vmovl_high_s16(high));
}

/* codes_as_floats in fewer instructions, for the down rows: each code moved to the top byte of a 32-bit lane
 * (code * 2^24) by one table lookup and converted as a fixed-point number with 24 fraction bits, exactly: two
 * instructions per four codes instead of two and a half. The lookups' four index registers spill in loops that keep
 * more live (the fp32-x row dot), so codes_as_floats stays there. */
EDGE_ALWAYS_INLINE void codes_as_floats_by_table(codes16 codes, float32x4_t out[4]) {
  for (int q = 0; q < 4; q++) {
    uint8x16_t top = vqtbl1q_u8(vreinterpretq_u8_s8(codes), vld1q_u8(EDGE_TOP_BYTES[q]));
    out[q] = vcvtq_n_f32_s32(vreinterpretq_s32_u8(top), 24);
  }
}

/* The 16 lanes of q[0..3] (q[i] lanes 4i..4i + 3) added as sum_lanes adds a vec16's. */
static inline float sum_quarters(const float32x4_t q[4]) {
  float32x4_t four = vaddq_f32(vaddq_f32(q[0], q[2]), vaddq_f32(q[1], q[3]));
  return (vgetq_lane_f32(four, 0) + vgetq_lane_f32(four, 2)) + (vgetq_lane_f32(four, 1) + vgetq_lane_f32(four, 3));
}
#endif

/* Asymmetric INT4 rows (mins non-NULL): value (code + 8) * scale + min = code * scale + mid, mid = 8 * scale + min
 * (the value of code 0; 8 * scale is exact, so mid is rounded once, fused or not). The code products are those of the
 * symmetric rows; the mids enter through a correction accumulator of 16 lanes per row, block b of 32 values adding
 * mid * block_sums[b] (x's sum over the block, computed once per call) to lane b % 16 in one fused multiply-add, in
 * increasing b, then added lane by lane to the row's accumulators before their pairwise sum: a term per block, the
 * same operations in the same order on every target (the AVX-512 integer path does 16 blocks per vector FMA). */
static inline float group_mid(const uint16_t *scales, const uint16_t *mins, size_t g) {
  return 8.0f * scale_at(scales, g) + scale_at(mins, g);
}

/* Tokens whose corrections block_corrections_tokens computes in one pass, at most. */
#define EDGE_CORRECTION_TOKENS 4

/* For each of n tokens (n <= EDGE_CORRECTION_TOKENS): lanes[t][b % 16] = the sum over blocks b, b + 16, ... (< blocks)
 * of mid of the block's group * block_sums[t][b], one fused multiply-add per block in increasing b, from +0; each
 * block's mids computed once for all n tokens. */
EDGE_ALWAYS_INLINE void block_corrections_tokens(int n, const uint16_t *scales, const uint16_t *mins, int group_log,
                                                 const float *const *block_sums, int blocks, float (*lanes)[16]) {
  for (int t = 0; t < n; t++) memset(lanes[t], 0, 16 * sizeof(float));
  int b = 0;
#if defined(__aarch64__)
  if (group_log == 0) { /* a group per block: four blocks' mids per vector, into their quarter of the 16 lanes */
    float32x4_t quarters[EDGE_CORRECTION_TOKENS][4];
    for (int t = 0; t < n; t++) {
      for (int q = 0; q < 4; q++) quarters[t][q] = vdupq_n_f32(0);
    }
    for (; b + 16 <= blocks; b += 16) {
      for (int q = 0; q < 4; q++) {
        float32x4_t s = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(scales + b + 4 * q)));
        float32x4_t m = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(mins + b + 4 * q)));
        float32x4_t mids = vaddq_f32(vmulq_n_f32(s, 8.0f), m);
        for (int t = 0; t < n; t++) {
          quarters[t][q] = vfmaq_f32(quarters[t][q], mids, vld1q_f32(block_sums[t] + b + 4 * q));
        }
      }
    }
    for (int t = 0; t < n; t++) {
      for (int q = 0; q < 4; q++) vst1q_f32(lanes[t] + 4 * q, quarters[t][q]);
    }
  }
#endif
  for (; b < blocks; b++) {
    float mid = group_mid(scales, mins, (size_t)(b >> group_log));
    for (int t = 0; t < n; t++) lanes[t][b % 16] = fmaf(mid, block_sums[t][b], lanes[t][b % 16]);
  }
}

/* block_corrections_tokens for one token's block_sums. */
EDGE_ALWAYS_INLINE void block_corrections(const uint16_t *scales, const uint16_t *mins, int group_log,
                                          const float *block_sums, int blocks, float lanes[16]) {
  block_corrections_tokens(1, scales, mins, group_log, &block_sums, blocks, (float (*)[16])lanes);
}

/* The fp32-x dot product of a quantized row (EDGE_SDK_QUANT_ACTIVATIONS=fp32). struct lane_sums holds 16 lanes for
 * the low halves of blocks and 16 for the high halves: two vec16, or on AVX2 their ymm halves (v[0], v[1] the low
 * lanes 0..7 and 8..15, v[2], v[3] the high ones) and on NEON their q quarters (v[0..3] low, v[4..7] high), where GCC
 * kept the vec16 sums on the stack (about 100 q-register stores per 128 values of an INT4 row under qemu; AVX2's build
 * 11x slower than AVX-512's). Each form does the same operations lane by lane, so the bits are the same. */
#if EDGE_ROWS_AVX2
struct lane_sums {
  __m256 v[4];
};

static inline void zero_sums(struct lane_sums *sums) {
  for (int i = 0; i < 4; i++) sums->v[i] = _mm256_setzero_ps();
}

/* sums += the codes of `block` times xb (its 32 values of x), per lane */
EDGE_ALWAYS_INLINE void add_block_products(const char *row, int dtype, int block, const float *xb,
                                           struct lane_sums *sums) {
  codes16 first, second;
  block_codes(row + (size_t)block * block_bytes(dtype), dtype, &first, &second);
  for (int i = 0; i < 4; i++) {
    __m256 codes = codes_as_floats(i < 2 ? first : second, i % 2);
    sums->v[i] = _mm256_add_ps(sums->v[i], _mm256_mul_ps(codes, _mm256_loadu_ps(xb + 8 * i)));
  }
}

/* acc += scale * sums, lane by lane */
EDGE_ALWAYS_INLINE void add_scaled_group(struct lane_sums *acc, float scale, const struct lane_sums *sums) {
  __m256 factor = _mm256_set1_ps(scale);
  for (int i = 0; i < 4; i++) acc->v[i] = _mm256_add_ps(acc->v[i], _mm256_mul_ps(factor, sums->v[i]));
}

/* (even_low + odd_low) + (even_high + odd_high) (+ corrections), then its 16 lanes pairwise as sum_lanes. */
static inline float row_total(const struct lane_sums *even, const struct lane_sums *odd, const float *corrections) {
  __m256 low = _mm256_add_ps(_mm256_add_ps(even->v[0], odd->v[0]), _mm256_add_ps(even->v[2], odd->v[2]));
  __m256 high = _mm256_add_ps(_mm256_add_ps(even->v[1], odd->v[1]), _mm256_add_ps(even->v[3], odd->v[3]));
  if (corrections != NULL) {
    low = _mm256_add_ps(low, _mm256_loadu_ps(corrections));
    high = _mm256_add_ps(high, _mm256_loadu_ps(corrections + 8));
  }
  return hsum(_mm256_add_ps(low, high));
}

#elif defined(__ARM_NEON)
struct lane_sums {
  float32x4_t v[8];
};

static inline void zero_sums(struct lane_sums *sums) {
  for (int i = 0; i < 8; i++) sums->v[i] = vdupq_n_f32(0);
}

EDGE_ALWAYS_INLINE void add_block_products(const char *row, int dtype, int block, const float *xb,
                                           struct lane_sums *sums) {
  codes16 first, second;
  block_codes(row + (size_t)block * block_bytes(dtype), dtype, &first, &second);
  float32x4_t values[8];
  codes_as_floats(first, values);
  codes_as_floats(second, values + 4);
  for (int i = 0; i < 8; i++) sums->v[i] = vaddq_f32(sums->v[i], vmulq_f32(values[i], vld1q_f32(xb + 4 * i)));
}

EDGE_ALWAYS_INLINE void add_scaled_group(struct lane_sums *acc, float scale, const struct lane_sums *sums) {
  for (int i = 0; i < 8; i++) acc->v[i] = vaddq_f32(acc->v[i], vmulq_n_f32(sums->v[i], scale));
}

static inline float row_total(const struct lane_sums *even, const struct lane_sums *odd, const float *corrections) {
  float32x4_t q[4];
  for (int i = 0; i < 4; i++) {
    q[i] = vaddq_f32(vaddq_f32(even->v[i], odd->v[i]), vaddq_f32(even->v[4 + i], odd->v[4 + i]));
    if (corrections != NULL) q[i] = vaddq_f32(q[i], vld1q_f32(corrections + 4 * i));
  }
  return sum_quarters(q);
}

#else
struct lane_sums {
  vec16 low, high;
};

static inline void zero_sums(struct lane_sums *sums) { sums->low = sums->high = (vec16){0}; }

EDGE_ALWAYS_INLINE void add_block_products(const char *row, int dtype, int block, const float *xb,
                                           struct lane_sums *sums) {
  vec16 low, high;
  load_codes(row, dtype, block, &low, &high);
  sums->low += low * VEC16_AT(xb);
  sums->high += high * VEC16_AT(xb + 16);
}

EDGE_ALWAYS_INLINE void add_scaled_group(struct lane_sums *acc, float scale, const struct lane_sums *sums) {
  acc->low += scale * sums->low;
  acc->high += scale * sums->high;
}

static inline float row_total(const struct lane_sums *even, const struct lane_sums *odd, const float *corrections) {
  vec16 acc = (even->low + odd->low) + (even->high + odd->high);
  if (corrections != NULL) acc += VEC16_AT(corrections);
  return sum_lanes(&acc);
}
#endif

/* The codes times x over one group, per lane, while the row `next` is prefetched at the same offsets. */
EDGE_ALWAYS_INLINE void quant_dot_group(const char *row, int dtype, int group, int blocks_per_group, const float *x,
                                        const char *next, struct lane_sums *sums) {
  zero_sums(sums);
  for (int k = 0, block = group * blocks_per_group; k < blocks_per_group; k++, block++) {
    size_t offset = (size_t)block * block_bytes(dtype);
    if (offset % EDGE_CACHE_LINE == 0) EDGE_PREFETCH(next, offset);
    add_block_products(row, dtype, block, x + block * EDGE_QUANT_BLOCK, sums);
  }
}

/* Each group's sums times its scale are added to the row's accumulators: one multiply per group rather than per
 * value. Even and odd groups have their own accumulators, four FMA chains in flight: with one pair, an INT4 row
 * of group size 32 waited on the latency of one FMA per 16 bytes. */
EDGE_ALWAYS_INLINE float quant_dot_row(const char *row, const uint16_t *scales, int dtype, int group_size,
                                       const float *x, int d, const char *next, const uint16_t *next_scales,
                                       const uint16_t *mins, const float *block_sums) {
  struct lane_sums even, odd, sums;
  zero_sums(&even);
  zero_sums(&odd);
  int blocks_per_group = group_size / EDGE_QUANT_BLOCK, groups = d / group_size;
  int g = 0;
  for (; g + 2 <= groups; g += 2) {
    if ((g * sizeof(uint16_t)) % EDGE_CACHE_LINE == 0) EDGE_PREFETCH(next_scales, g * sizeof(uint16_t));
    quant_dot_group(row, dtype, g, blocks_per_group, x, next, &sums);
    add_scaled_group(&even, scale_at(scales, (size_t)g), &sums);
    quant_dot_group(row, dtype, g + 1, blocks_per_group, x, next, &sums);
    add_scaled_group(&odd, scale_at(scales, (size_t)g + 1), &sums);
  }
  if (g < groups) {
    quant_dot_group(row, dtype, g, blocks_per_group, x, next, &sums);
    add_scaled_group(&even, scale_at(scales, (size_t)g), &sums);
  }
  if (mins == NULL) return row_total(&even, &odd, NULL);
  float corrections[16];
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2;
  block_corrections(scales, mins, group_log, block_sums, d / EDGE_QUANT_BLOCK, corrections);
  return row_total(&even, &odd, corrections);
}

/* Groups whose factors add_quant_rows computes at once, for a piece of the columns (1024 at group size 32). */
#define EDGE_FACTOR_GROUPS 32

/* factors[r][g] = h[r] * scale g0 + g of row rows[r], for g < n_groups. */
EDGE_ALWAYS_INLINE void row_factors(const uint16_t *scales, size_t groups, const size_t *rows, const float *h,
                                    int n_rows, int g0, int n_groups, float factors[][EDGE_FACTOR_GROUPS]) {
  for (int r = 0; r < n_rows; r++) {
    const uint16_t *row = scales + rows[r] * groups + g0;
#if EDGE_ROWS_AVX512
    __m512 hr = _mm512_set1_ps(h[r]);
    for (int g = 0; g < n_groups; g += 16) {
      int count = n_groups - g < 16 ? n_groups - g : 16;
      __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(count), row + g));
      _mm512_mask_storeu_ps(factors[r] + g, tail_mask(count), _mm512_mul_ps(hr, s));
    }
#elif EDGE_ROWS_AVX2
    __m256 hr = _mm256_set1_ps(h[r]);
    int g = 0;
    for (; g + 8 <= n_groups; g += 8) {
      _mm256_storeu_ps(factors[r] + g, _mm256_mul_ps(hr, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + g)))));
    }
    for (; g < n_groups; g++) factors[r][g] = h[r] * scale_at(row, (size_t)g);
#else
    for (int g = 0; g < n_groups; g++) factors[r][g] = h[r] * scale_at(row, (size_t)g);
#endif
  }
}

#if EDGE_ROWS_AVX512
/* The mids (scale * 8 + min) of blocks [block, block + count) of one asymmetric row (its scales and mins from group 0),
 * count <= 16, one block per lane: the 16 groups from the first block's on, permuted to the blocks as int_dot_step
 * does (lanes past count hold a group's mid or 0). */
EDGE_ALWAYS_INLINE __m512 block_mids16(const uint16_t *scales, const uint16_t *mins, int group_log, int block,
                                       int count) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int group = block >> group_log;
  int n_groups = ((block + count - 1) >> group_log) - group + 1;
  __m512i of_block = _mm512_sub_epi32(_mm512_srlv_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(block)),
                                                        _mm512_set1_epi32(group_log)),
                                      _mm512_set1_epi32(group));
  __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n_groups), scales + group));
  __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n_groups), mins + group));
  return _mm512_permutexvar_ps(of_block, _mm512_fmadd_ps(s, _mm512_set1_ps(8.0f), m));
}
#endif

/* corrections[b] = fmaf(h, mid of block b's group, corrections[b]) for blocks [first, first + n) of one asymmetric row
 * (its scales and mins from group 0). AVX-512: 16 blocks per FMA, their mids from the 16 groups from the first block's
 * on (permuted to the blocks as int_dot_step does); AVX2 8; aarch64 4 at group size 32; elsewhere a block at a time:
 * the same roundings. */
EDGE_ALWAYS_INLINE void add_row_corrections(float *corrections, int first, int n, const uint16_t *scales,
                                            const uint16_t *mins, int group_size, float h) {
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2;
#if EDGE_ROWS_AVX512
  for (int k = 0; k < n; k += 16) {
    int count = n - k < 16 ? n - k : 16, block = first + k;
    __m512 mids = block_mids16(scales, mins, group_log, block, count);
    __m512 sums = _mm512_maskz_loadu_ps(tail_mask(count), corrections + block);
    _mm512_mask_storeu_ps(corrections + block, tail_mask(count), _mm512_fmadd_ps(_mm512_set1_ps(h), mids, sums));
  }
#elif EDGE_ROWS_AVX2
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int k = 0; k < n; k += 8) {
    int count = n - k < 8 ? n - k : 8, block = first + k, group = block >> group_log;
    int n_groups = ((block + count - 1) >> group_log) - group + 1;
    __m256i of_block = _mm256_sub_epi32(_mm256_srlv_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(block)),
                                                          _mm256_set1_epi32(group_log)),
                                        _mm256_set1_epi32(group));
    __m256 group_mids = _mm256_fmadd_ps(load_halves(scales + group, n_groups), _mm256_set1_ps(8.0f),
                                        load_halves(mins + group, n_groups));
    __m256 mids = _mm256_permutevar8x32_ps(group_mids, of_block);
    __m256i in_piece = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lanes);
    __m256 sums = _mm256_maskload_ps(corrections + block, in_piece);
    _mm256_maskstore_ps(corrections + block, in_piece, _mm256_fmadd_ps(_mm256_set1_ps(h), mids, sums));
  }
#else
  int b = first;
#if defined(__aarch64__)
  if (group_log == 0) { /* a group per block (Q4_1's grid): four blocks' mids per vector, as block_corrections */
    for (; b + 4 <= first + n; b += 4) {
      float32x4_t s = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(scales + b)));
      float32x4_t m = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(mins + b)));
      float32x4_t mids = vaddq_f32(vmulq_n_f32(s, 8.0f), m);
      vst1q_f32(corrections + b, vfmaq_f32(vld1q_f32(corrections + b), vdupq_n_f32(h), mids));
    }
  }
#endif
  for (; b < first + n; b++) {
    corrections[b] = fmaf(h, group_mid(scales, mins, (size_t)(b >> group_log)), corrections[b]);
  }
#endif
}

/* Columns [c0, c0 + n) of y, both multiples of EDGE_QUANT_BLOCK, plus h[r] times the rows rows[r] (neuron
 * indices) of `codes` / `scales`, in order of r, 32 columns per step; the rows next[0:n_next] are prefetched over
 * the same columns. Each element gets, per row, the product (h[r] * scale) * code, rounded, then added: a multiply
 * and an add, not fused, on every target (a fused multiply-add is a library call of about 8 ns per value on an
 * x86-64 without FMA), so an element's value does not depend on where a block of y starts or ends. The factors
 * h[r] * scale are computed once per row and group, a piece of EDGE_FACTOR_GROUPS groups at a time. */
EDGE_ALWAYS_INLINE void add_quant_rows(float *y, int c0, int n, const char *codes, const uint16_t *scales, int dtype,
                                       int group_size, int d, const size_t *rows, const float *h, int n_rows,
                                       const size_t *next, int n_next, const uint16_t *mins, float *corrections) {
  size_t row_bytes = (size_t)d / EDGE_QUANT_BLOCK * block_bytes(dtype);
  size_t groups = (size_t)(d / group_size);
  int c1 = c0 + n;
  float factors[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS];
  for (int piece = c0; piece < c1;) {
    int g0 = piece / group_size;
    int piece_end = (g0 + EDGE_FACTOR_GROUPS) * group_size < c1 ? (g0 + EDGE_FACTOR_GROUPS) * group_size : c1;
    int n_groups = (piece_end - 1) / group_size - g0 + 1;
    row_factors(scales, groups, rows, h, n_rows, g0, n_groups, factors);
    if (mins != NULL) { /* asymmetric rows: h[r] * mid per row and block into the block's correction, rows in order */
      for (int r = 0; r < n_rows; r++) {
        add_row_corrections(corrections, piece / EDGE_QUANT_BLOCK, (piece_end - piece) / EDGE_QUANT_BLOCK,
                            scales + rows[r] * groups, mins + rows[r] * groups, group_size, h[r]);
      }
    }
    for (int r = 0; r < n_next; r++) { /* the piece's scales of the next rows: 64 bytes, on one or two lines */
      EDGE_PREFETCH(scales, (next[r] * groups + (size_t)g0) * sizeof(uint16_t));
      EDGE_PREFETCH(scales, (next[r] * groups + (size_t)(g0 + n_groups - 1)) * sizeof(uint16_t));
      if (mins != NULL) {
        EDGE_PREFETCH(mins, (next[r] * groups + (size_t)g0) * sizeof(uint16_t));
        EDGE_PREFETCH(mins, (next[r] * groups + (size_t)(g0 + n_groups - 1)) * sizeof(uint16_t));
      }
    }
    for (int column = piece; column < piece_end; column += EDGE_QUANT_BLOCK) {
      int block = column / EDGE_QUANT_BLOCK, g = column / group_size - g0;
      size_t offset = (size_t)block * block_bytes(dtype);
      for (int r = 0; r < n_next && offset % EDGE_CACHE_LINE == 0; r++) {
        EDGE_PREFETCH(codes, next[r] * row_bytes + offset);
      }
#if EDGE_ROWS_AVX512
      if (dtype == EDGE_Q4) {
        /* The 16 products of a factor with the 16 codes, in one multiply, then picked by each nibble: vpermps reads
         * the low 4 bits of each index, so a byte zero-extended to 32 bits picks its low nibble's product, and
         * shifted right by 4 its high nibble's (the same rounded products as a multiply per value). */
        const __m512 code_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
        __m512 acc_low = _mm512_loadu_ps(y + column), acc_high = _mm512_loadu_ps(y + column + 16);
        for (int r = 0; r < n_rows; r++) {
          __m512 products = _mm512_mul_ps(code_values, _mm512_set1_ps(factors[r][g]));
          const char *row = codes + rows[r] * row_bytes + offset;
          __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)row));
          acc_low = _mm512_add_ps(acc_low, _mm512_permutexvar_ps(bytes, products));
          acc_high = _mm512_add_ps(acc_high, _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), products));
        }
        _mm512_storeu_ps(y + column, acc_low);
        _mm512_storeu_ps(y + column + 16, acc_high);
        continue;
      }
#endif
#if EDGE_ROWS_AVX2
      /* the block's 32 columns in four ymm accumulators; codes widened 8 at a time, times the factor, then added */
      __m256 acc0 = _mm256_loadu_ps(y + column), acc1 = _mm256_loadu_ps(y + column + 8);
      __m256 acc2 = _mm256_loadu_ps(y + column + 16), acc3 = _mm256_loadu_ps(y + column + 24);
      for (int r = 0; r < n_rows; r++) {
        __m256 factor = _mm256_set1_ps(factors[r][g]);
        codes16 first, second;
        block_codes(codes + rows[r] * row_bytes + offset, dtype, &first, &second);
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(factor, codes_as_floats(first, 0)));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(factor, codes_as_floats(first, 1)));
        acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(factor, codes_as_floats(second, 0)));
        acc3 = _mm256_add_ps(acc3, _mm256_mul_ps(factor, codes_as_floats(second, 1)));
      }
      _mm256_storeu_ps(y + column, acc0);
      _mm256_storeu_ps(y + column + 8, acc1);
      _mm256_storeu_ps(y + column + 16, acc2);
      _mm256_storeu_ps(y + column + 24, acc3);
#elif defined(__ARM_NEON)
      /* the block's 32 columns in eight q accumulators; codes widened to fp32, times the factor, then added */
      float32x4_t acc[8];
      for (int i = 0; i < 8; i++) acc[i] = vld1q_f32(y + column + 4 * i);
      for (int r = 0; r < n_rows; r++) {
        codes16 first, second;
        block_codes(codes + rows[r] * row_bytes + offset, dtype, &first, &second);
        float32x4_t values[8];
        codes_as_floats_by_table(first, values);
        codes_as_floats_by_table(second, values + 4);
        for (int i = 0; i < 8; i++) acc[i] = vaddq_f32(acc[i], vmulq_n_f32(values[i], factors[r][g]));
      }
      for (int i = 0; i < 8; i++) vst1q_f32(y + column + 4 * i, acc[i]);
#else
      vec16 acc_low = VEC16_AT(y + column), acc_high = VEC16_AT(y + column + 16);
      for (int r = 0; r < n_rows; r++) {
        vec16 low, high;
        load_codes(codes + rows[r] * row_bytes, dtype, block, &low, &high);
        acc_low += factors[r][g] * low;
        acc_high += factors[r][g] * high;
      }
      VEC16_AT(y + column) = acc_low;
      VEC16_AT(y + column + 16) = acc_high;
#endif
    }
    piece = piece_end;
  }
}

/* ---- Integer dot products: x quantized per token (QUANT.md, "Integer dot products") -------------------------
 * The gate, up and matvec rows are dotted with x quantized once per call, per block of 32 values: scale =
 * max|x| / 127, t = x * (127 / max|x|), high code = round(t), low code = round(256 (t - high)) (ties to even, the
 * low one clamped to +-127), so x ~ (high + low / 256) * scale to within scale / 512 (scale / 256 where the low
 * code clamps): two int8 planes, about 16 bits per value. One plane alone (int8 activations, as llama.cpp's
 * Q8_0) changed the fixture's greedy ids against the fp32 reference and ONNX Runtime (QUANT.md).
 * A row's codes times each plane are summed exactly in int32 lanes and combined exactly as 256 high + low; each lane
 * is converted to fp32 (rounded) and added to its accumulator with one fused multiply-add by the factor x scale *
 * weight scale of its block. 16 lanes make a unit, one 64-byte cache line of codes and one accumulator vector:
 *   INT8: a lane is 4 consecutive values, 8 lanes per block, 2 blocks per unit;
 *   INT4: a lane is 8 values of a block, 4i..4i+3 and 16 + 4i..16 + 4i + 3 (the low and the high nibbles of the
 *         block's bytes 4i..4i + 3), 4 lanes per block, 4 blocks per unit. The nibbles of a block's 16 bytes are
 *         two vectors of 16 codes as they come (no shuffle), and the products of both add into the same lanes: half
 *         the lanes, conversions and multiply-adds per value of 4 consecutive values, which would have needed the
 *         low and high nibbles interleaved.
 * The integer part is exact and the float part the same sequence of operations on every target: AVX-512 (VNNI
 * vpdpbusd, or vpmaddubsw), AVX2 (AVX-VNNI, or vpmaddubsw), NEON (sdot with the dot-product extension, or smull)
 * and portable C give bit-identical results. vpdpbusd and vpmaddubsw multiply unsigned by signed bytes: the INT4
 * codes are taken as code + 8 (their signed nibbles xor 8) and, with VNNI, the INT8 codes as code + 128 (xor 0x80);
 * the surplus, offset times the lane's activation codes (256 high + low), starts the lane negated, computed once per
 * call. Without VNNI an INT8 lane would overflow vpmaddubsw's int16 pairs (255 * 127 * 2), so there the codes'
 * magnitudes multiply x's codes carrying the codes' signs, with no surplus. */

#define EDGE_UNIT_LANES 16
/* Values per unit, the most of the two formats (INT4's) */
#define EDGE_MAX_UNIT_VALUES 128

/* Blocks per unit, and lanes per block. */
static inline int unit_blocks(int dtype) { return dtype == EDGE_Q4 ? 4 : 2; }
static inline int block_lanes(int dtype) { return EDGE_UNIT_LANES / unit_blocks(dtype); }

/* x quantized for the integer dot products (d a multiple of 32, the arrays padded with zeros to whole units):
 * high and low codes, int8: for INT8 rows value j at j; for INT4 rows in the order of a unit's nibbles, value
 * 128 u + 32 b + k (k < 16) at 128 u + 16 b + k and value 128 u + 32 b + 16 + k at 128 u + 64 + 16 b + k, so that
 * each 64 bytes of a plane meet a unit's low or high nibbles as loaded. block_scales: per block, its scale over 256
 * (the weight of a low code; every lane of the block takes it). code_offset_sums: on x86, per lane, minus
 * the codes' offset times 256 high + low summed over the lane's values (NULL elsewhere). block_sums: per block, the
 * sum of its values x_hat, for asymmetric rows: the exact int32 sum of 256 high + low times block_scales (one
 * rounding). */
struct quantized_activations {
  const int8_t *high, *low;
  const int32_t *code_offset_sums;
  const float *block_scales;
  const float *block_sums;
};

/* Values of d rounded up to whole units of either format. */
static size_t padded_values(int d) {
  return ((size_t)d + EDGE_MAX_UNIT_VALUES - 1) / EDGE_MAX_UNIT_VALUES * EDGE_MAX_UNIT_VALUES;
}

/* Bytes quantize_activations needs for d values (any d, so a workspace can hold them whatever the rows' type): four
 * arrays of at most padded_values(d) bytes, each on a cache line (block_scales and block_sums, d / 8 bytes each,
 * share the last one). */
static size_t activation_bytes(int d) { return 4 * padded_values(d) + EDGE_CACHE_LINE; }

/* Where the block sums of x live in a buffer of activation_bytes(d) bytes (any alignment): in the second half of the
 * last array, with x quantized or (x in fp32) alone. */
static float *block_sums_at(void *buffer, int d) {
  uintptr_t base = ((uintptr_t)buffer + EDGE_CACHE_LINE - 1) / EDGE_CACHE_LINE * EDGE_CACHE_LINE;
  return (float *)(base + 3 * padded_values(d) + padded_values(d) / 2);
}

/* For asymmetric rows with x in fp32: sums[b] = x's values of block b added in a fixed order (the two halves lane by
 * lane, then the 16 lanes pairwise). */
static const float *fp32_block_sums(const float *x, int d, void *buffer) {
  float *sums = block_sums_at(buffer, d);
  for (int b = 0; b < d / EDGE_QUANT_BLOCK; b++) {
    vec16 halves = VEC16_AT(x + b * EDGE_QUANT_BLOCK) + VEC16_AT(x + b * EDGE_QUANT_BLOCK + 16);
    sums[b] = sum_lanes(&halves);
  }
  return sums;
}

#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
/* What the unsigned codes of `dtype` exceed the signed ones by, in the x86 integer products (see above). */
static inline int32_t code_offset(int dtype) {
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
  return dtype == EDGE_Q4 ? 8 : 128;
#else
  return dtype == EDGE_Q4 ? 8 : 0;
#endif
}
#endif

/* Position in a plane of value j (< 32) of block `block`, for rows of `dtype`. */
static inline size_t plane_position(int dtype, int block, int j) {
  if (dtype != EDGE_Q4) return (size_t)block * EDGE_QUANT_BLOCK + (size_t)j;
  size_t unit_start = (size_t)(block / 4) * EDGE_MAX_UNIT_VALUES;
  return unit_start + (size_t)(j / 16) * 64 + (size_t)(block % 4) * 16 + (size_t)(j % 16);
}

/* Value k (< 32 / lanes per block) of lane `lane` of a block: INT8 4 consecutive values, INT4 two runs of 4. */
static inline int lane_value(int dtype, int lane, int k) {
  return dtype == EDGE_Q4 ? 4 * lane + k % 4 + 16 * (k / 4) : 4 * lane + k;
}

/* The high and low codes of one block of 32 values, with the factor `inverse` (0 for an all-zero block). Written as
 * loops over the block without calls or branches, which GCC vectorises (fmaxf and fminf were library calls, a
 * third of a 90%-sparse 7B FFN's fixed cost); the clamp compares finite values, as fminf / fmaxf would. */
static inline void quantize_block(const float *values, float inverse, int8_t high[EDGE_QUANT_BLOCK],
                                  int8_t low[EDGE_QUANT_BLOCK]) {
  for (int j = 0; j < EDGE_QUANT_BLOCK; j++) {
    float scaled = values[j] * inverse;
    float rounded = nearbyintf(scaled);
    /* scaled - rounded is exact, and times 256 too: |it| <= 0.5, so the low code is within [-128, 128] */
    float rest = nearbyintf((scaled - rounded) * 256.0f);
    rest = rest < -127.0f ? -127.0f : rest;
    rest = rest > 127.0f ? 127.0f : rest;
    high[j] = (int8_t)(int32_t)rounded;
    low[j] = (int8_t)(int32_t)rest;
  }
}

/* x [d] into `buffer` (activation_bytes(d), any alignment) for rows of `dtype`. A block holding a non-finite value
 * gets codes 0 and a NaN scale, so every dot product it enters is NaN, as the fp32 products would be at best. */
static struct quantized_activations quantize_activations(const float *x, int d, int dtype, void *buffer) {
  uintptr_t base = ((uintptr_t)buffer + EDGE_CACHE_LINE - 1) / EDGE_CACHE_LINE * EDGE_CACHE_LINE;
  size_t stride = padded_values(d);
  int8_t *high = (int8_t *)base, *low = (int8_t *)(base + stride);
  int32_t *offset_sums = (int32_t *)(base + 2 * stride);
  float *block_scales = (float *)(base + 3 * stride), *block_sums = block_sums_at(buffer, d);
  int blocks = d / EDGE_QUANT_BLOCK;
  /* a last partial unit's missing blocks: zero codes, scales and sums, so its lanes add exact zeros */
  size_t unit_values = (size_t)unit_blocks(dtype) * EDGE_QUANT_BLOCK;
  size_t tail = (size_t)blocks * EDGE_QUANT_BLOCK / unit_values * unit_values;
  memset(high + tail, 0, stride - tail);
  memset(low + tail, 0, stride - tail);
  memset(offset_sums, 0, stride);
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
  int32_t offset = code_offset(dtype);
  int lanes = block_lanes(dtype);
#endif
  for (int block = 0; block < blocks; block++) {
    const float *values = x + block * EDGE_QUANT_BLOCK;
    /* max |x| on the magnitudes' bits, whose order as integers is that of the finite magnitudes (a float max with
     * NaN rules was a library call per value); a bit pattern at or above infinity's marks a non-finite value */
    union {
      vec16 v;
      uint32_t bits[16];
    } first = {VEC16_AT(values)}, second = {VEC16_AT(values + 16)};
    uint32_t largest_bits = 0;
    for (int l = 0; l < 16; l++) {
      uint32_t a = first.bits[l] & 0x7fffffffu, b = second.bits[l] & 0x7fffffffu;
      uint32_t m = a > b ? a : b;
      largest_bits = m > largest_bits ? m : largest_bits;
    }
    int finite = largest_bits < 0x7f800000u;
    float largest;
    memcpy(&largest, &largest_bits, sizeof largest);
    float scale = finite ? largest / 127.0f : NAN;
    int8_t block_high[EDGE_QUANT_BLOCK] = {0}, block_low[EDGE_QUANT_BLOCK] = {0};
    if (finite) quantize_block(values, largest > 0.0f ? 127.0f / largest : 0.0f, block_high, block_low);
    /* values 0..15 and 16..31 each stay consecutive in either plane order */
    for (int half = 0; half < 2; half++) {
      memcpy(high + plane_position(dtype, block, 16 * half), block_high + 16 * half, 16);
      memcpy(low + plane_position(dtype, block, 16 * half), block_low + 16 * half, 16);
    }
    block_scales[block] = scale / 256.0f;
    int32_t combined[EDGE_QUANT_BLOCK], block_sum = 0;
    for (int j = 0; j < EDGE_QUANT_BLOCK; j++) combined[j] = 256 * block_high[j] + block_low[j];
    for (int j = 0; j < EDGE_QUANT_BLOCK; j++) block_sum += combined[j];
    block_sums[block] = (float)block_sum * (scale / 256.0f); /* |block_sum| < 2^21: exact in fp32 */
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
    for (int lane = 0; lane < lanes; lane++) {
      int32_t sum = 0;
      for (int k = 0; k < EDGE_QUANT_BLOCK / lanes; k++) sum += combined[lane_value(dtype, lane, k)];
      offset_sums[block * lanes + lane] = -offset * sum;
    }
#endif
  }
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
  struct quantized_activations quantized = {high, low, offset_sums, block_scales, block_sums};
#else
  struct quantized_activations quantized = {high, low, NULL, block_scales, block_sums};
#endif
  return quantized;
}

/* Rows dotted at once by int_dot_rows, for rows picked from a list (the FFN's gate and up rows: scattered, each a cold
 * read) and for a contiguous run (a matvec's rows, which the hardware prefetchers stream). With AVX-512, 4, each with
 * its own accumulators in registers (8 of the 32); the core then has the cache lines of four rows in flight instead
 * of one row's, which is what bounds a cold row's read (benchmarks/README.md, section 3). With AVX2, 2 from a list
 * and 1 from a run: two rows' accumulators and constants spill out of the 16 ymm registers, which costs the streamed
 * run more than it gains (a 7B matvec -5%), while scattered rows gain more (the 90% FFN +10%). On NEON 1 (a vec16
 * takes 4 of its 32 registers; not measured on a core yet). EDGE_ROWS_AT_ONCE is the larger. */
#if EDGE_ROWS_AVX512
#define EDGE_LIST_ROWS_AT_ONCE 4
#define EDGE_RUN_ROWS_AT_ONCE 4
#elif EDGE_ROWS_AVX2
#define EDGE_LIST_ROWS_AT_ONCE 2
#define EDGE_RUN_ROWS_AT_ONCE 1
#else
#define EDGE_LIST_ROWS_AT_ONCE 1
#define EDGE_RUN_ROWS_AT_ONCE 1
#endif
#define EDGE_ROWS_AT_ONCE EDGE_LIST_ROWS_AT_ONCE

typedef int32_t ivec16 __attribute__((vector_size(64)));

#if EDGE_ROWS_AVX512

/* A unit's codes as the integer products take them, loaded and unpacked once for every x they meet: INT4, the low and
 * the high nibbles of its 64 bytes as unsigned codes (code + 8); INT8, its 64 (or 32) codes as unsigned bytes with,
 * without VNNI, the mask of the negative ones. */
struct unit_codes {
  __m512i first, second; /* INT4: low and high nibbles; INT8: the unsigned codes (second unused) */
  __mmask64 negative;    /* INT8 without VNNI: codes < 0 */
};

#define EDGE_LOAD_HALF_OR_ALL(p) \
  (n_blocks == 2 ? _mm512_loadu_si512(p) : _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)(p))))

/* INT8 unit `unit` (values [64 unit, 64 unit + 64)) of a row, n_blocks 2, or 1 for a row's last half unit. */
EDGE_ALWAYS_INLINE void int8_unit_codes(const char *row, int unit, int n_blocks, struct unit_codes *codes) {
  __m512i w = EDGE_LOAD_HALF_OR_ALL(row + (size_t)unit * 64);
#ifdef __AVX512VNNI__
  codes->first = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
  codes->negative = 0;
#else
  codes->first = _mm512_abs_epi8(w);
  codes->negative = _mm512_movepi8_mask(w);
#endif
  codes->second = codes->first;
}

/* The integer lanes of INT8 unit `unit` with x's planes (lanes 8..15 then 0 for a half unit). */
EDGE_ALWAYS_INLINE void int8_codes_products(const struct unit_codes *codes, int unit,
                                            const struct quantized_activations *xa, int n_blocks, ivec16 *out) {
  size_t first = (size_t)unit * 64;
  const int32_t *sums = xa->code_offset_sums + (size_t)unit * EDGE_UNIT_LANES;
  __m512i high = EDGE_LOAD_HALF_OR_ALL(xa->high + first), low = EDGE_LOAD_HALF_OR_ALL(xa->low + first);
  __m512i lanes = EDGE_LOAD_HALF_OR_ALL(sums);
#ifdef __AVX512VNNI__
  __m512i high_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes->first, high);
  __m512i low_sums = _mm512_dpbusd_epi32(lanes, codes->first, low);
#else
  high = _mm512_mask_sub_epi8(high, codes->negative, _mm512_setzero_si512(), high);
  low = _mm512_mask_sub_epi8(low, codes->negative, _mm512_setzero_si512(), low);
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i high_sums = _mm512_madd_epi16(_mm512_maddubs_epi16(codes->first, high), ones);
  __m512i low_sums = _mm512_add_epi32(lanes, _mm512_madd_epi16(_mm512_maddubs_epi16(codes->first, low), ones));
#endif
  *out = (ivec16)_mm512_add_epi32(_mm512_slli_epi32(high_sums, 8), low_sums);
}
#undef EDGE_LOAD_HALF_OR_ALL

/* INT4 unit `unit` (blocks 4 unit .. 4 unit + n_blocks - 1, n_blocks 1..4): the 64 bytes of codes give the low nibbles
 * in one vector and the high nibbles in another. A missing block's bytes load as zeros (code + 8 = 8), whose x codes
 * and sums are 0. */
EDGE_ALWAYS_INLINE void int4_unit_codes(const char *row, int unit, int n_blocks, struct unit_codes *codes) {
  const char *p = row + (size_t)unit * 64;
  __m512i bytes = n_blocks == 4 ? _mm512_loadu_si512(p)
                                : _mm512_maskz_loadu_epi8(((__mmask64)1 << (16 * n_blocks)) - 1, p);
  /* code + 8 = (nibble & 0x0f) ^ 8: the mask and the sign flip in one vpternlogd (0x6a: (a & b) ^ c) */
  const __m512i nibble = _mm512_set1_epi8(0x0f), sign = _mm512_set1_epi8(8);
  codes->first = _mm512_ternarylogic_epi32(bytes, nibble, sign, 0x6a);
  codes->second = _mm512_ternarylogic_epi32(_mm512_srli_epi16(bytes, 4), nibble, sign, 0x6a);
  codes->negative = 0;
}

/* The 16 lanes of INT4 unit `unit`: each nibble vector multiplied with its 64 bytes of each plane into the same
 * lanes. */
EDGE_ALWAYS_INLINE void int4_codes_products(const struct unit_codes *codes, int unit,
                                            const struct quantized_activations *xa, ivec16 *out) {
  const int8_t *high = xa->high + (size_t)unit * EDGE_MAX_UNIT_VALUES;
  const int8_t *low = xa->low + (size_t)unit * EDGE_MAX_UNIT_VALUES;
  __m512i lanes = _mm512_loadu_si512(xa->code_offset_sums + (size_t)unit * EDGE_UNIT_LANES);
#ifdef __AVX512VNNI__
  __m512i high_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes->first, _mm512_loadu_si512(high));
  high_sums = _mm512_dpbusd_epi32(high_sums, codes->second, _mm512_loadu_si512(high + 64));
  __m512i low_sums = _mm512_dpbusd_epi32(lanes, codes->first, _mm512_loadu_si512(low));
  low_sums = _mm512_dpbusd_epi32(low_sums, codes->second, _mm512_loadu_si512(low + 64));
#else
  /* (code + 8) x: at most 15 * 127, four of them fit an int16 */
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i high_pairs = _mm512_add_epi16(_mm512_maddubs_epi16(codes->first, _mm512_loadu_si512(high)),
                                        _mm512_maddubs_epi16(codes->second, _mm512_loadu_si512(high + 64)));
  __m512i low_pairs = _mm512_add_epi16(_mm512_maddubs_epi16(codes->first, _mm512_loadu_si512(low)),
                                       _mm512_maddubs_epi16(codes->second, _mm512_loadu_si512(low + 64)));
  __m512i high_sums = _mm512_madd_epi16(high_pairs, ones);
  __m512i low_sums = _mm512_add_epi32(lanes, _mm512_madd_epi16(low_pairs, ones));
#endif
  *out = (ivec16)_mm512_add_epi32(_mm512_slli_epi32(high_sums, 8), low_sums);
}

/* acc += products * factors, lane by lane, one rounding each (after the conversion's). */
EDGE_ALWAYS_INLINE void fused_multiply_add16(vec16 *acc, const ivec16 *products, const vec16 *factors) {
  *acc = (vec16)_mm512_fmadd_ps(_mm512_cvtepi32_ps((__m512i)*products), (__m512)*factors, (__m512)*acc);
}

#else /* AVX2, NEON and portable C */

#if EDGE_ROWS_AVX2
/* An INT8 block's codes as the unsigned operand of the products: code + 128 with AVX-VNNI (`vpdpbusd`), |code|
 * without (`vpmaddubsw`, x's codes then taking the code's sign), the same for every x they meet. */
static inline __m256i int8_unsigned_codes(__m256i w) {
#ifdef __AVXVNNI__
  return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
#else
  return _mm256_abs_epi8(w);
#endif
}

/* The 8 lanes of one INT8 block of codes w (unsigned: int8_unsigned_codes(w)) times activation codes high, low,
 * starting values `sums`. */
static inline __m256i int8_products(__m256i w, __m256i unsigned_codes, const int8_t *high, const int8_t *low,
                                    const int32_t *sums) {
  __m256i high8 = _mm256_loadu_si256((const void *)high), low8 = _mm256_loadu_si256((const void *)low);
  __m256i lanes = _mm256_loadu_si256((const void *)sums);
#ifdef __AVXVNNI__
  (void)w;
  __m256i high_sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), unsigned_codes, high8);
  __m256i low_sums = _mm256_dpbusd_avx_epi32(lanes, unsigned_codes, low8);
#else
  high8 = _mm256_sign_epi8(high8, w);
  low8 = _mm256_sign_epi8(low8, w);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i high_sums = _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_codes, high8), ones);
  __m256i low_sums = _mm256_add_epi32(lanes, _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_codes, low8), ones));
#endif
  return _mm256_add_epi32(_mm256_slli_epi32(high_sums, 8), low_sums);
}

/* The 8 lanes of one INT8 block: codes at `codes`, activation codes high, low, starting values `sums`. */
static inline __m256i int8_block_products(const char *codes, const int8_t *high, const int8_t *low,
                                          const int32_t *sums) {
  __m256i w = _mm256_loadu_si256((const void *)codes);
  return int8_products(w, int8_unsigned_codes(w), high, low, sums);
}

/* Two INT4 blocks' 32 bytes at `codes` (n_blocks 1 or 2; a missing block's bytes are zero) as code + 8 (each
 * nibble's sign bit flipped): their low nibbles and their high nibbles, one byte each. */
static inline void int4_pair_codes(const char *codes, int n_blocks, __m256i *low_codes, __m256i *high_codes) {
  __m256i bytes = n_blocks == 2 ? _mm256_loadu_si256((const void *)codes)
                                : _mm256_zextsi128_si256(_mm_loadu_si128((const void *)codes));
  bytes = _mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x88));
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  *low_codes = _mm256_and_si256(bytes, nibble);
  *high_codes = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
}

/* The 8 lanes of two INT4 blocks (int4_pair_codes; a missing block's x codes and sums are zero too): the low nibbles
 * meet 32 bytes of each plane at `high`, `low`, the high nibbles the 32 at + 64. */
static inline __m256i int4_pair_products(__m256i low_codes, __m256i high_codes, const int8_t *high, const int8_t *low,
                                         const int32_t *sums) {
  __m256i lanes = _mm256_loadu_si256((const void *)sums);
#define EDGE_LOAD256(p) _mm256_loadu_si256((const void *)(p))
#ifdef __AVXVNNI__
  __m256i high_sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), low_codes, EDGE_LOAD256(high));
  high_sums = _mm256_dpbusd_avx_epi32(high_sums, high_codes, EDGE_LOAD256(high + 64));
  __m256i low_sums = _mm256_dpbusd_avx_epi32(lanes, low_codes, EDGE_LOAD256(low));
  low_sums = _mm256_dpbusd_avx_epi32(low_sums, high_codes, EDGE_LOAD256(low + 64));
#else
  /* (code + 8) x: at most 15 * 127, four of them fit an int16 */
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i high_pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low_codes, EDGE_LOAD256(high)),
                                        _mm256_maddubs_epi16(high_codes, EDGE_LOAD256(high + 64)));
  __m256i low_pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low_codes, EDGE_LOAD256(low)),
                                       _mm256_maddubs_epi16(high_codes, EDGE_LOAD256(low + 64)));
  __m256i high_sums = _mm256_madd_epi16(high_pairs, ones);
  __m256i low_sums = _mm256_add_epi32(lanes, _mm256_madd_epi16(low_pairs, ones));
#endif
#undef EDGE_LOAD256
  return _mm256_add_epi32(_mm256_slli_epi32(high_sums, 8), low_sums);
}

/* The 8 lanes of two INT4 blocks at `codes` (n_blocks 1 or 2) times the planes at `high`, `low`. */
static inline __m256i int4_block_pair_products(const char *codes, int n_blocks, const int8_t *high, const int8_t *low,
                                               const int32_t *sums) {
  __m256i low_codes, high_codes;
  int4_pair_codes(codes, n_blocks, &low_codes, &high_codes);
  return int4_pair_products(low_codes, high_codes, high, low, sums);
}

/* Lane l's block within the 8 blocks of a step, for the lanes of one half unit: INT4 half h of unit k holds blocks
 * 4k + 2h (lanes 0..3) and 4k + 2h + 1 (lanes 4..7), INT8 half h of unit k block 2k + h (all 8 lanes). */
static inline __m256i half_unit_blocks(int dtype, int unit_in_step, int half) {
  return dtype == EDGE_Q4 ? _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                                             _mm256_set1_epi32(4 * unit_in_step + 2 * half))
                          : _mm256_set1_epi32(2 * unit_in_step + half);
}

/* A row's 16 accumulator lanes in an integer dot step: two ymm halves on AVX2 (half[0] lanes 0..7, half[1] 8..15),
 * one vec16 (one zmm) on AVX-512; EDGE_STEP_BLOCKS blocks per step. */
typedef struct {
  __m256 half[2];
} step_lanes;
#define EDGE_STEP_BLOCKS 8

static inline void zero_step_lanes(step_lanes *lanes) { lanes->half[0] = lanes->half[1] = _mm256_setzero_ps(); }

/* even + odd (+ corr) lane by lane, then the 16 lanes pairwise as sum_lanes (l + 8, then hsum). */
static inline float step_total(const step_lanes *even, const step_lanes *odd, const step_lanes *corr) {
  __m256 low = _mm256_add_ps(even->half[0], odd->half[0]), high = _mm256_add_ps(even->half[1], odd->half[1]);
  if (corr != NULL) {
    low = _mm256_add_ps(low, corr->half[0]);
    high = _mm256_add_ps(high, corr->half[1]);
  }
  return hsum(_mm256_add_ps(low, high));
}

/* acc[t] += the lanes of unit k of the step (its first unit first_unit; present of its blocks there, more meaning all)
 * of rows row[t < n] times their factors, prefetching the rows next[t] at the same offset. */
EDGE_ALWAYS_INLINE void add_unit_products(int n, const char *const *row, int dtype,
                                          const struct quantized_activations *xa, int first_unit, int k, int present,
                                          const char *const *next, const __m256 *block_factors, step_lanes *acc) {
  int unit = first_unit + k;
  const int32_t *sums = xa->code_offset_sums + (size_t)unit * EDGE_UNIT_LANES;
#pragma GCC unroll 4
  for (int t = 0; t < n; t++) EDGE_PREFETCH(next[t], (size_t)unit * 64);
#pragma GCC unroll 2
  for (int half = 0; half < 2; half++) {
    __m256i blocks_of_lanes = half_unit_blocks(dtype, k, half);
#pragma GCC unroll 4
    for (int t = 0; t < n; t++) {
      const char *codes = row[t] + (size_t)unit * 64 + 32 * half;
      __m256i products = _mm256_setzero_si256();
      if (dtype == EDGE_Q4) {
        size_t first = (size_t)unit * EDGE_MAX_UNIT_VALUES + 32 * (size_t)half;
        int in_pair = present - 2 * half < 2 ? present - 2 * half : 2;
        if (in_pair > 0) {
          products = int4_block_pair_products(codes, in_pair, xa->high + first, xa->low + first, sums + 8 * half);
        }
      } else if (half < present) {
        size_t at = (size_t)unit * 64 + (size_t)half * EDGE_QUANT_BLOCK;
        products = int8_block_products(codes, xa->high + at, xa->low + at, sums + 8 * half);
      }
      __m256 factors = _mm256_permutevar8x32_ps(block_factors[t], blocks_of_lanes);
      acc[t].half[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), factors, acc[t].half[half]);
    }
  }
}

/* One AVX2 step of at most 8 blocks from first_block (a multiple of 8): its units and groups. */
struct step_shape {
  __m256i group_of_block; /* block b's group within the step */
  int per_unit, first_unit, units, n_groups;
  size_t first_group;
};

EDGE_ALWAYS_INLINE struct step_shape step_shape_of(int dtype, int group_log, int first_block, int step_blocks) {
  struct step_shape shape;
  shape.group_of_block = _mm256_srlv_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(group_log));
  shape.per_unit = unit_blocks(dtype);
  shape.first_unit = first_block / shape.per_unit;
  shape.units = (step_blocks + shape.per_unit - 1) / shape.per_unit;
  shape.first_group = (size_t)first_block >> group_log;
  shape.n_groups = ((step_blocks - 1) >> group_log) + 1;
  return shape;
}

/* A row's fp16 values per group (its scales or minimums) for each block of the step, widened. */
EDGE_ALWAYS_INLINE __m256 step_group_values(const uint16_t *halves, const struct step_shape *shape) {
  return _mm256_permutevar8x32_ps(load_halves(halves + shape->first_group, shape->n_groups), shape->group_of_block);
}

/* The AVX2 form of the integer dot step: blocks [first_block, first_block + step_blocks) of rows row[t < n] into
 * their even and odd units' accumulators (step_lanes), step_blocks at most 8 and first_block a multiple of 8 (so the
 * step starts at an even unit: 2 INT4 or 4 INT8 units). As AVX-512's int_dot_step, the step's factors are one vector
 * product of the rows' and x's block scales, spread over each half unit's lanes by one permutation: the products the
 * portable path puts in each lane, so the same bits. Everything stays in ymm registers: the vec16 code that served AVX2 before went through
 * the stack (benchmarks/README.md, section 3, "The AVX2 build"). A missing block's lanes add 0 * 0, as elsewhere;
 * asymmetric rows' corrections go to lanes first_block % 16 + 0..7, block by block as block_corrections does. */
EDGE_ALWAYS_INLINE void int_dot_step(int n, const char *const *row, const uint16_t *const *scales, int dtype,
                                     int group_log, const struct quantized_activations *xa, int first_block,
                                     int step_blocks, const char *const *next, const uint16_t *const *next_scales,
                                     step_lanes *even, step_lanes *odd, int asymmetric, const uint16_t *const *mins,
                                     const uint16_t *const *next_mins, step_lanes *corr) {
  struct step_shape shape = step_shape_of(dtype, group_log, first_block, step_blocks);
  __m256 x_scales = load_floats(xa->block_scales + first_block, step_blocks);
  __m256 x_sums = asymmetric ? load_floats(xa->block_sums + first_block, step_blocks) : _mm256_setzero_ps();
  __m256 block_factors[EDGE_ROWS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    if ((shape.first_group * sizeof(uint16_t)) % EDGE_CACHE_LINE == 0) {
      EDGE_PREFETCH(next_scales[t], shape.first_group * sizeof(uint16_t));
      if (asymmetric) EDGE_PREFETCH(next_mins[t], shape.first_group * sizeof(uint16_t));
    }
    __m256 row_scales = step_group_values(scales[t], &shape);
    block_factors[t] = _mm256_mul_ps(row_scales, x_scales);
    if (asymmetric) {
      __m256 mids = _mm256_fmadd_ps(row_scales, _mm256_set1_ps(8.0f), step_group_values(mins[t], &shape));
      int half = (first_block / 8) % 2;
      corr[t].half[half] = _mm256_fmadd_ps(mids, x_sums, corr[t].half[half]);
    }
  }
  for (int k = 0; k < shape.units; k += 2) {
    int even_blocks = step_blocks - k * shape.per_unit, odd_blocks = even_blocks - shape.per_unit;
    add_unit_products(n, row, dtype, xa, shape.first_unit, k, even_blocks, next, block_factors, even);
    if (k + 1 < shape.units) {
      add_unit_products(n, row, dtype, xa, shape.first_unit, k + 1, odd_blocks, next, block_factors, odd);
    }
  }
}

/* Tokens of a block whose x one row meets at once (int_dot_tokens): each token's even and odd accumulators are 4 of
 * the 16 ymm registers. */
#define EDGE_TOKENS_AT_ONCE 2

/* add_unit_products for one row and the x of n tokens (xa[t], t < n): each half unit's codes loaded (INT4: split
 * into nibbles) once for the n tokens, then each token's products, factors and fused multiply-add as
 * add_unit_products computes them for that row and that x, so each token's bits are those of add_unit_products. */
EDGE_ALWAYS_INLINE void add_unit_products_tokens(int n, const char *row, int dtype,
                                                 const struct quantized_activations *const *xa, int first_unit, int k,
                                                 int present, const char *next, const __m256 *block_factors,
                                                 step_lanes *acc) {
  int unit = first_unit + k;
  EDGE_PREFETCH(next, (size_t)unit * 64);
#pragma GCC unroll 2
  for (int half = 0; half < 2; half++) {
    __m256i blocks_of_lanes = half_unit_blocks(dtype, k, half);
    const char *codes = row + (size_t)unit * 64 + 32 * half;
    size_t first = (size_t)unit * EDGE_MAX_UNIT_VALUES + 32 * (size_t)half, at = (size_t)unit * 64 + 32 * half;
    int in_pair = present - 2 * half < 2 ? present - 2 * half : 2;
    int has_products = dtype == EDGE_Q4 ? in_pair > 0 : half < present;
    __m256i low_nibbles = _mm256_setzero_si256(), high_nibbles = _mm256_setzero_si256(); /* INT4 */
    __m256i int8_codes = _mm256_setzero_si256(), int8_unsigned = _mm256_setzero_si256();
    if (has_products && dtype == EDGE_Q4) {
      int4_pair_codes(codes, in_pair, &low_nibbles, &high_nibbles);
    } else if (has_products) {
      int8_codes = _mm256_loadu_si256((const void *)codes);
      int8_unsigned = int8_unsigned_codes(int8_codes);
    }
#pragma GCC unroll 2
    for (int t = 0; t < n; t++) {
      const int32_t *sums = xa[t]->code_offset_sums + (size_t)unit * EDGE_UNIT_LANES + 8 * half;
      __m256i products = _mm256_setzero_si256();
      if (has_products && dtype == EDGE_Q4) {
        products = int4_pair_products(low_nibbles, high_nibbles, xa[t]->high + first, xa[t]->low + first, sums);
      } else if (has_products) {
        products = int8_products(int8_codes, int8_unsigned, xa[t]->high + at, xa[t]->low + at, sums);
      }
      __m256 factors = _mm256_permutevar8x32_ps(block_factors[t], blocks_of_lanes);
      acc[t].half[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), factors, acc[t].half[half]);
    }
  }
}

/* int_dot_step for one row and the x of n tokens (xa[t], t < n): the row's group scales (and minimums) widened once
 * per step and its codes once per half unit (add_unit_products_tokens), each token's factors, corrections and
 * accumulators as int_dot_step computes them for that row and that x, so each token's bits are those of
 * int_dot_step. */
EDGE_ALWAYS_INLINE void int_dot_step_tokens(int n, const char *row, const uint16_t *scales, int dtype, int group_log,
                                            const struct quantized_activations *const *xa, int first_block,
                                            int step_blocks, const char *next, const uint16_t *next_scales,
                                            step_lanes *even, step_lanes *odd, int asymmetric, const uint16_t *mins,
                                            const uint16_t *next_mins, step_lanes *corr) {
  struct step_shape shape = step_shape_of(dtype, group_log, first_block, step_blocks);
  if ((shape.first_group * sizeof(uint16_t)) % EDGE_CACHE_LINE == 0) {
    EDGE_PREFETCH(next_scales, shape.first_group * sizeof(uint16_t));
    if (asymmetric) EDGE_PREFETCH(next_mins, shape.first_group * sizeof(uint16_t));
  }
  __m256 row_scales = step_group_values(scales, &shape);
  __m256 mids = _mm256_setzero_ps();
  if (asymmetric) mids = _mm256_fmadd_ps(row_scales, _mm256_set1_ps(8.0f), step_group_values(mins, &shape));
  __m256 block_factors[EDGE_TOKENS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    block_factors[t] = _mm256_mul_ps(row_scales, load_floats(xa[t]->block_scales + first_block, step_blocks));
    if (asymmetric) {
      int half = (first_block / 8) % 2;
      __m256 x_sums = load_floats(xa[t]->block_sums + first_block, step_blocks);
      corr[t].half[half] = _mm256_fmadd_ps(mids, x_sums, corr[t].half[half]);
    }
  }
  for (int k = 0; k < shape.units; k += 2) {
    int even_blocks = step_blocks - k * shape.per_unit, odd_blocks = even_blocks - shape.per_unit;
    add_unit_products_tokens(n, row, dtype, xa, shape.first_unit, k, even_blocks, next, block_factors, even);
    if (k + 1 < shape.units) {
      add_unit_products_tokens(n, row, dtype, xa, shape.first_unit, k + 1, odd_blocks, next, block_factors, odd);
    }
  }
}

#elif defined(__ARM_NEON)
/* The 4 lanes of 16 signed codes times 16 activation codes: sdot, or widening multiplies and pairwise adds
 * (|a b| <= 127 * 127, so two products fit an int16). */
static inline int32x4_t lane_products(int8x16_t codes, int8x16_t xq) {
#ifdef __ARM_FEATURE_DOTPROD
  return vdotq_s32(vdupq_n_s32(0), codes, xq);
#else
  int16x8_t low = vmull_s8(vget_low_s8(codes), vget_low_s8(xq)), high = vmull_high_s8(codes, xq);
  return vpaddlq_s16(vpaddq_s16(low, high));
#endif
}

/* 256 (codes . high) + codes . low over 16 values, in 4 lanes. */
static inline int32x4_t two_plane_products(int8x16_t codes, const int8_t *high, const int8_t *low) {
  return vaddq_s32(vshlq_n_s32(lane_products(codes, vld1q_s8(high)), 8), lane_products(codes, vld1q_s8(low)));
}

/* The 8 lanes of one INT8 block. */
static inline void int8_block_products(const char *codes, const int8_t *high, const int8_t *low, int32x4_t out[2]) {
  out[0] = two_plane_products(load_codes16(codes), high, low);
  out[1] = two_plane_products(load_codes16(codes + 16), high + 16, low + 16);
}

/* The 4 lanes of one INT4 block's 16 low-nibble codes times xl and 16 high-nibble codes times xh: lane i sums
 * values 4i..4i+3 of each (sdot accumulates both into the same lanes; without it the int16 pair sums of both are
 * added before widening: four products of at most 8 * 127). */
static inline int32x4_t nibble_lane_products(int32x4_t start, int8x16_t low_codes, int8x16_t high_codes, int8x16_t xl,
                                             int8x16_t xh) {
#ifdef __ARM_FEATURE_DOTPROD
  return vdotq_s32(vdotq_s32(start, low_codes, xl), high_codes, xh);
#else
  int16x8_t low_pairs = vpaddq_s16(vmull_s8(vget_low_s8(low_codes), vget_low_s8(xl)), vmull_high_s8(low_codes, xl));
  int16x8_t high_pairs =
      vpaddq_s16(vmull_s8(vget_low_s8(high_codes), vget_low_s8(xh)), vmull_high_s8(high_codes, xh));
  return vaddq_s32(start, vpaddlq_s16(vaddq_s16(low_pairs, high_pairs)));
#endif
}

/* The 4 lanes of one INT4 block whose x codes start at high, low (its low nibbles' values) and + 64 (its high
 * nibbles' values): the high plane's sums, shifted, start the low plane's. */
static inline int32x4_t int4_split_block_products(int8x16_t low_codes, int8x16_t high_codes, const int8_t *high,
                                                  const int8_t *low) {
  int32x4_t high_sums = nibble_lane_products(vdupq_n_s32(0), low_codes, high_codes, vld1q_s8(high),
                                             vld1q_s8(high + 64));
  return nibble_lane_products(vshlq_n_s32(high_sums, 8), low_codes, high_codes, vld1q_s8(low), vld1q_s8(low + 64));
}

static inline int32x4_t int4_block_products(const char *codes, const int8_t *high, const int8_t *low) {
  codes16 bytes = load_codes16(codes);
  return int4_split_block_products(low_nibbles(bytes), high_nibbles(bytes), high, low);
}

/* A unit's 16 accumulator lanes as four q registers (quarter q: lanes 4q..4q + 3). The portable path's vec16 went
 * through the stack here, in and out of the unions that split it into quarters (14 q-register loads and stores per
 * unit of an INT4 matvec, counted under qemu). */
typedef struct {
  float32x4_t quarter[4];
} unit_accumulator;

static inline void zero_accumulator(unit_accumulator *acc) {
  for (int q = 0; q < 4; q++) acc->quarter[q] = vdupq_n_f32(0);
}

/* Halves p[0] and p[1] as one 32-bit word (p need not be 4-byte aligned). */
static inline uint32_t two_halves(const uint16_t *p) {
  uint32_t word;
  memcpy(&word, p, sizeof word);
  return word;
}

/* The group scales of the 4 blocks of a whole INT4 unit from first_block (lane b: block first_block + b), widened
 * from fp16: one load and one conversion per unit instead of a group index, a scalar load and a conversion per block
 * (and the spills their registers caused: benchmarks/README.md, section 3, the NEON build). */
EDGE_ALWAYS_INLINE float32x4_t int4_unit_scales(const uint16_t *scales, int group_log, int first_block) {
  if (group_log == 0) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(scales + first_block)));
  if (group_log == 1) { /* groups g, g + 1 to lanes 0, 1 and 2, 3 */
    float32x4_t two = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(two_halves(scales + (first_block >> 1)))));
    return vzip1q_f32(two, two);
  }
  return vdupq_n_f32(scale_at(scales, (size_t)(first_block >> 2)));
}

/* The group scales of the 2 blocks of a whole INT8 unit from first_block (lane b: block first_block + b). */
EDGE_ALWAYS_INLINE float32x2_t int8_unit_scales(const uint16_t *scales, int group_log, int first_block) {
  if (group_log == 0) {
    return vget_low_f32(vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(two_halves(scales + first_block)))));
  }
  return vdup_n_f32(scale_at(scales, (size_t)(first_block >> group_log)));
}

/* The factors of a unit's blocks (lane b: block first_block + b; the blocks past n_blocks 0): x's block scale times
 * the row's group scale (the product every build's lanes take), one vector product per whole unit. INT4: 4 blocks. */
EDGE_ALWAYS_INLINE float32x4_t int4_unit_factors(const float *x_scales, const uint16_t *scales, int group_log,
                                                 int first_block, int n_blocks) {
  float32x4_t factors;
  if (n_blocks == 4) {
    factors = vmulq_f32(vld1q_f32(x_scales), int4_unit_scales(scales, group_log, first_block));
  } else { /* a row's last, partial unit */
    float partial[4] = {0};
    for (int b = 0; b < n_blocks; b++) {
      partial[b] = x_scales[b] * scale_at(scales, (size_t)((first_block + b) >> group_log));
    }
    factors = vld1q_f32(partial);
  }
  return factors;
}

/* INT8: 2 blocks. */
EDGE_ALWAYS_INLINE float32x2_t int8_unit_factors(const float *x_scales, const uint16_t *scales, int group_log,
                                                 int first_block, int n_blocks) {
  float32x2_t factors;
  if (n_blocks == 2) {
    factors = vmul_f32(vld1_f32(x_scales), int8_unit_scales(scales, group_log, first_block));
  } else {
    factors = vset_lane_f32(x_scales[0] * scale_at(scales, (size_t)(first_block >> group_log)), vdup_n_f32(0), 0);
  }
  return factors;
}

/* acc += unit `unit`'s lanes (n_blocks of its blocks present; the others add 0 * 0) times their factors, quarter by
 * quarter: the portable path's unit_lanes, unit_factors and fused_multiply_add16, each quarter's fused
 * multiply-add taking its block's lane of the unit's factors. */
EDGE_ALWAYS_INLINE void int_dot_unit(const char *row, const uint16_t *scales, int dtype, int group_log,
                                     const struct quantized_activations *xa, int unit, int n_blocks,
                                     unit_accumulator *acc) {
  const char *codes = row + (size_t)unit * 64;
  int first_block = unit * unit_blocks(dtype);
  const float *x_scales = xa->block_scales + first_block;
  int32x4_t products[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  if (dtype == EDGE_Q4) {
    size_t first = (size_t)unit * EDGE_MAX_UNIT_VALUES;
    for (int b = 0; b < n_blocks; b++) {
      products[b] = int4_block_products(codes + 16 * b, xa->high + first + 16 * b, xa->low + first + 16 * b);
    }
    float32x4_t factors = int4_unit_factors(x_scales, scales, group_log, first_block, n_blocks);
    acc->quarter[0] = vfmaq_laneq_f32(acc->quarter[0], vcvtq_f32_s32(products[0]), factors, 0);
    acc->quarter[1] = vfmaq_laneq_f32(acc->quarter[1], vcvtq_f32_s32(products[1]), factors, 1);
    acc->quarter[2] = vfmaq_laneq_f32(acc->quarter[2], vcvtq_f32_s32(products[2]), factors, 2);
    acc->quarter[3] = vfmaq_laneq_f32(acc->quarter[3], vcvtq_f32_s32(products[3]), factors, 3);
  } else {
    for (int b = 0; b < n_blocks; b++) {
      size_t at = (size_t)unit * 64 + (size_t)b * EDGE_QUANT_BLOCK;
      int8_block_products(codes + 32 * b, xa->high + at, xa->low + at, products + 2 * b);
    }
    float32x2_t factors = int8_unit_factors(x_scales, scales, group_log, first_block, n_blocks);
    acc->quarter[0] = vfmaq_lane_f32(acc->quarter[0], vcvtq_f32_s32(products[0]), factors, 0);
    acc->quarter[1] = vfmaq_lane_f32(acc->quarter[1], vcvtq_f32_s32(products[1]), factors, 0);
    acc->quarter[2] = vfmaq_lane_f32(acc->quarter[2], vcvtq_f32_s32(products[2]), factors, 1);
    acc->quarter[3] = vfmaq_lane_f32(acc->quarter[3], vcvtq_f32_s32(products[3]), factors, 1);
  }
}

/* Tokens of a block whose x one row meets at once (int_dot_tokens): each token's 8 accumulator registers (even and odd
 * units) and its unit's factors; 2 tokens leave the codes, x and products their registers of the 32. */
#define EDGE_TOKENS_AT_ONCE 2
_Static_assert(EDGE_TOKENS_AT_ONCE <= EDGE_CORRECTION_TOKENS, "one pass of corrections per row");

/* acc + products * lane `lane` of factors (one rounding), the lane a constant once inlined. */
EDGE_ALWAYS_INLINE float32x4_t fma_by_lane(float32x4_t acc, int32x4_t products, float32x4_t factors, int lane) {
  float32x4_t values = vcvtq_f32_s32(products);
  switch (lane) {
    case 0: return vfmaq_laneq_f32(acc, values, factors, 0);
    case 1: return vfmaq_laneq_f32(acc, values, factors, 1);
    case 2: return vfmaq_laneq_f32(acc, values, factors, 2);
    default: return vfmaq_laneq_f32(acc, values, factors, 3);
  }
}

/* int_dot_unit for one row and the x of n tokens (xa[t], t < n): the unit's factors per token, then block by block
 * the codes loaded (and INT4's split into nibbles) once and each token's products added to its quarters at once, so
 * that no token's products wait in registers. Each fused multiply-add is int_dot_unit's for that row and that x
 * (those of the blocks past n_blocks too, with zero products), so each token's bits are those of int_dot_unit. */
EDGE_ALWAYS_INLINE void int_dot_unit_tokens(int n, const char *row, const uint16_t *scales, int dtype, int group_log,
                                            const struct quantized_activations *const *xa, int unit, int n_blocks,
                                            unit_accumulator *acc) {
  const char *codes = row + (size_t)unit * 64;
  int first_block = unit * unit_blocks(dtype);
  if (dtype == EDGE_Q4) {
    size_t first = (size_t)unit * EDGE_MAX_UNIT_VALUES;
    float32x4_t factors[EDGE_TOKENS_AT_ONCE];
    for (int t = 0; t < n; t++) {
      factors[t] = int4_unit_factors(xa[t]->block_scales + first_block, scales, group_log, first_block, n_blocks);
    }
    for (int b = 0; b < 4; b++) { /* a partial unit's missing blocks load block 0 again: never past the row */
      codes16 bytes = load_codes16(codes + 16 * (b < n_blocks ? b : 0));
      int8x16_t low_codes = low_nibbles(bytes), high_codes = high_nibbles(bytes);
      for (int t = 0; t < n; t++) {
        size_t at = first + 16 * (size_t)b;
        int32x4_t products = b < n_blocks ? int4_split_block_products(low_codes, high_codes, xa[t]->high + at,
                                                                      xa[t]->low + at)
                                          : vdupq_n_s32(0);
        acc[t].quarter[b] = fma_by_lane(acc[t].quarter[b], products, factors[t], b);
      }
    }
  } else {
    float32x2_t factors[EDGE_TOKENS_AT_ONCE];
    for (int t = 0; t < n; t++) {
      factors[t] = int8_unit_factors(xa[t]->block_scales + first_block, scales, group_log, first_block, n_blocks);
    }
    for (int b = 0; b < 2; b++) { /* as INT4's */
      codes16 first_half = load_codes16(codes + 32 * (b < n_blocks ? b : 0));
      codes16 second_half = load_codes16(codes + 32 * (b < n_blocks ? b : 0) + 16);
      size_t at = (size_t)unit * 64 + (size_t)b * EDGE_QUANT_BLOCK;
      for (int t = 0; t < n; t++) {
        int32x4_t first_products = vdupq_n_s32(0), second_products = vdupq_n_s32(0);
        if (b < n_blocks) {
          first_products = two_plane_products(first_half, xa[t]->high + at, xa[t]->low + at);
          second_products = two_plane_products(second_half, xa[t]->high + at + 16, xa[t]->low + at + 16);
        }
        float32x4_t lane_factors = vcombine_f32(factors[t], factors[t]); /* lane b of the pair: lanes b and 2 + b */
        acc[t].quarter[2 * b] = fma_by_lane(acc[t].quarter[2 * b], first_products, lane_factors, b);
        acc[t].quarter[2 * b + 1] = fma_by_lane(acc[t].quarter[2 * b + 1], second_products, lane_factors, b);
      }
    }
  }
}

/* Lane by lane even + odd (+ the asymmetric rows' corrections), then summed as sum_lanes does. */
static inline float unit_accumulators_sum(const unit_accumulator *even, const unit_accumulator *odd,
                                          const float *corrections) {
  float32x4_t q[4];
  for (int i = 0; i < 4; i++) {
    q[i] = vaddq_f32(even->quarter[i], odd->quarter[i]);
    if (corrections != NULL) q[i] = vaddq_f32(q[i], vld1q_f32(corrections + 4 * i));
  }
  return sum_quarters(q);
}

/* out[t] = row . x_t through the quantized planes xa[t] of n tokens (1 or EDGE_TOKENS_AT_ONCE, a constant once
 * inlined), prefetching the row `next`: the units in int_dot_rows' order (even and odd accumulators, a last partial
 * unit), each unit's codes loaded once for all n tokens (int_dot_unit_tokens), so each token's value is the bits
 * int_dot_rows gives that row and that x. */
EDGE_ALWAYS_INLINE void int_dot_tokens(int n, const char *row, const uint16_t *scales, const uint16_t *mins, int dtype,
                                       int group_size, const struct quantized_activations *const *xa, int d,
                                       const char *next, const uint16_t *next_scales, const uint16_t *next_mins,
                                       int asymmetric, float *out) {
  int blocks = d / EDGE_QUANT_BLOCK;
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2;
  unit_accumulator even[EDGE_TOKENS_AT_ONCE], odd[EDGE_TOKENS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    zero_accumulator(&even[t]);
    zero_accumulator(&odd[t]);
  }
  int per_unit = unit_blocks(dtype), unit = 0, full_units = blocks / per_unit, partial_blocks = blocks % per_unit;
  for (; unit + 2 <= full_units; unit += 2) {
    EDGE_PREFETCH(next, (size_t)unit * 64);
    EDGE_PREFETCH(next, (size_t)(unit + 1) * 64);
    if (((unit * per_unit) & ((32 << group_log) - 1)) < 2 * per_unit) {
      EDGE_PREFETCH(next_scales, (size_t)((unit * per_unit) >> group_log) * sizeof(uint16_t));
      if (asymmetric) EDGE_PREFETCH(next_mins, (size_t)((unit * per_unit) >> group_log) * sizeof(uint16_t));
    }
    int_dot_unit_tokens(n, row, scales, dtype, group_log, xa, unit, per_unit, even);
    int_dot_unit_tokens(n, row, scales, dtype, group_log, xa, unit + 1, per_unit, odd);
  }
  if (unit < full_units) {
    EDGE_PREFETCH(next, (size_t)unit * 64);
    int_dot_unit_tokens(n, row, scales, dtype, group_log, xa, unit, per_unit, even);
    unit++;
  }
  if (partial_blocks != 0) {
    EDGE_PREFETCH(next, (size_t)unit * 64);
    if (unit % 2 == 0) {
      int_dot_unit_tokens(n, row, scales, dtype, group_log, xa, unit, partial_blocks, even);
    } else {
      int_dot_unit_tokens(n, row, scales, dtype, group_log, xa, unit, partial_blocks, odd);
    }
  }
  float corrections[EDGE_TOKENS_AT_ONCE][16];
  if (asymmetric) {
    const float *block_sums[EDGE_TOKENS_AT_ONCE];
    for (int t = 0; t < n; t++) block_sums[t] = xa[t]->block_sums;
    block_corrections_tokens(n, scales, mins, group_log, block_sums, blocks, corrections);
  }
  for (int t = 0; t < n; t++) out[t] = unit_accumulators_sum(&even[t], &odd[t], asymmetric ? corrections[t] : NULL);
}

#else /* portable C */
/* Signed code j of a block. */
static inline int32_t block_code(const char *codes, int dtype, int j) {
  if (dtype == EDGE_Q8) return (int8_t)codes[j];
  uint8_t byte = (uint8_t)codes[j % 16];
  int32_t nibble = j < 16 ? byte & 0x0f : byte >> 4;
  return (nibble ^ 8) - 8; /* the 4-bit two's complement, sign-extended */
}

/* The lanes of block `block` of a row, its codes at `codes`. */
static inline void block_products(const char *codes, int dtype, int block, const struct quantized_activations *xa,
                                  int32_t *out) {
  int lanes = block_lanes(dtype);
  for (int l = 0; l < lanes; l++) {
    int32_t high_sum = 0, low_sum = 0;
    for (int k = 0; k < EDGE_QUANT_BLOCK / lanes; k++) {
      int j = lane_value(dtype, l, k);
      int32_t code = block_code(codes, dtype, j);
      size_t at = plane_position(dtype, block, j);
      high_sum += code * xa->high[at];
      low_sum += code * xa->low[at];
    }
    out[l] = 256 * high_sum + low_sum;
  }
}

/* fmaf rounds once, as the vector FMAs of the other paths do (a library call where the target has no FMA). */
EDGE_ALWAYS_INLINE void fused_multiply_add16(vec16 *acc, const ivec16 *products, const vec16 *factors) {
  float lanes[16], f[16];
  int32_t p[16];
  memcpy(lanes, acc, sizeof lanes);
  memcpy(f, factors, sizeof f);
  memcpy(p, products, sizeof p);
  for (int l = 0; l < 16; l++) lanes[l] = fmaf((float)p[l], f[l], lanes[l]);
  memcpy(acc, lanes, sizeof lanes);
}
#endif

#if !EDGE_ROWS_AVX2 && !defined(__ARM_NEON)
/* The 16 lanes of unit `unit` of a row (n_blocks of its blocks present; the other lanes 0). */
EDGE_ALWAYS_INLINE void unit_lanes(const char *row, int dtype, int unit, const struct quantized_activations *xa,
                                   int n_blocks, ivec16 *out) {
  const char *codes = row + (size_t)unit * 64;
  union {
    ivec16 all;
    int32_t lane[16];
  } lanes = {{0}};
  int per_block = block_lanes(dtype);
  for (int b = 0; b < n_blocks; b++) {
    block_products(codes + b * block_bytes(dtype), dtype, unit * unit_blocks(dtype) + b, xa,
                   lanes.lane + per_block * b);
  }
  *out = lanes.all;
}
#endif

#endif

#if EDGE_ROWS_AVX512
/* A unit's codes, unpacked once for the x they meet (unit_codes_products). */
EDGE_ALWAYS_INLINE void unit_codes(const char *row, int dtype, int unit, int n_blocks, struct unit_codes *codes) {
  if (dtype == EDGE_Q4) {
    int4_unit_codes(row, unit, n_blocks, codes);
  } else {
    int8_unit_codes(row, unit, n_blocks, codes);
  }
}

EDGE_ALWAYS_INLINE void unit_codes_products(const struct unit_codes *codes, int dtype, int unit,
                                            const struct quantized_activations *xa, int n_blocks, ivec16 *out) {
  if (dtype == EDGE_Q4) {
    int4_codes_products(codes, unit, xa, out);
  } else {
    int8_codes_products(codes, unit, xa, n_blocks, out);
  }
}

/* The integer lanes of a unit of a row with x's planes. */
EDGE_ALWAYS_INLINE void unit_lanes(const char *row, int dtype, int unit, const struct quantized_activations *xa,
                                   int n_blocks, ivec16 *out) {
  struct unit_codes codes;
  unit_codes(row, dtype, unit, n_blocks, &codes);
  unit_codes_products(&codes, dtype, unit, xa, n_blocks, out);
}

/* Lane l's block within a unit: l / 4 (INT4) or l / 8 (INT8), as int32 lanes for permutations. */
static inline __m512i lane_blocks(int dtype) {
  return dtype == EDGE_Q4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                          : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
}

#elif !EDGE_ROWS_AVX2 && !defined(__ARM_NEON)
typedef vec16 unit_accumulator;

static inline void zero_accumulator(vec16 *acc) { *acc = (vec16){0}; }

/* Lane by lane even + odd (+ the asymmetric rows' corrections), then summed pairwise. */
static inline float unit_accumulators_sum(const vec16 *even, const vec16 *odd, const float *corrections) {
  vec16 acc = *even + *odd;
  if (corrections != NULL) acc += VEC16_AT(corrections);
  return sum_lanes(&acc);
}

EDGE_ALWAYS_INLINE void unit_factors(const struct quantized_activations *xa, const uint16_t *scales, int dtype,
                                     int group_log, int unit, int n_blocks, vec16 *out) {
  int first_block = unit * unit_blocks(dtype);
  const float *x_scales = xa->block_scales + first_block;
  union {
    vec16 all;
    vec8 half[2];
    vec4 quarter[4];
  } f = {{0}};
  if (dtype == EDGE_Q4) {
    for (int b = 0; b < n_blocks; b++) {
      float scale = scale_at(scales, (size_t)((first_block + b) >> group_log));
      f.quarter[b] = (vec4){1, 1, 1, 1} * x_scales[b] * scale; /* x's block scale in each lane, times the row's */
    }
  } else {
    for (int b = 0; b < n_blocks; b++) {
      float scale = scale_at(scales, (size_t)((first_block + b) >> group_log));
      f.half[b] = (vec8){1, 1, 1, 1, 1, 1, 1, 1} * x_scales[b] * scale;
    }
  }
  *out = f.all;
}

EDGE_ALWAYS_INLINE void int_dot_unit(const char *row, const uint16_t *scales, int dtype, int group_log,
                                     const struct quantized_activations *xa, int unit, int n_blocks, vec16 *acc) {
  ivec16 products;
  vec16 factors;
  unit_lanes(row, dtype, unit, xa, n_blocks, &products);
  unit_factors(xa, scales, dtype, group_log, unit, n_blocks, &factors);
  fused_multiply_add16(acc, &products, &factors);
}
#endif

#if EDGE_ROWS_AVX512
typedef vec16 step_lanes;
#define EDGE_STEP_BLOCKS 16

static inline void zero_step_lanes(step_lanes *lanes) { *lanes = (vec16){0}; }

static inline float step_total(const step_lanes *even, const step_lanes *odd, const step_lanes *corr) {
  vec16 acc = *even + *odd;
  if (corr != NULL) acc += *corr;
  return sum_lanes(&acc);
}

/* One step of at most 16 blocks from first_block (a multiple of 16): its units, groups and masks. */
struct step_shape {
  __m512i group_of_block; /* block b's group within the step */
  __m512i first_lanes;    /* each lane's block within a unit */
  int per_unit, first_unit, units;
  size_t first_group;
  __mmask16 block_mask, group_mask;
};

EDGE_ALWAYS_INLINE struct step_shape step_shape_of(int dtype, int group_log, int first_block, int step_blocks) {
  struct step_shape shape;
  shape.group_of_block = _mm512_srlv_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(group_log));
  shape.first_lanes = lane_blocks(dtype);
  shape.per_unit = unit_blocks(dtype);
  shape.first_unit = first_block / shape.per_unit;
  shape.units = (step_blocks + shape.per_unit - 1) / shape.per_unit;
  shape.first_group = (size_t)first_block >> group_log;
  shape.block_mask = tail_mask(step_blocks);
  shape.group_mask = tail_mask(step_blocks >> group_log);
  return shape;
}

/* A row's fp16 values per group (its scales or minimums) for each block of the step, widened. */
EDGE_ALWAYS_INLINE __m512 step_group_values(const uint16_t *halves, const struct step_shape *shape) {
  __m256i loaded = _mm256_maskz_loadu_epi16(shape->group_mask, halves + shape->first_group);
  return _mm512_permutexvar_ps(shape->group_of_block, _mm512_cvtph_ps(loaded));
}

/* Blocks of the step's unit k (its last unit may be partial; <= 0 past the step), and its lanes' blocks in the step. */
EDGE_ALWAYS_INLINE int step_unit_blocks(const struct step_shape *shape, int step_blocks, int k) {
  int left = step_blocks - k * shape->per_unit;
  return left < shape->per_unit ? left : shape->per_unit;
}

EDGE_ALWAYS_INLINE __m512i step_unit_lanes(const struct step_shape *shape, int k) {
  return _mm512_add_epi32(shape->first_lanes, _mm512_set1_epi32(k * shape->per_unit));
}

/* Blocks [first_block, first_block + step_blocks) of rows row[t < n] into their even and odd units' accumulators,
 * step_blocks at most 16 and first_block a multiple of 16 (so the step starts at an even unit), prefetching the rows
 * next[t] at the same offsets. The step's factors are one vector product, spread over each unit's lanes by one
 * permutation, where converting and multiplying the scales unit by unit took a third of a unit's instructions; they
 * are the same products, so the results are the same bits. The rows' last step (fewer than 16 blocks left, its last
 * unit possibly partial) loads under masks, the missing blocks' factors 0: taken unit by unit through memory, it
 * took half the time of a 576-value row (SmolLM2's), where every row ends in such a step. */
EDGE_ALWAYS_INLINE void int_dot_step(int n, const char *const *row, const uint16_t *const *scales, int dtype,
                                     int group_log, const struct quantized_activations *xa, int first_block,
                                     int step_blocks, const char *const *next, const uint16_t *const *next_scales,
                                     vec16 *even, vec16 *odd, int asymmetric, const uint16_t *const *mins,
                                     const uint16_t *const *next_mins, vec16 *corr) {
  struct step_shape shape = step_shape_of(dtype, group_log, first_block, step_blocks);
  __m512 x_scales = _mm512_maskz_loadu_ps(shape.block_mask, xa->block_scales + first_block);
  __m512 block_factors[EDGE_ROWS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    EDGE_PREFETCH(next_scales[t], shape.first_group * sizeof(uint16_t));
    __m512 row_scales = step_group_values(scales[t], &shape);
    block_factors[t] = _mm512_mul_ps(row_scales, x_scales);
    if (asymmetric) { /* the step's 16 blocks' corrections in one FMA (lanes past the step add mid * 0) */
      EDGE_PREFETCH(next_mins[t], shape.first_group * sizeof(uint16_t));
      __m512 mids = _mm512_fmadd_ps(row_scales, _mm512_set1_ps(8.0f), step_group_values(mins[t], &shape));
      __m512 sums = _mm512_maskz_loadu_ps(shape.block_mask, xa->block_sums + first_block);
      corr[t] = (vec16)_mm512_fmadd_ps(mids, sums, (__m512)corr[t]);
    }
  }
  for (int k = 0; k < shape.units; k += 2) {
    int even_blocks = step_unit_blocks(&shape, step_blocks, k), odd_blocks = step_unit_blocks(&shape, step_blocks, k + 1);
    __m512i even_lanes = step_unit_lanes(&shape, k), odd_lanes = step_unit_lanes(&shape, k + 1);
    for (int t = 0; t < n; t++) {
      EDGE_PREFETCH(next[t], (size_t)(shape.first_unit + k) * 64);
      EDGE_PREFETCH(next[t], (size_t)(shape.first_unit + k + 1) * 64);
    }
    for (int t = 0; t < n; t++) {
      ivec16 products;
      unit_lanes(row[t], dtype, shape.first_unit + k, xa, even_blocks, &products);
      vec16 factors = (vec16)_mm512_permutexvar_ps(even_lanes, block_factors[t]);
      fused_multiply_add16(&even[t], &products, &factors);
    }
    if (odd_blocks <= 0) break;
    for (int t = 0; t < n; t++) {
      ivec16 products;
      unit_lanes(row[t], dtype, shape.first_unit + k + 1, xa, odd_blocks, &products);
      vec16 factors = (vec16)_mm512_permutexvar_ps(odd_lanes, block_factors[t]);
      fused_multiply_add16(&odd[t], &products, &factors);
    }
  }
}

/* Tokens of a block whose x one row meets at once (int_dot_tokens): each token's accumulators in registers (12 of the
 * 32 for 4 tokens, with the asymmetric rows' corrections). */
#define EDGE_TOKENS_AT_ONCE 4

/* int_dot_step for one row and the x of n tokens (xa[t], t < n): the row's codes loaded and unpacked once per unit
 * and its group scales (and minimums) widened once per step, then each token's products, factors and accumulators
 * as int_dot_step computes them for that row and that x, operation for operation, so each token's bits are those of
 * int_dot_step. */
EDGE_ALWAYS_INLINE void int_dot_step_tokens(int n, const char *row, const uint16_t *scales, int dtype, int group_log,
                                            const struct quantized_activations *const *xa, int first_block,
                                            int step_blocks, const char *next, const uint16_t *next_scales,
                                            vec16 *even, vec16 *odd, int asymmetric, const uint16_t *mins,
                                            const uint16_t *next_mins, vec16 *corr) {
  struct step_shape shape = step_shape_of(dtype, group_log, first_block, step_blocks);
  EDGE_PREFETCH(next_scales, shape.first_group * sizeof(uint16_t));
  __m512 row_scales = step_group_values(scales, &shape);
  __m512 mids = _mm512_setzero_ps();
  if (asymmetric) {
    EDGE_PREFETCH(next_mins, shape.first_group * sizeof(uint16_t));
    mids = _mm512_fmadd_ps(row_scales, _mm512_set1_ps(8.0f), step_group_values(mins, &shape));
  }
  __m512 block_factors[EDGE_TOKENS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    __m512 x_scales = _mm512_maskz_loadu_ps(shape.block_mask, xa[t]->block_scales + first_block);
    block_factors[t] = _mm512_mul_ps(row_scales, x_scales);
    if (asymmetric) {
      __m512 sums = _mm512_maskz_loadu_ps(shape.block_mask, xa[t]->block_sums + first_block);
      corr[t] = (vec16)_mm512_fmadd_ps(mids, sums, (__m512)corr[t]);
    }
  }
  for (int k = 0; k < shape.units; k += 2) {
    int even_blocks = step_unit_blocks(&shape, step_blocks, k), odd_blocks = step_unit_blocks(&shape, step_blocks, k + 1);
    __m512i even_lanes = step_unit_lanes(&shape, k), odd_lanes = step_unit_lanes(&shape, k + 1);
    EDGE_PREFETCH(next, (size_t)(shape.first_unit + k) * 64);
    EDGE_PREFETCH(next, (size_t)(shape.first_unit + k + 1) * 64);
    struct unit_codes codes;
    unit_codes(row, dtype, shape.first_unit + k, even_blocks, &codes);
    for (int t = 0; t < n; t++) {
      ivec16 products;
      unit_codes_products(&codes, dtype, shape.first_unit + k, xa[t], even_blocks, &products);
      vec16 factors = (vec16)_mm512_permutexvar_ps(even_lanes, block_factors[t]);
      fused_multiply_add16(&even[t], &products, &factors);
    }
    if (odd_blocks <= 0) break;
    unit_codes(row, dtype, shape.first_unit + k + 1, odd_blocks, &codes);
    for (int t = 0; t < n; t++) {
      ivec16 products;
      unit_codes_products(&codes, dtype, shape.first_unit + k + 1, xa[t], odd_blocks, &products);
      vec16 factors = (vec16)_mm512_permutexvar_ps(odd_lanes, block_factors[t]);
      fused_multiply_add16(&odd[t], &products, &factors);
    }
  }
}

#endif

#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2
/* out[t] = row . x_t through the quantized planes xa[t] of n tokens (1 or EDGE_TOKENS_AT_ONCE, a constant once
 * inlined), prefetching the row `next`: each token's value the bits int_dot_rows gives that row and that x. */
EDGE_ALWAYS_INLINE void int_dot_tokens(int n, const char *row, const uint16_t *scales, const uint16_t *mins, int dtype,
                                       int group_size, const struct quantized_activations *const *xa, int d,
                                       const char *next, const uint16_t *next_scales, const uint16_t *next_mins,
                                       int asymmetric, float *out) {
  int blocks = d / EDGE_QUANT_BLOCK;
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2;
  step_lanes even[EDGE_TOKENS_AT_ONCE], odd[EDGE_TOKENS_AT_ONCE], corr[EDGE_TOKENS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    zero_step_lanes(&even[t]);
    zero_step_lanes(&odd[t]);
    zero_step_lanes(&corr[t]);
  }
  int first_block = 0;
  for (; first_block + EDGE_STEP_BLOCKS <= blocks; first_block += EDGE_STEP_BLOCKS) {
    int_dot_step_tokens(n, row, scales, dtype, group_log, xa, first_block, EDGE_STEP_BLOCKS, next, next_scales, even,
                        odd, asymmetric, mins, next_mins, corr);
  }
  if (first_block < blocks) {
    int_dot_step_tokens(n, row, scales, dtype, group_log, xa, first_block, blocks - first_block, next, next_scales,
                        even, odd, asymmetric, mins, next_mins, corr);
  }
  for (int t = 0; t < n; t++) out[t] = step_total(&even[t], &odd[t], asymmetric ? &corr[t] : NULL);
}
#endif

/* out[t] = row[t] . x through x's quantized planes for t < n (1 or EDGE_ROWS_AT_ONCE, a constant once inlined),
 * prefetching the rows next[t] and their scales. Each row has its own accumulators for even and odd units (two FMA
 * chains in flight); their sum's 16 lanes are added pairwise, as quant_dot_row does. A row's operations and their
 * order do not depend on n, so neither do its bits. */
EDGE_ALWAYS_INLINE void int_dot_rows(int n, const char *const *row, const uint16_t *const *scales, int dtype,
                                     int group_size, const struct quantized_activations *xa, int d,
                                     const char *const *next, const uint16_t *const *next_scales, float *out,
                                     int asymmetric, const uint16_t *const *mins, const uint16_t *const *next_mins) {
  int blocks = d / EDGE_QUANT_BLOCK;
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2; /* log2 of blocks per group */
#if EDGE_ROWS_AVX2 || EDGE_ROWS_AVX512
  step_lanes even[EDGE_ROWS_AT_ONCE], odd[EDGE_ROWS_AT_ONCE], corr[EDGE_ROWS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    zero_step_lanes(&even[t]);
    zero_step_lanes(&odd[t]);
    zero_step_lanes(&corr[t]);
  }
  int first_block = 0;
  for (; first_block + EDGE_STEP_BLOCKS <= blocks; first_block += EDGE_STEP_BLOCKS) {
    int_dot_step(n, row, scales, dtype, group_log, xa, first_block, EDGE_STEP_BLOCKS, next, next_scales, even, odd,
                 asymmetric, mins, next_mins, corr);
  }
  if (first_block < blocks) {
    int_dot_step(n, row, scales, dtype, group_log, xa, first_block, blocks - first_block, next, next_scales, even, odd,
                 asymmetric, mins, next_mins, corr);
  }
  for (int t = 0; t < n; t++) out[t] = step_total(&even[t], &odd[t], asymmetric ? &corr[t] : NULL);
#else
  unit_accumulator even[EDGE_ROWS_AT_ONCE], odd[EDGE_ROWS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    zero_accumulator(&even[t]);
    zero_accumulator(&odd[t]);
  }
  int per_unit = unit_blocks(dtype), unit = 0, full_units = blocks / per_unit, partial_blocks = blocks % per_unit;
  for (; unit + 2 <= full_units; unit += 2) {
    for (int t = 0; t < n; t++) {
      EDGE_PREFETCH(next[t], (size_t)unit * 64);
      EDGE_PREFETCH(next[t], (size_t)(unit + 1) * 64);
      /* a cache line of scales covers 32 groups (a power of two: a mask, not a division) */
      if (((unit * per_unit) & ((32 << group_log) - 1)) < 2 * per_unit) {
        EDGE_PREFETCH(next_scales[t], (size_t)((unit * per_unit) >> group_log) * sizeof(uint16_t));
        if (asymmetric) EDGE_PREFETCH(next_mins[t], (size_t)((unit * per_unit) >> group_log) * sizeof(uint16_t));
      }
    }
    for (int t = 0; t < n; t++) {
      int_dot_unit(row[t], scales[t], dtype, group_log, xa, unit, per_unit, &even[t]);
      int_dot_unit(row[t], scales[t], dtype, group_log, xa, unit + 1, per_unit, &odd[t]);
    }
  }
  if (unit < full_units) {
    for (int t = 0; t < n; t++) {
      EDGE_PREFETCH(next[t], (size_t)unit * 64);
      int_dot_unit(row[t], scales[t], dtype, group_log, xa, unit, per_unit, &even[t]);
    }
    unit++;
  }
  /* a last partial unit, its missing blocks' lanes adding exact zeros; separate calls, as a pointer chosen at run time
   * would keep the accumulators in memory throughout the loop */
  for (int t = 0; t < n && partial_blocks != 0; t++) {
    EDGE_PREFETCH(next[t], (size_t)unit * 64);
    if (unit % 2 == 0) {
      int_dot_unit(row[t], scales[t], dtype, group_log, xa, unit, partial_blocks, &even[t]);
    } else {
      int_dot_unit(row[t], scales[t], dtype, group_log, xa, unit, partial_blocks, &odd[t]);
    }
  }
  for (int t = 0; t < n; t++) {
    float corrections[16];
    if (asymmetric) block_corrections(scales[t], mins[t], group_log, xa->block_sums, blocks, corrections);
    out[t] = unit_accumulators_sum(&even[t], &odd[t], asymmetric ? corrections : NULL);
  }
#endif
}

/* ---- Sparse FFN ----------------------------------------------------------------------------------------- */

/* Workspace layout: candidates, row values, segments and their counts, x quantized for the integer dot products,
 * each starting on a cache line. The chunk of candidates [k0, k1) uses values and writes its active neurons from k0
 * on (its segment). */
struct ffn_workspace {
  int32_t *candidates;    /* [D] the mask's neurons, increasing */
  float *values;          /* [D] dot products of each chunk's gate rows, then of its up rows, from its start */
  int32_t *active_index;  /* [D] segments of active neurons, increasing within and across segments */
  float *active_hidden;   /* [D] h_i = a_i * act_up(u_i) of those */
  int32_t *segment_count; /* [ceil(D / EDGE_GATE_CHUNK)] active neurons per segment */
  float *corrections;     /* [ceil(d / 32)] asymmetric down rows: per block of 32 columns, sum of h_i * mid_i */
  void *activations;      /* activation_bytes(d): x quantized for the integer dot products (or x's block sums) */
  int64_t *call_ns;       /* [1] the last successful call's duration (edge_cpu_sparse_ffn_call_ns) */
};

static size_t round_up(size_t bytes) { return (bytes + EDGE_CACHE_LINE - 1) / EDGE_CACHE_LINE * EDGE_CACHE_LINE; }

size_t edge_cpu_sparse_ffn_workspace_size(int d, int D, int threads) {
  (void)threads;
  if (d <= 0 || D <= 0) return 0;
  /* The extra line lets the layout align a workspace pointer of any alignment. */
  return 4 * round_up((size_t)D * 4) + round_up((size_t)ceil_div(D, EDGE_GATE_CHUNK) * 4) +
         round_up((size_t)ceil_div(d, EDGE_QUANT_BLOCK) * 4) + round_up(activation_bytes(d)) +
         round_up(sizeof(int64_t)) + EDGE_CACHE_LINE;
}

static struct ffn_workspace layout_workspace(void *workspace, int d, int D) {
  uintptr_t base = ((uintptr_t)workspace + EDGE_CACHE_LINE - 1) / EDGE_CACHE_LINE * EDGE_CACHE_LINE;
  size_t stride = round_up((size_t)D * 4);
  struct ffn_workspace ws = {
      .candidates = (int32_t *)base,
      .active_index = (int32_t *)(base + stride),
      .active_hidden = (float *)(base + 2 * stride),
      .values = (float *)(base + 3 * stride),
      .segment_count = (int32_t *)(base + 4 * stride),
      .corrections = (float *)(base + 4 * stride + round_up((size_t)ceil_div(D, EDGE_GATE_CHUNK) * 4)),
      .activations = (void *)(base + 4 * stride + round_up((size_t)ceil_div(D, EDGE_GATE_CHUNK) * 4) +
                              round_up((size_t)ceil_div(d, EDGE_QUANT_BLOCK) * 4)),
  };
  ws.call_ns = (int64_t *)((char *)ws.activations + round_up(activation_bytes(d)));
  return ws;
}

int64_t edge_cpu_sparse_ffn_call_ns(const void *workspace, int d, int D) {
  if (workspace == NULL || d <= 0 || D <= 0) return -1;
  return *layout_workspace((void *)workspace, d, D).call_ns;
}

static int64_t monotonic_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* A weight matrix of d-element rows as stored: fp32 or fp16 values, or INT8 / INT4 codes with their fp16 group
 * scales (scales and group_size unused for fp32 and fp16), and asymmetric INT4's group minimums. */
struct weight_rows {
  const void *values;
  const uint16_t *scales; /* [rows, d / group_size] */
  int dtype;              /* enum edge_dtype or enum edge_quant_format */
  int group_size;
  const uint16_t *mins; /* [rows, d / group_size] for asymmetric INT4, else NULL */
};

static inline int is_quantized(int dtype) { return dtype == EDGE_Q8 || dtype == EDGE_Q4; }

static inline size_t row_bytes(int dtype, int d) {
  return is_quantized(dtype) ? (size_t)d / EDGE_QUANT_BLOCK * block_bytes(dtype) : (size_t)d * weight_bytes(dtype);
}

static inline const char *row_address(const struct weight_rows *w, int row, int d) {
  return (const char *)w->values + (size_t)row * row_bytes(w->dtype, d);
}

static inline const uint16_t *row_scales(const struct weight_rows *w, int row, int d) {
  return w->scales + (size_t)row * (size_t)(d / w->group_size);
}

/* The row's minimums, or NULL for symmetric rows. */
static inline const uint16_t *row_mins(const struct weight_rows *w, int row, int d) {
  return w->mins == NULL ? NULL : w->mins + (size_t)row * (size_t)(d / w->group_size);
}

/* The row's minimums to prefetch: its scales when it has none (prefetched anyway). */
static inline const uint16_t *row_mins_or_scales(const struct weight_rows *w, int row, int d) {
  return w->mins == NULL ? row_scales(w, row, d) : row_mins(w, row, d);
}

/* Row `row` of w . x, x in fp32 (block_sums: x's per block, for asymmetric rows), while row `next` of next_w (the
 * same storage type and row length) is prefetched; each storage type gets its own inlined loop. (Quantized rows'
 * integer dot products: rows_dot, int_dot_rows.) */
static inline float row_dot(const struct weight_rows *w, int row, const float *x, const float *block_sums, int d,
                            const struct weight_rows *next_w, int next) {
  const char *start = row_address(w, row, d), *ahead = row_address(next_w, next, d);
  switch (w->dtype) {
    case EDGE_Q8:
      return quant_dot_row(start, row_scales(w, row, d), EDGE_Q8, w->group_size, x, d, ahead,
                           row_scales(next_w, next, d), NULL, NULL);
    case EDGE_Q4:
      if (w->mins != NULL) {
        return quant_dot_row(start, row_scales(w, row, d), EDGE_Q4, w->group_size, x, d, ahead,
                             row_scales(next_w, next, d), row_mins(w, row, d), block_sums);
      }
      return quant_dot_row(start, row_scales(w, row, d), EDGE_Q4, w->group_size, x, d, ahead,
                           row_scales(next_w, next, d), NULL, NULL);
    case EDGE_F16:
      return dot_row(start, EDGE_F16, x, d, ahead);
    default:
      return dot_row(start, EDGE_F32, x, d, ahead);
  }
}

/* Rows of one weight matrix: row rows[k] of w for k < n, or row first + k when rows is NULL. */
struct row_list {
  const struct weight_rows *w;
  const int32_t *rows;
  int first, n;
};

static inline int list_index(const struct row_list *list, int k) {
  return list->rows != NULL ? list->rows[k] : list->first + k;
}

/* Bytes of rows to have in flight ahead of the row being read: on x86-64, where they go to L2, 16 KiB (7 INT4 rows
 * of a 7B model; 2 KiB, one row, left the core waiting for its rows: benchmarks/README.md, section 3); elsewhere,
 * into L1, one L3 latency's worth as before (not measured on an aarch64 core yet). */
#if defined(__x86_64__)
#define EDGE_PREFETCH_BYTES 16384
#else
#define EDGE_PREFETCH_BYTES 2048
#endif

#ifdef EDGE_DOT_GROUP
/* out[k] = row k of `rows` . x for fp16 rows, EDGE_DOT_GROUP at a time; a last partial group repeats its last
 * row, whose extra values are not stored. */
static void rows_dot_grouped(const struct row_list *rows, const float *x, int d, float *out) {
  for (int k0 = 0; k0 < rows->n; k0 += EDGE_DOT_GROUP) {
    const uint16_t *group[EDGE_DOT_GROUP];
    float values[EDGE_DOT_GROUP];
    int n = rows->n - k0 < EDGE_DOT_GROUP ? rows->n - k0 : EDGE_DOT_GROUP;
    for (int r = 0; r < EDGE_DOT_GROUP; r++) {
      group[r] = (const uint16_t *)row_address(rows->w, list_index(rows, k0 + (r < n ? r : n - 1)), d);
    }
    dot_rows_group(group, x, d, values);
    memcpy(out + k0, values, (size_t)n * sizeof(float));
  }
}
#endif

/* Prefetches row `row` of w whole: its values or codes, and its scales. */
static void prefetch_row(const struct weight_rows *w, int row, int d) {
  const char *start = row_address(w, row, d);
  for (size_t byte = 0; byte < row_bytes(w->dtype, d); byte += EDGE_CACHE_LINE) EDGE_PREFETCH(start, byte);
  if (is_quantized(w->dtype)) {
    size_t scale_bytes = (size_t)(d / w->group_size) * sizeof(uint16_t);
    for (size_t byte = 0; byte < scale_bytes; byte += EDGE_CACHE_LINE) EDGE_PREFETCH(row_scales(w, row, d), byte);
    for (size_t byte = 0; w->mins != NULL && byte < scale_bytes; byte += EDGE_CACHE_LINE) {
      EDGE_PREFETCH(row_mins(w, row, d), byte);
    }
  }
}

/* The row `ahead` places after row k of `rows`, past its end into `then`, or row k itself when there is none. */
static inline void row_ahead(const struct row_list *rows, const struct row_list *then, int k, int ahead,
                             const struct weight_rows **next_w, int *next) {
  int later = k + ahead;
  *next_w = rows->w;
  *next = list_index(rows, k); /* nothing left to prefetch: its own row, in cache */
  if (later < rows->n) {
    *next = list_index(rows, later);
  } else if (later - rows->n < then->n) {
    *next_w = then->w;
    *next = list_index(then, later - rows->n);
  }
}

/* out[k .. k + n) = rows k .. k + n - 1 of `rows` . x through x's quantized planes xa (n at most EDGE_ROWS_AT_ONCE,
 * a constant once inlined), prefetching the rows `ahead` places later. */
EDGE_ALWAYS_INLINE void int_dot_list(int n, const struct row_list *rows, const struct row_list *then,
                                     const struct quantized_activations *xa, int d, int k, int ahead, float *out) {
  const char *row[EDGE_ROWS_AT_ONCE], *next[EDGE_ROWS_AT_ONCE];
  const uint16_t *scales[EDGE_ROWS_AT_ONCE], *next_scales[EDGE_ROWS_AT_ONCE];
  const uint16_t *mins[EDGE_ROWS_AT_ONCE], *next_mins[EDGE_ROWS_AT_ONCE];
  for (int t = 0; t < n; t++) {
    const struct weight_rows *next_w;
    int next_row;
    row_ahead(rows, then, k + t, ahead, &next_w, &next_row);
    row[t] = row_address(rows->w, list_index(rows, k + t), d);
    scales[t] = row_scales(rows->w, list_index(rows, k + t), d);
    mins[t] = row_mins(rows->w, list_index(rows, k + t), d);
    next[t] = row_address(next_w, next_row, d);
    next_scales[t] = row_scales(next_w, next_row, d);
    next_mins[t] = row_mins_or_scales(next_w, next_row, d);
  }
  if (rows->w->dtype == EDGE_Q4 && rows->w->mins != NULL) {
    int_dot_rows(n, row, scales, EDGE_Q4, rows->w->group_size, xa, d, next, next_scales, out + k, 1, mins, next_mins);
  } else if (rows->w->dtype == EDGE_Q4) {
    int_dot_rows(n, row, scales, EDGE_Q4, rows->w->group_size, xa, d, next, next_scales, out + k, 0, mins, next_mins);
  } else {
    int_dot_rows(n, row, scales, EDGE_Q8, rows->w->group_size, xa, d, next, next_scales, out + k, 0, mins, next_mins);
  }
}

/* out[k] = row k of `rows` . x through xa for every k: at_once rows at a time (a constant once inlined), the last few
 * one by one. */
EDGE_ALWAYS_INLINE void int_dot_all(int at_once, const struct row_list *rows, const struct row_list *then,
                                    const struct quantized_activations *xa, int d, int ahead, float *out) {
  int k = 0;
  for (; k + at_once <= rows->n; k += at_once) int_dot_list(at_once, rows, then, xa, d, k, ahead, out);
  for (; k < rows->n; k++) int_dot_list(1, rows, then, xa, d, k, ahead, out);
}

/* out[k] = row k of `rows` . x. While row k is read, the row `ahead` places later is prefetched, ahead rows
 * making about EDGE_PREFETCH_BYTES (on x86-64 7 INT4 rows of a 7B model, 2 fp16 rows, many short rows of small
 * models); past the end of `rows` the look-ahead goes on into `then` (rows of the same storage type), the rows the
 * caller reads next, so they do not start cold. With `cold`, nothing has prefetched the first rows: they are prefetched
 * whole before the first is read. Quantized rows with x's quantized planes xa are dotted several at a time
 * (EDGE_LIST_ROWS_AT_ONCE, EDGE_RUN_ROWS_AT_ONCE). */
static void rows_dot(const struct row_list *rows, const struct row_list *then, const float *x,
                     const struct quantized_activations *xa, const float *block_sums, int d, int cold, float *out) {
#ifdef EDGE_DOT_GROUP
  if (rows->w->dtype == EDGE_F16 && d <= EDGE_GROUP_MAX_D) {
    rows_dot_grouped(rows, x, d, out);
    return;
  }
#endif
  size_t bytes = row_bytes(rows->w->dtype, d);
  int ahead = bytes >= EDGE_PREFETCH_BYTES ? 1 : (int)(EDGE_PREFETCH_BYTES / bytes);
  for (int k = 0; cold && k < ahead && k < rows->n; k++) prefetch_row(rows->w, list_index(rows, k), d);
  if (xa != NULL && is_quantized(rows->w->dtype)) {
    if (rows->rows != NULL) {
      int_dot_all(EDGE_LIST_ROWS_AT_ONCE, rows, then, xa, d, ahead, out);
    } else {
      int_dot_all(EDGE_RUN_ROWS_AT_ONCE, rows, then, xa, d, ahead, out);
    }
    return;
  }
  for (int k = 0; k < rows->n; k++) {
    const struct weight_rows *next_w;
    int next;
    row_ahead(rows, then, k, ahead, &next_w, &next);
    out[k] = row_dot(rows->w, list_index(rows, k), x, block_sums, d, next_w, next);
  }
}

/* The environment variable that selects how quantized rows are dotted with x: "fp32" keeps x in fp32 and widens the
 * codes to fp32 in registers (quant_dot_row: the reference's numbers up to fp32 rounding order); unset or anything
 * else quantizes x to int8 for the integer dot products (int_dot_rows: faster, QUANT.md gives its error bound). */
#define EDGE_ACTIVATIONS_ENV "EDGE_SDK_QUANT_ACTIVATIONS"

/* Nonzero when rows of `dtype` are to be dotted with x quantized to int8. */
static int integer_dot_products(int dtype) {
  if (!is_quantized(dtype)) return 0;
  const char *setting = getenv(EDGE_ACTIVATIONS_ENV);
  return setting == NULL || strcmp(setting, "fp32") != 0;
}

/* One token's x as the row functions take it: x in fp32, its quantized planes (or NULL: quantized rows are dotted
 * with x itself) and its block sums for asymmetric rows (or NULL). */
struct token_input {
  const float *x;
  struct quantized_activations planes;
  const struct quantized_activations *xa;
  const float *block_sums;
};

/* A token's x [in] prepared for rows of `dtype` in `buffer` (activation_bytes(in), any alignment), as the one-token
 * kernels prepare x: its planes for the integer dot products, or its fp32 block sums for asymmetric rows dotted with
 * x in fp32. */
static void prepare_token(const float *x, int in, int dtype, int asymmetric, void *buffer, struct token_input *out) {
  out->x = x;
  out->xa = NULL;
  out->block_sums = NULL;
  if (integer_dot_products(dtype)) {
    out->planes = quantize_activations(x, in, dtype, buffer);
    out->xa = &out->planes;
    out->block_sums = out->planes.block_sums;
  } else if (asymmetric) {
    out->block_sums = fp32_block_sums(x, in, buffer);
  }
}

#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2 || defined(__ARM_NEON)
/* Bytes of a run's rows that the block's groups of tokens go through before the next rows: a quarter of a 32 KiB L1,
 * so that each group after the first finds them there beside its x (with the whole 32 KiB run per group, rows and
 * x came from L2; 4, 8 and 16 KiB measured, benchmarks/README.md, section 11). */
#define EDGE_TOKEN_PIECE_BYTES 8192

/* Row `row` of w . x_t for n tokens (1 or EDGE_TOKENS_AT_ONCE) into values, prefetching row `next` of next_w: one
 * int_dot_tokens per storage type. */
EDGE_ALWAYS_INLINE void int_dot_row_tokens(int n, const struct weight_rows *w, int row, int d,
                                           const struct quantized_activations *const *xa,
                                           const struct weight_rows *next_w, int next, float *values) {
  const char *address = row_address(w, row, d), *next_address = row_address(next_w, next, d);
  const uint16_t *scales = row_scales(w, row, d), *next_scales = row_scales(next_w, next, d);
  const uint16_t *next_mins = row_mins_or_scales(next_w, next, d);
  if (w->dtype == EDGE_Q4 && w->mins != NULL) {
    int_dot_tokens(n, address, scales, row_mins(w, row, d), EDGE_Q4, w->group_size, xa, d, next_address, next_scales,
                   next_mins, 1, values);
  } else if (w->dtype == EDGE_Q4) {
    int_dot_tokens(n, address, scales, NULL, EDGE_Q4, w->group_size, xa, d, next_address, next_scales, next_mins, 0,
                   values);
  } else {
    int_dot_tokens(n, address, scales, NULL, EDGE_Q8, w->group_size, xa, d, next_address, next_scales, next_mins, 0,
                   values);
  }
}

/* out[t * out_stride + k] = row k of the run `rows` . token t's x for every token of inputs (quantized rows, every
 * token's planes xa present), a piece of EDGE_TOKEN_PIECE_BYTES of rows at a time: each row of the piece with
 * EDGE_TOKENS_AT_ONCE tokens at a time and the rest one by one, so its codes are unpacked once per group of tokens;
 * while the first group reads a row, the row `ahead` places later is prefetched (past the run's end into `then`).
 * With `cold`, the first rows are prefetched whole first. Each value is the bits rows_dot gives for that token. */
static void int_dot_run_tokens(const struct row_list *rows, const struct row_list *then,
                               const struct token_input *inputs, int tokens, int d, int cold, float *out,
                               size_t out_stride) {
  const struct weight_rows *w = rows->w;
  size_t bytes = row_bytes(w->dtype, d);
  int ahead = bytes >= EDGE_PREFETCH_BYTES ? 1 : (int)(EDGE_PREFETCH_BYTES / bytes);
  for (int k = 0; cold && k < ahead && k < rows->n; k++) prefetch_row(w, list_index(rows, k), d);
  int piece = bytes >= EDGE_TOKEN_PIECE_BYTES ? 1 : (int)(EDGE_TOKEN_PIECE_BYTES / bytes);
  for (int k0 = 0; k0 < rows->n; k0 += piece) {
    int k1 = k0 + piece < rows->n ? k0 + piece : rows->n;
    for (int t = 0; t < tokens;) {
      int n = t + EDGE_TOKENS_AT_ONCE <= tokens ? EDGE_TOKENS_AT_ONCE : 1;
      const struct quantized_activations *xa[EDGE_TOKENS_AT_ONCE];
      for (int j = 0; j < n; j++) xa[j] = inputs[t + j].xa;
      for (int k = k0; k < k1; k++) {
        int row = list_index(rows, k);
        const struct weight_rows *next_w = w;
        int next = row; /* the piece's later groups of tokens: nothing more to prefetch */
        if (t == 0) row_ahead(rows, then, k, ahead, &next_w, &next);
        float values[EDGE_TOKENS_AT_ONCE];
        if (n == EDGE_TOKENS_AT_ONCE) {
          int_dot_row_tokens(EDGE_TOKENS_AT_ONCE, w, row, d, xa, next_w, next, values);
        } else {
          int_dot_row_tokens(1, w, row, d, xa, next_w, next, values);
        }
        for (int j = 0; j < n; j++) out[(size_t)(t + j) * out_stride + (size_t)k] = values[j];
      }
      t += n;
    }
  }
}
#endif

#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2 || defined(__ARM_NEON)
/* Whether rows of `dtype` take fewer instructions dotted with EDGE_TOKENS_AT_ONCE tokens at once than token by token.
 * Not INT4 on NEON without the dot product extension: its widening products need the registers the second token's
 * accumulators take, and the pair spilled (counted under qemu: 4.5% more instructions than token by token,
 * benchmarks/README.md section 3); INT8 gains there too. */
static inline int tokens_at_once_pay(int dtype) {
#if defined(__ARM_NEON) && !defined(__ARM_FEATURE_DOTPROD)
  return dtype != EDGE_Q4;
#else
  (void)dtype;
  return 1;
#endif
}
#endif

/* Bytes of x's planes (about 2.5 per value: the two int8 planes, the lanes' offset sums) that EDGE_TOKENS_AT_ONCE
 * tokens may take for a row to be dotted with them at once: half of a 32 KiB L1. Beyond, each row would read them
 * from L2 (AVX-512's 4 tokens of LLaMA-2-7B's 4096 values: 40 KiB, and its prefill 0.80x of token by token over the
 * cached run). AVX2's 2 tokens of 4096 values (20 KiB) beside an 8 KiB piece of rows still fit, and prefill the 7B
 * shape 1.15-1.2x faster than token by token (benchmarks/README.md section 11); NEON keeps half an L1 until an
 * A78AE (64 KiB of L1) measures it. */
#if EDGE_ROWS_AVX2
#define EDGE_TOKEN_PLANES_BYTES 24576
#else
#define EDGE_TOKEN_PLANES_BYTES 16384
#endif

/* out[t * out_stride + k] = row k of the run `rows` . token t's x for every token: int_dot_run_tokens where it
 * applies (AVX-512, AVX2 and NEON, quantized rows with x quantized, rows short enough for
 * EDGE_TOKEN_PLANES_BYTES), rows_dot token by token otherwise (the rows then come from the core's cache for every
 * token after the first). */
static void rows_dot_tokens(const struct row_list *rows, const struct row_list *then, const struct token_input *inputs,
                            int tokens, int d, int cold, float *out, size_t out_stride) {
#if EDGE_ROWS_AVX512 || EDGE_ROWS_AVX2 || defined(__ARM_NEON)
  int planes_fit = (size_t)d * EDGE_TOKENS_AT_ONCE * 5 / 2 <= EDGE_TOKEN_PLANES_BYTES;
  if (tokens > 1 && planes_fit && inputs[0].xa != NULL && is_quantized(rows->w->dtype) &&
      tokens_at_once_pay(rows->w->dtype)) {
    int_dot_run_tokens(rows, then, inputs, tokens, d, cold, out, out_stride);
    return;
  }
#endif
  for (int t = 0; t < tokens; t++) {
    const struct token_input *token = inputs + t;
    rows_dot(rows, then, token->x, token->xa, token->block_sums, d, cold && t == 0, out + (size_t)t * out_stride);
  }
}

/* Gate and up for candidates [k0, k1) of one chunk of the n_candidates; returns how many were active (every
 * candidate when not skip_zeros), stored from k0 on. Two passes: all gate rows, then the up rows of the neurons
 * that fired. Whether a neuron fires is close to a coin toss, so deciding it between its gate and up rows cost a
 * mispredicted branch per candidate; here the active list is compacted without branches. */
static int gate_up_chunk(const struct ffn_workspace *ws, int k0, int k1, int n_candidates, const float *x,
                         const struct quantized_activations *xa, const float *block_sums, int d, const struct weight_rows *gate,
                         const struct weight_rows *up, int skip_zeros, const float *thresholds, int activation,
                         float act_threshold) {
  float *values = ws->values + k0;
  /* the gate pass looks ahead into the chunk's up rows (the predictor expects them to fire), the up pass into
   * the next chunk's gate rows */
  struct row_list gate_rows = {gate, ws->candidates + k0, 0, k1 - k0};
  struct row_list likely_up_rows = {up, ws->candidates + k0, 0, k1 - k0};
  rows_dot(&gate_rows, &likely_up_rows, x, xa, block_sums, d, 1, values);
  int32_t *index = ws->active_index + k0;
  float *hidden = ws->active_hidden + k0;
  int n_active = 0;
  for (int k = 0; k < k1 - k0; k++) {
    int i = ws->candidates[k0 + k];
    float a = gate_activation(activation, values[k], act_threshold);
    int above_threshold = thresholds == NULL || fabsf(a) > thresholds[i];
    int fires = (skip_zeros == 0) | ((a != 0.0f) & above_threshold);
    index[n_active] = i;
    hidden[n_active] = a;
    n_active += fires;
  }
  struct row_list up_rows = {up, index, 0, n_active};
  struct row_list next_gate_rows = {gate, ws->candidates + k1, 0, n_candidates - k1};
  rows_dot(&up_rows, &next_gate_rows, x, xa, block_sums, d, 0, values);
  for (int j = 0; j < n_active; j++) {
    float u = activation == EDGE_ACT_DRELU ? keep_or_zero(values[j], !(values[j] < 0.0f)) : values[j];
    hidden[j] *= u;
  }
  return n_active;
}

/* Walks the segments in order, yielding the down rows in groups of up to EDGE_DOWN_GROUP; with skip_zeros
 * only those with h != 0 (rows with h == 0 would add exactly zero and are not read). */
struct down_cursor {
  const struct ffn_workspace *ws;
  int chunk; /* candidates per chunk: segment s starts at s * chunk */
  int n_segments;
  int skip_zeros;
  int segment; /* current segment */
  int j;       /* next entry of the active list */
};

static int next_down_group(struct down_cursor *cursor, size_t row_length, size_t column, size_t *rows, float *h) {
  const struct ffn_workspace *ws = cursor->ws;
  int n_rows = 0;
  while (n_rows < EDGE_DOWN_GROUP && cursor->segment < cursor->n_segments) {
    if (cursor->j >= cursor->segment * cursor->chunk + ws->segment_count[cursor->segment]) {
      cursor->segment++;
      cursor->j = cursor->segment * cursor->chunk;
      continue;
    }
    int j = cursor->j++;
    if (cursor->skip_zeros && ws->active_hidden[j] == 0.0f) continue;
    rows[n_rows] = (size_t)ws->active_index[j] * row_length + column;
    h[n_rows++] = ws->active_hidden[j];
  }
  return n_rows;
}

/* y[c0:c1] = sum over the active list (in order) of h_j * w_down_t[i_j][c0:c1], a group of rows at a time
 * while the next group is prefetched. */
static void down_columns(float *y, int c0, int c1, int d, const struct weight_rows *down,
                         const struct ffn_workspace *ws, int chunk, int n_segments, int skip_zeros) {
  int n = c1 - c0;
  memset(y + c0, 0, (size_t)n * sizeof(float));
  /* asymmetric rows: the blocks' corrections, C_b = sum of h_i * mid_i over the active rows in order (each column
   * block of this thread's own), added to each column once after the last row */
  float *corrections = down->mins != NULL ? ws->corrections : NULL;
  if (corrections != NULL) memset(corrections + c0 / EDGE_QUANT_BLOCK, 0, (size_t)n / EDGE_QUANT_BLOCK * sizeof(float));
  struct down_cursor cursor = {ws, chunk, n_segments, skip_zeros, 0, 0};
  /* fp rows: element offsets of the rows' pieces [c0, c1); quantized rows: the neurons, as add_quant_rows finds
   * a piece's codes and scales from its row; this group and the next */
  int quantized = is_quantized(down->dtype);
  size_t row_length = quantized ? 1 : (size_t)d, column = quantized ? 0 : (size_t)c0;
  size_t rows[2][EDGE_DOWN_GROUP];
  float h[2][EDGE_DOWN_GROUP];
  int now = 0;
  int n_rows = next_down_group(&cursor, row_length, column, rows[now], h[now]);
  /* the first group's pieces, which no earlier group prefetched */
  for (int r = 0; r < n_rows; r++) {
    size_t first = rows[now][r] * weight_bytes(down->dtype), piece = (size_t)n * weight_bytes(down->dtype);
    if (quantized) {
      first = rows[now][r] * row_bytes(down->dtype, d) + (size_t)c0 / EDGE_QUANT_BLOCK * block_bytes(down->dtype);
      piece = (size_t)n / EDGE_QUANT_BLOCK * block_bytes(down->dtype);
    }
    for (size_t byte = 0; byte < piece; byte += EDGE_CACHE_LINE) EDGE_PREFETCH(down->values, first + byte);
  }
  while (n_rows > 0) {
    int n_next = next_down_group(&cursor, row_length, column, rows[!now], h[!now]);
    switch (down->dtype) {
      case EDGE_Q8:
        add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q8, down->group_size, d, rows[now], h[now], n_rows,
                       rows[!now], n_next, NULL, NULL);
        break;
      case EDGE_Q4:
        if (corrections != NULL) {
          add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q4, down->group_size, d, rows[now], h[now],
                         n_rows, rows[!now], n_next, down->mins, corrections);
        } else {
          add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q4, down->group_size, d, rows[now], h[now],
                         n_rows, rows[!now], n_next, NULL, NULL);
        }
        break;
      case EDGE_F16:
        add_rows(y + c0, n, down->values, EDGE_F16, rows[now], h[now], n_rows, rows[!now], n_next);
        break;
      default:
        add_rows(y + c0, n, down->values, EDGE_F32, rows[now], h[now], n_rows, rows[!now], n_next);
    }
    now = !now;
    n_rows = n_next;
  }
  for (int c = c0; corrections != NULL && c < c1; c++) y[c] += corrections[c / EDGE_QUANT_BLOCK];
}

/* candidates = the neurons with mask[i] != 0, increasing; returns how many. Without branches: a predicted mask
 * is close to random, and a mispredicted branch per neuron cost more than the gate rows it saves on small
 * layers. With AVX-512, 16 neurons per step: their indices compressed into one store, which may write past
 * the count but never past candidates[i + 16] <= candidates[D]. */
static int list_candidates(const uint8_t *mask, int D, int32_t *candidates) {
  int n = 0, i = 0;
#if EDGE_ROWS_AVX512
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 16 <= D; i += 16) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)(mask + i));
    __mmask16 set = _mm_test_epi8_mask(bytes, bytes);
    _mm512_storeu_si512(candidates + n, _mm512_maskz_compress_epi32(set, index));
    n += __builtin_popcount(set);
    index = _mm512_add_epi32(index, _mm512_set1_epi32(16));
  }
#endif
  for (; i < D; i++) {
    candidates[n] = i;
    n += mask[i] != 0;
  }
  return n;
}

/* Nonzero when w is a valid matrix of rows of `in` values: fp32 / fp16, or quantized with scales and a group size
 * of 32, 64 or 128 that divides in. */
static int valid_weights(const struct weight_rows *w, int in) {
  if (w->values == NULL || in <= 0) return 0;
  if (w->mins != NULL && w->dtype != EDGE_Q4) return 0; /* only INT4 has an asymmetric form */
  if (w->dtype == EDGE_F32 || w->dtype == EDGE_F16) return 1;
  int group_size_ok = w->group_size == 32 || w->group_size == 64 || w->group_size == 128;
  return is_quantized(w->dtype) && w->scales != NULL && group_size_ok && in % w->group_size == 0;
}

static int check_ffn_arguments(const float *x, int d, int D, const struct weight_rows *gate,
                               const struct weight_rows *up, const struct weight_rows *down, int activation,
                               float act_threshold, const float *y, const void *workspace) {
  if (x == NULL || y == NULL || workspace == NULL || D <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  if (!valid_weights(gate, d) || !valid_weights(up, d) || !valid_weights(down, d)) return EDGE_CPU_INVALID_ARGUMENT;
  /* gate and up of one format; down of theirs, or INT8 under INT4 gate and up (a wider down projection) */
  int int8_down = gate->dtype == EDGE_Q4 && down->dtype == EDGE_Q8;
  if (up->dtype != gate->dtype || (down->dtype != gate->dtype && !int8_down)) return EDGE_CPU_INVALID_ARGUMENT;
  /* minimums on gate and up both (asymmetric INT4) or neither, and on INT4 down rows exactly when gate and up have
   * them (INT8 rows have none: valid_weights) */
  if ((gate->mins == NULL) != (up->mins == NULL)) return EDGE_CPU_INVALID_ARGUMENT;
  if (down->dtype == EDGE_Q4 && (gate->mins == NULL) != (down->mins == NULL)) return EDGE_CPU_INVALID_ARGUMENT;
  if (activation < EDGE_ACT_RELU || activation > EDGE_ACT_SILU) return EDGE_CPU_INVALID_ARGUMENT;
  if (activation == EDGE_ACT_FATRELU && !(act_threshold >= 0.0f)) return EDGE_CPU_INVALID_ARGUMENT;
  return EDGE_CPU_OK;
}

/* One FFN call: its arguments and the workspace's lists, for the two phases below. */
struct ffn_job {
  const float *x;
  const struct quantized_activations *xa; /* x quantized for quantized rows, or NULL: dot them with x */
  const float *block_sums;                /* x's block sums for asymmetric rows (xa's or x's in fp32), or NULL */
  int d;
  struct weight_rows gate, up, down;
  const float *thresholds;
  int activation;
  float act_threshold;
  float *y;
  uint8_t *active_out;
  int skip_zeros;
  struct ffn_workspace ws;
  int n_candidates, chunk, n_segments;
  int column_unit; /* columns per unit of a down block */
  int n_units, n_column_blocks;
};

/* Gate and up of candidate chunk s into segment s. */
static void gate_up_segment(struct ffn_job *job, int s) {
  int k0 = s * job->chunk;
  int k1 = k0 + job->chunk < job->n_candidates ? k0 + job->chunk : job->n_candidates;
  int n_active = gate_up_chunk(&job->ws, k0, k1, job->n_candidates, job->x, job->xa, job->block_sums, job->d,
                               &job->gate, &job->up, job->skip_zeros, job->thresholds, job->activation,
                               job->act_threshold);
  job->ws.segment_count[s] = n_active;
  if (job->active_out != NULL) {
    for (int j = k0; j < k0 + n_active; j++) job->active_out[job->ws.active_index[j]] = 1;
  }
}

/* Down projection into column block b of y. */
static void down_block(const struct ffn_job *job, int b) {
  int c0 = job->column_unit * split_point(job->n_units, job->n_column_blocks, b);
  int c1 = job->column_unit * split_point(job->n_units, job->n_column_blocks, b + 1);
  down_columns(job->y, c0, c1 < job->d ? c1 : job->d, job->d, &job->down, &job->ws, job->chunk, job->n_segments,
               job->skip_zeros);
}

/* The FFN over the mask's neurons (all when NULL) after checking the arguments; skip_zeros: drop neurons whose
 * activation is zero (or under their threshold) before up and down, as the sparse FFN does, or compute every
 * candidate as a dense FFN. */
static int run_ffn(const float *x, int d, int D, struct weight_rows gate, struct weight_rows up,
                   struct weight_rows down, const uint8_t *mask, const float *thresholds, int activation,
                   float act_threshold, float *y, void *workspace, int threads, uint8_t *active_out, int skip_zeros) {
  int64_t start_ns = monotonic_ns();
  int status = check_ffn_arguments(x, d, D, &gate, &up, &down, activation, act_threshold, y, workspace);
  if (status != EDGE_CPU_OK) return status;
  struct ffn_job job = {x, NULL, NULL, d, gate, up, down, thresholds, activation, act_threshold, y, active_out,
                        skip_zeros, layout_workspace(workspace, d, D), 0, 0, 0, 0, 0, 0};
  struct quantized_activations activations;
  if (integer_dot_products(gate.dtype)) {
    activations = quantize_activations(x, d, gate.dtype, job.ws.activations);
    job.xa = &activations;
    job.block_sums = activations.block_sums;
  } else if (gate.mins != NULL) {
    job.block_sums = fp32_block_sums(x, d, job.ws.activations);
  }
  if (mask == NULL) {
    for (int i = 0; i < D; i++) job.ws.candidates[i] = i;
    job.n_candidates = D;
  } else {
    job.n_candidates = list_candidates(mask, D, job.ws.candidates);
  }
  if (active_out != NULL) memset(active_out, 0, (size_t)D);
  if (threads <= 0) threads = edge_cpu_max_threads();
  int share = ceil_div(job.n_candidates, threads * EDGE_CHUNKS_PER_THREAD);
  job.chunk = threads > 1 ? (share > EDGE_GATE_CHUNK ? share : EDGE_GATE_CHUNK)
                          : (job.n_candidates > 0 ? job.n_candidates : 1);
  job.n_segments = ceil_div(job.n_candidates, job.chunk);
  /* Down: one block of columns per thread, so each weight row is read in long contiguous pieces. */
  /* Quantized rows are summed a block of EDGE_QUANT_BLOCK columns at a time (whole bytes of INT4 codes). */
  job.column_unit = is_quantized(down.dtype) ? EDGE_QUANT_BLOCK : EDGE_COLUMN_UNIT;
  job.n_units = ceil_div(d, job.column_unit);
  job.n_column_blocks = threads < job.n_units ? threads : job.n_units;
  int one_thread = 1;
#ifdef _OPENMP
  if (threads > 1) {
    one_thread = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 1)
      for (int s = 0; s < job.n_segments; s++) gate_up_segment(&job, s);
      /* (the loop's implicit barrier: every h is known before any column of y is summed) */
#pragma omp for schedule(dynamic, 1)
      for (int b = 0; b < job.n_column_blocks; b++) down_block(&job, b);
    }
  }
#endif
  /* One thread without OpenMP: a parallel region of one thread and its dynamic loops cost several us per
   * call, as much as a whole FFN of a small model. */
  if (one_thread) {
    for (int s = 0; s < job.n_segments; s++) gate_up_segment(&job, s);
    for (int b = 0; b < job.n_column_blocks; b++) down_block(&job, b);
  }
  *job.ws.call_ns = monotonic_ns() - start_ns;
  return EDGE_CPU_OK;
}

int edge_cpu_sparse_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                        int weight_dtype, const uint8_t *mask, const float *thresholds, int activation,
                        float act_threshold, float *y, void *workspace, int threads, uint8_t *active_out) {
  struct weight_rows gate = {w_gate, NULL, weight_dtype, 0, NULL}, up = {w_up, NULL, weight_dtype, 0, NULL};
  struct weight_rows down = {w_down_t, NULL, weight_dtype, 0, NULL};
  if (weight_dtype != EDGE_F32 && weight_dtype != EDGE_F16) return EDGE_CPU_INVALID_ARGUMENT;
  return run_ffn(x, d, D, gate, up, down, mask, thresholds, activation, act_threshold, y, workspace, threads,
                 active_out, 1);
}

int edge_cpu_sparse_ffn_q(const float *x, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                          const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                          const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                          const uint16_t *down_mins, int quant_format, int down_format, int group_size,
                          const uint8_t *mask, const float *thresholds, int activation, float act_threshold, float *y,
                          void *workspace, int threads, uint8_t *active_out) {
  struct weight_rows gate = {w_gate, gate_scales, quant_format, group_size, gate_mins};
  struct weight_rows up = {w_up, up_scales, quant_format, group_size, up_mins};
  struct weight_rows down = {w_down_t, down_scales, down_format, group_size, down_mins};
  if (!is_quantized(quant_format) || !is_quantized(down_format)) return EDGE_CPU_INVALID_ARGUMENT;
  return run_ffn(x, d, D, gate, up, down, mask, thresholds, activation, act_threshold, y, workspace, threads,
                 active_out, 1);
}

int edge_cpu_dense_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                       int weight_dtype, int activation, float act_threshold, float *y, void *workspace, int threads) {
  struct weight_rows gate = {w_gate, NULL, weight_dtype, 0, NULL}, up = {w_up, NULL, weight_dtype, 0, NULL};
  struct weight_rows down = {w_down_t, NULL, weight_dtype, 0, NULL};
  if (weight_dtype != EDGE_F32 && weight_dtype != EDGE_F16) return EDGE_CPU_INVALID_ARGUMENT;
  return run_ffn(x, d, D, gate, up, down, NULL, NULL, activation, act_threshold, y, workspace, threads, NULL, 0);
}

/* ---- Matrix products of a token (decode) or of a block of tokens (a prompt), and a block's FFN ------------------
 * A prompt's tokens all multiply the same matrices. Token by token, every weight row comes from memory once per
 * token; here the rows are taken a run of about EDGE_TOKEN_RUN_BYTES at a time, and each run is dotted with every
 * token's x before the next run is read, so a row comes from memory once per block of tokens and from the core's
 * cache for the others. Each token's values come from the one-token kernels' own row functions in their order, so
 * they are the bits of token-by-token calls. */

/* Bytes of weight rows a run holds: small enough to stay in a core's L1 / L2 while a block's tokens go over it. */
#define EDGE_TOKEN_RUN_BYTES 32768
/* Rows of a run at most: the FFN lists a run's active neurons on the stack. */
#define EDGE_TOKEN_RUN_MAX_ROWS 256

/* Rows per run for rows (or down-row pieces) of bytes_per_row bytes: EDGE_TOKEN_RUN_BYTES of them in whole groups of
 * the rows dotted at once, at least one group and at most EDGE_TOKEN_RUN_MAX_ROWS. */
static int token_run_rows(size_t bytes_per_row) {
  size_t rows = EDGE_TOKEN_RUN_BYTES / (bytes_per_row > 0 ? bytes_per_row : 1);
  rows = rows / EDGE_ROWS_AT_ONCE * EDGE_ROWS_AT_ONCE;
  if (rows < EDGE_ROWS_AT_ONCE) rows = EDGE_ROWS_AT_ONCE;
  return rows > EDGE_TOKEN_RUN_MAX_ROWS ? EDGE_TOKEN_RUN_MAX_ROWS : (int)rows;
}

/* Part `part` of `parts` contiguous runs of the rows of all n matrices, taken as one list in order, for every token
 * of `inputs`: each matrix's piece of the run is dotted with each token's x into that token's y (y + t * rows, + bias),
 * and the run's next piece, the next matrix's first rows, is what the end of a piece prefetches. One token reads a
 * piece in one pass; several take it a run of rows at a time (token_run_rows), every token over a run before the
 * next run is read. */
static void matmuls_rows(const struct token_input *inputs, int tokens, int in, const struct edge_cpu_matrix *m, int n,
                         int total, int parts, int part) {
  int r0 = split_point(total, parts, part), r1 = split_point(total, parts, part + 1);
  int cold = 1;
  for (int i = 0, first = 0; i < n && first < r1; first += m[i].rows, i++) {
    int a = r0 > first ? r0 - first : 0, b = r1 - first < m[i].rows ? r1 - first : m[i].rows;
    if (a >= b) continue;
    int last = i + 1 == n, after = r1 - (first + m[i].rows);
    const struct edge_cpu_matrix *next = last ? m + i : m + i + 1;
    struct weight_rows w = {m[i].w, m[i].scales, m[i].dtype, m[i].group_size, m[i].mins};
    struct weight_rows next_w = {next->w, next->scales, next->dtype, next->group_size, next->mins};
    int next_rows = last || after <= 0 ? 0 : after < m[i + 1].rows ? after : m[i + 1].rows;
    int run = tokens == 1 ? b - a : token_run_rows(row_bytes(w.dtype, in));
    for (int s = a; s < b; s += run) {
      int e = b - s < run ? b : s + run;
      /* after a run, the next run of this piece, or the next matrix's first rows after the last */
      struct row_list rows = {&w, NULL, s, e - s};
      struct row_list then = e < b ? (struct row_list){&w, NULL, e, b - e < run ? b - e : run}
                                   : (struct row_list){&next_w, NULL, 0, next_rows};
      rows_dot_tokens(&rows, &then, inputs, tokens, in, cold, m[i].y + s, (size_t)m[i].rows);
      for (int t = 0; t < tokens && m[i].bias != NULL; t++) {
        float *y = m[i].y + (size_t)t * (size_t)m[i].rows;
        for (int r = s; r < e; r++) y[r] += m[i].bias[r];
      }
      cold = 0;
    }
  }
}

/* The rows of the n matrices (checked: one storage type, each valid for `in` values) into *total, and whether any is
 * asymmetric; EDGE_CPU_INVALID_ARGUMENT for a bad matrix. */
static int check_matrices(int in, const struct edge_cpu_matrix *matrices, int n, int *total, int *asymmetric) {
  if (matrices == NULL || n <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  *total = 0;
  *asymmetric = 0;
  for (int i = 0; i < n; i++) {
    const struct edge_cpu_matrix *m = matrices + i;
    struct weight_rows w = {m->w, m->scales, m->dtype, m->group_size, m->mins};
    *asymmetric |= m->mins != NULL;
    int same_storage = m->dtype == matrices[0].dtype && m->group_size == matrices[0].group_size;
    if (m->y == NULL || m->rows <= 0 || m->rows > INT_MAX - *total || !same_storage || !valid_weights(&w, in)) {
      return EDGE_CPU_INVALID_ARGUMENT;
    }
    *total += m->rows;
  }
  return EDGE_CPU_OK;
}

/* matmuls_rows over the threads: one contiguous run of rows per thread, so each streams its rows with the next group
 * prefetched; one thread without OpenMP's per-call cost (as run_ffn). */
static void run_matmuls(const struct token_input *inputs, int tokens, int in, const struct edge_cpu_matrix *matrices,
                        int n, int total, int threads) {
#ifdef _OPENMP
  if (threads <= 0) threads = edge_cpu_max_threads();
  int parts = threads < total ? threads : total;
  if (parts > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int part = 0; part < parts; part++) matmuls_rows(inputs, tokens, in, matrices, n, total, parts, part);
    return;
  }
#else
  (void)threads; /* without OpenMP, one thread */
#endif
  matmuls_rows(inputs, tokens, in, matrices, n, total, 1, 0);
}

/* x's quantized planes live on the stack for rows of up to this many values (16 KiB, a 7B model's hidden size:
 * the frame is reserved for fp rows too), on the heap beyond. */
#define EDGE_MATVEC_STACK_VALUES 4096

int edge_cpu_matvecs(const float *x, int in, const struct edge_cpu_matrix *matrices, int n, int threads) {
  int total, asymmetric;
  if (x == NULL || check_matrices(in, matrices, n, &total, &asymmetric) != EDGE_CPU_OK) {
    return EDGE_CPU_INVALID_ARGUMENT;
  }
  unsigned char stack_buffer[4 * EDGE_MATVEC_STACK_VALUES + EDGE_CACHE_LINE];
  void *heap_buffer = NULL;
  if ((integer_dot_products(matrices[0].dtype) || asymmetric) && in > EDGE_MATVEC_STACK_VALUES &&
      (heap_buffer = malloc(activation_bytes(in))) == NULL) {
    return EDGE_CPU_OUT_OF_MEMORY;
  }
  struct token_input input;
  prepare_token(x, in, matrices[0].dtype, asymmetric, heap_buffer != NULL ? heap_buffer : stack_buffer, &input);
  run_matmuls(&input, 1, in, matrices, n, total, threads);
  free(heap_buffer);
  return EDGE_CPU_OK;
}

int edge_cpu_matmuls(const float *x, int tokens, int in, const struct edge_cpu_matrix *matrices, int n, int threads) {
  int total, asymmetric;
  if (x == NULL || tokens <= 0 || check_matrices(in, matrices, n, &total, &asymmetric) != EDGE_CPU_OK) {
    return EDGE_CPU_INVALID_ARGUMENT;
  }
  void *buffer = malloc((size_t)tokens * activation_bytes(in));
  struct token_input *inputs = malloc((size_t)tokens * sizeof *inputs);
  if (buffer == NULL || inputs == NULL) {
    free(buffer);
    free(inputs);
    return EDGE_CPU_OUT_OF_MEMORY;
  }
  for (int t = 0; t < tokens; t++) {
    prepare_token(x + (size_t)t * (size_t)in, in, matrices[0].dtype, asymmetric,
                  (char *)buffer + (size_t)t * activation_bytes(in), inputs + t);
  }
  run_matmuls(inputs, tokens, in, matrices, n, total, threads);
  free(inputs);
  free(buffer);
  return EDGE_CPU_OK;
}

int edge_cpu_matvec(const float *x, int in, int out, const void *w, int weight_dtype, const float *bias, float *y,
                    int threads) {
  if (weight_dtype != EDGE_F32 && weight_dtype != EDGE_F16) return EDGE_CPU_INVALID_ARGUMENT;
  struct edge_cpu_matrix matrix = {w, NULL, NULL, weight_dtype, 0, out, bias, y};
  return edge_cpu_matvecs(x, in, &matrix, 1, threads);
}

int edge_cpu_matvec_q(const float *x, int in, int out, const void *w, const uint16_t *scales, const uint16_t *mins,
                      int quant_format, int group_size, const float *bias, float *y, int threads) {
  if (!is_quantized(quant_format)) return EDGE_CPU_INVALID_ARGUMENT;
  struct edge_cpu_matrix matrix = {w, scales, mins, quant_format, group_size, out, bias, y};
  return edge_cpu_matvecs(x, in, &matrix, 1, threads);
}

/* The FFN of a block of tokens. Workspace: per token its prepared x (activation_bytes(d)), its gate activations and
 * then hidden values h [D], its up values [D] and the corrections of asymmetric down rows [ceil(d / 32)], each on a
 * cache line. */
static size_t token_ffn_bytes(int d, int D) {
  return round_up(activation_bytes(d)) + 2 * round_up((size_t)D * 4) +
         round_up((size_t)ceil_div(d, EDGE_QUANT_BLOCK) * 4);
}

size_t edge_cpu_ffn_tokens_workspace_size(int d, int D, int tokens) {
  if (d <= 0 || D <= 0 || tokens <= 0) return 0;
  return (size_t)tokens * token_ffn_bytes(d, D) + EDGE_CACHE_LINE;
}

struct ffn_tokens_job {
  int tokens, d, D;
  struct weight_rows gate, up, down;
  int activation;
  float act_threshold;
  const float *x;             /* [tokens, d] */
  float *y;                   /* [tokens, d] */
  struct token_input *inputs; /* [tokens] */
  char *workspace;            /* the workspace from its first cache line: token_ffn_bytes(d, D) per token */
  int run, n_runs;            /* neurons per run of gate and up rows, and runs */
  int column_unit, n_units, n_column_blocks;
  /* INT4 down rows every token adds: per column block, [tokens][EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS] factors */
  float (*down_factors)[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS];
};

static char *token_workspace(const struct ffn_tokens_job *job, int t) {
  return job->workspace + (size_t)t * token_ffn_bytes(job->d, job->D);
}

static float *token_hidden(const struct ffn_tokens_job *job, int t) {
  return (float *)(token_workspace(job, t) + round_up(activation_bytes(job->d)));
}

static float *token_up_values(const struct ffn_tokens_job *job, int t) {
  return (float *)(token_workspace(job, t) + round_up(activation_bytes(job->d)) + round_up((size_t)job->D * 4));
}

static float *token_corrections(const struct ffn_tokens_job *job, int t) {
  return (float *)(token_workspace(job, t) + round_up(activation_bytes(job->d)) + 2 * round_up((size_t)job->D * 4));
}

static void prepare_ffn_token(const struct ffn_tokens_job *job, int t) {
  prepare_token(job->x + (size_t)t * (size_t)job->d, job->d, job->gate.dtype, job->gate.mins != NULL,
                token_workspace(job, t), job->inputs + t);
}

/* Gate and up of neurons [n0, n1) for every token: the gate rows as a run, each token's activations, then for each
 * token the up rows of its neurons that fire (a != 0), as gate_up_chunk computes them for one token with mask and
 * thresholds NULL; h = a * act_up(u) into the token's hidden values, a (zero) for the others. Where every neuron of
 * the run fires for every token (a SiLU model's prompt), the up rows go as a run too (rows_dot_tokens). */
static void gate_up_tokens(const struct ffn_tokens_job *job, int run) {
  int n0 = run * job->run, n1 = n0 + job->run < job->D ? n0 + job->run : job->D, d = job->d;
  int32_t index[EDGE_TOKEN_RUN_MAX_ROWS];
  float values[EDGE_TOKEN_RUN_MAX_ROWS];
  struct row_list gate_rows = {&job->gate, NULL, n0, n1 - n0};
  struct row_list up_run = {&job->up, NULL, n0, n1 - n0};
  rows_dot_tokens(&gate_rows, &up_run, job->inputs, job->tokens, d, 1, token_hidden(job, 0) + n0,
                  token_ffn_bytes(d, job->D) / sizeof(float));
  for (int t = 0; t < job->tokens; t++) {
    float *hidden = token_hidden(job, t);
    for (int i = n0; i < n1; i++) hidden[i] = gate_activation(job->activation, hidden[i], job->act_threshold);
  }
  int next0 = n1, next_n = job->D - n1 < job->run ? job->D - n1 : job->run;
  struct row_list next_gate_rows = {&job->gate, NULL, next0, next_n};
  int all_fire = 1;
  for (int t = 0; t < job->tokens; t++) {
    const float *hidden = token_hidden(job, t);
    for (int i = n0; i < n1; i++) all_fire &= hidden[i] != 0.0f;
  }
  if (all_fire) {
    rows_dot_tokens(&up_run, &next_gate_rows, job->inputs, job->tokens, d, 0, token_up_values(job, 0) + n0,
                    token_ffn_bytes(d, job->D) / sizeof(float));
    for (int t = 0; t < job->tokens; t++) {
      float *hidden = token_hidden(job, t);
      const float *values = token_up_values(job, t);
      for (int i = n0; i < n1; i++) {
        float u = job->activation == EDGE_ACT_DRELU ? keep_or_zero(values[i], !(values[i] < 0.0f)) : values[i];
        hidden[i] *= u;
      }
    }
    return;
  }
  for (int t = 0; t < job->tokens; t++) {
    const struct token_input *token = job->inputs + t;
    float *hidden = token_hidden(job, t);
    int n_active = 0;
    for (int i = n0; i < n1; i++) {
      index[n_active] = i;
      n_active += hidden[i] != 0.0f;
    }
    struct row_list up_rows = {&job->up, index, 0, n_active};
    rows_dot(&up_rows, &next_gate_rows, token->x, token->xa, token->block_sums, d, 0, values);
    for (int j = 0; j < n_active; j++) {
      float u = job->activation == EDGE_ACT_DRELU ? keep_or_zero(values[j], !(values[j] < 0.0f)) : values[j];
      hidden[index[j]] *= u;
    }
  }
}

/* What every token of a block adds from down rows rows[r < n_rows] (neuron indices) that all its tokens fire, in two
 * parts, each the bits add_quant_rows gives token by token, with what depends on the rows alone done once for all
 * tokens: row_corrections_tokens, the asymmetric rows' corrections of a piece of the columns, and
 * row_block_tokens, the rows' 32 columns of one block times each token's factors. */
#if EDGE_ROWS_AVX512
/* Corrections of blocks [first_block, first_block + n_blocks) (n_blocks <= EDGE_FACTOR_GROUPS * 4) for every token
 * t (at corrections + t * stride, h_t[r] at hidden + t * hidden_stride + rows[r]), rows in order: each row's mids
 * once (block_mids16), then added to each token's corrections in registers, as add_row_corrections adds them. */
static void row_corrections_tokens(float *corrections, size_t stride, int tokens, const uint16_t *scales,
                                   const uint16_t *mins, size_t groups, int group_size, const size_t *rows, int n_rows,
                                   const float *hidden, size_t hidden_stride, int first_block, int n_blocks) {
  enum { PIECE_CHUNKS = EDGE_FACTOR_GROUPS * 128 / EDGE_QUANT_BLOCK / 16 }; /* 16-block chunks of a piece, at most */
  int group_log = group_size == 32 ? 0 : group_size == 64 ? 1 : 2;
  __m512 mids[EDGE_DOWN_GROUP][PIECE_CHUNKS];
  for (int r = 0; r < n_rows; r++) {
    for (int k = 0; k < n_blocks; k += 16) {
      int count = n_blocks - k < 16 ? n_blocks - k : 16;
      mids[r][k / 16] = block_mids16(scales + rows[r] * groups, mins + rows[r] * groups, group_log, first_block + k,
                                     count);
    }
  }
  for (int t = 0; t < tokens; t++) {
    float *token_corrections = corrections + (size_t)t * stride + first_block;
    const float *h = hidden + (size_t)t * hidden_stride;
    for (int k = 0; k < n_blocks; k += 16) {
      __mmask16 in_piece = tail_mask(n_blocks - k < 16 ? n_blocks - k : 16);
      __m512 sums = _mm512_maskz_loadu_ps(in_piece, token_corrections + k);
      for (int r = 0; r < n_rows; r++) sums = _mm512_fmadd_ps(_mm512_set1_ps(h[rows[r]]), mids[r][k / 16], sums);
      _mm512_mask_storeu_ps(token_corrections + k, in_piece, sums);
    }
  }
}

/* y_t[0:32) plus factor_t[r] times the 32 code values of rows r < n_rows (low[r]: the block's low nibbles' values,
 * high[r]: its high ones'), for tokens t < n (1 or 2, a constant once inlined), the rows in order of r: the product
 * of each factor and value rounded, then added, as add_quant_rows does. Two tokens at once keep four add chains in
 * flight instead of two. */
EDGE_ALWAYS_INLINE void add_int4_block_tokens(int n, float *const *y, const float *const *factors, int n_rows,
                                              const __m512 *low, const __m512 *high) {
  __m512 acc_low[2], acc_high[2];
  for (int t = 0; t < n; t++) {
    acc_low[t] = _mm512_loadu_ps(y[t]);
    acc_high[t] = _mm512_loadu_ps(y[t] + 16);
  }
  for (int r = 0; r < n_rows; r++) {
    for (int t = 0; t < n; t++) {
      __m512 factor = _mm512_set1_ps(factors[t][r * EDGE_FACTOR_GROUPS]);
      acc_low[t] = _mm512_add_ps(acc_low[t], _mm512_mul_ps(low[r], factor));
      acc_high[t] = _mm512_add_ps(acc_high[t], _mm512_mul_ps(high[r], factor));
    }
  }
  for (int t = 0; t < n; t++) {
    _mm512_storeu_ps(y[t], acc_low[t]);
    _mm512_storeu_ps(y[t] + 16, acc_high[t]);
  }
}

/* Columns [column, column + 32) of every token's y (token t's at y + t * d) plus factors[t][r][g] times the INT4
 * rows rows[r] there: the rows' nibbles widened to fp32 values once, in registers (their product with a factor is the
 * one add_quant_rows picks from its 16 products), then two tokens at a time. */
static void row_block_tokens(float *y, int d, int tokens, int column, const char *codes, size_t row_bytes,
                             const size_t *rows, int n_rows, float (*factors)[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS],
                             int g) {
  size_t offset = (size_t)(column / EDGE_QUANT_BLOCK) * block_bytes(EDGE_Q4);
  __m512 low[EDGE_DOWN_GROUP], high[EDGE_DOWN_GROUP];
  for (int r = 0; r < n_rows; r++) { /* each nibble's signed value: its 4 bits moved to the top, shifted back */
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + rows[r] * row_bytes + offset)));
    low[r] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(bytes, 28), 28));
    high[r] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(bytes, 24), 28));
  }
  int t = 0;
  for (; t + 2 <= tokens; t += 2) {
    float *y_t[2] = {y + (size_t)t * (size_t)d + column, y + (size_t)(t + 1) * (size_t)d + column};
    const float *factors_t[2] = {&factors[t][0][g], &factors[t + 1][0][g]};
    add_int4_block_tokens(2, y_t, factors_t, n_rows, low, high);
  }
  if (t < tokens) {
    float *y_t[1] = {y + (size_t)t * (size_t)d + column};
    const float *factors_t[1] = {&factors[t][0][g]};
    add_int4_block_tokens(1, y_t, factors_t, n_rows, low, high);
  }
}
#else
/* row_corrections_tokens of the AVX-512 build (same arguments and bits): add_row_corrections token by token. */
static void row_corrections_tokens(float *corrections, size_t stride, int tokens, const uint16_t *scales,
                                   const uint16_t *mins, size_t groups, int group_size, const size_t *rows, int n_rows,
                                   const float *hidden, size_t hidden_stride, int first_block, int n_blocks) {
  for (int t = 0; t < tokens; t++) {
    for (int r = 0; r < n_rows; r++) {
      add_row_corrections(corrections + (size_t)t * stride, first_block, n_blocks, scales + rows[r] * groups,
                          mins + rows[r] * groups, group_size, hidden[(size_t)t * hidden_stride + rows[r]]);
    }
  }
}

/* The 32 values of INT4 block `block` of a row as fp32, in add_quant_rows' element order: values[j] is the low
 * nibble of byte j for j < 16, the high nibble of byte j - 16 after. */
EDGE_ALWAYS_INLINE void int4_block_values(const char *row, int block, float values[EDGE_QUANT_BLOCK]) {
#if EDGE_ROWS_AVX2
  codes16 first, second;
  block_codes(row + (size_t)block * block_bytes(EDGE_Q4), EDGE_Q4, &first, &second);
  _mm256_storeu_ps(values, codes_as_floats(first, 0));
  _mm256_storeu_ps(values + 8, codes_as_floats(first, 1));
  _mm256_storeu_ps(values + 16, codes_as_floats(second, 0));
  _mm256_storeu_ps(values + 24, codes_as_floats(second, 1));
#elif defined(__ARM_NEON)
  codes16 first, second;
  block_codes(row + (size_t)block * block_bytes(EDGE_Q4), EDGE_Q4, &first, &second);
  float32x4_t quarters[8];
  codes_as_floats_by_table(first, quarters);
  codes_as_floats_by_table(second, quarters + 4);
  for (int i = 0; i < 8; i++) vst1q_f32(values + 4 * i, quarters[i]);
#else
  vec16 low, high;
  load_codes(row, EDGE_Q4, block, &low, &high);
  VEC16_AT(values) = low;
  VEC16_AT(values + 16) = high;
#endif
}

/* y[0:32) plus factors[r * EDGE_FACTOR_GROUPS] times values[r][0:32) for r < n_rows, in order of r: each product
 * rounded, then added, in the accumulators add_quant_rows keeps for the block on this target. */
EDGE_ALWAYS_INLINE void add_block_values(float *y, const float *factors, int n_rows,
                                         const float (*values)[EDGE_QUANT_BLOCK]) {
#if EDGE_ROWS_AVX2
  __m256 acc[4];
  for (int i = 0; i < 4; i++) acc[i] = _mm256_loadu_ps(y + 8 * i);
  for (int r = 0; r < n_rows; r++) {
    __m256 factor = _mm256_set1_ps(factors[r * EDGE_FACTOR_GROUPS]);
    for (int i = 0; i < 4; i++) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(factor, _mm256_loadu_ps(values[r] + 8 * i)));
  }
  for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + 8 * i, acc[i]);
#elif defined(__ARM_NEON)
  float32x4_t acc[8];
  for (int i = 0; i < 8; i++) acc[i] = vld1q_f32(y + 4 * i);
  for (int r = 0; r < n_rows; r++) {
    float factor = factors[r * EDGE_FACTOR_GROUPS];
    for (int i = 0; i < 8; i++) acc[i] = vaddq_f32(acc[i], vmulq_n_f32(vld1q_f32(values[r] + 4 * i), factor));
  }
  for (int i = 0; i < 8; i++) vst1q_f32(y + 4 * i, acc[i]);
#else
  vec16 acc_low = VEC16_AT(y), acc_high = VEC16_AT(y + 16);
  for (int r = 0; r < n_rows; r++) {
    acc_low += factors[r * EDGE_FACTOR_GROUPS] * VEC16_AT(values[r]);
    acc_high += factors[r * EDGE_FACTOR_GROUPS] * VEC16_AT(values[r] + 16);
  }
  VEC16_AT(y) = acc_low;
  VEC16_AT(y + 16) = acc_high;
#endif
}

/* row_block_tokens of the AVX-512 build (same arguments and bits): the rows' codes widened to fp32 once into a
 * small buffer, then added token by token. */
static void row_block_tokens(float *y, int d, int tokens, int column, const char *codes, size_t row_bytes,
                             const size_t *rows, int n_rows, float (*factors)[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS],
                             int g) {
  float values[EDGE_DOWN_GROUP][EDGE_QUANT_BLOCK];
  for (int r = 0; r < n_rows; r++) int4_block_values(codes + rows[r] * row_bytes, column / EDGE_QUANT_BLOCK, values[r]);
  for (int t = 0; t < tokens; t++) add_block_values(y + (size_t)t * (size_t)d + column, &factors[t][0][g], n_rows, values);
}
#endif

/* Down rows that every token of a block adds (each with its own h): columns [c0, c0 + n) of each token's y (token t's
 * at y + t * d) plus h_t[r] times the INT4 rows rows[r] (neuron indices, n_rows <= EDGE_DOWN_GROUP), h_t[r] at
 * hidden + t * hidden_stride + rows[r]. add_quant_rows token by token, operation for operation (the factors h *
 * scale, their products with the code values added in order of r; asymmetric rows' corrections, at corrections + t *
 * corrections_stride, in order of r), a piece of EDGE_FACTOR_GROUPS groups at a time as there: the same bits.
 * factors: [tokens][EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS] scratch. */
static void add_int4_rows_tokens(float *y, int d, int tokens, int c0, int n, const char *codes, const uint16_t *scales,
                                 int group_size, const size_t *rows, int n_rows, const float *hidden,
                                 size_t hidden_stride, const uint16_t *mins, float *corrections,
                                 size_t corrections_stride, float (*factors)[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS]) {
  size_t row_bytes = (size_t)d / EDGE_QUANT_BLOCK * block_bytes(EDGE_Q4);
  size_t groups = (size_t)(d / group_size);
  int c1 = c0 + n;
  for (int piece = c0; piece < c1;) {
    int g0 = piece / group_size;
    int piece_end = (g0 + EDGE_FACTOR_GROUPS) * group_size < c1 ? (g0 + EDGE_FACTOR_GROUPS) * group_size : c1;
    int n_groups = (piece_end - 1) / group_size - g0 + 1;
    for (int t = 0; t < tokens; t++) {
      float h[EDGE_DOWN_GROUP];
      for (int r = 0; r < n_rows; r++) h[r] = hidden[(size_t)t * hidden_stride + rows[r]];
      row_factors(scales, groups, rows, h, n_rows, g0, n_groups, factors[t]);
    }
    if (mins != NULL) {
      row_corrections_tokens(corrections, corrections_stride, tokens, scales, mins, groups, group_size, rows, n_rows,
                             hidden, hidden_stride, piece / EDGE_QUANT_BLOCK, (piece_end - piece) / EDGE_QUANT_BLOCK);
    }
    for (int column = piece; column < piece_end; column += EDGE_QUANT_BLOCK) {
      row_block_tokens(y, d, tokens, column, codes, row_bytes, rows, n_rows, factors, column / group_size - g0);
    }
    piece = piece_end;
  }
}

/* Columns [c0, c1) of every token's y: the down rows with h != 0, in increasing neuron order per token as
 * down_columns adds them, taken a run of neurons at a time for all tokens. A run of INT4 rows that every token adds
 * (a SiLU model's prompt) goes through add_int4_rows_tokens, 8 rows at a time for all tokens. */
static void down_tokens(const struct ffn_tokens_job *job, int block) {
  int d = job->d;
  int c0 = job->column_unit * split_point(job->n_units, job->n_column_blocks, block);
  int c1 = job->column_unit * split_point(job->n_units, job->n_column_blocks, block + 1);
  c1 = c1 < d ? c1 : d;
  int n = c1 - c0, quantized = is_quantized(job->down.dtype);
  const struct weight_rows *down = &job->down;
  for (int t = 0; t < job->tokens; t++) {
    memset(job->y + (size_t)t * (size_t)d + c0, 0, (size_t)n * sizeof(float));
    if (down->mins != NULL) memset(token_corrections(job, t) + c0 / EDGE_QUANT_BLOCK, 0, (size_t)n / EDGE_QUANT_BLOCK * 4);
  }
  size_t piece_bytes = quantized ? (size_t)n / EDGE_QUANT_BLOCK * block_bytes(down->dtype)
                                 : (size_t)n * weight_bytes(down->dtype);
  int run = token_run_rows(piece_bytes);
  /* fp rows: element offsets of the rows' pieces; quantized rows: the neurons (as down_columns) */
  size_t row_length = quantized ? 1 : (size_t)d, column = quantized ? 0 : (size_t)c0;
  for (int n0 = 0; n0 < job->D; n0 += run) {
    int n1 = n0 + run < job->D ? n0 + run : job->D;
    int all_fire = down->dtype == EDGE_Q4 && job->tokens > 1;
    for (int t = 0; all_fire && t < job->tokens; t++) {
      const float *hidden = token_hidden(job, t);
      for (int i = n0; i < n1; i++) all_fire &= hidden[i] != 0.0f;
    }
    if (all_fire) {
      float(*factors)[EDGE_DOWN_GROUP][EDGE_FACTOR_GROUPS] = job->down_factors + (size_t)block * (size_t)job->tokens;
      size_t stride = token_ffn_bytes(d, job->D) / sizeof(float);
      for (int g = n0; g < n1; g += EDGE_DOWN_GROUP) {
        size_t rows[EDGE_DOWN_GROUP];
        int count = n1 - g < EDGE_DOWN_GROUP ? n1 - g : EDGE_DOWN_GROUP;
        for (int r = 0; r < count; r++) rows[r] = (size_t)(g + r);
        add_int4_rows_tokens(job->y, d, job->tokens, c0, n, down->values, down->scales, down->group_size, rows, count,
                             token_hidden(job, 0), stride, down->mins, token_corrections(job, 0), stride, factors);
      }
      continue;
    }
    for (int t = 0; t < job->tokens; t++) {
      const float *hidden = token_hidden(job, t);
      float *y = job->y + (size_t)t * (size_t)d;
      size_t rows[EDGE_TOKEN_RUN_MAX_ROWS];
      float h[EDGE_TOKEN_RUN_MAX_ROWS];
      int n_rows = 0;
      for (int i = n0; i < n1; i++) {
        rows[n_rows] = (size_t)i * row_length + column;
        h[n_rows] = hidden[i];
        n_rows += hidden[i] != 0.0f;
      }
      for (int g = 0; g < n_rows; g += EDGE_DOWN_GROUP) {
        int count = n_rows - g < EDGE_DOWN_GROUP ? n_rows - g : EDGE_DOWN_GROUP;
        int n_next = n_rows - g - count < EDGE_DOWN_GROUP ? n_rows - g - count : EDGE_DOWN_GROUP;
        const size_t *group = rows + g, *next = rows + g + count;
        switch (down->dtype) {
          case EDGE_Q8:
            add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q8, down->group_size, d, group, h + g, count,
                           next, n_next, NULL, NULL);
            break;
          case EDGE_Q4:
            if (down->mins != NULL) {
              add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q4, down->group_size, d, group, h + g, count,
                             next, n_next, down->mins, token_corrections(job, t));
            } else {
              add_quant_rows(y, c0, n, down->values, down->scales, EDGE_Q4, down->group_size, d, group, h + g, count,
                             next, n_next, NULL, NULL);
            }
            break;
          case EDGE_F16:
            add_rows(y + c0, n, down->values, EDGE_F16, group, h + g, count, next, n_next);
            break;
          default:
            add_rows(y + c0, n, down->values, EDGE_F32, group, h + g, count, next, n_next);
        }
      }
    }
  }
  for (int t = 0; down->mins != NULL && t < job->tokens; t++) {
    float *y = job->y + (size_t)t * (size_t)d;
    for (int c = c0; c < c1; c++) y[c] += token_corrections(job, t)[c / EDGE_QUANT_BLOCK];
  }
}

int edge_cpu_ffn_tokens(const float *x, int tokens, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                        const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                        const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                        const uint16_t *down_mins, int weight_dtype, int down_format, int group_size,
                        int activation, float act_threshold, float *y, void *workspace, int threads) {
  struct weight_rows gate = {w_gate, gate_scales, weight_dtype, group_size, gate_mins};
  struct weight_rows up = {w_up, up_scales, weight_dtype, group_size, up_mins};
  struct weight_rows down = {w_down_t, down_scales, down_format, group_size, down_mins};
  if (tokens <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  if (!is_quantized(weight_dtype) && (gate_scales != NULL || up_scales != NULL || down_scales != NULL)) {
    return EDGE_CPU_INVALID_ARGUMENT;
  }
  int status = check_ffn_arguments(x, d, D, &gate, &up, &down, activation, act_threshold, y, workspace);
  if (status != EDGE_CPU_OK) return status;
  if (threads <= 0) threads = edge_cpu_max_threads();
  char *base = (char *)(((uintptr_t)workspace + EDGE_CACHE_LINE - 1) / EDGE_CACHE_LINE * EDGE_CACHE_LINE);
  struct ffn_tokens_job job = {tokens, d, D, gate, up, down, activation, act_threshold, x, y, NULL, base,
                               token_run_rows(row_bytes(weight_dtype, d)), 0, 0, 0, 0, NULL};
  job.n_runs = ceil_div(D, job.run);
  job.column_unit = is_quantized(down_format) ? EDGE_QUANT_BLOCK : EDGE_COLUMN_UNIT;
  job.n_units = ceil_div(d, job.column_unit);
  job.n_column_blocks = threads < job.n_units ? threads : job.n_units;
  job.inputs = malloc((size_t)tokens * sizeof *job.inputs);
  /* the factors of INT4 down rows shared by the tokens (down_tokens); INT8 down rows go token by token */
  int shared_down = down_format == EDGE_Q4 && tokens > 1;
  if (shared_down) {
    job.down_factors = malloc((size_t)job.n_column_blocks * (size_t)tokens * sizeof *job.down_factors);
  }
  int factors_missing = shared_down && job.down_factors == NULL;
  if (job.inputs == NULL || factors_missing) {
    free(job.inputs);
    free(job.down_factors);
    return EDGE_CPU_OUT_OF_MEMORY;
  }
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
      for (int t = 0; t < tokens; t++) prepare_ffn_token(&job, t);
#pragma omp for schedule(dynamic, 1)
      for (int r = 0; r < job.n_runs; r++) gate_up_tokens(&job, r);
#pragma omp for schedule(dynamic, 1)
      for (int b = 0; b < job.n_column_blocks; b++) down_tokens(&job, b);
    }
    free(job.inputs);
    free(job.down_factors);
    return EDGE_CPU_OK;
  }
#endif
  for (int t = 0; t < tokens; t++) prepare_ffn_token(&job, t);
  for (int r = 0; r < job.n_runs; r++) gate_up_tokens(&job, r);
  for (int b = 0; b < job.n_column_blocks; b++) down_tokens(&job, b);
  free(job.inputs);
  free(job.down_factors);
  return EDGE_CPU_OK;
}

const char *EDGE_CPU_ISA_NAME(edge_cpu_build_isa)(void) { return EDGE_CPU_COMPILED_ISA; }
