/* edge-sdk CPU kernels: the C side shared by the Python CPU backend (through ctypes) and the C runtime.
 * Every kernel keeps the argument order of its CUDA launcher in plugins/kernels (DESIGN.md 3.6), minus the
 * stream: edge_<op>(stream, ...) on CUDA is edge_cpu_<op>(...) here.
 *
 * Conventions for every kernel below:
 * - Returns an edge_cpu_status: 0 on success, nonzero when an argument is invalid (a required pointer is
 *   NULL, a size is <= 0, an enum is out of range). Nothing is written on failure; the library never
 *   aborts or exits.
 * - Weights are read in place through the caller's pointers (e.g. into memory-mapped safetensors): no
 *   kernel copies a weight matrix or allocates memory proportional to it.
 * - Results are deterministic: the same inputs give bit-identical outputs for any thread count, because
 *   every output element is computed by one thread with a fixed summation order (no float atomics, no
 *   cross-thread reductions).
 * - Thread safety: kernels keep no global state; concurrent calls are safe when they do not share output
 *   or workspace buffers. */
#ifndef EDGE_CPU_KERNELS_H
#define EDGE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum edge_cpu_status {
  EDGE_CPU_OK = 0,
  EDGE_CPU_INVALID_ARGUMENT = 1,
  EDGE_CPU_OUT_OF_MEMORY = 2, /* only edge_cpu_signbit_predictor for d > 65536 and edge_cpu_matvec_q for in > 4096 */
};

/* Storage type of weight matrices. Accumulation is always fp32. */
enum edge_dtype { EDGE_F32 = 0, EDGE_F16 = 1 };

/* Group-wise quantized weight rows (kernels/cpu/QUANT.md, edge_sdk/quant.py), numbered on from enum
 * edge_dtype so that one number names any storage type. Each row of d values is cut into d / group_size groups
 * (group_size 32, 64 or 128) with one fp16 scale each: scales [rows, d / group_size], IEEE half bits.
 * EDGE_Q8: int8 codes [rows, d], value = code * scale. EDGE_Q4: [rows, d / 2] bytes; per block of 32 values,
 * byte k holds value k in its low nibble and value k + 16 in its high nibble, each the 4-bit two's complement of
 * its code (-8..7: the nibble is code & 0xf).
 * Asymmetric EDGE_Q4 (llama.cpp's Q4_1 grid): the same codes plus one fp16 minimum per group, mins [rows,
 * d / group_size] (IEEE half bits), value = (code + 8) * scale + min. Every kernel taking quantized rows takes their
 * mins as an optional pointer: NULL is the symmetric format, with exactly the results of the symmetric kernels. */
enum edge_quant_format { EDGE_Q8 = 2, EDGE_Q4 = 3 };

/* Gated-FFN activation (edge_sdk/model/activation.py): gate part act(g), up part for drelu only.
 * relu: max(g, 0); fatrelu: g > t ? g : 0; drelu: max(g, 0) * max(u, 0); silu: g * sigmoid(g). */
enum edge_activation { EDGE_ACT_RELU = 0, EDGE_ACT_FATRELU = 1, EDGE_ACT_DRELU = 2, EDGE_ACT_SILU = 3 };

/* Version of edge-sdk the library was built from, e.g. "0.1.0". */
const char *edge_cpu_version(void);

/* Threads the kernels use: OpenMP's maximum, or 1 when built without OpenMP. */
int edge_cpu_max_threads(void);

/* The instruction set the kernels run: "avx512_vnni", "avx512", "avx2_vnni", "avx2", "neon_dotprod", "neon" or
 * "portable" (plain C that the compiler vectorises). A library compiled for the build machine holds one build of
 * the kernels; a package's (CMake with EDGE_SDK_NATIVE_ARCH=OFF, and every cross-build) holds one per instruction set
 * of its architecture and, at the first kernel call or query, chooses the best one this CPU runs, or the one the
 * environment variable EDGE_SDK_CPU_ISA names ("auto" or unset: the best). The choice holds for the process. The
 * quantized rows' integer dot products and the attention compute the same bits on every build (QUANT.md), so for them
 * it changes the speed only; fp32 / fp16 rows use fused multiply-adds where the instruction set has them, so their
 * last bits may differ between builds (each is deterministic for any thread count). */
const char *edge_cpu_isa(void);

/* The instruction sets this library holds, best first, separated by spaces (e.g. "avx512_vnni avx512 avx2_vnni
 * avx2 portable"). */
const char *edge_cpu_isas(void);

/* NULL, or why EDGE_SDK_CPU_ISA could not be followed: a name this library does not hold, or an instruction set
 * this CPU lacks. The kernels then run the automatic choice; programs report the message as an error (edge-sdk's
 * loader and edge_model_open do). */
const char *edge_cpu_isa_error(void);

/* SVD predictor (DESIGN 3.2): mask[i] = ((x B^T) A^T)_i + bias_i > 0.
 * x: [d]; a_t: [rank, D], the bundle's svd.a [D, rank] transposed once at load, so the scores of consecutive
 * neurons are vector operations; b: [rank, d]; bias: [D] or NULL (zero bias); all fp32. Each score sums its
 * rank terms in order. mask: [D] output, 1 = predicted active. scratch: [rank] floats (holds x B^T). Uses all
 * OpenMP threads, each with up to 64 KiB of stack for a block of scores. */
int edge_cpu_svd_predictor(const float *x, int d, int D, int rank, const float *a_t, const float *b, const float *bias,
                           uint8_t *mask, float *scratch);

/* edge_cpu_svd_predictor with fp16 factors (IEEE half bits; bundles of format version 5 whose weights are not fp32):
 * a_t [rank, D] and b [rank, d] are widened to fp32 in registers and every score is computed as
 * edge_cpu_svd_predictor computes it on the widened factors, operation for operation, so the two give the same mask
 * for the same factor values on every build. */
int edge_cpu_svd_predictor_f16(const float *x, int d, int D, int rank, const uint16_t *a_t, const uint16_t *b,
                               const float *bias, uint8_t *mask, float *scratch);

/* Sign-bit predictor (DESIGN 3.2, edge_sdk/sparsity/signbit.py).
 * x: [d] fp32; packed: [D, ceil(d/32)] int32 sign bits of W_gate (bit j of word k = w[32k+j] < 0, padding
 * bits 0); alpha: the layer's alpha. N_neg_i = popcount(packed_i XOR signbits(x)), N_pos_i = d - N_neg_i;
 * mask[i] = 0 when alpha * N_pos_i < N_neg_i (compared in double), else 1. x's sign bit is x_j < 0, so
 * -0.0 and NaN count as non-negative. x's packed bits live on the stack up to d = 65536; a larger d
 * allocates d/8 bytes (and returns EDGE_CPU_OUT_OF_MEMORY if that fails). Uses all OpenMP threads. */
int edge_cpu_signbit_predictor(const float *x, int d, int D, const int32_t *packed, float alpha, uint8_t *mask);

/* Bytes of workspace edge_cpu_sparse_ffn needs for d x D with `threads` threads (O(D + d): the neuron lists,
 * x quantized for the integer dot products of edge_cpu_sparse_ffn_q, asymmetric rows' down corrections and the last
 * call's duration, edge_cpu_sparse_ffn_call_ns; threads is part of the contract so the layout
 * may use it without an API change).
 * Returns 0 when d <= 0 or D <= 0. */
size_t edge_cpu_sparse_ffn_workspace_size(int d, int D, int threads);

/* Nanoseconds the last successful edge_cpu_sparse_ffn, edge_cpu_sparse_ffn_q or edge_cpu_dense_ffn call with this
 * workspace (and this d, D) took, from its entry to its return on a monotonic clock: a benchmark's measure of the
 * kernel alone, without its caller's cost of making the call (through ctypes from a cold Python interpreter, 50-100
 * us; benchmarks/README.md). Undefined before the workspace's first call; -1 when workspace is NULL or d, D <= 0. */
int64_t edge_cpu_sparse_ffn_call_ns(const void *workspace, int d, int D);

/* Sequential SparseFFN for one decode token (DESIGN 3.1, edge_sdk/sparsity/ffn.py sparse_ffn):
 *   for i in mask:   g_i = w_gate_i . x ; a_i = act(g_i)
 *   active = { i in mask : a_i != 0 [and |a_i| > thresholds_i] }   (predictor false positives dropped)
 *   for i in active: u_i = w_up_i . x [drelu: max(u_i, 0)] ; h_i = a_i * u_i
 *   y = sum over active of h_i * w_down_t_i   (rows with h_i == 0 add exactly zero and are not read)
 * x: [d] fp32; w_gate, w_up, w_down_t: [D, d] row-major, all of weight_dtype (enum edge_dtype), w_down_t
 * is W_down transposed so neuron i's down weights are row i. mask: [D] uint8 (nonzero = predicted
 * active) or NULL for dense. thresholds: [D] fp32 CHESS thresholds or NULL. act_threshold: fatrelu's t
 * (>= 0), ignored otherwise. y: [d] fp32 output. workspace: edge_cpu_sparse_ffn_workspace_size(d, D,
 * threads) bytes, any alignment, reusable across calls (not concurrently). threads <= 0 means
 * omp_get_max_threads(). active_out: [D] uint8 or NULL; receives 1 for the neurons in `active`.
 * Gate and up are parallel over neurons, each dot product in one thread with fixed lanes; the down
 * projection is parallel over column slices of y, each summing the active rows in increasing order. */
int edge_cpu_sparse_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                        int weight_dtype, const uint8_t *mask, const float *thresholds, int activation,
                        float act_threshold, float *y, void *workspace, int threads, uint8_t *active_out);

/* The dense FFN of one token through the same row primitives: y = W_down (act(W_gate x) * act_up(W_up x)) with
 * every neuron's gate, up and down rows read and multiplied, zeros included -- what a runtime that does not
 * exploit activation sparsity computes, and the baseline the sparse paths are measured against. Arguments as
 * for edge_cpu_sparse_ffn without mask, thresholds and active_out; the same workspace size. The result equals
 * edge_cpu_sparse_ffn with mask NULL up to the order of the additions of exact zeros (bit-identical for finite
 * weights). */
int edge_cpu_dense_ffn(const float *x, int d, int D, const void *w_gate, const void *w_up, const void *w_down_t,
                       int weight_dtype, int activation, float act_threshold, float *y, void *workspace, int threads);

/* Dense y = W x (+ bias) for one token: the attention projections and the LM head of the decode step.
 * x: [in] fp32; w: [out, in] row-major of weight_dtype (enum edge_dtype), read in place; bias: [out] fp32 or
 * NULL; y: [out] fp32. Each output is one row's dot product computed by one thread with the same fixed lanes
 * as the SparseFFN kernel, so the result is bit-identical for any thread count. threads <= 0 means
 * omp_get_max_threads(). */
int edge_cpu_matvec(const float *x, int in, int out, const void *w, int weight_dtype, const float *bias, float *y,
                    int threads);

/* edge_cpu_sparse_ffn over quantized rows: w_gate and w_up hold the codes of quant_format (enum edge_quant_format),
 * w_down_t those of down_format, each [D, d], with gate_scales, up_scales, down_scales [D, d / group_size] fp16 of
 * the one group size; d must be a multiple of group_size (32, 64 or 128). down_format is quant_format, or EDGE_Q8
 * under EDGE_Q4 gate and up: an int4 bundle whose down projection stays int8 (manifest down_dtype), the matrix whose
 * int4 rounding costs the most perplexity (SmolLM2: +7.1% with int4 down rows, +0.7% with int8 ones; llama.cpp's
 * Q4_K_M keeps ffn_down wider too). Its rows stay neuron-major and are added exactly as an int8 FFN's down rows; any
 * other pair is EDGE_CPU_INVALID_ARGUMENT. Every other argument, the workspace size and the determinism as for
 * edge_cpu_sparse_ffn. The gate and up rows are dotted with x quantized per token into two int8
 * planes per block of 32 values (integer dot products, QUANT.md "Integer dot products": within max|x| / 32512 of
 * x per value, the same bits on every instruction set); with the environment variable
 * EDGE_SDK_QUANT_ACTIVATIONS=fp32 they are dotted with x itself, the codes widened to fp32 in registers. Each
 * down row adds (h_i * scale) * code to y. A row's bytes are read once and nothing is dequantized in memory.
 *
 * Asymmetric int4: gate_mins, up_mins, down_mins [D, d / group_size] fp16: gate_mins and up_mins both NULL
 * (symmetric) or both non-NULL, non-NULL only with EDGE_Q4, and down_mins non-NULL exactly when down_format is EDGE_Q4
 * and gate and up have theirs (int8 down rows are symmetric, under asymmetric gate and up too); else
 * EDGE_CPU_INVALID_ARGUMENT. A value (code + 8) * scale + min is
 * taken as code * scale + mid with mid = 8 * scale + min (one fp32 rounding): the code products are those of the
 * symmetric kernels, and per block of 32 values one fused multiply-add mid * sum(x's block) goes into a correction
 * accumulator of its own per row (16 lanes, block b in lane b % 16, added lane by lane to the row's accumulators
 * before their pairwise sum). sum(x's block) is computed once per call: of the two planes' values (x_hat) on the
 * integer path, exactly (an int32 times the block's scale / 256, one rounding), or of x in fp32 (pairwise) with
 * EDGE_SDK_QUANT_ACTIVATIONS=fp32. Down rows: y[c] += (h_i * scale) * code per value as symmetric, and per row
 * and block of 32 columns C_b = fmaf(h_i, mid_i, C_b) over the active rows in order, added once per column after
 * the last row (y[c] += C_b): a term per row and block, not per value (the workspace holds the d / 32 C_b). Declared
 * bounds against the float64 reference on the dequantized rows (edge_sdk/quant.py's fp32 values) and x_hat (x in
 * the fp32 setting), S_i = sum_j abs(w_hat_ij x_hat_j) of a row:
 *   a dot product (gate, up, matvec):  abs(y - w_hat . x_hat) <= 1e-5 max_rows S_i
 *   the FFN, per column c:  abs(y_c - y_ref_c) <= 1e-5 sum_i (abs(h_i) + abs(a_i) S_up_i + 1.1 abs(u_i) S_gate_i)
 *                                                        * abs(w_down_ic)   (same active set off the boundaries)
 * (fp32 rounding in a fixed order, plus mid's rounding and the dequantized value's own, each at most 2^-24
 * relative). Results are bit-identical for any thread count, for a row alone or among others, and across
 * instruction sets wherever the symmetric rows' are (the correction terms are fused multiply-adds in the same order
 * on every target). */
int edge_cpu_sparse_ffn_q(const float *x, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                          const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                          const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                          const uint16_t *down_mins, int quant_format, int down_format, int group_size,
                          const uint8_t *mask, const float *thresholds, int activation, float act_threshold, float *y,
                          void *workspace, int threads, uint8_t *active_out);

/* edge_cpu_matvec over quantized rows: w [out, in] in quant_format with scales [out, in / group_size] fp16; in a
 * multiple of group_size; mins [out, in / group_size] fp16 for asymmetric int4 (EDGE_Q4 only, else
 * EDGE_CPU_INVALID_ARGUMENT), NULL for the symmetric formats. Each output's dot product as in
 * edge_cpu_sparse_ffn_q (its bound too), bit-identical for any thread count. x's quantized planes live on the
 * stack up to in = 4096 and are allocated beyond (EDGE_CPU_OUT_OF_MEMORY if that fails). */
int edge_cpu_matvec_q(const float *x, int in, int out, const void *w, const uint16_t *scales, const uint16_t *mins,
                      int quant_format, int group_size, const float *bias, float *y, int threads);

/* Attention of one decode token over a layer's KV cache, every head: for query head h (KV head g = h / (n_heads /
 * n_kv_heads), GQA), s_t = scale * (q_h . k_{g,t}) with scale = 1 / sqrt(head_dim) for the positions t in [first,
 * pos], w = softmax(s), out_h = sum over t of w_t v_{g,t}. q: [n_heads * head_dim]; keys: the layer's key cache in
 * tiles of 16 positions, [n_kv_heads, key_tiles, head_dim, 16] (dimension i of KV head g at position t is
 * keys[((g * key_tiles + t / 16) * head_dim + i) * 16 + t % 16]; a head's keys are contiguous, and a cache fills
 * memory a tile at a time as positions come, where rows of all positions touched a page per row at the first), read
 * in whole tiles, so key_tiles > pos / 16 (the positions of a tile before first or past pos are read and ignored);
 * values: position-major, [positions, n_kv_heads * head_dim]; scores: [n_heads, score_stride] workspace, score_stride > pos, whose row h holds w at [first, pos]
 * after the call; out: [n_heads * head_dim]. Each score sums over the head dimension in order; the softmax takes
 * e^x of the scores minus their maximum within 2 ulp of expf (flushing results below e^-87.3 to 0) and its maximum
 * and sum in 16 lanes with a fixed final order; each output sums over the positions in order. Heads are split over
 * `threads` threads (<= 0: OpenMP's maximum) when heads x positions x head_dim >= 65536, one head per thread, so the
 * results are bit-identical for any thread count, and on every instruction set. */
int edge_cpu_attention(const float *q, int n_heads, int n_kv_heads, int head_dim, const float *keys, size_t key_tiles,
                       const float *values, int first, int pos, float *scores, size_t score_stride, float *out,
                       int threads);

/* One matrix of edge_cpu_matvecs: y [rows] = w x (+ bias). w [rows, in] row-major of dtype (enum edge_dtype, or
 * enum edge_quant_format with scales [rows, in / group_size] fp16; scales NULL and group_size 0 for fp rows); mins
 * [rows, in / group_size] fp16 for asymmetric EDGE_Q4 rows, NULL otherwise (each matrix its own: the matrices of
 * one call may mix asymmetric and symmetric int4); bias [rows] fp32 or NULL. */
struct edge_cpu_matrix {
  const void *w;
  const uint16_t *scales;
  const uint16_t *mins;
  int dtype;
  int group_size;
  int rows;
  const float *bias;
  float *y;
};

/* y_i = W_i x (+ bias_i) for n matrices of one storage type and group size over the same x [in] (a token's q, k and
 * v projections): the results of n edge_cpu_matvec / edge_cpu_matvec_q calls, bit for bit, in one call. x is
 * quantized once, and the rows of all n matrices are split over the threads as one list (one parallel region where
 * n calls took n), each thread prefetching across a matrix's end into the next matrix's rows. */
int edge_cpu_matvecs(const float *x, int in, const struct edge_cpu_matrix *matrices, int n, int threads);

/* ---- A block of tokens (a prompt) ----
 * The kernels below take the tokens of a block at once and compute for each exactly what the one-token kernels give
 * it, bit for bit; the weights are read once per block instead of once per token (each run of rows dotted with every
 * token before the next run is read). They have no CUDA launcher: a GPU runtime prefills through its graphs. */

/* y_i = W_i x_t (+ bias_i) for every token t of x [tokens, in] (token t's values at x + t * in) and every matrix i of
 * edge_cpu_matvecs: matrix i's y holds [tokens, rows] (token t's outputs at y + t * rows). The results of `tokens`
 * edge_cpu_matvecs calls, one per token, bit for bit, for any thread count. Allocates the tokens' quantized x
 * (about 5 * in bytes each; EDGE_CPU_OUT_OF_MEMORY if that fails). */
int edge_cpu_matmuls(const float *x, int tokens, int in, const struct edge_cpu_matrix *matrices, int n, int threads);

/* Bytes of workspace edge_cpu_ffn_tokens needs for `tokens` tokens of d x D (O(tokens * (d + D))); 0 when an
 * argument is <= 0. */
size_t edge_cpu_ffn_tokens_workspace_size(int d, int D, int tokens);

/* The FFN of every token of x [tokens, d] into y [tokens, d], each token's row the y of edge_cpu_sparse_ffn
 * (weight_dtype EDGE_F32 / EDGE_F16, down_format the same, the scales and mins NULL, group_size ignored) or
 * edge_cpu_sparse_ffn_q (weight_dtype EDGE_Q8 / EDGE_Q4 as its quant_format, down_format and the mins as there) with
 * mask and thresholds NULL, bit for bit: every neuron's gate row, the up and down rows of
 * those whose activation is not zero (a prompt's FFN). workspace: edge_cpu_ffn_tokens_workspace_size(d, D, tokens)
 * bytes, any alignment. threads <= 0 means OpenMP's maximum; the results do not depend on it. Allocates under 100
 * bytes per token, and for INT4 down rows 1 KiB per token and thread (EDGE_CPU_OUT_OF_MEMORY if that fails). */
int edge_cpu_ffn_tokens(const float *x, int tokens, int d, int D, const void *w_gate, const uint16_t *gate_scales,
                        const uint16_t *gate_mins, const void *w_up, const uint16_t *up_scales,
                        const uint16_t *up_mins, const void *w_down_t, const uint16_t *down_scales,
                        const uint16_t *down_mins, int weight_dtype, int down_format, int group_size,
                        int activation, float act_threshold, float *y, void *workspace, int threads);

#ifdef __cplusplus
}
#endif

#endif
