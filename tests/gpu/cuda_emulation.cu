// Host emulation of the quantized CUDA kernels (plugins/kernels/sparse_ffn_q.cu, matvec_q.cu), for machines without a
// GPU: every block, warp, lane and thread of each kernel, in the launchers' grids, calling the same __host__
// __device__ functions the kernels call (quant_rows.cuh, sparse_ffn_pipeline.cuh) with the same indices, warp sums as
// the same butterfly, and block-level sums in the kernels' order. What a kernel does besides those calls (its index
// arithmetic from blockIdx / threadIdx, shared-memory staging and barriers) is written out again here, next to a
// comment naming the kernel line it mirrors; tests/gpu/test_cuda_emulation.py and the op table (tests/ops) check the
// results against the reference on the dequantized weights. Compiled by the tests with nvcc into a shared library.
//
// The matrix units' products of edge_matvec_q's integer GEMM (mma_step) are emulated from the fragments as the lanes
// hand them over, in the PTX ISA's layout; their int32 sums are exact, so the order does not matter.
// The compaction and reduction kernels are the float pipeline's, emulated from their definitions (the neurons with
// h != 0 in increasing order; per column, lane group g sums chunks g, g + 8, ..., then the groups in order).
// Asymmetric int4 rows (mins non-NULL) run the kernels' kAsymmetric instantiations, chosen as the launchers choose
// them (quant::dispatch_rows); int8 down rows under int4 gate and up rows (down_format) the int8 down kernel's.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_rows.cuh"
#include "sparse_ffn_pipeline.cuh"

namespace {

using edge::quant::QuantMatrix;
constexpr int kLanes = edge::quant::kWarpLanes;

// warp_sum (edge_cuda_common.cuh): v += shfl_xor(v, offset) for offset 16, 8, 4, 2, 1, on all lanes at once.
float warp_sum(float (&lanes)[kLanes]) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    float next[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) next[lane] = lanes[lane] + lanes[lane ^ offset];
    std::memcpy(lanes, next, sizeof(next));
  }
  return lanes[0];
}

// x [tokens, n] in the planes of the integer dot products, laid out as quantize_x_kernel writes them (XPlanesLayout):
// per block of 32 values the largest magnitude's bits (the lanes' butterfly max), each value's codes
// (quantize_x_value), the block's factor (x_factor) and code sum.
struct Planes {
  std::vector<char> buffer;
  edge::quant::XPlanesLayout layout;

  Planes(const float* x, int tokens, int n)
      : buffer(static_cast<size_t>(tokens) * edge::quant::XPlanesLayout::token_stride_for(n)),
        layout{buffer.data(), edge::quant::XPlanesLayout::token_stride_for(n),
               edge::quant::XPlanesLayout::plane_stride_for(n)} {
    for (int t = 0; t < tokens; ++t) {
      const float* xt = x + static_cast<size_t>(t) * n;
      for (int block = 0; block < n / kLanes; ++block) {
        uint32_t largest_bits = 0;
        for (int lane = 0; lane < kLanes; ++lane) {
          uint32_t bits;
          std::memcpy(&bits, xt + block * kLanes + lane, sizeof(bits));
          largest_bits = std::max(largest_bits, bits & 0x7fffffffu);
        }
        int32_t sum = 0;
        for (int lane = 0; lane < kLanes; ++lane) {
          const int j = block * kLanes + lane;
          edge::quant::quantize_x_value(xt[j], largest_bits, &layout.high(t)[j], &layout.low(t)[j]);
          sum += 256 * layout.high(t)[j] + layout.low(t)[j];
        }
        layout.factor(t)[block] = edge::quant::x_factor(largest_bits);
        layout.code_sum(t)[block] = sum;
      }
    }
  }
};

// QuantRows::row_dot (sparse_ffn_q.cu): lane_row_dot_planes on every lane, then the warp sum.
template <int kFormat, bool kAsymmetric>
float row_dot(const QuantMatrix& m, int row, const edge::quant::QuantX& x) {
  float lanes[kLanes];
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes[lane] = edge::quant::lane_row_dot_planes<kFormat, kAsymmetric>(m, row, x, lane);
  }
  return warp_sum(lanes);
}

// gate and up rows of format kFormat (with minimums: kAsymmetric), down rows of kDownFormat (kDownAsymmetric)
template <int kFormat, bool kAsymmetric, int kDownFormat, bool kDownAsymmetric>
void sparse_ffn_q(const float* x, int tokens, int d, int D, const QuantMatrix (&w)[3], const int32_t* mask,
                  const float* thresholds, int activation, float act_threshold, float* y, uint8_t* active_out) {
  using namespace edge;
  constexpr int kV = quant::Format<kDownFormat>::kPieceValues;
  constexpr int kTileColumns = kLanes * kV;
  const int n_chunks = ceil_div(D, kRowsPerChunk);
  for (int t = 0; t < tokens; ++t) {
    // quantize_x_kernel
    const Planes planes(x + static_cast<size_t>(t) * d, 1, d);
    const quant::QuantX xt = planes.layout.token(0);
    // gate_up_kernel: warp i of the grid computes neuron i, and its up row where the gate fires
    std::vector<float> neuron_hidden(D, 0.0f);
    for (int i = 0; i < D; ++i) {
      float a = 0.0f;
      if (mask == nullptr || mask[static_cast<size_t>(t) * D + i] != 0) {
        const float g = row_dot<kFormat, kAsymmetric>(w[0], i, xt);
        a = gated_activation(activation, g, act_threshold, thresholds != nullptr ? thresholds + i : nullptr);
        if (a != 0.0f) neuron_hidden[i] = hidden_value(activation, a, row_dot<kFormat, kAsymmetric>(w[1], i, xt));
      }
      if (active_out != nullptr) active_out[static_cast<size_t>(t) * D + i] = a != 0.0f;
    }
    // compact_kernel
    std::vector<int32_t> index;
    std::vector<float> hidden;
    for (int i = 0; i < D; ++i) {
      if (neuron_hidden[i] != 0.0f) {
        index.push_back(i);
        hidden.push_back(neuron_hidden[i]);
      }
    }
    const int count = static_cast<int>(index.size());
    // down_kernel_q: block (tile, chunk); warp w's rows (down_rows); lane l's piece of the tile (lane_down); then
    // each column's warp sums in warp order
    std::vector<float> partial(static_cast<size_t>(n_chunks) * d, 0.0f);
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
      const int first = chunk * kRowsPerChunk;
      if (first >= count) continue;
      const int end = first + kRowsPerChunk < count ? first + kRowsPerChunk : count;
      for (int tile_start = 0; tile_start < d; tile_start += kTileColumns) {
        std::vector<float> warp_sums(static_cast<size_t>(kDownWarps) * kTileColumns);
        for (int warp = 0; warp < kDownWarps; ++warp) {
          float h[kRowsPerDownWarp];
          int neuron[kRowsPerDownWarp];
          down_rows(first, end, warp, hidden.data(), index.data(), h, neuron);
          for (int lane = 0; lane < kLanes; ++lane) {
            float acc[kV] = {};
            const int column = tile_start + lane * kV;
            if (column < d) quant::lane_down<kDownFormat, kDownAsymmetric>(w[2], column, h, neuron, acc);
            for (int e = 0; e < kV; ++e) warp_sums[static_cast<size_t>(warp) * kTileColumns + lane * kV + e] = acc[e];
          }
        }
        for (int slot = 0; slot < kTileColumns; ++slot) {
          const int c = tile_start + slot;
          if (c >= d) continue;
          float total = 0.0f;
          for (int warp = 0; warp < kDownWarps; ++warp) {
            total += warp_sums[static_cast<size_t>(warp) * kTileColumns + slot];
          }
          partial[static_cast<size_t>(chunk) * d + c] = total;
        }
      }
    }
    // reduce_kernel
    const int used = ceil_div(count, kRowsPerChunk);
    for (int c = 0; c < d; ++c) {
      float total = 0.0f;
      for (int group = 0; group < kReduceLanes; ++group) {
        float sum = 0.0f;
        for (int chunk = group; chunk < used; chunk += kReduceLanes) sum += partial[static_cast<size_t>(chunk) * d + c];
        total += sum;
      }
      y[static_cast<size_t>(t) * d + c] = total;
    }
  }
}

// mma_step (matvec_q.cu), mma.sync.m16n8k32.row.col.s32.s8.s8.s32 with zero initial sums, over a warp's fragments in
// the PTX ISA's layout (quant_rows.cuh, "integer GEMM"): lane l, g = l / 4, q = l % 4, holds A[g][4q..] in a0,
// A[g+8][4q..] in a1, A[g][16+4q..] in a2, A[g+8][16+4q..] in a3, B[4q..][g] in b0, B[16+4q..][g] in b1, and gets
// C[g][2q], C[g][2q+1], C[g+8][2q], C[g+8][2q+1]. The int32 sums are exact, so the order does not matter.
void mma_step(const uint32_t (&a)[kLanes][4], const uint32_t (&b)[kLanes][2], int32_t (&sums)[kLanes][4]) {
  using edge::quant::kMmaK;
  using edge::quant::kMmaRows;
  using edge::quant::kMmaTokens;
  int32_t A[kMmaRows][kMmaK];
  int32_t B[kMmaK][kMmaTokens];
  const auto byte = [](uint32_t word, int i) { return static_cast<int32_t>(static_cast<int8_t>(word >> (8 * i))); };
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4;
    const int q = lane % 4;
    for (int i = 0; i < 4; ++i) {
      A[g][4 * q + i] = byte(a[lane][0], i);
      A[g + 8][4 * q + i] = byte(a[lane][1], i);
      A[g][16 + 4 * q + i] = byte(a[lane][2], i);
      A[g + 8][16 + 4 * q + i] = byte(a[lane][3], i);
      B[4 * q + i][g] = byte(b[lane][0], i);
      B[16 + 4 * q + i][g] = byte(b[lane][1], i);
    }
  }
  const auto product = [&](int row, int token) {
    int32_t sum = 0;
    for (int k = 0; k < kMmaK; ++k) sum += A[row][k] * B[k][token];
    return sum;
  };
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4;
    const int q = lane % 4;
    sums[lane][0] = product(g, 2 * q);
    sums[lane][1] = product(g, 2 * q + 1);
    sums[lane][2] = product(g + 8, 2 * q);
    sums[lane][3] = product(g + 8, 2 * q + 1);
  }
}

// warp_step (matvec_q.cu): the lanes' fragments of warp `warp`'s rows and tokens, their products, then each lane's
// accumulation.
template <int kFormat, bool kAsymmetric>
void warp_step(const edge::quant::IntGemmStage<kFormat>& stage, int step, int warp,
               float (&acc)[kLanes][edge::quant::kWarpTokenTiles][edge::quant::kLaneOutputs]) {
  using namespace edge;
  const int rows = quant::int_gemm_warp_rows(warp);
  const int tokens = quant::int_gemm_warp_tokens(warp);
  uint32_t a[kLanes][4];
  for (int lane = 0; lane < kLanes; ++lane) quant::int_gemm_lane_codes<kFormat>(stage, step, rows, lane, a[lane]);
  int32_t high[quant::kWarpTokenTiles][kLanes][quant::kLaneOutputs];
  int32_t low[quant::kWarpTokenTiles][kLanes][quant::kLaneOutputs];
  for (int n = 0; n < quant::kWarpTokenTiles; ++n) {
    uint32_t b[kLanes][2];
    for (int lane = 0; lane < kLanes; ++lane) {
      quant::int_gemm_lane_plane<kFormat>(stage, 0, step, tokens + quant::kMmaTokens * n, lane, b[lane]);
    }
    mma_step(a, b, high[n]);
    for (int lane = 0; lane < kLanes; ++lane) {
      quant::int_gemm_lane_plane<kFormat>(stage, 1, step, tokens + quant::kMmaTokens * n, lane, b[lane]);
    }
    mma_step(a, b, low[n]);
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    int32_t lane_high[quant::kWarpTokenTiles][quant::kLaneOutputs];
    int32_t lane_low[quant::kWarpTokenTiles][quant::kLaneOutputs];
    for (int n = 0; n < quant::kWarpTokenTiles; ++n) {
      std::memcpy(lane_high[n], high[n][lane], sizeof(lane_high[n]));
      std::memcpy(lane_low[n], low[n][lane], sizeof(lane_low[n]));
    }
    quant::int_gemm_lane_accumulate<kAsymmetric>(stage, step, rows, tokens, lane, lane_high, lane_low, acc[lane]);
  }
}

template <int kFormat, bool kAsymmetric>
void matvec_q(const float* x, int tokens, int out, const QuantMatrix& w, const float* bias, float* y) {
  using namespace edge;
  const int in = w.cols;
  // quantize_x_kernel
  const Planes planes(x, tokens, in);
  if (tokens <= quant::kGemvTokens) {
    // gemv_kernel: warp `row` of the grid
    for (int row = 0; row < out; ++row) {
      float lanes[quant::kGemvTokens][kLanes];
      for (int lane = 0; lane < kLanes; ++lane) {
        float acc[quant::kGemvTokens];
        if (tokens == 1) {
          acc[0] = quant::lane_row_dot_planes<kFormat, kAsymmetric>(w, row, planes.layout.token(0), lane);
        } else {
          quant::lane_row_dot_tokens_planes<kFormat, kAsymmetric>(w, row, planes.layout, tokens, lane, acc);
        }
        for (int t = 0; t < tokens; ++t) lanes[t][lane] = acc[t];
      }
      for (int t = 0; t < tokens; ++t) {
        const float sum = warp_sum(lanes[t]);
        y[static_cast<size_t>(t) * out + row] = bias != nullptr ? sum + bias[row] : sum;
      }
    }
    return;
  }
  // int_gemm_kernel: block (blockIdx.x, blockIdx.y), its threads staging each stage (the kernel loads a stage while
  // the warps multiply the one before; either way every thread has stored it before a warp reads it), its warps
  // multiplying and accumulating the stage's steps (warp_step)
  constexpr int kWarps = quant::kGemmThreads / kLanes;
  struct WarpAccumulators {
    float lanes[kLanes][quant::kWarpTokenTiles][quant::kLaneOutputs];
  };
  std::vector<WarpAccumulators> acc(kWarps);
  quant::IntGemmStage<kFormat> stage;
  for (int block_y = 0; block_y < ceil_div(tokens, quant::kTileTokens); ++block_y) {
    for (int block_x = 0; block_x < ceil_div(out, quant::kTileRows); ++block_x) {
      const int row0 = block_x * quant::kTileRows;
      const int token0 = block_y * quant::kTileTokens;
      std::fill(acc.begin(), acc.end(), WarpAccumulators{});
      for (int k0 = 0; k0 < in; k0 += quant::kStageColumns) {
        std::memset(&stage, 0x7F, sizeof(stage));  // an element no thread stages poisons the result
        for (int thread = 0; thread < quant::kGemmThreads; ++thread) {
          quant::IntGemmStaged<kFormat> staged;
          quant::int_gemm_load_stage<kFormat, kAsymmetric>(w, out, planes.layout, tokens, row0, token0, k0, thread,
                                                           staged);
          quant::int_gemm_store_stage(staged, thread, stage);
        }
        for (int step = 0; step < quant::stage_steps(in, k0); ++step) {
          for (int warp = 0; warp < kWarps; ++warp) warp_step<kFormat, kAsymmetric>(stage, step, warp, acc[warp].lanes);
        }
      }
      for (int warp = 0; warp < kWarps; ++warp) {
        for (int lane = 0; lane < kLanes; ++lane) {
          quant::int_gemm_lane_store(acc[warp].lanes[lane], row0 + quant::int_gemm_warp_rows(warp),
                                     token0 + quant::int_gemm_warp_tokens(warp), lane, out, tokens, bias, y);
        }
      }
    }
  }
}

// gemm_t_kernel (edge_matvec_q_t): as the GEMM above with outputs over W's columns and steps over its rows
template <int kFormat, bool kAsymmetric>
void matvec_q_t(const float* x, int tokens, int in, const QuantMatrix& w, const float* bias, float* y) {
  using namespace edge;
  const int out = w.cols;
  std::vector<float> acc(static_cast<size_t>(quant::kGemmThreads) * quant::kThreadTokens * quant::kThreadRows);
  quant::GemmTiles tiles;
  for (int block_y = 0; block_y < ceil_div(tokens, quant::kTileTokens); ++block_y) {
    for (int block_x = 0; block_x < ceil_div(out, quant::kTileRows); ++block_x) {
      const int col0 = block_x * quant::kTileRows;
      const int token0 = block_y * quant::kTileTokens;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int k0 = 0; k0 < in; k0 += quant::kTileK) {
        std::memset(&tiles, 0xFF, sizeof(tiles));
        for (int thread = 0; thread < quant::kGemmThreads; ++thread) {
          quant::gemm_stage_weights_t<kFormat, kAsymmetric>(w, in, col0, k0, thread, tiles);
          quant::gemm_stage_x(quant::DenseX<float>{x, in}, tokens, in, token0, k0, thread, tiles);
        }
        for (int thread = 0; thread < quant::kGemmThreads; ++thread) {
          auto& mine = *reinterpret_cast<float(*)[quant::kThreadTokens][quant::kThreadRows]>(
              acc.data() + static_cast<size_t>(thread) * quant::kThreadTokens * quant::kThreadRows);
          quant::gemm_accumulate(tiles, thread, mine);
        }
      }
      for (int thread = 0; thread < quant::kGemmThreads; ++thread) {
        const auto& mine = *reinterpret_cast<const float(*)[quant::kThreadTokens][quant::kThreadRows]>(
            acc.data() + static_cast<size_t>(thread) * quant::kThreadTokens * quant::kThreadRows);
        quant::gemm_store(mine, thread, token0, col0, tokens, out, bias, y);
      }
    }
  }
}

bool valid(int quant_format, int group_size, int cols, const uint16_t* mins) {
  return edge::quant::valid_format(quant_format) && edge::quant::valid_mins(quant_format, mins) &&
         edge::quant::valid_group_size(group_size) && cols > 0 && cols % group_size == 0;
}

}  // namespace

// edge_sparse_ffn_q on host memory, fp32 x [tokens, d], with the launcher's checks of the formats and minimums: the
// down rows in quant_format (the mins all NULL or all non-NULL) or int8 under int4 gate and up rows (down_mins NULL);
// returns 0, or 1 for invalid arguments.
extern "C" __attribute__((visibility("default"))) int edge_emulate_sparse_ffn_q(
    const float* x, int tokens, int d, int D, const void* w_gate, const uint16_t* gate_scales,
    const uint16_t* gate_mins, const void* w_up, const uint16_t* up_scales, const uint16_t* up_mins,
    const void* w_down_t, const uint16_t* down_scales, const uint16_t* down_mins, int quant_format, int down_format,
    int group_size, const int32_t* mask, const float* thresholds, int activation, float act_threshold, float* y,
    uint8_t* active_out) {
  const bool asymmetric = gate_mins != nullptr;
  const bool int8_down = down_format == EDGE_Q8 && quant_format == EDGE_Q4;
  const bool down_asymmetric = asymmetric && !int8_down;
  if (!valid(quant_format, group_size, d, gate_mins) || tokens <= 0 || D <= 0 || (up_mins != nullptr) != asymmetric ||
      (down_format != quant_format && !int8_down) || (down_mins != nullptr) != down_asymmetric) {
    return 1;
  }
  const QuantMatrix w[3] = {{static_cast<const uint8_t*>(w_gate), gate_scales, gate_mins, d, group_size, true},
                            {static_cast<const uint8_t*>(w_up), up_scales, up_mins, d, group_size, true},
                            {static_cast<const uint8_t*>(w_down_t), down_scales, down_mins, d, group_size, true}};
  // the launcher's choice of kernels (sparse_ffn_q.cu)
  edge::quant::dispatch_rows(quant_format, asymmetric, [&](auto kind) {
    using Kind = decltype(kind);
    auto run = [&](auto down) {
      using Down = decltype(down);
      sparse_ffn_q<Kind::kFormat, Kind::kAsymmetric, Down::kFormat, Down::kAsymmetric>(
          x, tokens, d, D, w, mask, thresholds, activation, act_threshold, y, active_out);
    };
    if constexpr (Kind::kFormat == EDGE_Q4) {
      if (int8_down) return run(edge::quant::RowsKind<EDGE_Q8, false>{});
    }
    return run(kind);
  });
  return 0;
}

// edge_matvec_q on host memory, fp32 x [tokens, in]; returns 0, or 1 for invalid arguments.
extern "C" __attribute__((visibility("default"))) int edge_emulate_matvec_q(const float* x, int tokens, int in, int out,
                                                                          const void* w, const uint16_t* scales,
                                                                          const uint16_t* mins, int quant_format,
                                                                          int group_size, const float* bias, float* y) {
  if (!valid(quant_format, group_size, in, mins) || tokens <= 0 || out <= 0) return 1;
  const QuantMatrix matrix{static_cast<const uint8_t*>(w), scales, mins, in, group_size, true};
  edge::quant::dispatch_rows(quant_format, mins != nullptr, [&](auto kind) {
    using Kind = decltype(kind);
    matvec_q<Kind::kFormat, Kind::kAsymmetric>(x, tokens, out, matrix, bias, y);
  });
  return 0;
}

// edge_matvec_q_t on host memory: W [in, out] quantized along its rows, fp32 x [tokens, in]; 0, or 1 for invalid
// arguments.
extern "C" __attribute__((visibility("default"))) int edge_emulate_matvec_q_t(const float* x, int tokens, int in,
                                                                            int out, const void* w,
                                                                            const uint16_t* scales,
                                                                            const uint16_t* mins, int quant_format,
                                                                            int group_size, const float* bias,
                                                                            float* y) {
  if (!valid(quant_format, group_size, out, mins) || tokens <= 0 || in <= 0) return 1;
  const QuantMatrix matrix{static_cast<const uint8_t*>(w), scales, mins, out, group_size, true};
  edge::quant::dispatch_rows(quant_format, mins != nullptr, [&](auto kind) {
    using Kind = decltype(kind);
    matvec_q_t<Kind::kFormat, Kind::kAsymmetric>(x, tokens, in, matrix, bias, y);
  });
  return 0;
}
