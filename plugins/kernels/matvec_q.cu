// Dense y = W x (+ bias) over group-wise quantized INT8 / INT4 rows (kernels/cpu/QUANT.md), for the
// projections and the LM head of a quantized bundle's TensorRT graph: TensorRT 10.3 dequantizes blocks only for INT4
// with positive scales (NvInfer.h, IDequantizeLayer), which the group-wise INT8 and the signed-scale INT4 of the
// format are not, so the graph gives these products to a plugin (QuantizedMatMul) that calls this launcher.
//
// edge_matvec_q first quantizes x into the two int8 planes of the integer dot products (quant_x.cuh, in the caller's
// workspace), then, by the number of tokens:
// - up to quant::kGemvTokens tokens (decode): one warp per weight row, the row's 16-byte pieces read once with the
//   evict-first hint and dotted with each token's planes in dp4a (exact in int32), as the SparseFFN's gate rows;
//   each token's sum in a fixed lane order, then a warp butterfly;
// - more tokens (a prompt): tiles of 64 rows x 32 tokens per block, stepping 32 columns at a time through shared
//   memory: the codes as int8 and x's two planes, multiplied on the matrix units (wmma, int8 operands, exact int32
//   sums; quant_rows.cuh, "integer GEMM"), each output then summing its steps' sums times their factors in column
//   order, one thread per output.
// Either way y is that of the reference on x_hat (quantized_activations), and each output's order of summation
// depends only on the shapes, so y is bit-identical run to run.
// edge_matvec_q_t takes W transposed, [in, out] quantized along its rows: the down projection of a prompt's dense FFN
// over the neuron-major rows SparseFFN reads (one copy of the weights serves both); always the tiled GEMM (a prompt),
// with x in fp32 (its `in` need not be a multiple of 32).
// Asymmetric int4 rows (group minimums) get their own instantiation of each kernel: the GEMV and the integer GEMM add
// each block's mid times x's block sum after its integer dot, edge_matvec_q_t's GEMM stages (code + 8) * scale + min
// (quant_rows.cuh).
#include <mma.h>

#include "edge_cuda_common.cuh"
#include "quant_rows.cuh"
#include "quant_x.cuh"

namespace edge {
namespace {

constexpr int kGemvWarps = 8;  // rows per block of the GEMV
constexpr size_t kPlanesAlignment = 256;  // where x's planes start in the workspace

// Up to kGemvTokens tokens: warp `row` of the grid computes row `row` for every token.
template <int kFormat, bool kAsymmetric>
__global__ void __launch_bounds__(kGemvWarps * kWarpSize)
    gemv_kernel(quant::XPlanesLayout x, int tokens, quant::QuantMatrix w, int n_rows, const float* __restrict__ bias,
                float* __restrict__ y) {
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n_rows) return;
  float acc[quant::kGemvTokens];
  if (tokens == 1) {
    acc[0] = quant::lane_row_dot_planes<kFormat, kAsymmetric>(w, row, x.token(0), lane);
  } else {
    quant::lane_row_dot_tokens_planes<kFormat, kAsymmetric>(w, row, x, tokens, lane, acc);
  }
#pragma unroll
  for (int t = 0; t < quant::kGemvTokens; ++t) {
    if (t < tokens) {  // the same for the whole warp
      const float sum = warp_sum(acc[t]);
      if (lane == 0) y[static_cast<size_t>(t) * n_rows + row] = bias != nullptr ? sum + bias[row] : sum;
    }
  }
}

// Warp `warp` of an integer GEMM block: rows (warp % 4) * 16.. and tokens (warp / 4) * 16.. of the step's tiles,
// tiles.sums = 256 (codes . high) + (codes . low) over the step's 32 columns, two k halves of 16 each. Both
// accumulators have one type, so element i of each is the same output, whatever the fragments' layout.
__device__ void warp_step_sums(quant::IntGemmTiles& tiles, int warp) {
  using namespace nvcuda;
  constexpr int kK = quant::kMmaK;
  static_assert(quant::kGemmThreads / kWarpSize == (quant::kTileRows / kK) * (quant::kTileTokens / kK),
                "one 16 x 16 piece of the tile per warp");
  const int rows = (warp % (quant::kTileRows / kK)) * kK;
  const int tokens = (warp / (quant::kTileRows / kK)) * kK;
  wmma::fragment<wmma::accumulator, kK, kK, kK, int> high;
  wmma::fragment<wmma::accumulator, kK, kK, kK, int> low;
  wmma::fill_fragment(high, 0);
  wmma::fill_fragment(low, 0);
#pragma unroll
  for (int half = 0; half < quant::kTileK / kK; ++half) {
    // codes [16 rows][16 k] row-major and a plane [16 tokens][16 k], which is k x tokens column-major
    wmma::fragment<wmma::matrix_a, kK, kK, kK, signed char, wmma::row_major> codes;
    wmma::fragment<wmma::matrix_b, kK, kK, kK, signed char, wmma::col_major> plane;
    wmma::load_matrix_sync(codes, &tiles.w[half][rows][0], kK);
    wmma::load_matrix_sync(plane, &tiles.x[0][half][tokens][0], kK);
    wmma::mma_sync(high, codes, plane, high);
    wmma::load_matrix_sync(plane, &tiles.x[1][half][tokens][0], kK);
    wmma::mma_sync(low, codes, plane, low);
  }
#pragma unroll
  for (int i = 0; i < high.num_elements; ++i) high.x[i] = 256 * high.x[i] + low.x[i];
  // rows x tokens, column-major: element (row r, token t) at sums[tokens + t][rows + r]
  wmma::store_matrix_sync(&tiles.sums[tokens][rows], high, quant::kSumsStride, wmma::mem_col_major);
}

template <int kFormat, bool kAsymmetric>
__global__ void __launch_bounds__(quant::kGemmThreads)
    int_gemm_kernel(quant::XPlanesLayout x, int tokens, quant::QuantMatrix w, int n_rows,
                    const float* __restrict__ bias, float* __restrict__ y) {
  __shared__ quant::IntGemmTiles tiles;
  const int row0 = blockIdx.x * quant::kTileRows;
  const int token0 = blockIdx.y * quant::kTileTokens;
  const int thread = threadIdx.x;
  float acc[quant::kThreadTokens][quant::kThreadRows] = {};
  for (int k0 = 0; k0 < w.cols; k0 += quant::kTileK) {
    quant::int_gemm_stage_codes<kFormat>(w, n_rows, row0, k0, thread, tiles);
    quant::int_gemm_stage_planes(x, tokens, token0, k0, thread, tiles);
    __syncthreads();  // also: every thread has added the last step's sums, which this step overwrites
    warp_step_sums(tiles, thread / kWarpSize);
    __syncthreads();
    quant::int_gemm_accumulate<kFormat, kAsymmetric>(tiles, w, n_rows, x, tokens, row0, token0, k0, thread, acc);
  }
  quant::gemm_store(acc, thread, token0, row0, tokens, n_rows, bias, y);
}

// edge_matvec_q_t: the same tiles over W [in, out], quantized along its rows (out), so output n of y is column n.
template <int kFormat, bool kAsymmetric, typename TX>
__global__ void __launch_bounds__(quant::kGemmThreads)
    gemm_t_kernel(const TX* __restrict__ x, int tokens, int n_in, quant::QuantMatrix w, const float* __restrict__ bias,
                  float* __restrict__ y) {
  __shared__ quant::GemmTiles tiles;
  const int col0 = blockIdx.x * quant::kTileRows;
  const int token0 = blockIdx.y * quant::kTileTokens;
  const int thread = threadIdx.x;
  float acc[quant::kThreadTokens][quant::kThreadRows] = {};
  for (int k0 = 0; k0 < n_in; k0 += quant::kTileK) {
    quant::gemm_stage_weights_t<kFormat, kAsymmetric>(w, n_in, col0, k0, thread, tiles);
    quant::gemm_stage_x(quant::DenseX<TX>{x, n_in}, tokens, n_in, token0, k0, thread, tiles);
    __syncthreads();
    quant::gemm_accumulate(tiles, thread, acc);
    __syncthreads();
  }
  quant::gemm_store(acc, thread, token0, col0, tokens, w.cols, bias, y);
}

template <int kFormat, bool kAsymmetric>
cudaError_t launch_matvec_q(cudaStream_t stream, const quant::XPlanesLayout& x, int tokens,
                            const quant::QuantMatrix& w, int n_rows, const float* bias, float* y) {
  if (tokens <= quant::kGemvTokens) {
    gemv_kernel<kFormat, kAsymmetric><<<ceil_div(n_rows, kGemvWarps), kGemvWarps * kWarpSize, 0, stream>>>(
        x, tokens, w, n_rows, bias, y);
  } else {
    const dim3 grid(ceil_div(n_rows, quant::kTileRows), ceil_div(tokens, quant::kTileTokens));
    int_gemm_kernel<kFormat, kAsymmetric><<<grid, quant::kGemmThreads, 0, stream>>>(x, tokens, w, n_rows, bias, y);
  }
  return cudaGetLastError();
}

// x's planes in edge_matvec_q's workspace (edge_matvec_q_workspace_size), from its first 256-byte boundary.
quant::XPlanesLayout matvec_planes(void* workspace, int in) {
  char* base = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(workspace), kPlanesAlignment));
  return {base, quant::XPlanesLayout::token_stride_for(in), quant::XPlanesLayout::plane_stride_for(in)};
}

// The checks of both launchers' arguments, and W as the kernels see it: rows of `row_values` values (out for
// edge_matvec_q_t's W [in, out], in for edge_matvec_q's W [out, in]). false: cudaErrorInvalidValue.
bool matvec_arguments(const void* x, int x_dtype, int tokens, int in, int out, const void* w, const uint16_t* scales,
                      const uint16_t* mins, int quant_format, int group_size, const float* y, int row_values,
                      quant::QuantMatrix* matrix) {
  if (x == nullptr || w == nullptr || scales == nullptr || y == nullptr || reinterpret_cast<uintptr_t>(w) % 4 != 0) {
    return false;
  }
  if (tokens <= 0 || in <= 0 || out <= 0 || !valid_dtype(x_dtype) || !quant::valid_format(quant_format) ||
      !quant::valid_mins(quant_format, mins) || !quant::valid_group_size(group_size) || row_values % group_size != 0 ||
      ceil_div(tokens, quant::kTileTokens) > kMaxGridYZ) {
    return false;
  }
  *matrix = {static_cast<const uint8_t*>(w), scales, mins, row_values, group_size, aligned16(w)};
  return true;
}

}  // namespace
}  // namespace edge

extern "C" cudaError_t edge_matvec_q_t(cudaStream_t stream, const void* x, int x_dtype, int tokens, int in, int out,
                                       const void* w, const uint16_t* scales, const uint16_t* mins, int quant_format,
                                       int group_size, const float* bias, float* y) {
  using namespace edge;
  quant::QuantMatrix matrix;  // W [in, out]: its rows hold `out` values
  if (!matvec_arguments(x, x_dtype, tokens, in, out, w, scales, mins, quant_format, group_size, y, out, &matrix)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(ceil_div(out, quant::kTileRows), ceil_div(tokens, quant::kTileTokens));
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using TX = decltype(tag);
    const TX* xt = static_cast<const TX*>(x);
    return quant::dispatch_rows(quant_format, mins != nullptr, [&](auto kind) {
      using Kind = decltype(kind);
      gemm_t_kernel<Kind::kFormat, Kind::kAsymmetric, TX>
          <<<grid, quant::kGemmThreads, 0, stream>>>(xt, tokens, in, matrix, bias, y);
      return cudaGetLastError();
    });
  });
}

extern "C" size_t edge_matvec_q_workspace_size(int in, int tokens) {
  if (in <= 0 || tokens <= 0) return 0;
  return static_cast<size_t>(tokens) * edge::quant::XPlanesLayout::token_stride_for(in) + edge::kPlanesAlignment;
}

extern "C" cudaError_t edge_matvec_q(cudaStream_t stream, const void* x, int x_dtype, int tokens, int in, int out,
                                     const void* w, const uint16_t* scales, const uint16_t* mins, int quant_format,
                                     int group_size, const float* bias, float* y, void* workspace) {
  using namespace edge;
  quant::QuantMatrix matrix;  // W [out, in]: its rows hold `in` values
  if (workspace == nullptr ||
      !matvec_arguments(x, x_dtype, tokens, in, out, w, scales, mins, quant_format, group_size, y, in, &matrix)) {
    return cudaErrorInvalidValue;
  }
  const quant::XPlanesLayout planes = matvec_planes(workspace, in);
  const cudaError_t status = quantize_x(stream, x, x_dtype, tokens, in, planes);
  if (status != cudaSuccess) return status;
  return quant::dispatch_rows(quant_format, mins != nullptr, [&](auto kind) {
    using Kind = decltype(kind);
    return launch_matvec_q<Kind::kFormat, Kind::kAsymmetric>(stream, planes, tokens, matrix, out, bias, y);
  });
}
