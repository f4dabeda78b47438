/* Portable vector helpers shared by the CPU kernels and the C runtime's engine; internal, not installed. */
#ifndef EDGE_CPU_VECTORS_H
#define EDGE_CPU_VECTORS_H

#include <stdint.h>
#include <string.h>

/* 16 fp32 lanes as one GCC vector: one AVX-512 register, two AVX2 or four NEON ones. GCC keeps a few of these
 * in registers across a loop, where it kept the equivalent float arrays on the stack: a store and a reload on
 * the dependency chain of every step. The halves name the lanes of a pairwise sum. */
typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));

static inline vec16 load16(const float *p) {
  vec16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void store16(float *p, vec16 v) { memcpy(p, &v, sizeof v); }

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

#endif
