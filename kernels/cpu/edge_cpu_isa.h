/* One instruction-set build of the kernels (sparse_ffn.c, predictors.c, attention.c, which include this header
 * first).
 *
 * A library can hold several builds of the kernel sources, each compiled for one instruction set, and choose one
 * when it first runs (isa_dispatch.c): a Debian package or a wheel then runs AVX-512 or AVX2 code on a CPU that has
 * it and the portable path elsewhere, and NEON's dot-product instructions on an Orin. So every kernel function a
 * build defines carries the build's name (edge_cpu_sparse_ffn_q_avx2 for EDGE_CPU_ISA_BUILD avx2), and
 * isa_dispatch.c defines the public names of edge_cpu_kernels.h over the build it chose. A library of one build
 * (compiled for the build machine, or by one plain compiler command over the kernel sources) holds the build named
 * `single`. Internal, not installed; only the kernel sources include it. */
#ifndef EDGE_CPU_ISA_H
#define EDGE_CPU_ISA_H

#ifndef EDGE_CPU_ISA_BUILD
#define EDGE_CPU_ISA_BUILD single
#endif

#define EDGE_CPU_ISA_PASTE_(name, build) name##_##build
#define EDGE_CPU_ISA_PASTE(name, build) EDGE_CPU_ISA_PASTE_(name, build)
#define EDGE_CPU_ISA_NAME(name) EDGE_CPU_ISA_PASTE(name, EDGE_CPU_ISA_BUILD)

/* The kernels' definitions (and edge_cpu_kernels.h's prototypes, included after this) under the build's names. A
 * macro does not expand inside its own expansion, so each name below becomes name_<build> once. */
#define edge_cpu_attention EDGE_CPU_ISA_NAME(edge_cpu_attention)
#define edge_cpu_svd_predictor EDGE_CPU_ISA_NAME(edge_cpu_svd_predictor)
#define edge_cpu_svd_predictor_f16 EDGE_CPU_ISA_NAME(edge_cpu_svd_predictor_f16)
#define edge_cpu_signbit_predictor EDGE_CPU_ISA_NAME(edge_cpu_signbit_predictor)
#define edge_cpu_sparse_ffn_workspace_size EDGE_CPU_ISA_NAME(edge_cpu_sparse_ffn_workspace_size)
#define edge_cpu_sparse_ffn_call_ns EDGE_CPU_ISA_NAME(edge_cpu_sparse_ffn_call_ns)
#define edge_cpu_sparse_ffn EDGE_CPU_ISA_NAME(edge_cpu_sparse_ffn)
#define edge_cpu_dense_ffn EDGE_CPU_ISA_NAME(edge_cpu_dense_ffn)
#define edge_cpu_matvec EDGE_CPU_ISA_NAME(edge_cpu_matvec)
#define edge_cpu_sparse_ffn_q EDGE_CPU_ISA_NAME(edge_cpu_sparse_ffn_q)
#define edge_cpu_matvec_q EDGE_CPU_ISA_NAME(edge_cpu_matvec_q)
#define edge_cpu_matvecs EDGE_CPU_ISA_NAME(edge_cpu_matvecs)
#define edge_cpu_matmuls EDGE_CPU_ISA_NAME(edge_cpu_matmuls)
#define edge_cpu_ffn_tokens_workspace_size EDGE_CPU_ISA_NAME(edge_cpu_ffn_tokens_workspace_size)
#define edge_cpu_ffn_tokens EDGE_CPU_ISA_NAME(edge_cpu_ffn_tokens)

/* The instruction set this build's row primitives were compiled for, from the compiler's own macros (the same tests
 * sparse_ffn.c makes to pick its code), so a build says what it runs whatever flags made it: "avx512_vnni",
 * "avx512", "avx2_vnni", "avx2", "neon_dotprod", "neon" or "portable" (plain C that GCC vectorises). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#ifdef __AVX512VNNI__
#define EDGE_CPU_COMPILED_ISA "avx512_vnni"
#else
#define EDGE_CPU_COMPILED_ISA "avx512"
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#ifdef __AVXVNNI__
#define EDGE_CPU_COMPILED_ISA "avx2_vnni"
#else
#define EDGE_CPU_COMPILED_ISA "avx2"
#endif
#elif defined(__aarch64__)
#ifdef __ARM_FEATURE_DOTPROD
#define EDGE_CPU_COMPILED_ISA "neon_dotprod"
#else
#define EDGE_CPU_COMPILED_ISA "neon"
#endif
#else
#define EDGE_CPU_COMPILED_ISA "portable"
#endif

/* EDGE_CPU_COMPILED_ISA of the build, for isa_dispatch.c (defined in sparse_ffn.c). */
const char *EDGE_CPU_ISA_NAME(edge_cpu_build_isa)(void);

#endif
