// The sequential SparseFFN pipeline shared by the float kernels (sparse_ffn.cu) and the quantized ones
// (sparse_ffn_q.cu): the workspace layout, x to fp32, the gate-and-up kernel, the down kernels' rows and the final
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
//   2. down (per format): a block sums the neurons of one chunk of kNeuronsPerChunk consecutive neurons over one
//      tile of columns: the chunk's neurons with h_i != 0, listed in increasing order by each warp (ballots), warp w
//      taking kRowsPerDownWarp consecutive entries (DownBlock), then the warps that have rows, in order, into
//      partial[chunk]; a neuron with h_i == 0 adds exactly zero and none of its w_down_t bytes is read;
//   3. reduce: y = sum over chunks of partial[chunk], in a fixed order.
// At 80-95% sparsity the latency of these dependent kernels, not bytes, is most of an FFN's time (benchmarks/README.md
// section 8.1): gate and up share a kernel since only the up row of a firing gate is read, and the down kernel reads
// h by neuron, so no kernel lists the firing neurons first (section 8.5).
#ifndef EDGE_SPARSE_FFN_PIPELINE_CUH
#define EDGE_SPARSE_FFN_PIPELINE_CUH

#include "edge_cuda_common.cuh"
#include "quant_rows.cuh"

namespace edge {
namespace {

constexpr int kRowWarps = 8;          // warps (= rows) per block of the gate-and-up kernel
constexpr int kNeuronsPerChunk = 64;  // consecutive neurons per block of the down kernel
constexpr int kDownWarps = 8;
constexpr int kRowsPerDownWarp = kNeuronsPerChunk / kDownWarps;
// reduce kernel: kReduceColumns columns x kReduceLanes chunk lanes per block; a lane sums every kReduceLanes-th
// chunk, so that the ceil(D / 64) chunks of a 7B FFN (172) take each thread 6 loads, all in flight at once
constexpr int kReduceColumns = 8;
constexpr int kReduceLanes = 32;
constexpr int kConvertThreads = 256;
constexpr size_t kAlignment = 256;  // every workspace region starts on this boundary

// Where each buffer lives inside the caller's workspace, per token t at offset t * stride.
struct Workspace {
  float* x32;            // [tokens, d_stride] x as fp32
  float* neuron_hidden;  // [tokens, D_stride] h_i by neuron, 0 for the neurons that do not fire
  float* partial;        // [tokens, n_chunks, d_stride] down-projection partial sums
  size_t d_stride, D_stride;
  int n_chunks;
};

struct WorkspaceSizes {
  size_t x32, neuron_hidden, partial;
  size_t total() const { return x32 + neuron_hidden + partial + kAlignment; }
};

inline WorkspaceSizes workspace_sizes(int d, int D, int tokens, size_t* d_stride, size_t* D_stride, int* n_chunks) {
  *d_stride = round_up(static_cast<size_t>(d), kAlignment / sizeof(float));
  *D_stride = round_up(static_cast<size_t>(D), kAlignment / sizeof(float));
  *n_chunks = ceil_div(D, kNeuronsPerChunk);
  const size_t n = static_cast<size_t>(tokens);
  WorkspaceSizes sizes;
  sizes.x32 = n * *d_stride * sizeof(float);
  sizes.neuron_hidden = n * *D_stride * sizeof(float);
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

// A block of a down kernel: token t = blockIdx.z, the chunk blockIdx.y of its neurons, the tile blockIdx.x of
// kTileColumns columns from tile_start; the calling thread's warp and lane; the chunk's neurons with h != 0, listed
// in increasing order (n_listed of them), of which warp w adds entries kRowsPerDownWarp * w, ... + kRowsPerDownWarp -
// 1: h of each and its neuron, or -1 past the list. A neuron with h == 0 adds exactly zero and is not read (a NaN h is
// listed and propagates). Consecutive entries per warp, so that at decode's sparsity one warp holds all of a chunk's
// rows, their loads in flight at once, and writes the chunk's sums without a barrier (store_down_partial).
struct DownBlock {
  int t, chunk, warp, lane, tile_start, n_listed;
  float h[kRowsPerDownWarp];
  int neuron[kRowsPerDownWarp];
};

// Warps of a down block whose entries start inside a list of n_listed.
EDGE_HD int down_warps_used(int n_listed) { return (n_listed + kRowsPerDownWarp - 1) / kRowsPerDownWarp; }

// The calling thread's DownBlock in a down kernel over D neurons. Each warp lists the chunk itself: lane l looks at
// neurons l and 32 + l of the chunk, a ballot per half gives the neurons with h != 0, and the owner of each of the
// warp's entries hands over its h.
template <int kTileColumns>
__device__ DownBlock down_block(const Workspace& ws, int D) {
  static_assert(kNeuronsPerChunk == 2 * kWarpSize, "a lane looks at two neurons of the chunk");
  DownBlock block;
  block.t = blockIdx.z;
  block.chunk = blockIdx.y;
  block.warp = threadIdx.x / kWarpSize;
  block.lane = threadIdx.x % kWarpSize;
  block.tile_start = blockIdx.x * kTileColumns;
  const int first = block.chunk * kNeuronsPerChunk;
  const float* neuron_hidden = ws.neuron_hidden + block.t * ws.D_stride;
  const unsigned lanes_below = (1u << block.lane) - 1u;
  float h_half[2];
  unsigned fires[2];
  int position[2];  // list entry of the lane's neuron in each half
  int listed = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int k = first + half * kWarpSize + block.lane;
    h_half[half] = k < D ? neuron_hidden[k] : 0.0f;
    fires[half] = __ballot_sync(kFullWarp, h_half[half] != 0.0f);
    position[half] = listed + __popc(fires[half] & lanes_below);
    listed += __popc(fires[half]);
  }
  block.n_listed = listed;
#pragma unroll
  for (int r = 0; r < kRowsPerDownWarp; ++r) {
    const int entry = block.warp * kRowsPerDownWarp + r;
    block.h[r] = 0.0f;
    block.neuron[r] = -1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const bool owns = (fires[half] >> block.lane & 1u) != 0 && position[half] == entry;
      const unsigned owner = __ballot_sync(kFullWarp, owns);  // the same on every lane
      if (owner != 0) {
        const int source = __ffs(owner) - 1;
        block.h[r] = __shfl_sync(kFullWarp, h_half[half], source);
        block.neuron[r] = first + half * kWarpSize + source;
      }
    }
  }
  return block;
}

// Shared memory of a down kernel for the warps' sums of a tile: one row per warp, a lane's kV consecutive slots padded
// by one, so that the lanes' stores of one value land in distinct banks.
template <int kTileColumns, int kV>
using DownWarpSums = float[kDownWarps][kTileColumns + kTileColumns / kV];

// The end of a down kernel, once the calling lane has summed its warp's rows for its tile slots slot_of(e), e < kV
// (column tile_start + slot), in acc: partial[t, chunk, column] = the used warps' sums (down_warps_used) added in warp
// order. With one warp used (or none), warp 0's sums are stored as they are and no barrier is needed.
template <int kTileColumns, int kV, typename SlotOf>
__device__ void store_down_partial(const float (&acc)[kV], SlotOf slot_of, DownWarpSums<kTileColumns, kV>& warp_sums,
                                   int d, const DownBlock& block, const Workspace& ws) {
  float* partial = ws.partial + (static_cast<size_t>(block.t) * ws.n_chunks + block.chunk) * ws.d_stride;
  const int used = down_warps_used(block.n_listed);  // the same for the whole block
  if (used <= 1) {
    if (block.warp != 0) return;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      const int column = block.tile_start + slot_of(e);
      if (column < d) partial[column] = acc[e];
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    const int slot = slot_of(e);
    warp_sums[block.warp][slot + slot / kV] = acc[e];
  }
  __syncthreads();
  for (int slot = threadIdx.x; slot < kTileColumns; slot += kDownWarps * kWarpSize) {
    const int column = block.tile_start + slot;
    if (column >= d) continue;
    float total = warp_sums[0][slot + slot / kV];
    for (int w = 1; w < used; ++w) total += warp_sums[w][slot + slot / kV];
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

// y[t, c] = sum over the chunks of partial[t, chunk, c]: lane group g of a column sums chunks g, g + kReduceLanes,
// ..., then the groups are added in order.
__global__ void __launch_bounds__(kReduceColumns * kReduceLanes) reduce_kernel(int d, Workspace ws, float* y) {
  __shared__ float group_sums[kReduceLanes][kReduceColumns];
  const int t = blockIdx.y;
  const int slot = threadIdx.x % kReduceColumns;
  const int group = threadIdx.x / kReduceColumns;
  const int column = blockIdx.x * kReduceColumns + slot;
  const float* partial = ws.partial + static_cast<size_t>(t) * ws.n_chunks * ws.d_stride;
  float sum = 0.0f;
  if (column < d) {
#pragma unroll 8
    for (int chunk = group; chunk < ws.n_chunks; chunk += kReduceLanes) sum += partial[chunk * ws.d_stride + column];
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
         tokens <= kMaxGridYZ && ceil_div(D, kNeuronsPerChunk) <= kMaxGridYZ && valid_dtype(x_dtype) &&
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
