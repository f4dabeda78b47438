/* Attention of one decode token over a layer's KV cache (edge_cpu_attention): the scores q . k of every cached
 * position, their softmax, and the weighted sum of the values, per head, GQA as edge_sdk/model/decoder.py. The C
 * runtime's engine calls it for each layer of each token; here, among the kernels, it is built for each instruction
 * set the library holds (edge_cpu_isa.h), where the engine's own code is built once, for the baseline.
 *
 * Every head's arithmetic and its order are fixed (each score sums over the head dimension in order, the softmax's
 * maximum and sum in 16 lanes with a fixed final order, each output sums over the positions in order), with no fused
 * multiply-add (-ffp-contract=off): the same bits on every instruction set and for any thread count. */
#include "edge_cpu_isa.h" /* first: the kernels under this build's names */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "edge_cpu_internal.h"
#include "edge_cpu_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

/* Below this many multiply-adds (heads x positions x head dimension) the heads run on one thread: an OpenMP region
 * costs as much as a small model's whole attention. */
#define EDGE_ATTENTION_PARALLEL_MIN_WORK (1 << 16)
/* Lanes of the softmax's maximum and sum. */
#define LANES 16

/* e^x for x <= 0 (softmax scores minus their maximum), within 2 ulp of expf; results below e^-87.3 (under
 * FLT_MIN, negligible next to the maximum's e^0 = 1) are flushed to 0. Branch-free arithmetic that GCC
 * vectorises, where a libm expf call per score cost most of the attention; with floating-point contraction off
 * in this file it rounds identically on every target. Cephes' expf: e^x = 2^n e^r, |r| <= ln2 / 2. */
static inline float exp_nonpositive(float x) {
  float clamped = x < -87.3f ? -87.3f : x;
  /* n = round(x / ln2): adding and subtracting 1.5 * 2^23 rounds to an integer (floorf does not vectorise) */
  float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * (r * r) + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.3f ? 0.0f : y * scale;
}

/* Heads attended together. A head's value sums add one position after the other, and with AVX-512 a vec16 is one
 * register, so a lone head of 32 dimensions is two dependency chains waiting on the adder's latency; four heads'
 * chains are independent and interleave (benchmarks/README.md: "Attention of four heads at once"). Each head's
 * arithmetic and its order stay exactly those of the head alone. Elsewhere a vec16 is two (AVX2) or four (NEON)
 * registers, already as many independent chains, and more heads would only spill registers. */
#ifdef __AVX512F__
#define HEAD_BLOCK 4
#else
#define HEAD_BLOCK 1
#endif

/* On NEON and AVX2 a vec16 is four or two registers, and GCC kept the sums of score_vectors and weighted_values below
 * on the stack around every multiply and add (the disassembly of attend_head_range; on AVX2 even moved through
 * general registers); these forms keep each 16-lane vector in registers (`lanes`, four q or two ymm), with the same
 * multiply and add per lane in the same order (HEAD_BLOCK is 1 there). */
#if defined(__aarch64__)
#define EDGE_ATTENTION_IN_REGISTERS 1
typedef float32x4_t lanes;
#define LANES_PER_REGISTER 4
static inline lanes lanes_zero(void) { return vdupq_n_f32(0); }
static inline lanes lanes_load(const float *p) { return vld1q_f32(p); }
static inline void lanes_store(float *p, lanes v) { vst1q_f32(p, v); }
static inline lanes lanes_times(lanes v, float w) { return vmulq_n_f32(v, w); }
static inline lanes lanes_plus(lanes a, lanes b) { return vaddq_f32(a, b); }
#elif defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#define EDGE_ATTENTION_IN_REGISTERS 1
typedef __m256 lanes;
#define LANES_PER_REGISTER 8
static inline lanes lanes_zero(void) { return _mm256_setzero_ps(); }
static inline lanes lanes_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void lanes_store(float *p, lanes v) { _mm256_storeu_ps(p, v); }
static inline lanes lanes_times(lanes v, float w) { return _mm256_mul_ps(v, _mm256_set1_ps(w)); }
static inline lanes lanes_plus(lanes a, lanes b) { return _mm256_add_ps(a, b); }
#endif

#if EDGE_ATTENTION_IN_REGISTERS
#define REGISTERS_PER_16 (16 / LANES_PER_REGISTER)

static inline __attribute__((always_inline)) void score_vectors(float *const scores[], const float *const keys[],
                                                                size_t tile_floats, const float *const q[],
                                                                int n_heads, int hd, float scale, int n_vectors) {
  (void)n_heads;
  lanes sum[4][REGISTERS_PER_16];
  for (int v = 0; v < n_vectors; v++) {
    for (int l = 0; l < REGISTERS_PER_16; l++) sum[v][l] = lanes_zero();
  }
  for (int i = 0; i < hd; i++) {
    const float *row = keys[0] + (size_t)i * 16;
    float qi = q[0][i];
    for (int v = 0; v < n_vectors; v++) {
      for (int l = 0; l < REGISTERS_PER_16; l++) {
        sum[v][l] = lanes_plus(sum[v][l],
                               lanes_times(lanes_load(row + (size_t)v * tile_floats + LANES_PER_REGISTER * l), qi));
      }
    }
  }
  for (int v = 0; v < n_vectors; v++) {
    for (int l = 0; l < REGISTERS_PER_16; l++) {
      lanes_store(scores[0] + 16 * v + LANES_PER_REGISTER * l, lanes_times(sum[v][l], scale));
    }
  }
}

/* sums[0 .. n) += w * v[0 .. n LANES_PER_REGISTER) */
static inline __attribute__((always_inline)) void add_weighted(lanes *sums, int n, float w, const float *v) {
  for (int l = 0; l < n; l++) sums[l] = lanes_plus(sums[l], lanes_times(lanes_load(v + LANES_PER_REGISTER * l), w));
}

static void weighted_values(float *const out[], const float *const weights[], const float *const values[],
                            int n_heads, size_t row_stride, int first, int pos, int hd) {
  (void)n_heads;
  int i0 = 0;
  for (; i0 + 32 <= hd; i0 += 32) {
    lanes sums[2 * REGISTERS_PER_16];
    for (int l = 0; l < 2 * REGISTERS_PER_16; l++) sums[l] = lanes_zero();
    for (int t = first; t <= pos; t++) {
      add_weighted(sums, 2 * REGISTERS_PER_16, weights[0][t], values[0] + (size_t)t * row_stride + i0);
    }
    for (int l = 0; l < 2 * REGISTERS_PER_16; l++) lanes_store(out[0] + i0 + LANES_PER_REGISTER * l, sums[l]);
  }
  for (; i0 + 16 <= hd; i0 += 16) {
    lanes sums[REGISTERS_PER_16];
    for (int l = 0; l < REGISTERS_PER_16; l++) sums[l] = lanes_zero();
    for (int t = first; t <= pos; t++) {
      add_weighted(sums, REGISTERS_PER_16, weights[0][t], values[0] + (size_t)t * row_stride + i0);
    }
    for (int l = 0; l < REGISTERS_PER_16; l++) lanes_store(out[0] + i0 + LANES_PER_REGISTER * l, sums[l]);
  }
  for (; i0 < hd; i0++) {
    float sum = 0.0f;
    for (int t = first; t <= pos; t++) sum += weights[0][t] * values[0][(size_t)t * row_stride + (size_t)i0];
    out[0][i0] = sum;
  }
}

#else
/* For each of n_heads heads j: scores[j][0:16 * n_vectors] = scale * (q[j] . the keys of n_vectors consecutive tiles
 * from keys[j]), n_vectors in 1..4, a tile [hd, 16] of tile_floats floats; each score sums over the head dimension in
 * order. */
static inline void score_vectors(float *const scores[], const float *const keys[], size_t tile_floats,
                                 const float *const q[], int n_heads, int hd, float scale, int n_vectors) {
  vec16 sum[HEAD_BLOCK][4] = {{{0}}};
  for (int i = 0; i < hd; i++) {
    for (int j = 0; j < n_heads; j++) {
      const float *row = keys[j] + (size_t)i * 16;
      for (int v = 0; v < n_vectors; v++) sum[j][v] += q[j][i] * VEC16_AT(row + (size_t)v * tile_floats);
    }
  }
  for (int j = 0; j < n_heads; j++) {
    for (int v = 0; v < n_vectors; v++) VEC16_AT(scores[j] + 16 * v) = sum[j][v] * scale;
  }
}

/* For each of n_heads heads j: out[j][0:hd] = sum over t in [first, pos] of weights[j][t] * values[j][t][0:hd],
 * positions in order, 32 or 16 dimensions at a time in registers. */
static void weighted_values(float *const out[], const float *const weights[], const float *const values[],
                            int n_heads, size_t row_stride, int first, int pos, int hd) {
  int i0 = 0;
  for (; i0 + 32 <= hd; i0 += 32) {
    vec16 low[HEAD_BLOCK] = {{0}}, high[HEAD_BLOCK] = {{0}};
    for (int t = first; t <= pos; t++) {
      for (int j = 0; j < n_heads; j++) {
        const float *v = values[j] + (size_t)t * row_stride + (size_t)i0;
        low[j] += weights[j][t] * VEC16_AT(v);
        high[j] += weights[j][t] * VEC16_AT(v + 16);
      }
    }
    for (int j = 0; j < n_heads; j++) {
      VEC16_AT(out[j] + i0) = low[j];
      VEC16_AT(out[j] + i0 + 16) = high[j];
    }
  }
  for (; i0 + 16 <= hd; i0 += 16) {
    vec16 sum[HEAD_BLOCK] = {{0}};
    for (int t = first; t <= pos; t++) {
      for (int j = 0; j < n_heads; j++) {
        sum[j] += weights[j][t] * VEC16_AT(values[j] + (size_t)t * row_stride + (size_t)i0);
      }
    }
    for (int j = 0; j < n_heads; j++) VEC16_AT(out[j] + i0) = sum[j];
  }
  for (; i0 < hd; i0++) {
    for (int j = 0; j < n_heads; j++) {
      float sum = 0.0f;
      for (int t = first; t <= pos; t++) sum += weights[j][t] * values[j][(size_t)t * row_stride + (size_t)i0];
      out[j][i0] = sum;
    }
  }
}

#endif

/* scores[0:n] = softmax(scores[0:n]). The maximum and the sum are taken in LANES lanes (k % LANES) with a fixed
 * final order, so they do not depend on threads. The last n % LANES scores go through a full vector padded with
 * -inf (whose exponentials are 0 and leave the lane sums exact), not through a scalar loop per pass; exponentials
 * and their sum share one pass. */
static void softmax(float *scores, int n) {
  int full = n / LANES * LANES;
  float tail[LANES];
  for (int l = 0; l < LANES; l++) tail[l] = l < n - full ? scores[full + l] : -INFINITY;
  float lane_max[LANES];
  for (int l = 0; l < LANES; l++) lane_max[l] = tail[l];
  for (int k = 0; k < full; k += LANES) {
    for (int l = 0; l < LANES; l++) lane_max[l] = scores[k + l] > lane_max[l] ? scores[k + l] : lane_max[l];
  }
  float max = lane_max[0];
  for (int l = 1; l < LANES; l++) max = lane_max[l] > max ? lane_max[l] : max;
  float partial[LANES] = {0};
  for (int k = 0; k < full; k += LANES) {
    for (int l = 0; l < LANES; l++) {
      scores[k + l] = exp_nonpositive(scores[k + l] - max);
      partial[l] += scores[k + l];
    }
  }
  for (int l = 0; l < LANES; l++) {
    tail[l] = exp_nonpositive(tail[l] - max);
    partial[l] += tail[l];
  }
  for (int half = LANES / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; l++) partial[l] += partial[l + half];
  }
  float sum = partial[0];
  for (int k = 0; k < full; k += LANES) {
    for (int l = 0; l < LANES; l++) scores[k + l] /= sum;
  }
  for (int l = 0; l < LANES; l++) tail[l] /= sum;
  for (int l = 0; l < n - full; l++) scores[full + l] = tail[l];
}

/* One call's arguments, for the heads' loops. */
struct attention_call {
  const float *q, *keys, *values;
  float *scores, *out;
  size_t key_tiles, score_stride, kv_dim;
  int head_dim, groups, first, pos;
  float scale;
};

/* scores[j][lo:hi] = the scores of positions [lo, hi) within the tile of 16 positions from t0 (tiles[j] its keys):
 * the whole tile's scores, the others not kept. */
static inline __attribute__((always_inline)) void score_tile_part(float *const scores[], const float *const tiles[],
                                                                  size_t tile_floats, const float *const q[],
                                                                  int n_heads, int hd, float scale, int t0, int lo,
                                                                  int hi) {
  float tail[HEAD_BLOCK][16];
  float *tails[HEAD_BLOCK];
  for (int j = 0; j < n_heads; j++) tails[j] = tail[j];
  score_vectors(tails, tiles, tile_floats, q, n_heads, hd, scale, 1);
  for (int j = 0; j < n_heads; j++) memcpy(scores[j] + lo, tail[j] + (lo - t0), (size_t)(hi - lo) * sizeof(float));
}

/* Attention of heads [h0, h0 + n_heads) (n_heads <= HEAD_BLOCK) for the token at pos over positions [first, pos]:
 * the scores a tile of 16 positions at a time from first's tile (4 tiles at a time where all their positions count),
 * the softmax, the weighted values. */
static inline __attribute__((always_inline)) void attend_heads(const struct attention_call *a, int h0, int n_heads) {
  int hd = a->head_dim, first = a->first, pos = a->pos;
  size_t tile_floats = (size_t)hd * 16;
  const float *q[HEAD_BLOCK], *keys[HEAD_BLOCK], *values[HEAD_BLOCK], *tiles[HEAD_BLOCK];
  float *scores[HEAD_BLOCK], *out[HEAD_BLOCK];
  for (int j = 0; j < n_heads; j++) {
    int h = h0 + j;
    size_t kv_head = (size_t)(h / a->groups);
    q[j] = a->q + (size_t)h * (size_t)hd;
    keys[j] = a->keys + kv_head * a->key_tiles * tile_floats; /* the head's tiles from position 0 */
    values[j] = a->values + kv_head * (size_t)hd;
    scores[j] = a->scores + (size_t)h * a->score_stride; /* scores[j][t]: position t */
    out[j] = a->out + (size_t)h * (size_t)hd;
  }
  int t0 = first / 16 * 16;
  if (t0 < first) { /* a sliding window's first tile, partly before the window */
    for (int j = 0; j < n_heads; j++) tiles[j] = keys[j] + (size_t)(t0 / 16) * tile_floats;
    int hi = t0 + 16 < pos + 1 ? t0 + 16 : pos + 1;
    score_tile_part(scores, tiles, tile_floats, q, n_heads, hd, a->scale, t0, first, hi);
    t0 += 16;
  }
  for (; t0 + 64 <= pos + 1; t0 += 64) {
    float *scores_t[HEAD_BLOCK];
    for (int j = 0; j < n_heads; j++) {
      tiles[j] = keys[j] + (size_t)(t0 / 16) * tile_floats;
      scores_t[j] = scores[j] + t0;
    }
    score_vectors(scores_t, tiles, tile_floats, q, n_heads, hd, a->scale, 4);
  }
  for (; t0 <= pos; t0 += 16) { /* the last tiles: positions past pos are read (within the tile) but not kept */
    for (int j = 0; j < n_heads; j++) tiles[j] = keys[j] + (size_t)(t0 / 16) * tile_floats;
    int hi = t0 + 16 < pos + 1 ? t0 + 16 : pos + 1;
    score_tile_part(scores, tiles, tile_floats, q, n_heads, hd, a->scale, t0, t0, hi);
  }
  const float *weights[HEAD_BLOCK];
  for (int j = 0; j < n_heads; j++) {
    softmax(scores[j] + first, pos - first + 1);
    weights[j] = scores[j];
  }
  weighted_values(out, weights, values, n_heads, a->kv_dim, first, pos, hd);
}

/* Attention of heads [h0, h1) in blocks of HEAD_BLOCK, then of two and one (block sizes the compiler sees as
 * constants, so each block's loops over heads unroll). */
static void attend_head_range(const struct attention_call *a, int h0, int h1) {
  int h = h0;
  for (; h + HEAD_BLOCK <= h1; h += HEAD_BLOCK) attend_heads(a, h, HEAD_BLOCK);
  if (HEAD_BLOCK > 2 && h + 2 <= h1) {
    attend_heads(a, h, 2);
    h += 2;
  }
  for (; h < h1; h++) attend_heads(a, h, 1);
}

int edge_cpu_attention(const float *q, int n_heads, int n_kv_heads, int head_dim, const float *keys, size_t key_tiles,
                       const float *values, int first, int pos, float *scores, size_t score_stride, float *out,
                       int threads) {
  if (q == NULL || keys == NULL || values == NULL || scores == NULL || out == NULL) return EDGE_CPU_INVALID_ARGUMENT;
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0) return EDGE_CPU_INVALID_ARGUMENT;
  if (first < 0 || pos < first || score_stride <= (size_t)pos) return EDGE_CPU_INVALID_ARGUMENT;
  if (key_tiles <= (size_t)pos / 16) return EDGE_CPU_INVALID_ARGUMENT; /* pos's tile */
  struct attention_call a = {
      .q = q,
      .keys = keys,
      .values = values,
      .scores = scores,
      .out = out,
      .key_tiles = key_tiles,
      .score_stride = score_stride,
      .kv_dim = (size_t)n_kv_heads * (size_t)head_dim,
      .head_dim = head_dim,
      .groups = n_heads / n_kv_heads,
      .first = first,
      .pos = pos,
      .scale = 1.0f / sqrtf((float)head_dim),
  };
  if (threads <= 0) threads = edge_cpu_max_threads();
#ifdef _OPENMP
  if ((int64_t)n_heads * (pos - first + 1) * head_dim >= EDGE_ATTENTION_PARALLEL_MIN_WORK && threads > 1) {
    int n_blocks = ceil_div(n_heads, HEAD_BLOCK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int b = 0; b < n_blocks; b++) {
      int h1 = (b + 1) * HEAD_BLOCK < n_heads ? (b + 1) * HEAD_BLOCK : n_heads;
      attend_head_range(&a, b * HEAD_BLOCK, h1);
    }
    return EDGE_CPU_OK;
  }
#endif
  attend_head_range(&a, 0, n_heads);
  return EDGE_CPU_OK;
}
