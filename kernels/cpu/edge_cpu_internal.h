/* Helpers shared by the CPU kernels and the C runtime's engine: GCC vectors, fp16 widening, the gate activation.
 * Internal, not installed. */
#ifndef EDGE_CPU_INTERNAL_H
#define EDGE_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "edge_cpu_kernels.h"

/* 16 fp32 lanes as one GCC vector: one AVX-512 register, two AVX2 or four NEON ones. GCC keeps a few of these
 * in registers across a loop, where it kept the equivalent float arrays on the stack: a store and a reload on
 * the dependency chain of every step. The halves name the lanes of a pairwise sum. */
typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));

/* The 16 floats at p as one vector, to read or assign: an unaligned vector type that may alias floats. A macro
 * rather than load / store functions: passing a 64-byte vector by value has a different calling convention with
 * and without AVX-512, which GCC warns about (-Wpsabi) at every call in builds without it. */
typedef float unaligned_vec16 __attribute__((vector_size(64), aligned(4), may_alias));
#define VEC16_AT(p) (*(unaligned_vec16 *)(p))

/* For helpers whose arguments (a dtype, a row count) are constants at every call: each caller gets its own loop. */
#define EDGE_ALWAYS_INLINE static inline __attribute__((always_inline))

/* The 16 lanes added pairwise (l + 8, l + 4, l + 2, l + 1): a fixed order on every target. */
static inline float sum_lanes(const vec16 *v) {
  union {
    vec16 all;
    vec8 half[2];
  } sixteen = {*v};
  union {
    vec8 all;
    vec4 half[2];
  } eight = {sixteen.half[0] + sixteen.half[1]};
  vec4 four = eight.half[0] + eight.half[1];
  return (four[0] + four[2]) + (four[1] + four[3]);
}

static inline int ceil_div(int n, int m) { return (n + m - 1) / m; }

/* Start of part `index` when n items are split into `parts` contiguous, near-equal parts. */
static inline int split_point(int n, int parts, int index) { return (int)((int64_t)n * index / parts); }

/* IEEE half -> float with integer operations and one multiply, which GCC vectorises on any target (a
 * _Float16 cast becomes a library call per element on x86-64 without F16C). Shifting the 15 magnitude
 * bits into float position and multiplying by 2^112 rebiases the exponent, exactly, for normal and
 * subnormal halves; infinities and NaNs get the all-ones float exponent. */
static inline float half_to_float(uint16_t h) {
  uint32_t shifted = (uint32_t)(h & 0x7fffu) << 13;
  float magnitude;
  memcpy(&magnitude, &shifted, sizeof shifted);
  magnitude *= 0x1p112f;
  uint32_t bits;
  memcpy(&bits, &magnitude, sizeof bits);
  uint32_t special = 0u - (uint32_t)((h & 0x7c00u) == 0x7c00u); /* all ones for inf / NaN; no branch */
  bits = (bits & ~special) | ((shifted | 0x7f800000u) & special);
  bits |= (uint32_t)(h & 0x8000u) << 16;
  float value;
  memcpy(&value, &bits, sizeof bits);
  return value;
}

/* g when keep is nonzero, else +0.0f. With bit operations rather than a select, because GCC turns the select
 * into a branch, and whether a gate fires is close to a coin toss: a mispredicted branch per neuron. */
static inline float keep_or_zero(float g, int keep) {
  uint32_t bits;
  memcpy(&bits, &g, sizeof bits);
  bits &= 0u - (uint32_t)(keep != 0);
  memcpy(&g, &bits, sizeof bits);
  return g;
}

/* a = act(g) for the gate (edge_sdk/model/activation.py). */
static inline float gate_activation(int activation, float g, float threshold) {
  switch (activation) {
    case EDGE_ACT_FATRELU:
      return keep_or_zero(g, g > threshold);
    case EDGE_ACT_SILU:
      return g / (1.0f + expf(-g));
    default: /* relu, and drelu's gate part; NaN propagates as in torch.relu */
      return keep_or_zero(g, !(g < 0.0f));
  }
}

#endif
