// Sign-bit predictor (DESIGN 3.2, edge_sdk/sparsity/signbit.py, SparseInfer): one warp per row of W_gate's
// packed sign bits, N_neg = sum of popcount(row XOR bits(x)), inactive when alpha * N_pos < N_neg.
//
// Each block first packs x's sign bits into shared memory with one warp ballot per 32-bit word, then its
// warps walk kRowsPerBlock rows. The rows are 1/32 of W_gate, so the per-block re-read of x (from L2) is
// amortised over enough rows to stay below the packed bytes the block streams.
#include "edge_cuda_common.cuh"

namespace edge {
namespace {

constexpr int kBitsPerWord = 32;
constexpr int kWarps = 8;
constexpr int kRowsPerBlock = 64;
// x's packed bits of one token must fit the default 48 KiB of shared memory per block.
constexpr int kMaxWords = 48 * 1024 / 4;

// vectorized: packed is 16-byte aligned and the row length in words is a multiple of 4 (uint4 loads).
template <typename TX>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    signbit_kernel(const TX* __restrict__ x, int d, int D, const uint32_t* __restrict__ packed, float alpha,
                   int32_t* __restrict__ mask, bool vectorized) {
  extern __shared__ uint32_t x_bits[];  // [n_words]
  const int n_words = ceil_div(d, kBitsPerWord);
  const int t = blockIdx.y;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const TX* xt = x + static_cast<size_t>(t) * d;
  for (int k = warp; k < n_words; k += kWarps) {
    const int j = k * kBitsPerWord + lane;
    // x_j < 0: -0.0 and NaN are non-negative, as signbit.pack_sign_bits decides.
    const unsigned word = __ballot_sync(kFullWarp, j < d && to_float(xt[j]) < 0.0f);
    if (lane == 0) x_bits[k] = word;
  }
  __syncthreads();
  const int first_row = blockIdx.x * kRowsPerBlock;
  for (int r = warp; r < kRowsPerBlock; r += kWarps) {
    const int i = first_row + r;
    if (i >= D) break;
    const uint32_t* row = packed + static_cast<size_t>(i) * n_words;
    int n_negative = 0;
    if (vectorized) {
      const uint4* pieces = reinterpret_cast<const uint4*>(row);
      for (int q = lane; q < n_words / 4; q += kWarpSize) {
        const uint4 w = __ldcs(pieces + q);
        n_negative += __popc(w.x ^ x_bits[4 * q]) + __popc(w.y ^ x_bits[4 * q + 1]) +
                      __popc(w.z ^ x_bits[4 * q + 2]) + __popc(w.w ^ x_bits[4 * q + 3]);
      }
    } else {
      for (int k = lane; k < n_words; k += kWarpSize) n_negative += __popc(__ldcs(row + k) ^ x_bits[k]);
    }
    n_negative = warp_sum(n_negative);
    if (lane == 0) {
      // every count is an exact integer; the comparison is in double, as signbit.py makes it
      const bool inactive = static_cast<double>(alpha) * static_cast<double>(d - n_negative) <
                            static_cast<double>(n_negative);
      mask[static_cast<size_t>(t) * D + i] = inactive ? 0 : 1;
    }
  }
}

}  // namespace
}  // namespace edge

extern "C" cudaError_t edge_signbit_predictor(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d,
                                              int D, const int32_t* packed, float alpha, int32_t* mask) {
  using namespace edge;
  if (x == nullptr || packed == nullptr || mask == nullptr || d <= 0 || D <= 0 || tokens <= 0) {
    return cudaErrorInvalidValue;
  }
  const int n_words = ceil_div(d, kBitsPerWord);
  if (tokens > kMaxGridYZ || n_words > kMaxWords || !valid_dtype(x_dtype)) return cudaErrorInvalidValue;
  const bool vectorized = aligned16(packed) && n_words % 4 == 0;
  const size_t shared_bytes = static_cast<size_t>(n_words) * sizeof(uint32_t);
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using TX = decltype(tag);
    signbit_kernel<TX><<<dim3(ceil_div(D, kRowsPerBlock), tokens), kWarps * kWarpSize, shared_bytes, stream>>>(
        static_cast<const TX*>(x), d, D, reinterpret_cast<const uint32_t*>(packed), alpha, mask, vectorized);
    return cudaGetLastError();
  });
}
