// x quantized for the integer dot products (quant_rows.cuh, "x in two int8 planes"), on the device: the kernel that
// writes the planes of every token, shared by the quantized SparseFFN (sparse_ffn_q.cu) and QuantizedMatMul
// (matvec_q.cu). Each .cu file has its own copy of the kernel (internal linkage).
#ifndef EDGE_QUANT_X_CUH
#define EDGE_QUANT_X_CUH

#include "edge_cuda_common.cuh"
#include "quant_rows.cuh"

namespace edge {
namespace {

constexpr int kQuantizeThreads = 256;

// One warp per block of 32 values of x [tokens, n] (n a multiple of 32, so a warp is wholly inside or outside a row):
// the block's largest magnitude by a butterfly over the lanes' bits, each lane's codes, and lane 0 the block's factor
// and code sum.
template <typename TX>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_x_kernel(const TX* __restrict__ x, int n, quant::XPlanesLayout planes) {
  const int j = blockIdx.x * kQuantizeThreads + threadIdx.x;
  const int t = blockIdx.y;
  if (j >= n) return;
  const float value = to_float(x[static_cast<size_t>(t) * n + j]);
  uint32_t largest_bits = __float_as_uint(value) & 0x7fffffffu;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    largest_bits = max(largest_bits, __shfl_xor_sync(kFullWarp, largest_bits, offset));
  }
  int8_t high, low;
  quant::quantize_x_value(value, largest_bits, &high, &low);
  planes.high(t)[j] = high;
  planes.low(t)[j] = low;
  const int code_sum = warp_sum(256 * static_cast<int>(high) + static_cast<int>(low));
  if (threadIdx.x % kWarpSize == 0) {
    planes.factor(t)[j / quant::kXBlock] = quant::x_factor(largest_bits);
    planes.code_sum(t)[j / quant::kXBlock] = code_sum;
  }
}

// Queues quantize_x_kernel for x [tokens, n] of x_dtype; returns its launch status.
inline cudaError_t quantize_x(cudaStream_t stream, const void* x, int x_dtype, int tokens, int n,
                              const quant::XPlanesLayout& planes) {
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using TX = decltype(tag);
    quantize_x_kernel<TX><<<dim3(ceil_div(n, kQuantizeThreads), tokens), kQuantizeThreads, 0, stream>>>(
        static_cast<const TX*>(x), n, planes);
    return cudaGetLastError();
  });
}

}  // namespace
}  // namespace edge

#endif
