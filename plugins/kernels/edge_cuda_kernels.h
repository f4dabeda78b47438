/* edge-sdk CUDA kernels: one extern "C" launcher per op (DESIGN.md 3.6). The TensorRT plugins
 * (plugins/tensorrt) call only these launchers, and the ctypes harness of tests/gpu calls the same ones.
 *
 * Each launcher mirrors its CPU kernel in kernels/cpu/edge_cpu_kernels.h: edge_cpu_<op>(x, d, D, ...) becomes
 * edge_<op>(stream, x, x_dtype, tokens, d, D, ...), the rest of the arguments in the same order, and
 * - x is [tokens, d] of x_dtype (enum edge_cuda_dtype) instead of one fp32 token; masks are [tokens, D];
 * - every pointer is device memory; weight matrices are read in place (no copies);
 * - the CPU's thread count has no equivalent.
 *
 * Conventions for every launcher below:
 * - Returns cudaSuccess when the work was enqueued on `stream`, cudaErrorInvalidValue (nothing enqueued)
 *   when an argument is invalid (a required pointer is NULL, a size is <= 0 or beyond the launch limits,
 *   an enum is out of range), or the error of the kernel launch.
 * - Asynchronous and capturable in a CUDA graph: no host synchronisation, no allocation, no device query.
 *   Temporary storage is the caller's (scratch / workspace arguments).
 * - Deterministic: the same inputs give bit-identical outputs run to run. Every sum has a fixed order
 *   (per-lane sequences, a fixed butterfly across a warp, per-block partial sums reduced in index order);
 *   there are no floating-point atomics.
 * - Arithmetic is fp32 on fp32-converted values, whatever the storage type.
 * - Thread safety: no global state; concurrent calls are safe when they share no output, scratch or
 *   workspace buffer. */
#ifndef EDGE_CUDA_KERNELS_H
#define EDGE_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "edge_cpu_kernels.h" /* enum edge_dtype, enum edge_quant_format, enum edge_activation */

#if defined(__GNUC__)
#define EDGE_CUDA_API __attribute__((visibility("default")))
#else
#define EDGE_CUDA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Storage type of x and of weight matrices: enum edge_dtype's values, plus bf16, which only the CUDA
 * kernels read. */
enum edge_cuda_dtype { EDGE_CUDA_F32 = EDGE_F32, EDGE_CUDA_F16 = EDGE_F16, EDGE_CUDA_BF16 = 2 };

/* SVD predictor (DESIGN 3.2): mask[t, i] = ((x_t B^T) A^T)_i + bias_i > 0.
 * x: [tokens, d] of x_dtype; a: [D, rank]; b: [rank, d]; bias: [D] or NULL (zero bias); a, b, bias fp32.
 * mask: [tokens, D] int32 output, 1 = predicted active, 0 otherwise. scratch: [tokens, rank] floats (x B^T). */
EDGE_CUDA_API cudaError_t edge_svd_predictor(cudaStream_t stream, const void *x, int x_dtype, int tokens, int d,
                                             int D, int rank, const float *a, const float *b, const float *bias,
                                             int32_t *mask, float *scratch);

/* edge_svd_predictor with fp16 factors (IEEE half; bundles of format version 5 whose weights are not fp32): a and b
 * are widened to fp32 as they are read and every product and sum is fp32, in the order of edge_svd_predictor. */
EDGE_CUDA_API cudaError_t edge_svd_predictor_f16(cudaStream_t stream, const void *x, int x_dtype, int tokens, int d,
                                                 int D, int rank, const void *a, const void *b, const float *bias,
                                                 int32_t *mask, float *scratch);

/* Sign-bit predictor (DESIGN 3.2, edge_sdk/sparsity/signbit.py), one warp per row of `packed`.
 * x: [tokens, d] of x_dtype; packed: [D, ceil(d/32)] int32 sign bits of W_gate (bit j of word k =
 * w[32k+j] < 0, padding bits 0); alpha: the layer's alpha. x's sign bits (x_j < 0, so -0.0 and NaN count
 * as non-negative) are packed on the device; N_neg = popcount(packed_i XOR bits(x_t)), N_pos = d - N_neg;
 * mask[t, i] (int32) = 0 when alpha * N_pos < N_neg (compared in double), else 1. d <= 393216 (the packed bits of
 * one token live in shared memory). */
EDGE_CUDA_API cudaError_t edge_signbit_predictor(cudaStream_t stream, const void *x, int x_dtype, int tokens, int d,
                                                 int D, const int32_t *packed, float alpha, int32_t *mask);

/* Bytes of workspace edge_sparse_ffn needs for `tokens` tokens of a d x D FFN (including the slack that
 * lets the layout align a workspace pointer of any alignment): 4 * tokens * (3 D + d * (1 + ceil(D / 64)))
 * bytes with D and d rounded up to multiples of 64, plus 4 * tokens rounded up to 256, plus 256. The partial
 * sums of the down projection dominate. Returns 0 when a size is <= 0. */
EDGE_CUDA_API size_t edge_sparse_ffn_workspace_size(int d, int D, int tokens);

/* Sequential SparseFFN (DESIGN 3.1, edge_sdk/sparsity/ffn.py sparse_ffn), for each token t:
 *   for i in mask_t:   g_i = w_gate_i . x_t ; a_i = act(g_i)           (one warp per predicted row)
 *   active = { i in mask_t : a_i != 0 [and |a_i| > thresholds_i] }    (predictor false positives dropped)
 *   for i in active:   u_i = w_up_i . x_t [drelu: max(u_i, 0)] ; h_i = a_i * u_i   (the same warp, after g_i)
 *   y_t = sum over active of h_i * w_down_t_i   (the i with h_i != 0 compacted on the device, in order; rows
 *                                                 with h_i == 0 add exactly zero and are not read; partial
 *                                                 sums per block of 64 rows, reduced in order)
 * x: [tokens, d] of x_dtype; w_gate, w_up, w_down_t: [D, d] row-major, all of weight_dtype (enum
 * edge_cuda_dtype), w_down_t is W_down transposed so neuron i's down weights are row i. mask: [tokens, D]
 * int32 (nonzero = predicted active; the predictors write 1) or NULL for dense. thresholds: [D] fp32 CHESS thresholds or NULL.
 * activation: enum edge_activation; act_threshold: fatrelu's t (>= 0), ignored otherwise. y: [tokens, d]
 * fp32 output. workspace: edge_sparse_ffn_workspace_size(d, D, tokens) bytes, any alignment, reusable
 * across calls on the same stream. active_out: [tokens, D] uint8 or NULL, a diagnostic for the tests that no
 * plugin exposes (so not bound by OPS.md's plugin I/O types); receives 1 for the neurons in
 * `active`, 0 for the others. Loads are 16 bytes wide (weights with the evict-first hint: they are streamed
 * once per token) when every weight matrix is 16-byte aligned and d * element size is a multiple of 16;
 * other shapes take an element-wise path with the same semantics. */
EDGE_CUDA_API cudaError_t edge_sparse_ffn(cudaStream_t stream, const void *x, int x_dtype, int tokens, int d, int D,
                                          const void *w_gate, const void *w_up, const void *w_down_t,
                                          int weight_dtype, const int32_t *mask, const float *thresholds,
                                          int activation, float act_threshold, float *y, void *workspace,
                                          uint8_t *active_out);

/* edge_sparse_ffn over group-wise quantized rows (kernels/cpu/QUANT.md; the CPU's edge_cpu_sparse_ffn_q):
 * w_gate, w_up, w_down_t hold the codes of quant_format (enum edge_quant_format), each a [D, d] matrix in that
 * format (EDGE_Q8: int8 [D, d]; EDGE_Q4: [D, d / 2] bytes, signed 4-bit two's complement nibbles in llama.cpp's
 * Q4_0 order within each 32-value block: byte k holds value k in its low nibble and value 16 + k in its high
 * nibble), 4-byte aligned (16-byte aligned for the vector loads; they cross TensorRT as INT32 words), with
 * gate_scales, up_scales, down_scales [D, d / group_size] fp16 bits; d a multiple of group_size (32, 64 or 128).
 * Every other argument, the workspace (edge_sparse_ffn_workspace_size) and the pipeline as for edge_sparse_ffn.
 * Rows are dequantized in registers. x is quantized per block of 32 values into two int8 planes as the CPU kernels
 * quantize it (kernels/cpu/QUANT.md, "Integer dot products"; edge_sdk's quantized_activations gives the values, within
 * max|x| / 32512 of x per block); gate and up sum code * plane exactly in int32 over each 16-byte piece of the row (16
 * int8 values or one 32-value int4 block) and scale the piece's combined sum by x's block scale and the group's
 * scale; a down row adds (h_i * scale) * code. y differs from the reference on the dequantized rows and
 * quantized_activations(x) by fp32 summation order only. The planes live in the workspace's x rows.
 *
 * Asymmetric int4 (llama.cpp's Q4_1 grid, kernels/cpu/QUANT.md "Asymmetric INT4"): gate_mins, up_mins, down_mins
 * [D, d / group_size] fp16 bits laid out as the scales, the group minimums; all three NULL (symmetric: the kernels and
 * bits of the symmetric format) or all three non-NULL (down_mins NULL with int8 down rows, below), and non-NULL only
 * with EDGE_Q4 (else cudaErrorInvalidValue).
 * Value j of row i = (code + 8) * scale + min (edge_sdk/quant.py's dequantize), taken as code * scale + mid with mid =
 * 8 * scale + min (fp32, one rounding), as the CPU kernels take it ("Asymmetric INT4 rows"): gate and up keep the
 * symmetric integer products and add, right after each 32-value block's, fmaf(mid, block_sum) with block_sum the
 * block's x_hat sum (x's code sum over the block, exact in int32, times its scale / 256: one rounding); a down row adds
 * (h_i * scale) * code per value, and each lane (32 columns, one group) adds the fmaf(h_i, mid_i, c) sum over its
 * warp's rows once to its columns. The block sums come from the planes: the workspace size is the symmetric one.
 * Error bound (the CPU kernels' "Asymmetric bound"; the minimums make a row's values large against y, so it is
 * relative to the products before they cancel), against the float64 reference on the dequantized rows and
 * quantized_activations(x), the same active set away from the decision boundaries: per column c,
 *   abs(y_c - y_ref_c) <= 1e-5 sum_i (abs(h_i) + abs(a_i) S_up_i + 1.1 abs(u_i) S_gate_i) abs(w_down_ic),
 * S_i = sum_j abs(w_ij x_hat_j) of a row. Measured on the host emulation (tests/gpu/cuda_emulation.cu): at most
 * 1.2e-3 of that bound and 1.1e-6 of max abs(y_ref), so within OPS.md's 1e-5 max abs(y_ref) too (the op table's
 * asymmetric cases, Gaussian rows, and rows shifted by 3 to 6 standard deviations per group).
 *
 * down_format (enum edge_quant_format): the format of w_down_t's codes. down_format == quant_format is the single
 * format described above (its kernels and bits unchanged). down_format EDGE_Q8 with quant_format EDGE_Q4 (an int4
 * bundle that keeps its FFN down projection in int8, OPS.md's QuantizedSparseFFN down_weight_format "int8"): w_gate and
 * w_up are int4 as above (symmetric, or asymmetric with gate_mins and up_mins both non-NULL), w_down_t is int8 [D, d]
 * codes with down_scales [D, d / group_size], and down_mins must be NULL: gate and up run the int4 (or asymmetric int4)
 * kernel and the down rows the int8 path's down kernel, each a row adding (h_i * scale) * code per value as the int8
 * path does, so the mix compiles no kernel of its own. Its bounds are the existing ones: y differs from the reference
 * on the dequantized rows (int4 gate and up, int8 down) and quantized_activations(x) by fp32 summation order only for
 * symmetric gate and up rows (within OPS.md's 1e-5 max abs(y_ref)), and with asymmetric ones within the asymmetric
 * bound above (w_down_ic the int8 down rows' values; no correction for down mids, which int8 rows do not have).
 * Measured on the host emulation (tests/gpu/test_cuda_emulation.py, d 1152, D 301, groups of 32 and 128, relu and silu,
 * rows shifted per group): at most 2.6e-7 of max abs(y_ref) and 1.3e-4 of the asymmetric bound, symmetric or
 * asymmetric gate and up rows alike. Any other pair (an int8 gate with int4 down rows, an unknown value), down_mins
 * non-NULL with int8 down rows, or gate_mins and up_mins not both NULL or both non-NULL: cudaErrorInvalidValue. */
EDGE_CUDA_API cudaError_t edge_sparse_ffn_q(cudaStream_t stream, const void *x, int x_dtype, int tokens, int d, int D,
                                            const void *w_gate, const uint16_t *gate_scales, const uint16_t *gate_mins,
                                            const void *w_up, const uint16_t *up_scales, const uint16_t *up_mins,
                                            const void *w_down_t, const uint16_t *down_scales,
                                            const uint16_t *down_mins, int quant_format, int down_format,
                                            int group_size,
                                            const int32_t *mask, const float *thresholds, int activation,
                                            float act_threshold, float *y, void *workspace, uint8_t *active_out);

/* Bytes of workspace edge_matvec_q needs for `tokens` tokens of `in` inputs: x's two int8 planes and their block
 * factors and sums, round_up(2.25 * round_up(in, 64), 256) bytes per token, plus 256 (the slack that lets the layout
 * align a workspace pointer of any alignment). Returns 0 when in or tokens is <= 0. */
EDGE_CUDA_API size_t edge_matvec_q_workspace_size(int in, int tokens);

/* Dense y_t = W x_t (+ bias) over quantized rows for each token t (the CPU's edge_cpu_matvec_q): the projections and
 * the LM head of a quantized bundle. x: [tokens, in] of x_dtype; w: [out, in] codes of quant_format, 4-byte aligned,
 * with scales [out, in / group_size] fp16 bits, in a multiple of group_size; bias: [out] fp32 or NULL; y: [tokens,
 * out] fp32; workspace: edge_matvec_q_workspace_size(in, tokens) bytes, any alignment, reusable across calls on the
 * same stream. x is quantized per block of 32 values into two int8 planes as the CPU kernels quantize it (as for
 * edge_sparse_ffn_q), and y is the product with those values (quantized_activations(x)) up to fp32 summation order.
 * Up to 4 tokens: one warp per row, the row read once for all of them, integer dot products; more: tiles of 64 rows
 * x 32 tokens through shared memory. Each output is summed in an order fixed by the shapes (tokens, in), so it is
 * bit-identical run to run; the same token may round differently in a call with another number of tokens.
 * mins: [out, in / group_size] fp16 bits for asymmetric int4 rows (EDGE_Q4 only, else cudaErrorInvalidValue), NULL
 * for symmetric rows (their kernels and bits unchanged). Up to 4 tokens each block's integer product is followed by
 * fmaf(mid, block_sum) as in edge_sparse_ffn_q's gate rows; the tiles stage (code + 8) * scale + min, exactly
 * edge_sdk/quant.py's values. Bound: abs(y - y_ref) <= 1e-5 max_rows S_i, S_i = sum_j abs(w_ij x_hat_j) (the CPU
 * kernels' asymmetric bound); measured at most 3e-7 of it, and 4e-6 of max abs(y_ref) (in = 4096 in tiles, the
 * order of the symmetric tiles' 2.5e-6), within OPS.md's 1e-5 max abs(y_ref) too. */
EDGE_CUDA_API cudaError_t edge_matvec_q(cudaStream_t stream, const void *x, int x_dtype, int tokens, int in, int out,
                                        const void *w, const uint16_t *scales, const uint16_t *mins, int quant_format,
                                        int group_size, const float *bias, float *y, void *workspace);

/* edge_matvec_q with W stored transposed: y_t = W^T x_t (+ bias) for w [in, out], quantized along its rows (scales
 * [in, out / group_size], out a multiple of group_size; in any size); x: [tokens, in]; y: [tokens, out]. This is the
 * down projection of a dense FFN over the neuron-major W_down^T that SparseFFN reads, so a prompt's FFN needs no
 * second copy of it. Tiles of 64 outputs x 32 tokens through shared memory, for any number of tokens; x stays fp32
 * (in need not be a multiple of 32); each output summed over the rows of W in order, bit-identical run to run. No
 * workspace. mins: [in, out / group_size] fp16 bits for asymmetric int4 rows (EDGE_Q4 only, else
 * cudaErrorInvalidValue), NULL for symmetric ones: the tiles stage (code + 8) * scale + min, edge_sdk/quant.py's
 * values to the bit, and the bound is edge_matvec_q's with x itself for x_hat. */
EDGE_CUDA_API cudaError_t edge_matvec_q_t(cudaStream_t stream, const void *x, int x_dtype, int tokens, int in, int out,
                                          const void *w, const uint16_t *scales, const uint16_t *mins, int quant_format,
                                          int group_size, const float *bias, float *y);

#ifdef __cplusplus
}
#endif

#endif
