/* The public kernel functions of edge_cpu_kernels.h, over one of the instruction-set builds this library holds
 * (edge_cpu_isa.h), chosen once per process at the first call.
 *
 * A library compiled for the build machine holds one build (`single`). A package's library (CMake with
 * EDGE_SDK_NATIVE_ARCH=OFF, or any cross-build: kernels/cpu/isa_builds.cmake) holds one per instruction set, its
 * CMake flags EDGE_CPU_HAS_BUILD_<name> saying which; the choice is the first, best first, whose instructions this
 * CPU and its operating system support (cpuid and xgetbv on x86-64, Linux's hwcaps on aarch64), or the one
 * $EDGE_SDK_CPU_ISA names. The quantized kernels and the attention compute the same bits on every build (QUANT.md),
 * so for them the choice changes the speed only; fp32 / fp16 rows fuse multiply-adds where the instruction set has
 * them, so their last bits may differ between builds (edge_cpu_kernels.h). This file itself is compiled for the
 * baseline of its architecture. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_cpu_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#define EDGE_CPU_ISA_ENV "EDGE_SDK_CPU_ISA"

#if !defined(EDGE_CPU_ISA_DISPATCH)
#define EDGE_CPU_HAS_BUILD_single 1
#endif

/* ---- What this CPU runs ---------------------------------------------------------------------------------------- */

/* Unused where the compiler could not make that build (and in a library of one build). */
#define EDGE_CPU_MAYBE_UNUSED __attribute__((unused))

static int runs_anywhere(void) { return 1; }

#if defined(__x86_64__)
struct x86_features {
  unsigned leaf1_ecx, leaf7_ebx, leaf7_ecx, leaf7_1_eax, extended_ecx;
  unsigned long long enabled_state; /* XCR0: the register state the operating system saves */
};

EDGE_CPU_MAYBE_UNUSED static struct x86_features x86_features(void) {
  struct x86_features found = {0};
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) found.leaf1_ecx = ecx;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    found.leaf7_ebx = ebx;
    found.leaf7_ecx = ecx;
  }
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) found.leaf7_1_eax = eax;
  if (__get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx)) found.extended_ecx = ecx;
  if (found.leaf1_ecx & (1u << 27)) { /* OSXSAVE: xgetbv is there */
    unsigned low, high;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    found.enabled_state = ((unsigned long long)high << 32) | low;
  }
  return found;
}

EDGE_CPU_MAYBE_UNUSED static int has_bits(unsigned word, unsigned bits) { return (word & bits) == bits; }

/* x86-64-v3, what -march=x86-64-v3 may use: AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT, MOVBE and the v2 set
 * (SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B, LAHF/SAHF), with the ymm state enabled by the operating system. */
EDGE_CPU_MAYBE_UNUSED static int runs_x86_64_v3(void) {
  struct x86_features cpu = x86_features();
  unsigned v2 = (1u << 0) | (1u << 9) | (1u << 19) | (1u << 20) | (1u << 23) | (1u << 13);
  unsigned avx_fma_f16c_movbe = (1u << 28) | (1u << 12) | (1u << 29) | (1u << 22);
  unsigned bmi1_avx2_bmi2 = (1u << 3) | (1u << 5) | (1u << 8);
  unsigned lahf_lzcnt = (1u << 0) | (1u << 5);
  return has_bits(cpu.leaf1_ecx, v2 | avx_fma_f16c_movbe) && has_bits(cpu.leaf7_ebx, bmi1_avx2_bmi2) &&
         has_bits(cpu.extended_ecx, lahf_lzcnt) && (cpu.enabled_state & 0x6) == 0x6;
}

/* x86-64-v4: v3 and AVX-512 F, DQ, CD, BW, VL, with the opmask and zmm state enabled. */
EDGE_CPU_MAYBE_UNUSED static int runs_x86_64_v4(void) {
  struct x86_features cpu = x86_features();
  unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  return runs_x86_64_v3() && has_bits(cpu.leaf7_ebx, avx512) && (cpu.enabled_state & 0xe6) == 0xe6;
}

EDGE_CPU_MAYBE_UNUSED static int runs_avx512(void) { return runs_x86_64_v4(); }
EDGE_CPU_MAYBE_UNUSED static int runs_avx512_vnni(void) {
  return runs_x86_64_v4() && has_bits(x86_features().leaf7_ecx, 1u << 11);
}
EDGE_CPU_MAYBE_UNUSED static int runs_avx2(void) { return runs_x86_64_v3(); }
EDGE_CPU_MAYBE_UNUSED static int runs_avx2_vnni(void) {
  return runs_x86_64_v3() && has_bits(x86_features().leaf7_1_eax, 1u << 4);
}
#endif

#if defined(__aarch64__)
EDGE_CPU_MAYBE_UNUSED static int runs_neon_dotprod(void) {
#if defined(__linux__)
  /* The build is compiled for Armv8.2-A (isa_builds.cmake): the dot product (HWCAP_ASIMDDP) and, of what v8.1 and
   * v8.2 add, the atomics a compiler may emit (HWCAP_ATOMICS). */
  unsigned long needed = (1ul << 20) | (1ul << 8);
  return (getauxval(AT_HWCAP) & needed) == needed;
#else
  return 0;
#endif
}
#endif

/* ---- The builds ------------------------------------------------------------------------------------------------ */

#define EDGE_CPU_DECLARE_BUILD(build)                                          \
  const char *edge_cpu_build_isa_##build(void);                                \
  __typeof__(edge_cpu_attention) edge_cpu_attention_##build;                   \
  __typeof__(edge_cpu_svd_predictor) edge_cpu_svd_predictor_##build;           \
  __typeof__(edge_cpu_svd_predictor_f16) edge_cpu_svd_predictor_f16_##build;   \
  __typeof__(edge_cpu_signbit_predictor) edge_cpu_signbit_predictor_##build;   \
  __typeof__(edge_cpu_sparse_ffn_workspace_size) edge_cpu_sparse_ffn_workspace_size_##build; \
  __typeof__(edge_cpu_sparse_ffn_call_ns) edge_cpu_sparse_ffn_call_ns_##build;           \
  __typeof__(edge_cpu_sparse_ffn) edge_cpu_sparse_ffn_##build;                 \
  __typeof__(edge_cpu_dense_ffn) edge_cpu_dense_ffn_##build;                   \
  __typeof__(edge_cpu_matvec) edge_cpu_matvec_##build;                         \
  __typeof__(edge_cpu_sparse_ffn_q) edge_cpu_sparse_ffn_q_##build;             \
  __typeof__(edge_cpu_matvec_q) edge_cpu_matvec_q_##build;                     \
  __typeof__(edge_cpu_matvecs) edge_cpu_matvecs_##build;                       \
  __typeof__(edge_cpu_matmuls) edge_cpu_matmuls_##build;                       \
  __typeof__(edge_cpu_ffn_tokens_workspace_size) edge_cpu_ffn_tokens_workspace_size_##build; \
  __typeof__(edge_cpu_ffn_tokens) edge_cpu_ffn_tokens_##build;

struct isa_build {
  const char *(*isa)(void);
  int (*runs_here)(void);
  __typeof__(edge_cpu_attention) *attention;
  __typeof__(edge_cpu_svd_predictor) *svd_predictor;
  __typeof__(edge_cpu_svd_predictor_f16) *svd_predictor_f16;
  __typeof__(edge_cpu_signbit_predictor) *signbit_predictor;
  __typeof__(edge_cpu_sparse_ffn_workspace_size) *sparse_ffn_workspace_size;
  __typeof__(edge_cpu_sparse_ffn_call_ns) *sparse_ffn_call_ns;
  __typeof__(edge_cpu_sparse_ffn) *sparse_ffn;
  __typeof__(edge_cpu_dense_ffn) *dense_ffn;
  __typeof__(edge_cpu_matvec) *matvec;
  __typeof__(edge_cpu_sparse_ffn_q) *sparse_ffn_q;
  __typeof__(edge_cpu_matvec_q) *matvec_q;
  __typeof__(edge_cpu_matvecs) *matvecs;
  __typeof__(edge_cpu_matmuls) *matmuls;
  __typeof__(edge_cpu_ffn_tokens_workspace_size) *ffn_tokens_workspace_size;
  __typeof__(edge_cpu_ffn_tokens) *ffn_tokens;
};

#define EDGE_CPU_BUILD(build, runs_here)                                                                         \
  {edge_cpu_build_isa_##build,         runs_here,                                                                \
   edge_cpu_attention_##build,         edge_cpu_svd_predictor_##build,                                           \
   edge_cpu_svd_predictor_f16_##build, edge_cpu_signbit_predictor_##build,                                       \
   edge_cpu_sparse_ffn_workspace_size_##build, edge_cpu_sparse_ffn_call_ns_##build,                              \
   edge_cpu_sparse_ffn_##build,                                                                                  \
   edge_cpu_dense_ffn_##build,         edge_cpu_matvec_##build,                                                  \
   edge_cpu_sparse_ffn_q_##build,      edge_cpu_matvec_q_##build,                                                \
   edge_cpu_matvecs_##build,           edge_cpu_matmuls_##build,                                                 \
   edge_cpu_ffn_tokens_workspace_size_##build, edge_cpu_ffn_tokens_##build}

#if EDGE_CPU_HAS_BUILD_avx512_vnni
EDGE_CPU_DECLARE_BUILD(avx512_vnni)
#endif
#if EDGE_CPU_HAS_BUILD_avx512
EDGE_CPU_DECLARE_BUILD(avx512)
#endif
#if EDGE_CPU_HAS_BUILD_avx2_vnni
EDGE_CPU_DECLARE_BUILD(avx2_vnni)
#endif
#if EDGE_CPU_HAS_BUILD_avx2
EDGE_CPU_DECLARE_BUILD(avx2)
#endif
#if EDGE_CPU_HAS_BUILD_neon_dotprod
EDGE_CPU_DECLARE_BUILD(neon_dotprod)
#endif
#if EDGE_CPU_HAS_BUILD_neon
EDGE_CPU_DECLARE_BUILD(neon)
#endif
#if EDGE_CPU_HAS_BUILD_portable
EDGE_CPU_DECLARE_BUILD(portable)
#endif
#if EDGE_CPU_HAS_BUILD_single
EDGE_CPU_DECLARE_BUILD(single)
#endif

/* Best first; the last runs on any CPU of the architecture. */
static const struct isa_build builds[] = {
#if EDGE_CPU_HAS_BUILD_avx512_vnni
    EDGE_CPU_BUILD(avx512_vnni, runs_avx512_vnni),
#endif
#if EDGE_CPU_HAS_BUILD_avx512
    EDGE_CPU_BUILD(avx512, runs_avx512),
#endif
#if EDGE_CPU_HAS_BUILD_avx2_vnni
    EDGE_CPU_BUILD(avx2_vnni, runs_avx2_vnni),
#endif
#if EDGE_CPU_HAS_BUILD_avx2
    EDGE_CPU_BUILD(avx2, runs_avx2),
#endif
#if EDGE_CPU_HAS_BUILD_neon_dotprod
    EDGE_CPU_BUILD(neon_dotprod, runs_neon_dotprod),
#endif
#if EDGE_CPU_HAS_BUILD_neon
    EDGE_CPU_BUILD(neon, runs_anywhere),
#endif
#if EDGE_CPU_HAS_BUILD_portable
    EDGE_CPU_BUILD(portable, runs_anywhere),
#endif
#if EDGE_CPU_HAS_BUILD_single
    EDGE_CPU_BUILD(single, runs_anywhere),
#endif
};
enum { BUILD_COUNT = sizeof builds / sizeof builds[0] };

/* ---- The choice ------------------------------------------------------------------------------------------------ */

static const struct isa_build *chosen;
static char build_names[BUILD_COUNT * 16];
static char env_error[512];
static pthread_once_t choice_once = PTHREAD_ONCE_INIT;

/* The builds' names (with only_runnable, those this CPU runs), best first, separated by spaces. */
static void list_builds(char *out, size_t size, int only_runnable) {
  out[0] = '\0';
  for (int i = 0; i < BUILD_COUNT; i++) {
    if (only_runnable && !builds[i].runs_here()) continue;
    size_t used = strlen(out);
    snprintf(out + used, size - used, "%s%s", used ? " " : "", builds[i].isa());
  }
}

static void choose_build(void) {
  list_builds(build_names, sizeof build_names, 0);
  chosen = &builds[BUILD_COUNT - 1]; /* runs anywhere */
  for (int i = BUILD_COUNT - 2; i >= 0; i--)
    if (builds[i].runs_here()) chosen = &builds[i];
  const char *wanted = getenv(EDGE_CPU_ISA_ENV);
  if (wanted == NULL || wanted[0] == '\0' || strcmp(wanted, "auto") == 0) return;
  for (int i = 0; i < BUILD_COUNT; i++) {
    if (strcmp(wanted, builds[i].isa()) != 0) continue;
    if (builds[i].runs_here()) {
      chosen = &builds[i];
      return;
    }
    char runnable[sizeof build_names];
    list_builds(runnable, sizeof runnable, 1);
    snprintf(env_error, sizeof env_error,
             "%s=%s: this CPU lacks the instructions of that build of the kernels; it runs: %s (or auto)",
             EDGE_CPU_ISA_ENV, wanted, runnable);
    return;
  }
  snprintf(env_error, sizeof env_error,
           "%s=%.64s: not an instruction set of this library's kernels, which hold: %s (or auto)%s", EDGE_CPU_ISA_ENV,
           wanted, build_names,
           BUILD_COUNT == 1 ? "; this library holds one build, compiled for its build machine or with one set of "
                              "flags: CMake's -DEDGE_SDK_NATIVE_ARCH=OFF builds one per instruction set"
                            : "");
}

static const struct isa_build *kernels(void) {
  pthread_once(&choice_once, choose_build);
  return chosen;
}

const char *edge_cpu_isa(void) { return kernels()->isa(); }

const char *edge_cpu_isas(void) {
  kernels();
  return build_names;
}

const char *edge_cpu_isa_error(void) {
  kernels();
  return env_error[0] ? env_error : NULL;
}

/* ---- The kernels ----------------------------------------------------------------------------------------------- */

int edge_cpu_attention(const float *q, int n_heads, int n_kv_heads, int head_dim, const float *keys, size_t key_tiles,
                       const float *values, int first, int pos, float *scores, size_t score_stride, float *out,
                       int threads) {
  return kernels()->attention(q, n_heads, n_kv_heads, head_dim, keys, key_tiles, values, first, pos, scores,
                              score_stride, out, threads);
}

int edge_cpu_svd_predictor(const float *x, int d, int D, int rank, const float *a_t, const float *b, const float *bias,
                           uint8_t *mask, float *scratch) {
  return kernels()->svd_predictor(x, d, D, rank, a_t, b, bias, mask, scratch);
}

int edge_cpu_svd_predictor_f16(const float *x, int d, int D, int rank, const uint16_t *a_t, const uint16_t *b,
                               const float *bias, uint8_t *mask, float *scratch) {
  return kernels()->svd_predictor_f16(x, d, D, rank, a_t, b, bias, mask, scratch);
}

int edge_cpu_signbit_predictor(const float *x, int d, int D, const int32_t *packed, float alpha, uint8_t *mask) {
  return kernels()->signbit_predictor(x, d, D, packed, alpha, mask);
}

size_t edge_cpu_sparse_ffn_workspace_size(int d, int D, int threads) {
  return kernels()->sparse_ffn_workspace_size(d, D, threads);
}

int64_t edge_cpu_sparse_ffn_call_ns(const void *workspace, int d, int D) {
  return kernels()->sparse_ffn_call_ns(workspace, d, D);
}

int edge_cpu_sparse_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                        int weight_dtype, const uint8_t *mask, const float *thresholds, int activation,
                        float act_threshold, float *y, void *workspace, int threads, uint8_t *active_out) {
  return kernels()->sparse_ffn(x, d, D, w_gate, w_up, w_down_t, weight_dtype, mask, thresholds, activation,
                               act_threshold, y, workspace, threads, active_out);
}

int edge_cpu_dense_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                       int weight_dtype, int activation, float act_threshold, float *y, void *workspace, int threads) {
  return kernels()->dense_ffn(x, d, D, w_gate, w_up, w_down_t, weight_dtype, activation, act_threshold, y, workspace,
                              threads);
}

int edge_cpu_matvec(const float *x, int in, int out, const void *w, int weight_dtype, const float *bias, float *y,
                    int threads) {
  return kernels()->matvec(x, in, out, w, weight_dtype, bias, y, threads);
}

int edge_cpu_sparse_ffn_q(const float *x, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                          const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                          const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                          const uint16_t *down_mins, int quant_format, int down_format, int group_size,
                          const uint8_t *mask, const float *thresholds, int activation, float act_threshold, float *y,
                          void *workspace, int threads, uint8_t *active_out) {
  return kernels()->sparse_ffn_q(x, d, D, w_gate, gate_scales, gate_mins, w_up, up_scales, up_mins, w_down_t,
                                 down_scales, down_mins, quant_format, down_format, group_size, mask, thresholds,
                                 activation, act_threshold, y, workspace, threads, active_out);
}

int edge_cpu_matvec_q(const float *x, int in, int out, const void *w, const uint16_t *scales, const uint16_t *mins,
                      int quant_format, int group_size, const float *bias, float *y, int threads) {
  return kernels()->matvec_q(x, in, out, w, scales, mins, quant_format, group_size, bias, y, threads);
}

int edge_cpu_matvecs(const float *x, int in, const struct edge_cpu_matrix *matrices, int n, int threads) {
  return kernels()->matvecs(x, in, matrices, n, threads);
}

int edge_cpu_matmuls(const float *x, int tokens, int in, const struct edge_cpu_matrix *matrices, int n, int threads) {
  return kernels()->matmuls(x, tokens, in, matrices, n, threads);
}

size_t edge_cpu_ffn_tokens_workspace_size(int d, int D, int tokens) {
  return kernels()->ffn_tokens_workspace_size(d, D, tokens);
}

int edge_cpu_ffn_tokens(const float *x, int tokens, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                        const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                        const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                        const uint16_t *down_mins, int weight_dtype, int down_format, int group_size,
                        int activation, float act_threshold, float *y, void *workspace, int threads) {
  return kernels()->ffn_tokens(x, tokens, d, D, w_gate, gate_scales, gate_mins, w_up, up_scales, up_mins, w_down_t,
                               down_scales, down_mins, weight_dtype, down_format, group_size, activation,
                               act_threshold, y, workspace, threads);
}
