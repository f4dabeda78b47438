// Sequential SparseFFN over group-wise quantized INT8 / INT4 rows (DESIGN 3.1, kernels/cpu/QUANT.md): the
// pipeline of sparse_ffn_pipeline.cuh with rows read as codes and dequantized in registers, never in memory.
//
// x is first quantized per block of 32 values into two int8 planes (quantize_x_kernel, as the CPU kernels quantize
// it; the planes live in the workspace's x32 rows). gate and up: one warp per row, lane l reading the 16-byte pieces
// l, l + 32, ... of the row's codes with the evict-first hint (quant::lane_row_dot_planes): each piece's codes times
// the planes are summed exactly in int32 and the sum is scaled by x's block factor and the piece's group scale (the
// pipeline's gate-and-up kernel over QuantRows). down:
// a lane owns one piece's columns (16 for int8, a 32-value block for int4) of a tile of 32 pieces and adds
// (h_r * scale) * code for each of its warp's rows (quant::lane_down); partial sums per chunk of rows, reduced in
// order as for float rows. Every sum has a fixed order: y is bit-identical run to run. Asymmetric int4 rows (group
// minimums): each kernel is compiled a third time, adding the mids as quant_rows.cuh describes (per block of a gate or
// up row one fused multiply-add with x's block sum; per lane of the down kernel one correction over its rows).
// int8 down rows under int4 gate and up rows (down_format EDGE_Q8, quant_format EDGE_Q4, symmetric or asymmetric):
// the int4 (or asymmetric int4) gate-and-up kernel, then the int8 path's down kernel, the very instantiations the
// single-format launches use, so no kernel is compiled for the mix.
#include "quant_x.cuh"
#include "sparse_ffn_pipeline.cuh"

namespace edge {
namespace {

// x's planes in the workspace's x32 rows (4 d_stride bytes per token): high codes at 0, low codes at d_stride, then
// the blocks' factors and code sums.
quant::XPlanesLayout x_planes(const Workspace& ws) {
  return {reinterpret_cast<char*>(ws.x32), 4 * ws.d_stride, ws.d_stride};
}

// Quantized rows for the pipeline's gate-and-up kernel, with x in planes (lane_row_dot_planes, then the warp sum).
template <int kFormat, bool kAsymmetric>
struct QuantRows {
  quant::QuantMatrix m;
  quant::XPlanesLayout x;
  __device__ float row_dot(int row, int t) const {
    return warp_sum(quant::lane_row_dot_planes<kFormat, kAsymmetric>(m, row, x.token(t), threadIdx.x % kWarpSize));
  }
};

// partial[t, chunk, c] = sum over the chunk's listed rows k of h_k * w_down_t[index_k, c] for the columns c of this
// block's tile (kWarpSize pieces); warp w takes rows w, w + kDownWarps, ... of the chunk, and the warps' sums are
// added in warp order.
template <int kFormat, bool kAsymmetric>
__global__ void __launch_bounds__(kDownWarps * kWarpSize) down_kernel_q(quant::QuantMatrix w_down_t, Workspace ws) {
  constexpr int kV = quant::Format<kFormat>::kPieceValues;
  constexpr int kTileColumns = kWarpSize * kV;
  __shared__ DownWarpSums<kTileColumns, kV> warp_sums;
  DownBlock block;
  if (!down_block<kTileColumns>(ws, block)) return;
  float acc[kV] = {};
  const int column = block.tile_start + block.lane * kV;
  if (column < w_down_t.cols) quant::lane_down<kFormat, kAsymmetric>(w_down_t, column, block.h, block.neuron, acc);
#pragma unroll
  for (int e = 0; e < kV; ++e) warp_sums.at(block.warp, block.lane * kV + e) = acc[e];
  store_down_partial(warp_sums, w_down_t.cols, block, ws);
}

// Gate and up rows of kind Rows (quant::RowsKind: format and minimums), down rows of kind Down.
template <typename Rows, typename Down>
cudaError_t launch_ffn_q(cudaStream_t stream, int tokens, int d, int D, const quant::QuantMatrix& w_gate,
                         const quant::QuantMatrix& w_up, const quant::QuantMatrix& w_down_t, const int32_t* mask,
                         const float* thresholds, int activation, float act_threshold, float* y, const Workspace& ws,
                         uint8_t* active_out) {
  constexpr int kV = quant::Format<Down::kFormat>::kPieceValues;
  const dim3 rows(ceil_div(D, kRowWarps), tokens);
  using GateUpRows = QuantRows<Rows::kFormat, Rows::kAsymmetric>;
  gate_up_kernel<<<rows, kRowWarps * kWarpSize, 0, stream>>>(D, GateUpRows{w_gate, x_planes(ws)},
                                                             GateUpRows{w_up, x_planes(ws)}, mask, thresholds,
                                                             activation, act_threshold, ws, active_out);
  compact_kernel<<<tokens, kCompactThreads, 0, stream>>>(D, ws);
  const dim3 down_grid(ceil_div(d, kWarpSize * kV), ws.n_chunks, tokens);
  down_kernel_q<Down::kFormat, Down::kAsymmetric><<<down_grid, kDownWarps * kWarpSize, 0, stream>>>(w_down_t, ws);
  reduce_kernel<<<dim3(ceil_div(d, kReduceColumns), tokens), kReduceColumns * kReduceLanes, 0, stream>>>(d, ws, y);
  return cudaGetLastError();
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

}  // namespace
}  // namespace edge

extern "C" cudaError_t edge_sparse_ffn_q(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d, int D,
                                         const void* w_gate, const uint16_t* gate_scales, const uint16_t* gate_mins,
                                         const void* w_up, const uint16_t* up_scales, const uint16_t* up_mins,
                                         const void* w_down_t, const uint16_t* down_scales,
                                         const uint16_t* down_mins, int quant_format, int down_format, int group_size,
                                         const int32_t* mask, const float* thresholds, int activation,
                                         float act_threshold, float* y, void* workspace, uint8_t* active_out) {
  using namespace edge;
  if (!valid_ffn_arguments(x, x_dtype, tokens, d, D, activation, act_threshold, y, workspace)) {
    return cudaErrorInvalidValue;
  }
  if (!quant::valid_format(quant_format) || !quant::valid_group_size(group_size) || d % group_size != 0) {
    return cudaErrorInvalidValue;
  }
  // the down rows in the gate and up rows' format, or int8 down rows under int4 gate and up rows
  const bool int8_down = down_format == EDGE_Q8 && quant_format == EDGE_Q4;
  if (down_format != quant_format && !int8_down) return cudaErrorInvalidValue;
  const void* codes[] = {w_gate, w_up, w_down_t};
  const uint16_t* scales[] = {gate_scales, up_scales, down_scales};
  const uint16_t* mins[] = {gate_mins, up_mins, down_mins};
  const int formats[] = {quant_format, quant_format, down_format};
  const bool asymmetric = gate_mins != nullptr;
  quant::QuantMatrix matrices[3];
  for (int m = 0; m < 3; ++m) {
    // codes are read in 4-byte words at least (they cross TensorRT as INT32)
    if (codes[m] == nullptr || scales[m] == nullptr || !aligned4(codes[m])) return cudaErrorInvalidValue;
    // the matrices of one format are of one kind: minimums for all of them or for none (int8 down rows have none)
    const bool has_mins = asymmetric && formats[m] == quant_format;
    if ((mins[m] != nullptr) != has_mins || !quant::valid_mins(formats[m], mins[m])) return cudaErrorInvalidValue;
    matrices[m] = {static_cast<const uint8_t*>(codes[m]), scales[m], mins[m], d, group_size, aligned16(codes[m])};
  }
  const Workspace ws = layout_workspace(workspace, d, D, tokens);
  const cudaError_t status = quantize_x(stream, x, x_dtype, tokens, d, x_planes(ws));
  if (status != cudaSuccess) return status;
  return quant::dispatch_rows(quant_format, asymmetric, [&](auto kind) {
    using Kind = decltype(kind);
    auto launch = [&](auto down) {
      return launch_ffn_q<Kind, decltype(down)>(stream, tokens, d, D, matrices[0], matrices[1], matrices[2], mask,
                                                thresholds, activation, act_threshold, y, ws, active_out);
    };
    if constexpr (Kind::kFormat == EDGE_Q4) {
      if (int8_down) return launch(quant::RowsKind<EDGE_Q8, false>{});
    }
    return launch(kind);
  });
}
