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
//   memory, four steps per stage, the next stage loaded while the current one is multiplied: the codes and x's two
//   planes on the matrix units (mma m16n8k32, int8 operands, exact int32 sums; quant_rows.cuh, "integer GEMM"),
//   each output then summing its steps' sums times their factors in column order, in the lane whose product
//   fragment holds it.
// Either way y is that of the reference on x_hat (quantized_activations), and each output's order of summation
// depends only on the shapes, so y is bit-identical run to run.
// edge_matvec_q_t takes W transposed, [in, out] quantized along its rows: the down projection of a prompt's dense FFN
// over the neuron-major rows SparseFFN reads (one copy of the weights serves both); always the tiled GEMM (a prompt),
// with x in fp32 (its `in` need not be a multiple of 32).
// Asymmetric int4 rows (group minimums) get their own instantiation of each kernel: the GEMV and the integer GEMM add
// each block's mid times x's block sum after its integer dot, edge_matvec_q_t's GEMM stages (code + 8) * scale + min
// (quant_rows.cuh).
#include "edge_cuda_common.cuh"
#include "quant_rows.cuh"
#include "quant_x.cuh"

namespace edge {
namespace {

constexpr int kGemvWarps = 8;  // rows per block of the GEMV
constexpr size_t kPlanesAlignment = 256;  // where x's planes start in the workspace

// Up to kGemvTokens tokens: warp `row` of the grid computes row `row` for every token. One token (decode) has its own
// instantiation, held to 64 registers so that four blocks fit an SM: a 4096-row projection then runs in one wave of
// blocks on an H200's 132 SMs, where the 76 registers the shared code took allowed three (two waves; benchmarks/README.md
// section 8.4).
template <int kFormat, bool kAsymmetric, bool kOneToken>
__global__ void __launch_bounds__(kGemvWarps * kWarpSize, kOneToken ? 4 : 1)
    gemv_kernel(quant::XPlanesLayout x, int tokens, quant::QuantMatrix w, int n_rows, const float* __restrict__ bias,
                float* __restrict__ y) {
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= n_rows) return;
  float acc[quant::kGemvTokens];
  if (kOneToken) {
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

// sums = A B over one step (zero initial sums), A a warp's 16 x 32 int8 codes and B 32 x 8 int8 plane values, in the
// fragment layouts of quant_rows.cuh ("integer GEMM"); exact in int32.
__device__ __forceinline__ void mma_step(const uint32_t (&a)[4], const uint32_t (&b)[2], int32_t (&sums)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(sums[0]), "=r"(sums[1]), "=r"(sums[2]), "=r"(sums[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}

// One step of a warp's 16 rows x 16 tokens: the rows' codes times each token tile's high and low planes, added to
// the lane's outputs.
template <int kFormat, bool kAsymmetric>
__device__ __forceinline__ void warp_step(const quant::IntGemmStage<kFormat>& stage, int step, int rows, int tokens,
                                          int lane, float (&acc)[quant::kWarpTokenTiles][quant::kLaneOutputs]) {
  uint32_t a[4];
  quant::int_gemm_lane_codes<kFormat>(stage, step, rows, lane, a);
  int32_t high[quant::kWarpTokenTiles][quant::kLaneOutputs];
  int32_t low[quant::kWarpTokenTiles][quant::kLaneOutputs];
#pragma unroll
  for (int n = 0; n < quant::kWarpTokenTiles; ++n) {
    uint32_t b[2];
    quant::int_gemm_lane_plane<kFormat>(stage, 0, step, tokens + quant::kMmaTokens * n, lane, b);
    mma_step(a, b, high[n]);
    quant::int_gemm_lane_plane<kFormat>(stage, 1, step, tokens + quant::kMmaTokens * n, lane, b);
    mma_step(a, b, low[n]);
  }
  quant::int_gemm_lane_accumulate<kAsymmetric>(stage, step, rows, tokens, lane, high, low, acc);
}

// mma.m16n8k32 on int8 exists from sm_80 on (Orin's sm_87, the H100's sm_90, Thor's sm_110).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "edge_matvec_q's integer GEMM needs sm_80 or later (mma.m16n8k32 on int8)"
#endif

template <int kFormat, bool kAsymmetric>
__global__ void __launch_bounds__(quant::kGemmThreads)
    int_gemm_kernel(quant::XPlanesLayout x, int tokens, quant::QuantMatrix w, int n_rows,
                    const float* __restrict__ bias, float* __restrict__ y) {
  __shared__ quant::IntGemmStage<kFormat> stages[2];
  const int row0 = blockIdx.x * quant::kTileRows;
  const int token0 = blockIdx.y * quant::kTileTokens;
  const int thread = threadIdx.x;
  const int lane = thread % kWarpSize;
  const int rows = quant::int_gemm_warp_rows(thread / kWarpSize);
  const int warp_tokens = quant::int_gemm_warp_tokens(thread / kWarpSize);
  float acc[quant::kWarpTokenTiles][quant::kLaneOutputs] = {};
  quant::IntGemmStaged<kFormat> staged;
  quant::int_gemm_load_stage<kFormat, kAsymmetric>(w, n_rows, x, tokens, row0, token0, 0, thread, staged);
  quant::int_gemm_store_stage(staged, thread, stages[0]);
  __syncthreads();
  const int n_stages = ceil_div(w.cols, quant::kStageColumns);
  for (int s = 0; s < n_stages; ++s) {
    const int k0 = s * quant::kStageColumns;
    const bool more = s + 1 < n_stages;
    // the next stage's loads are in flight while the warps multiply this one
    if (more) {
      quant::int_gemm_load_stage<kFormat, kAsymmetric>(w, n_rows, x, tokens, row0, token0, k0 + quant::kStageColumns,
                                                       thread, staged);
    }
    const int steps = quant::stage_steps(w.cols, k0);
#pragma unroll
    for (int step = 0; step < quant::kStageSteps; ++step) {
      if (step < steps) warp_step<kFormat, kAsymmetric>(stages[s % 2], step, rows, warp_tokens, lane, acc);
    }
    // the other buffer was last read in the previous stage, before the barrier that ended it
    if (more) quant::int_gemm_store_stage(staged, thread, stages[(s + 1) % 2]);
    __syncthreads();
  }
  quant::int_gemm_lane_store(acc, row0 + rows, token0 + warp_tokens, lane, n_rows, tokens, bias, y);
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
  if (tokens == 1) {
    gemv_kernel<kFormat, kAsymmetric, true><<<ceil_div(n_rows, kGemvWarps), kGemvWarps * kWarpSize, 0, stream>>>(
        x, tokens, w, n_rows, bias, y);
  } else if (tokens <= quant::kGemvTokens) {
    gemv_kernel<kFormat, kAsymmetric, false><<<ceil_div(n_rows, kGemvWarps), kGemvWarps * kWarpSize, 0, stream>>>(
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
