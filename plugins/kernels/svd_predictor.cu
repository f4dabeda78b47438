// SVD predictor (DESIGN 3.2, edge_sdk/sparsity/svd.py): mask = ((x B^T) A^T + bias) > 0, as two skinny GEMVs.
//
// 1. low = x B^T: rank rows of length d. Only `rank` (~2% of D) dot products, so one block per row with
//    every thread on a slice of it: one warp per row would leave most of the GPU idle.
// 2. scores = low A^T + bias: D short rows of length rank, one warp per row; mask = scores > 0.
#include <type_traits>

#include "edge_cuda_common.cuh"

namespace edge {
namespace {

constexpr int kLowRankThreads = 256;
constexpr int kScoreWarps = 8;  // rows of A per block of stage 2

// scratch[t, r] = B_r . x_t, B float or half (the bundle's F16 factors, widened on load into registers).
// vectorized: B is float, 16-byte aligned and d % 4 == 0 (float4 loads of B).
template <typename TX, typename TB>
__global__ void __launch_bounds__(kLowRankThreads)
    low_rank_kernel(const TX* __restrict__ x, int d, int rank, const TB* __restrict__ b,
                    float* __restrict__ scratch, bool vectorized) {
  const int r = blockIdx.x;
  const int t = blockIdx.y;
  const TB* row = b + static_cast<size_t>(r) * d;
  const TX* xt = x + static_cast<size_t>(t) * d;
  float acc = 0.0f;
  if (std::is_same<TB, float>::value && vectorized) {
    const float4* pieces = reinterpret_cast<const float4*>(row);  // TB is float on this branch
    for (int q = threadIdx.x; q < d / 4; q += kLowRankThreads) {
      const float4 w = __ldcs(pieces + q);
      acc = fmaf(w.x, to_float(xt[4 * q]), acc);
      acc = fmaf(w.y, to_float(xt[4 * q + 1]), acc);
      acc = fmaf(w.z, to_float(xt[4 * q + 2]), acc);
      acc = fmaf(w.w, to_float(xt[4 * q + 3]), acc);
    }
  } else {
    for (int j = threadIdx.x; j < d; j += kLowRankThreads) acc = fmaf(to_float(row[j]), to_float(xt[j]), acc);
  }
  acc = warp_sum(acc);
  __shared__ float warp_sums[kLowRankThreads / kWarpSize];
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kLowRankThreads / kWarpSize; ++w) total += warp_sums[w];
    scratch[static_cast<size_t>(t) * rank + r] = total;
  }
}

// mask[t, i] = A_i . scratch_t + bias_i > 0, A float or half. vectorized: A and scratch are 16-byte aligned and
// rank is a multiple of the values per 16 bytes (4 float, 8 half).
template <typename TA>
__global__ void __launch_bounds__(kScoreWarps * kWarpSize)
    score_kernel(int D, int rank, const TA* __restrict__ a, const float* __restrict__ bias,
                 const float* __restrict__ scratch, int32_t* __restrict__ mask, bool vectorized) {
  const int i = blockIdx.x * kScoreWarps + threadIdx.x / kWarpSize;
  const int t = blockIdx.y;
  if (i >= D) return;
  const float score = warp_row_dot(a + static_cast<size_t>(i) * rank, scratch + static_cast<size_t>(t) * rank,
                                   rank, vectorized);
  if (threadIdx.x % kWarpSize == 0) {
    mask[static_cast<size_t>(t) * D + i] = score + (bias == nullptr ? 0.0f : bias[i]) > 0.0f ? 1 : 0;
  }
}

}  // namespace
}  // namespace edge

namespace edge {
namespace {

template <typename TF>
cudaError_t launch_svd_predictor(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d, int D, int rank,
                                 const TF* a, const TF* b, const float* bias, int32_t* mask, float* scratch) {
  if (x == nullptr || a == nullptr || b == nullptr || mask == nullptr || scratch == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (d <= 0 || D <= 0 || rank <= 0 || tokens <= 0 || tokens > kMaxGridYZ || !valid_dtype(x_dtype)) {
    return cudaErrorInvalidValue;
  }
  const bool low_vectorized = aligned16(b) && d % 4 == 0;
  const bool score_vectorized = aligned16(a) && aligned16(scratch) && rank % Vec16<TF>::kElements == 0;
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using TX = decltype(tag);
    low_rank_kernel<TX, TF><<<dim3(rank, tokens), kLowRankThreads, 0, stream>>>(static_cast<const TX*>(x), d, rank,
                                                                                b, scratch, low_vectorized);
    score_kernel<TF><<<dim3(ceil_div(D, kScoreWarps), tokens), kScoreWarps * kWarpSize, 0, stream>>>(
        D, rank, a, bias, scratch, mask, score_vectorized);
    return cudaGetLastError();
  });
}

}  // namespace
}  // namespace edge

extern "C" cudaError_t edge_svd_predictor(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d, int D,
                                          int rank, const float* a, const float* b, const float* bias, int32_t* mask,
                                          float* scratch) {
  return edge::launch_svd_predictor(stream, x, x_dtype, tokens, d, D, rank, a, b, bias, mask, scratch);
}

extern "C" cudaError_t edge_svd_predictor_f16(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d,
                                              int D, int rank, const void* a, const void* b, const float* bias,
                                              int32_t* mask, float* scratch) {
  return edge::launch_svd_predictor(stream, x, x_dtype, tokens, d, D, rank, static_cast<const __half*>(a),
                                    static_cast<const __half*>(b), bias, mask, scratch);
}
