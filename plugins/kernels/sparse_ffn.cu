// Sequential SparseFFN for decode tokens (DESIGN 3.1) over fp32 / fp16 / bf16 weight rows: read only the weight rows
// of the neurons that fire.
//
// Decode is a GEMV, bound by memory bandwidth, so the pipeline (sparse_ffn_pipeline.cuh) is built around reading each
// needed weight row once, in 16-byte pieces, with the evict-first hint; this file adds how a float row is read and
// the down projection over float rows. Every sum has an order fixed by the data alone, so y is bit-identical from
// run to run; there are no float atomics. Rows with h == 0 (drelu's up, or u == 0) are not read in the down step:
// they would add exactly zero.
#include "sparse_ffn_pipeline.cuh"

namespace edge {
namespace {

// Rows of a [D, d] float matrix for the gate-and-up kernel (warp_row_dot), with x32 [tokens, x_stride]. vectorized:
// 16-byte loads (the matrix 16-byte aligned, d * element size a multiple of 16, x aligned).
template <typename TW>
struct FloatRows {
  const TW* w;
  int d;
  bool vectorized;
  const float* x32;
  size_t x_stride;
  __device__ float row_dot(int row, int t) const {
    return warp_row_dot(w + static_cast<size_t>(row) * d, x32 + t * x_stride, d, vectorized);
  }
};

// partial[t, chunk, c] = sum over the chunk's listed rows k of h_k * w_down_t[index_k, c], for the columns c of
// this block's tile. Lane l owns kV columns: l * kV + e (vectorized, one 16-byte load per row) or l + 32 e.
// Warp w takes rows w, w + kDownWarps, ... of the chunk, all loads of a row group in flight at once; the
// warps' sums are then added in warp order.
template <typename TW>
__global__ void __launch_bounds__(kDownWarps * kWarpSize)
    down_kernel(int d, const TW* __restrict__ w_down_t, Workspace ws, bool vectorized) {
  constexpr int kV = Vec16<TW>::kElements;
  constexpr int kTileColumns = kWarpSize * kV;
  __shared__ DownWarpSums<kTileColumns, kV> warp_sums;
  DownBlock block;
  if (!down_block<kTileColumns>(ws, block)) return;
  float acc[kV] = {};
  if (vectorized) {
    const int column = block.tile_start + block.lane * kV;
    if (column < d) {
      uint4 raw[kRowsPerDownWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerDownWarp; ++r) {
        raw[r] = make_uint4(0, 0, 0, 0);
        if (block.neuron[r] >= 0) {
          raw[r] = __ldcs(reinterpret_cast<const uint4*>(w_down_t + static_cast<size_t>(block.neuron[r]) * d + column));
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerDownWarp; ++r) {
        if (block.neuron[r] < 0) continue;
        float w[kV];
        unpack_as<TW>(raw[r], w);
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[e] = fmaf(block.h[r], w[e], acc[e]);
      }
    }
  } else {
    const int first_column = block.tile_start + block.lane;
#pragma unroll
    for (int r = 0; r < kRowsPerDownWarp; ++r) {
      if (block.neuron[r] < 0) continue;
      const TW* row = w_down_t + static_cast<size_t>(block.neuron[r]) * d;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int column = first_column + e * kWarpSize;
        if (column < d) acc[e] = fmaf(block.h[r], to_float(row[column]), acc[e]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    warp_sums.at(block.warp, vectorized ? block.lane * kV + e : block.lane + e * kWarpSize) = acc[e];
  }
  store_down_partial(warp_sums, d, block, ws);
}

template <typename TW>
cudaError_t launch_ffn(cudaStream_t stream, const float* x32, size_t x_stride, int tokens, int d, int D,
                       const TW* w_gate, const TW* w_up, const TW* w_down_t, const int32_t* mask,
                       const float* thresholds, int activation, float act_threshold, float* y, const Workspace& ws,
                       uint8_t* active_out) {
  constexpr int kV = Vec16<TW>::kElements;
  const bool x_aligned = aligned16(x32) && x_stride % 4 == 0;
  auto rows_of = [&](const TW* w) {
    return FloatRows<TW>{w, d, x_aligned && aligned16(w) && d % kV == 0, x32, x_stride};
  };
  const dim3 rows(ceil_div(D, kRowWarps), tokens);
  gate_up_kernel<<<rows, kRowWarps * kWarpSize, 0, stream>>>(D, rows_of(w_gate), rows_of(w_up), mask, thresholds,
                                                             activation, act_threshold, ws, active_out);
  compact_kernel<<<tokens, kCompactThreads, 0, stream>>>(D, ws);
  const dim3 down_grid(ceil_div(d, kWarpSize * kV), ws.n_chunks, tokens);
  down_kernel<TW><<<down_grid, kDownWarps * kWarpSize, 0, stream>>>(d, w_down_t, ws,
                                                                      aligned16(w_down_t) && d % kV == 0);
  reduce_kernel<<<dim3(ceil_div(d, kReduceColumns), tokens), kReduceColumns * kReduceLanes, 0, stream>>>(d, ws, y);
  return cudaGetLastError();
}

}  // namespace
}  // namespace edge

extern "C" size_t edge_sparse_ffn_workspace_size(int d, int D, int tokens) {
  if (d <= 0 || D <= 0 || tokens <= 0) return 0;
  size_t d_stride, D_stride;
  int n_chunks;
  return edge::workspace_sizes(d, D, tokens, &d_stride, &D_stride, &n_chunks).total();
}

extern "C" cudaError_t edge_sparse_ffn(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d, int D,
                                       const void* w_gate, const void* w_up, const void* w_down_t, int weight_dtype,
                                       const int32_t* mask, const float* thresholds, int activation,
                                       float act_threshold, float* y, void* workspace, uint8_t* active_out) {
  using namespace edge;
  if (!valid_ffn_arguments(x, x_dtype, tokens, d, D, activation, act_threshold, y, workspace) ||
      w_gate == nullptr || w_up == nullptr || w_down_t == nullptr || !valid_dtype(weight_dtype)) {
    return cudaErrorInvalidValue;
  }
  const Workspace ws = layout_workspace(workspace, d, D, tokens);
  // fp32 x that is already aligned for float4 loads is read in place; anything else is converted first
  const float* x32;
  size_t x_stride;
  const cudaError_t status = fp32_input(stream, x, x_dtype, tokens, d, ws, &x32, &x_stride);
  if (status != cudaSuccess) return status;
  return dispatch_dtype(weight_dtype, [&](auto tag) {
    using TW = decltype(tag);
    return launch_ffn<TW>(stream, x32, x_stride, tokens, d, D, static_cast<const TW*>(w_gate),
                          static_cast<const TW*>(w_up), static_cast<const TW*>(w_down_t), mask, thresholds,
                          activation, act_threshold, y, ws, active_out);
  });
}
