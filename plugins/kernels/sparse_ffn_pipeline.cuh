// The sequential SparseFFN pipeline shared by the float kernels (sparse_ffn.cu) and the quantized ones
// (sparse_ffn_q.cu): the workspace layout, x to fp32, the gate-and-up kernel, the compaction and the final
// reduction. Only how a weight row is read, and the form x takes, differ, which the gate-and-up kernel takes as a
// `Rows` type:
//   struct Rows { __device__ float row_dot(int row, int t) const; };
// returning row . x_t to every lane of the calling warp (the sum in a fixed order). Each .cu file has its own copy of
// these kernels (internal linkage); the down projection is format-specific and lives with its launcher.
//
// Pipeline, every kernel over all tokens at once (blockIdx.y or .z = token), no host synchronisation:
//   0. x as the rows read it: fp32 (skipped when x is already aligned fp32), or quantized (sparse_ffn_q.cu);
//   1. gate and up: one warp per row i of the mask: a_i = act(w_gate_i . x), zero for rows outside the mask or
//      failing the thresholds (active_out written here); where a_i != 0 the same warp reads w_up_i: h_i = a_i *
//      act_up(w_up_i . x), else h_i = 0, so no w_up byte of a predictor's false positive is read;
//   2. compact: one block per token lists the i with h_i != 0 in increasing order, with their h (block-wide prefix
//      sums); no w_down_t byte of a neuron with h_i == 0 is read;
//   3. down (per format): the listed rows in chunks of kRowsPerChunk; a block sums one chunk over one tile of
//      columns (each warp a fixed subset of the chunk's rows, then the warps in order), into partial[chunk];
//   4. reduce: y = sum over chunks of partial[chunk], in chunk order.
// At 80-95% sparsity the latency of these dependent kernels, not bytes, is most of an FFN's time (benchmarks/README.md
// section 8.1): gate and up share a kernel since only the up row of a firing gate is read.
#ifndef EDGE_SPARSE_FFN_PIPELINE_CUH
#define EDGE_SPARSE_FFN_PIPELINE_CUH

#include "edge_cuda_common.cuh"
#include "quant_rows.cuh"

namespace edge {
namespace {

constexpr int kRowWarps = 8;           // warps (= rows) per block of the gate-and-up kernel
constexpr int kCompactThreads = 1024;  // one block per token
constexpr int kCompactPerThread = 4;   // consecutive neurons per thread and tile
constexpr int kCompactTilesLoaded = 4;  // tiles whose h a thread loads before listing the first of them
constexpr int kRowsPerChunk = 64;      // listed rows per block of the down kernel
constexpr int kDownWarps = 8;
constexpr int kRowsPerDownWarp = kRowsPerChunk / kDownWarps;
constexpr int kReduceColumns = 32;  // reduce kernel: 32 columns x kReduceLanes chunk lanes per block
constexpr int kReduceLanes = 8;
constexpr int kConvertThreads = 256;
constexpr size_t kAlignment = 256;  // every workspace region starts on this boundary

// Where each buffer lives inside the caller's workspace, per token t at offset t * stride.
struct Workspace {
  float* x32;      // [tokens, d_stride] x as fp32
  float* neuron_hidden;  // [tokens, D_stride] h_i by neuron, 0 for the neurons that do not fire
  int32_t* index;        // [tokens, D_stride] the neurons with h_i != 0, increasing
  float* hidden;         // [tokens, D_stride] their h, in the same order
  int32_t* count;  // [tokens] how many are listed
  float* partial;  // [tokens, n_chunks, d_stride] down-projection partial sums
  size_t d_stride, D_stride;
  int n_chunks;
};

struct WorkspaceSizes {
  size_t x32, neuron_hidden, index, hidden, count, partial;
  size_t total() const { return x32 + neuron_hidden + index + hidden + count + partial + kAlignment; }
};

inline WorkspaceSizes workspace_sizes(int d, int D, int tokens, size_t* d_stride, size_t* D_stride, int* n_chunks) {
  *d_stride = round_up(static_cast<size_t>(d), kAlignment / sizeof(float));
  *D_stride = round_up(static_cast<size_t>(D), kAlignment / sizeof(float));
  *n_chunks = ceil_div(D, kRowsPerChunk);
  const size_t n = static_cast<size_t>(tokens);
  WorkspaceSizes sizes;
  sizes.x32 = n * *d_stride * sizeof(float);
  sizes.neuron_hidden = n * *D_stride * sizeof(float);
  sizes.index = n * *D_stride * sizeof(int32_t);
  sizes.hidden = n * *D_stride * sizeof(float);
  sizes.count = round_up(n * sizeof(int32_t), kAlignment);
  sizes.partial = n * static_cast<size_t>(*n_chunks) * *d_stride * sizeof(float);
  return sizes;
}

inline Workspace layout_workspace(void* workspace, int d, int D, int tokens) {
  Workspace ws;
  const WorkspaceSizes sizes = workspace_sizes(d, D, tokens, &ws.d_stride, &ws.D_stride, &ws.n_chunks);
  char* base = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(workspace), kAlignment));
  ws.x32 = reinterpret_cast<float*>(base);
  base += sizes.x32;
  ws.neuron_hidden = reinterpret_cast<float*>(base);
  base += sizes.neuron_hidden;
  ws.index = reinterpret_cast<int32_t*>(base);
  base += sizes.index;
  ws.hidden = reinterpret_cast<float*>(base);
  base += sizes.hidden;
  ws.count = reinterpret_cast<int32_t*>(base);
  base += sizes.count;
  ws.partial = reinterpret_cast<float*>(base);
  return ws;
}

// a = act(g) for the gate (edge_sdk/model/activation.py): relu and drelu's gate part max(g, 0) with NaN
// propagating (as torch.relu), fatrelu g > t ? g : 0, silu g * sigmoid(g).
EDGE_HD float gate_activation(int activation, float g, float threshold) {
  switch (activation) {
    case EDGE_ACT_FATRELU:
      return g > threshold ? g : 0.0f;
    case EDGE_ACT_SILU:
      return g / (1.0f + expf(-g));
    default:
      return g < 0.0f ? 0.0f : g;
  }
}

// The gate's verdict on neuron i: a_i, or 0 when it fails its CHESS threshold (threshold_i NULL: no threshold).
EDGE_HD float gated_activation(int activation, float g, float act_threshold, const float* threshold_i) {
  float a = gate_activation(activation, g, act_threshold);
  if (threshold_i != nullptr && !(fabsf(a) > *threshold_i)) a = 0.0f;
  return a;
}

// h = a * act_up(u): relu on up for drelu, identity otherwise.
EDGE_HD float hidden_value(int activation, float a, float u) {
  if (activation == EDGE_ACT_DRELU) u = u < 0.0f ? 0.0f : u;
  return a * u;
}

// The kRowsPerDownWarp listed rows warp `warp` adds in the down kernel's chunk [first, end): rows first + warp,
// first + warp + kDownWarps, ...; h of each, and its neuron, or -1 when past the list or h == 0 (an exact zero: the
// row is not read).
EDGE_HD void down_rows(int first, int end, int warp, const float* hidden, const int32_t* index,
                       float (&h)[kRowsPerDownWarp], int (&neuron)[kRowsPerDownWarp]) {
EDGE_UNROLL
  for (int r = 0; r < kRowsPerDownWarp; ++r) {
    const int k = first + warp + r * kDownWarps;
    h[r] = k < end ? hidden[k] : 0.0f;
    neuron[r] = h[r] != 0.0f ? index[k] : -1;
  }
}

// A block of a down kernel: token t = blockIdx.z, the chunk blockIdx.y of its list, the tile blockIdx.x of
// kTileColumns columns from tile_start; the calling thread's warp and lane, and the rows its warp adds (down_rows).
struct DownBlock {
  int t, chunk, warp, lane, tile_start;
  float h[kRowsPerDownWarp];
  int neuron[kRowsPerDownWarp];
};

// Fills `block` for the calling thread; false when the chunk starts past the token's list (nothing to add).
template <int kTileColumns>
__device__ bool down_block(const Workspace& ws, DownBlock& block) {
  block.t = blockIdx.z;
  block.chunk = blockIdx.y;
  const int first = block.chunk * kRowsPerChunk;
  const int n_listed = ws.count[block.t];
  if (first >= n_listed) return false;
  const int end = min(first + kRowsPerChunk, n_listed);
  block.warp = threadIdx.x / kWarpSize;
  block.lane = threadIdx.x % kWarpSize;
  block.tile_start = blockIdx.x * kTileColumns;
  down_rows(first, end, block.warp, ws.hidden + block.t * ws.D_stride, ws.index + block.t * ws.D_stride, block.h,
            block.neuron);
  return true;
}

// A down kernel's shared memory for its warps' sums of a tile, one row per warp, slot s (column tile_start + s) at
// s + s / kV: a lane's kV consecutive slots padded by one, so that the lanes' stores of their e-th value land in 32
// banks, where unpadded the int4 kernel's lanes (kV = 32) would all hit one.
template <int kTileColumns, int kV>
struct DownWarpSums {
  float values[kDownWarps][kTileColumns + kTileColumns / kV];
  __device__ float& at(int warp, int slot) { return values[warp][slot + slot / kV]; }
};

// The end of a down kernel, once each warp has written its sums of the tile's columns to warp_sums.at(warp, slot):
// after a barrier, partial[t, chunk, column] = the warps' sums added in warp order.
template <int kTileColumns, int kV>
__device__ void store_down_partial(DownWarpSums<kTileColumns, kV>& warp_sums, int d, const DownBlock& block,
                                   const Workspace& ws) {
  __syncthreads();
  float* partial = ws.partial + (static_cast<size_t>(block.t) * ws.n_chunks + block.chunk) * ws.d_stride;
  for (int slot = threadIdx.x; slot < kTileColumns; slot += kDownWarps * kWarpSize) {
    const int column = block.tile_start + slot;
    if (column >= d) continue;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kDownWarps; ++w) total += warp_sums.at(w, slot);
    partial[column] = total;
  }
}

template <typename TX>
__global__ void __launch_bounds__(kConvertThreads)
    convert_kernel(const TX* __restrict__ x, int d, size_t d_stride, float* __restrict__ x32) {
  const int j = blockIdx.x * kConvertThreads + threadIdx.x;
  const int t = blockIdx.y;
  if (j < d) x32[t * d_stride + j] = to_float(x[static_cast<size_t>(t) * d + j]);
}

// One warp per row i of token blockIdx.y: the gate's verdict a_i, and where a_i != 0 the up row: h_i.
template <typename Rows>
__global__ void __launch_bounds__(kRowWarps * kWarpSize)
    gate_up_kernel(int D, Rows w_gate, Rows w_up, const int32_t* __restrict__ mask,
                   const float* __restrict__ thresholds, int activation, float act_threshold, Workspace ws,
                   uint8_t* __restrict__ active_out) {
  const int i = blockIdx.x * kRowWarps + threadIdx.x / kWarpSize;
  const int t = blockIdx.y;
  if (i >= D) return;
  float a = 0.0f;
  float h = 0.0f;
  if (mask == nullptr || mask[static_cast<size_t>(t) * D + i] != 0) {
    const float g = w_gate.row_dot(i, t);
    a = gated_activation(activation, g, act_threshold, thresholds != nullptr ? thresholds + i : nullptr);
    if (a != 0.0f) h = hidden_value(activation, a, w_up.row_dot(i, t));  // a is the same on every lane
  }
  if (threadIdx.x % kWarpSize == 0) {
    ws.neuron_hidden[t * ws.D_stride + i] = h;
    if (active_out != nullptr) active_out[static_cast<size_t>(t) * D + i] = a != 0.0f;
  }
}

// One block per token: index = the i with h_i != 0, increasing, hidden = their h, count = how many. Each tile
// covers kCompactThreads * kCompactPerThread neurons, thread k the kCompactPerThread consecutive ones from
// k * kCompactPerThread, placed with a block-wide exclusive prefix sum of the per-thread counts. A thread loads its
// h of kCompactTilesLoaded tiles at once, so that the tiles' listing waits for one round of loads, not one per tile.
__global__ void __launch_bounds__(kCompactThreads) compact_kernel(int D, Workspace ws) {
  constexpr int kWarps = kCompactThreads / kWarpSize;
  constexpr int kTile = kCompactThreads * kCompactPerThread;
  static_assert(kCompactPerThread == 4, "one float4 load per thread and tile");
  __shared__ int warp_offsets[kWarps];
  __shared__ int listed;  // neurons listed by the tiles so far
  const int t = blockIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const float* neuron_hidden = ws.neuron_hidden + t * ws.D_stride;
  int32_t* index = ws.index + t * ws.D_stride;
  float* hidden = ws.hidden + t * ws.D_stride;
  if (threadIdx.x == 0) listed = 0;
  for (int round = 0; round < D; round += kCompactTilesLoaded * kTile) {
    float4 loaded[kCompactTilesLoaded];
#pragma unroll
    for (int tile = 0; tile < kCompactTilesLoaded; ++tile) {
      const int first = round + tile * kTile + threadIdx.x * kCompactPerThread;
      loaded[tile] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // rows start 256-byte aligned and D_stride is a multiple of 4: the float4 stays inside the row
      if (first < D) loaded[tile] = *reinterpret_cast<const float4*>(neuron_hidden + first);
    }
#pragma unroll
    for (int tile = 0; tile < kCompactTilesLoaded; ++tile) {
      const int first = round + tile * kTile + threadIdx.x * kCompactPerThread;
      if (round + tile * kTile >= D) break;  // the same for every thread of the block
      const float h[kCompactPerThread] = {loaded[tile].x, loaded[tile].y, loaded[tile].z, loaded[tile].w};
      bool fires[kCompactPerThread];
#pragma unroll
      for (int e = 0; e < kCompactPerThread; ++e) fires[e] = first + e < D && h[e] != 0.0f;
      const int n = fires[0] + fires[1] + fires[2] + fires[3];
      int inclusive = n;  // prefix sum over the warp
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const int before = __shfl_up_sync(kFullWarp, inclusive, offset);
        if (lane >= offset) inclusive += before;
      }
      if (lane == kWarpSize - 1) warp_offsets[warp] = inclusive;
      __syncthreads();
      if (warp == 0) {  // exclusive prefix sum of the warp totals
        const int total = lane < kWarps ? warp_offsets[lane] : 0;
        int running = total;
#pragma unroll
        for (int offset = 1; offset < kWarpSize; offset *= 2) {
          const int before = __shfl_up_sync(kFullWarp, running, offset);
          if (lane >= offset) running += before;
        }
        if (lane < kWarps) warp_offsets[lane] = running - total;
      }
      __syncthreads();
      int position = listed + warp_offsets[warp] + inclusive - n;
#pragma unroll
      for (int e = 0; e < kCompactPerThread; ++e) {
        if (fires[e]) {
          index[position] = first + e;
          hidden[position] = h[e];
          ++position;
        }
      }
      __syncthreads();  // every thread has read `listed` and warp_offsets
      if (threadIdx.x == kCompactThreads - 1) listed = position;
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) ws.count[t] = listed;
}

// y[t, c] = sum over the used chunks of partial[t, chunk, c]: lane group g of a column sums chunks g, g + 8, ...,
// then the groups are added in order.
__global__ void __launch_bounds__(kReduceColumns * kReduceLanes) reduce_kernel(int d, Workspace ws, float* y) {
  __shared__ float group_sums[kReduceLanes][kReduceColumns];
  const int t = blockIdx.y;
  const int slot = threadIdx.x % kReduceColumns;
  const int group = threadIdx.x / kReduceColumns;
  const int column = blockIdx.x * kReduceColumns + slot;
  const int n_chunks = ceil_div(ws.count[t], kRowsPerChunk);
  const float* partial = ws.partial + static_cast<size_t>(t) * ws.n_chunks * ws.d_stride;
  float sum = 0.0f;
  if (column < d) {
    for (int chunk = group; chunk < n_chunks; chunk += kReduceLanes) sum += partial[chunk * ws.d_stride + column];
  }
  group_sums[group][slot] = sum;
  __syncthreads();
  if (group == 0 && column < d) {
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < kReduceLanes; ++g) total += group_sums[g][slot];
    y[static_cast<size_t>(t) * d + column] = total;
  }
}

// Checks shared by both launchers; false means cudaErrorInvalidValue.
inline bool valid_ffn_arguments(const void* x, int x_dtype, int tokens, int d, int D, int activation,
                                float act_threshold, const float* y, const void* workspace) {
  return x != nullptr && y != nullptr && workspace != nullptr && d > 0 && D > 0 && tokens > 0 &&
         tokens <= kMaxGridYZ && ceil_div(D, kRowsPerChunk) <= kMaxGridYZ && valid_dtype(x_dtype) &&
         activation >= EDGE_ACT_RELU && activation <= EDGE_ACT_SILU && act_threshold >= 0.0f;
}

// x as the gate-and-up kernel reads it: x itself when it is aligned fp32, else ws.x32 after the conversion kernel
// (queued here). Returns the conversion's launch status.
inline cudaError_t fp32_input(cudaStream_t stream, const void* x, int x_dtype, int tokens, int d, const Workspace& ws,
                              const float** x32, size_t* x_stride) {
  const bool in_place = x_dtype == EDGE_CUDA_F32 && aligned16(x) && d % 4 == 0;
  *x32 = in_place ? static_cast<const float*>(x) : ws.x32;
  *x_stride = in_place ? static_cast<size_t>(d) : ws.d_stride;
  if (in_place) return cudaSuccess;
  return dispatch_dtype(x_dtype, [&](auto tag) {
    using TX = decltype(tag);
    convert_kernel<TX><<<dim3(ceil_div(d, kConvertThreads), tokens), kConvertThreads, 0, stream>>>(
        static_cast<const TX*>(x), d, ws.d_stride, ws.x32);
    return cudaGetLastError();
  });
}

}  // namespace
}  // namespace edge

#endif
