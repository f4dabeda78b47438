// Sequential SparseFFN for decode tokens (DESIGN 3.1): read only the weight rows of the neurons that fire.
//
// Decode is a GEMV, bound by memory bandwidth, so the pipeline is built around reading each needed weight row
// once, in 16-byte pieces, with the evict-first hint. Five kernels per call, every one over all tokens at once
// (blockIdx.y or .z = token), with no host synchronisation: sizes that depend on the data (how many neurons
// fire) live on the device, and the grids are sized for the worst case, their surplus blocks exiting at once.
//   0. x32 = x as fp32 (skipped when x is already aligned fp32);
//   1. gate: one warp per row i of the mask: a_i = act(w_gate_i . x), zero for rows outside the mask or failing
//      the thresholds; active_out written here;
//   2. compact: one block per token lists the i with a_i != 0 in increasing order (block-wide prefix sums);
//      this drops the predictor's false positives before any w_up / w_down_t byte is read;
//   3. up: one warp per listed neuron: h_k = a_i * act_up(w_up_i . x);
//   4. down: the listed rows in chunks of kRowsPerChunk; a block sums one chunk over one tile of columns
//      (each warp a fixed subset of the chunk's rows, then the warps in order), into partial[chunk];
//   5. reduce: y = sum over chunks of partial[chunk], in chunk order.
// Every sum has an order fixed by the data alone, so y is bit-identical from run to run; there are no float
// atomics. Rows with h == 0 (drelu's up, or u == 0) are not read in step 4: they would add exactly zero.
#include "edge_cuda_common.cuh"

namespace edge {
namespace {

constexpr int kRowWarps = 8;           // warps (= rows) per block of the gate and up kernels
constexpr int kCompactThreads = 1024;  // one block per token
constexpr int kCompactPerThread = 4;   // consecutive neurons per thread and tile
constexpr int kRowsPerChunk = 64;      // listed rows per block of the down kernel
constexpr int kDownWarps = 8;
constexpr int kReduceColumns = 32;  // reduce kernel: 32 columns x kReduceLanes chunk lanes per block
constexpr int kReduceLanes = 8;
constexpr int kConvertThreads = 256;
constexpr size_t kAlignment = 256;  // every workspace region starts on this boundary

// Where each buffer lives inside the caller's workspace, per token t at offset t * stride.
struct Workspace {
  float* x32;      // [tokens, d_stride] x as fp32
  float* act;      // [tokens, D_stride] a_i, 0 for inactive neurons
  int32_t* index;  // [tokens, D_stride] active neurons, increasing
  float* hidden;   // [tokens, D_stride] h of the listed neurons
  int32_t* count;  // [tokens] how many are listed
  float* partial;  // [tokens, n_chunks, d_stride] down-projection partial sums
  size_t d_stride, D_stride;
  int n_chunks;
};

struct WorkspaceSizes {
  size_t x32, act, index, hidden, count, partial;
  size_t total() const { return x32 + act + index + hidden + count + partial + kAlignment; }
};

WorkspaceSizes workspace_sizes(int d, int D, int tokens, size_t* d_stride, size_t* D_stride, int* n_chunks) {
  *d_stride = round_up(static_cast<size_t>(d), kAlignment / sizeof(float));
  *D_stride = round_up(static_cast<size_t>(D), kAlignment / sizeof(float));
  *n_chunks = ceil_div(D, kRowsPerChunk);
  const size_t n = static_cast<size_t>(tokens);
  WorkspaceSizes sizes;
  sizes.x32 = n * *d_stride * sizeof(float);
  sizes.act = n * *D_stride * sizeof(float);
  sizes.index = n * *D_stride * sizeof(int32_t);
  sizes.hidden = n * *D_stride * sizeof(float);
  sizes.count = round_up(n * sizeof(int32_t), kAlignment);
  sizes.partial = n * static_cast<size_t>(*n_chunks) * *d_stride * sizeof(float);
  return sizes;
}

Workspace layout_workspace(void* workspace, int d, int D, int tokens) {
  Workspace ws;
  const WorkspaceSizes sizes = workspace_sizes(d, D, tokens, &ws.d_stride, &ws.D_stride, &ws.n_chunks);
  char* base = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(workspace), kAlignment));
  ws.x32 = reinterpret_cast<float*>(base);
  base += sizes.x32;
  ws.act = reinterpret_cast<float*>(base);
  base += sizes.act;
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
__device__ __forceinline__ float gate_activation(int activation, float g, float threshold) {
  switch (activation) {
    case EDGE_ACT_FATRELU:
      return g > threshold ? g : 0.0f;
    case EDGE_ACT_SILU:
      return g / (1.0f + expf(-g));
    default:
      return g < 0.0f ? 0.0f : g;
  }
}

template <typename TX>
__global__ void __launch_bounds__(kConvertThreads)
    convert_kernel(const TX* __restrict__ x, int d, size_t d_stride, float* __restrict__ x32) {
  const int j = blockIdx.x * kConvertThreads + threadIdx.x;
  const int t = blockIdx.y;
  if (j < d) x32[t * d_stride + j] = to_float(x[static_cast<size_t>(t) * d + j]);
}

template <typename TW>
__global__ void __launch_bounds__(kRowWarps * kWarpSize)
    gate_kernel(const float* __restrict__ x32, size_t x_stride, int d, int D, const TW* __restrict__ w_gate,
                const int32_t* __restrict__ mask, const float* __restrict__ thresholds, int activation,
                float act_threshold, Workspace ws, uint8_t* __restrict__ active_out, bool vectorized) {
  const int i = blockIdx.x * kRowWarps + threadIdx.x / kWarpSize;
  const int t = blockIdx.y;
  if (i >= D) return;
  float a = 0.0f;
  if (mask == nullptr || mask[static_cast<size_t>(t) * D + i] != 0) {
    const float g = warp_row_dot(w_gate + static_cast<size_t>(i) * d, x32 + t * x_stride, d, vectorized);
    a = gate_activation(activation, g, act_threshold);
    if (thresholds != nullptr && !(fabsf(a) > thresholds[i])) a = 0.0f;
  }
  if (threadIdx.x % kWarpSize == 0) {
    ws.act[t * ws.D_stride + i] = a;
    if (active_out != nullptr) active_out[static_cast<size_t>(t) * D + i] = a != 0.0f;
  }
}

// One block per token: index = the i with act_i != 0, increasing; count = how many. Each pass covers
// kCompactThreads * kCompactPerThread neurons, thread k the kCompactPerThread consecutive ones from
// k * kCompactPerThread, and places them with a block-wide exclusive prefix sum of the per-thread counts.
__global__ void __launch_bounds__(kCompactThreads) compact_kernel(int D, Workspace ws) {
  constexpr int kWarps = kCompactThreads / kWarpSize;
  constexpr int kTile = kCompactThreads * kCompactPerThread;
  __shared__ int warp_offsets[kWarps];
  __shared__ int listed;  // neurons listed by the passes so far
  const int t = blockIdx.x;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const float* act = ws.act + t * ws.D_stride;
  int32_t* index = ws.index + t * ws.D_stride;
  if (threadIdx.x == 0) listed = 0;
  for (int base = 0; base < D; base += kTile) {
    const int first = base + threadIdx.x * kCompactPerThread;
    static_assert(kCompactPerThread == 4, "one float4 load per thread and pass");
    bool fires[kCompactPerThread] = {false, false, false, false};
    if (first + kCompactPerThread <= D) {
      const float4 v = *reinterpret_cast<const float4*>(act + first);  // rows start 256-byte aligned
      fires[0] = v.x != 0.0f;
      fires[1] = v.y != 0.0f;
      fires[2] = v.z != 0.0f;
      fires[3] = v.w != 0.0f;
    } else {
#pragma unroll
      for (int e = 0; e < kCompactPerThread; ++e) fires[e] = first + e < D && act[first + e] != 0.0f;
    }
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
      if (fires[e]) index[position++] = first + e;
    }
    __syncthreads();  // every thread has read `listed` and warp_offsets
    if (threadIdx.x == kCompactThreads - 1) listed = position;
    __syncthreads();
  }
  if (threadIdx.x == 0) ws.count[t] = listed;
}

template <typename TW>
__global__ void __launch_bounds__(kRowWarps * kWarpSize)
    up_kernel(const float* __restrict__ x32, size_t x_stride, int d, const TW* __restrict__ w_up, int activation,
              Workspace ws, bool vectorized) {
  const int k = blockIdx.x * kRowWarps + threadIdx.x / kWarpSize;
  const int t = blockIdx.y;
  if (k >= ws.count[t]) return;
  const int i = ws.index[t * ws.D_stride + k];
  float u = warp_row_dot(w_up + static_cast<size_t>(i) * d, x32 + t * x_stride, d, vectorized);
  if (activation == EDGE_ACT_DRELU) u = u < 0.0f ? 0.0f : u;
  if (threadIdx.x % kWarpSize == 0) ws.hidden[t * ws.D_stride + k] = ws.act[t * ws.D_stride + i] * u;
}

// partial[t, chunk, c] = sum over the chunk's listed rows k of h_k * w_down_t[index_k, c], for the columns c of
// this block's tile. Lane l owns kV columns: l * kV + e (vectorized, one 16-byte load per row) or l + 32 e.
// Warp w takes rows w, w + kDownWarps, ... of the chunk, all loads of a row group in flight at once; the
// warps' sums are then added in warp order.
template <typename TW>
__global__ void __launch_bounds__(kDownWarps * kWarpSize)
    down_kernel(int d, const TW* __restrict__ w_down_t, Workspace ws, bool vectorized) {
  constexpr int kV = Vec16<TW>::kElements;
  constexpr int kTileColumns = kWarpSize * kV;
  constexpr int kRowsPerWarp = kRowsPerChunk / kDownWarps;
  __shared__ float warp_sums[kDownWarps][kTileColumns];
  const int t = blockIdx.z;
  const int chunk = blockIdx.y;
  const int first = chunk * kRowsPerChunk;
  const int n_listed = ws.count[t];
  if (first >= n_listed) return;
  const int end = min(first + kRowsPerChunk, n_listed);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int tile_start = blockIdx.x * kTileColumns;
  const int32_t* index = ws.index + t * ws.D_stride;
  const float* hidden = ws.hidden + t * ws.D_stride;

  float acc[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) acc[e] = 0.0f;
  // this warp's rows of the chunk: h and the neuron (-1 when past the list or h == 0, so not read)
  float h[kRowsPerWarp];
  int neuron[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int k = first + warp + r * kDownWarps;
    h[r] = k < end ? hidden[k] : 0.0f;
    neuron[r] = h[r] != 0.0f ? index[k] : -1;
  }
  if (vectorized) {
    const int column = tile_start + lane * kV;
    if (column < d) {
      uint4 raw[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        raw[r] = make_uint4(0, 0, 0, 0);
        if (neuron[r] >= 0) {
          raw[r] = __ldcs(reinterpret_cast<const uint4*>(w_down_t + static_cast<size_t>(neuron[r]) * d + column));
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (neuron[r] < 0) continue;
        float w[kV];
        unpack_as<TW>(raw[r], w);
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[e] = fmaf(h[r], w[e], acc[e]);
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (neuron[r] < 0) continue;
      const TW* row = w_down_t + static_cast<size_t>(neuron[r]) * d;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int column = tile_start + lane + e * kWarpSize;
        if (column < d) acc[e] = fmaf(h[r], to_float(row[column]), acc[e]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) warp_sums[warp][vectorized ? lane * kV + e : lane + e * kWarpSize] = acc[e];
  __syncthreads();
  float* partial = ws.partial + (static_cast<size_t>(t) * ws.n_chunks + chunk) * ws.d_stride;
  for (int slot = threadIdx.x; slot < kTileColumns; slot += kDownWarps * kWarpSize) {
    const int column = tile_start + slot;
    if (column >= d) continue;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kDownWarps; ++w) total += warp_sums[w][slot];
    partial[column] = total;
  }
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

template <typename TW>
cudaError_t launch_ffn(cudaStream_t stream, const float* x32, size_t x_stride, int tokens, int d, int D,
                       const TW* w_gate, const TW* w_up, const TW* w_down_t, const int32_t* mask,
                       const float* thresholds, int activation, float act_threshold, float* y, const Workspace& ws,
                       uint8_t* active_out) {
  constexpr int kV = Vec16<TW>::kElements;
  const bool x_aligned = aligned16(x32) && x_stride % 4 == 0;
  auto vectorized = [&](const TW* w) { return x_aligned && aligned16(w) && d % kV == 0; };
  const dim3 rows(ceil_div(D, kRowWarps), tokens);
  gate_kernel<TW><<<rows, kRowWarps * kWarpSize, 0, stream>>>(x32, x_stride, d, D, w_gate, mask, thresholds,
                                                               activation, act_threshold, ws, active_out,
                                                               vectorized(w_gate));
  compact_kernel<<<tokens, kCompactThreads, 0, stream>>>(D, ws);
  up_kernel<TW><<<rows, kRowWarps * kWarpSize, 0, stream>>>(x32, x_stride, d, w_up, activation, ws,
                                                             vectorized(w_up));
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
  if (x == nullptr || w_gate == nullptr || w_up == nullptr || w_down_t == nullptr || y == nullptr ||
      workspace == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (d <= 0 || D <= 0 || tokens <= 0 || tokens > kMaxGridYZ || ceil_div(D, kRowsPerChunk) > kMaxGridYZ) {
    return cudaErrorInvalidValue;
  }
  if (!valid_dtype(x_dtype) || !valid_dtype(weight_dtype) || activation < EDGE_ACT_RELU ||
      activation > EDGE_ACT_SILU || !(act_threshold >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  const Workspace ws = layout_workspace(workspace, d, D, tokens);
  // fp32 x that is already aligned for float4 loads is read in place; anything else is converted first
  const bool x_in_place = x_dtype == EDGE_CUDA_F32 && aligned16(x) && d % 4 == 0;
  const float* x32 = x_in_place ? static_cast<const float*>(x) : ws.x32;
  const size_t x_stride = x_in_place ? static_cast<size_t>(d) : ws.d_stride;
  if (!x_in_place) {
    const cudaError_t status = dispatch_dtype(x_dtype, [&](auto tag) {
      using TX = decltype(tag);
      convert_kernel<TX><<<dim3(ceil_div(d, kConvertThreads), tokens), kConvertThreads, 0, stream>>>(
          static_cast<const TX*>(x), d, ws.d_stride, ws.x32);
      return cudaGetLastError();
    });
    if (status != cudaSuccess) return status;
  }
  return dispatch_dtype(weight_dtype, [&](auto tag) {
    using TW = decltype(tag);
    return launch_ffn<TW>(stream, x32, x_stride, tokens, d, D, static_cast<const TW*>(w_gate),
                          static_cast<const TW*>(w_up), static_cast<const TW*>(w_down_t), mask, thresholds,
                          activation, act_threshold, y, ws, active_out);
  });
}
