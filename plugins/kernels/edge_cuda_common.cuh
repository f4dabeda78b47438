// Device helpers shared by the edge-sdk CUDA kernels: element conversion, 16-byte vector loads, warp sums,
// and the dtype dispatch of the launchers. Internal to plugins/kernels (not installed).
#ifndef EDGE_CUDA_COMMON_CUH
#define EDGE_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "edge_cuda_kernels.h"

namespace edge {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
// Grid limits the launchers check before launching: gridDim.y and gridDim.z.
constexpr int kMaxGridYZ = 65535;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Elements of T in one 16-byte load.
template <typename T>
struct Vec16 {
  static constexpr int kElements = 16 / static_cast<int>(sizeof(T));
};

// The kElements values of a 16-byte load of T, as floats, in memory order.
template <typename T>
__device__ __forceinline__ void unpack_as(uint4 raw, float (&out)[Vec16<T>::kElements]);

template <>
__device__ __forceinline__ void unpack_as<float>(uint4 raw, float (&out)[4]) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}

template <>
__device__ __forceinline__ void unpack_as<__half>(uint4 raw, float (&out)[8]) {
  const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 values = __half22float2(pairs[k]);
    out[2 * k] = values.x;
    out[2 * k + 1] = values.y;
  }
}

template <>
__device__ __forceinline__ void unpack_as<__nv_bfloat16>(uint4 raw, float (&out)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 values = __bfloat1622float2(pairs[k]);
    out[2 * k] = values.x;
    out[2 * k + 1] = values.y;
  }
}

// Sum of v over the warp, in the same butterfly order on every run; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// row . x over n elements, computed by one warp (every lane gets the sum), fp32 accumulation.
// vectorized: row and x are 16-byte aligned and n is a multiple of Vec16<TW>::kElements; lane l then reads
// the 16-byte pieces l, l + 32, ... of the row with the evict-first hint (weights are streamed once), four
// in flight, into four accumulators. Otherwise lane l reads elements l, l + 32, ... The order of every
// sum is fixed, so the result is the same on every run.
template <typename TW>
__device__ __forceinline__ float warp_row_dot(const TW* __restrict__ row, const float* __restrict__ x, int n,
                                              bool vectorized) {
  const int lane = threadIdx.x % kWarpSize;
  constexpr int kUnroll = 4;
  float acc[kUnroll] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (vectorized) {
    constexpr int kV = Vec16<TW>::kElements;
    const uint4* pieces = reinterpret_cast<const uint4*>(row);
    const int n_pieces = n / kV;
    int p = lane;
    for (; p + (kUnroll - 1) * kWarpSize < n_pieces; p += kUnroll * kWarpSize) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = __ldcs(pieces + p + u * kWarpSize);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float w[kV];
        unpack_as<TW>(raw[u], w);
        const float4* xs = reinterpret_cast<const float4*>(x + (p + u * kWarpSize) * kV);
#pragma unroll
        for (int q = 0; q < kV / 4; ++q) {
          const float4 xv = __ldg(xs + q);
          acc[u] = fmaf(w[4 * q], xv.x, acc[u]);
          acc[u] = fmaf(w[4 * q + 1], xv.y, acc[u]);
          acc[u] = fmaf(w[4 * q + 2], xv.z, acc[u]);
          acc[u] = fmaf(w[4 * q + 3], xv.w, acc[u]);
        }
      }
    }
    for (; p < n_pieces; p += kWarpSize) {
      float w[kV];
      unpack_as<TW>(__ldcs(pieces + p), w);
      const float4* xs = reinterpret_cast<const float4*>(x + p * kV);
#pragma unroll
      for (int q = 0; q < kV / 4; ++q) {
        const float4 xv = __ldg(xs + q);
        acc[0] = fmaf(w[4 * q], xv.x, acc[0]);
        acc[0] = fmaf(w[4 * q + 1], xv.y, acc[0]);
        acc[0] = fmaf(w[4 * q + 2], xv.z, acc[0]);
        acc[0] = fmaf(w[4 * q + 3], xv.w, acc[0]);
      }
    }
  } else {
    for (int j = lane; j < n; j += kWarpSize) acc[0] = fmaf(to_float(row[j]), __ldg(x + j), acc[0]);
  }
  return warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

__host__ __device__ constexpr size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

__host__ __device__ constexpr int ceil_div(int n, int m) { return (n + m - 1) / m; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline bool valid_dtype(int dtype) {
  return dtype == EDGE_CUDA_F32 || dtype == EDGE_CUDA_F16 || dtype == EDGE_CUDA_BF16;
}

// Calls launch(T{}) with the C++ element type of an enum edge_cuda_dtype value (checked by valid_dtype).
template <typename Launch>
cudaError_t dispatch_dtype(int dtype, Launch&& launch) {
  switch (dtype) {
    case EDGE_CUDA_F16:
      return launch(__half{});
    case EDGE_CUDA_BF16:
      return launch(__nv_bfloat16{});
    default:
      return launch(float{});
  }
}

}  // namespace edge

#endif
