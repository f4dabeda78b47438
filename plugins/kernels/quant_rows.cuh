// Quantized weight rows (kernels/cpu/QUANT.md) on the GPU: how a row's bytes become values, and the
// per-lane / per-thread arithmetic of the quantized kernels (sparse_ffn_q.cu, matvec_q.cu).
//
// Everything here is __host__ __device__: the kernels call these functions for their lanes and threads, and the
// host emulation of the kernels (tests/gpu/cuda_emulation.cu) calls the very same functions for every lane and
// thread of every block, in the kernels' order, so the indexing and the summation orders are checked on a machine
// without a GPU. A kernel keeps only what cannot run on the host: thread and block indices, warp shuffles, the
// matrix units (mma), shared memory and barriers.
//
// Layout of a quantized [rows, cols] matrix (cols a multiple of the group size G, G in {32, 64, 128}):
// - codes, row-major, row r at byte r * row_bytes: EDGE_Q8 one int8 per value (row_bytes = cols); EDGE_Q4 one signed
//   4-bit two's complement nibble per value (row_bytes = cols / 2), in llama.cpp's Q4_0 order inside each block of
//   32 values: byte k of a block holds value k in its low nibble and value 16 + k in its high nibble;
// - scales [rows, cols / G], IEEE fp16 bits; value j of row r = code * scale[r, j / G], exact in fp32;
// - asymmetric EDGE_Q4 (llama.cpp's Q4_1 grid) only: mins [rows, cols / G], IEEE fp16 bits laid out as the scales, and
//   value j of row r = (code + 8) * scale[r, j / G] + min[r, j / G], the product exact in fp32 and the sum rounded once
//   (edge_sdk/quant.py's dequantize). QuantMatrix::mins is nullptr for the symmetric formats.
// Rows are read in "pieces" of 16 bytes: 16 int8 values or one whole 32-value int4 block. A piece never straddles a
// group (G is a multiple of both), so it has one scale, and row_bytes is a multiple of 16, so piece p of every row
// starts at byte 16 p of the row: 16-byte aligned whenever the matrix is.
//
// The SparseFFN's gate and up rows are dotted with x quantized as the CPU kernels quantize it (kernels/cpu/QUANT.md,
// "Integer dot products"): per block of 32 values two int8 planes, high and low, with x ~ (high + low / 256) * scale,
// scale = max |x| / 127. A piece's codes times each plane are summed exactly in int32 (dp4a: four byte products and a
// sum per instruction) and combined exactly as 256 high + low; the combination, converted to fp32, is added to the
// lane's accumulator with one fused multiply-add by the factor scale / 256 * weight scale. Against fp32 x this reads a
// quarter of x's bytes per weight byte and spends a quarter of the instructions: fp32 x, 8 bytes per INT4 weight byte
// loaded in 16-byte runs 128 bytes apart, bound these kernels on the L1 load path (ncu on an H200: lg_throttle stalls,
// L1 88% busy, 12% of the memory's rate).
//
// Asymmetric int4 rows (kernels/cpu/QUANT.md, "Asymmetric INT4 rows"): a value is taken as code * scale + mid with
// mid = 8 * scale + min (fp32, one rounding: 8 * scale is exact), so the codes' integer products are the symmetric
// rows' own, and the minimums enter once per 32-value block. Dotted with x's planes (gate, up, edge_matvec_q's GEMV),
// a piece (one block b) adds fmaf(mid of its group, block_sum_b, acc) right after its integer dot, block_sum_b = x's
// code sum over the block (exact in int32) times the block's factor, one rounding: the sum of its x_hat values, already
// in the planes (XPlanesLayout::code_sum), so no workspace grows. A down row (y += h_i row_i) adds the symmetric
// (h_i * scale) * code per value, and a lane, whose piece lies in one group, sums fmaf(h_i, mid_i, c) over its rows
// once and adds c to each of its columns after the last row. edge_matvec_q's integer GEMM adds the mid times x's block
// sum per step as the GEMV does; edge_matvec_q_t's fp32 GEMM stages each value dequantized as the reference does,
// (code + 8) * scale + min (exact product, one rounding): the very values of edge_sdk/quant.py.
// The kernels take kAsymmetric as a template parameter: their symmetric instantiations hold no trace of the minimums
// and keep the symmetric arithmetic, in its order, to the bit.
#ifndef EDGE_QUANT_ROWS_CUH
#define EDGE_QUANT_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "edge_cuda_kernels.h"

#define EDGE_HD __host__ __device__ __forceinline__
// #pragma unroll inside EDGE_HD functions, for the device compilation only (host compilers warn about it)
#ifdef __CUDA_ARCH__
#define EDGE_UNROLL _Pragma("unroll")
#else
#define EDGE_UNROLL
#endif

namespace edge {
namespace quant {

constexpr int kWarpLanes = 32;
constexpr int kPieceBytes = 16;
constexpr int kLanePiecesInFlight = 4;  // pieces a lane loads before using them (latency hiding)

// What differs between the two formats: values per 16-byte piece, bytes per row, and how a piece unpacks.
template <int kFormat>
struct Format;

template <>
struct Format<EDGE_Q8> {
  static constexpr int kPieceValues = 16;
  EDGE_HD static size_t row_bytes(int cols) { return static_cast<size_t>(cols); }
  // values[e] = int8 byte e of the piece (little-endian words).
  EDGE_HD static void unpack(uint4 raw, float (&values)[kPieceValues]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
EDGE_UNROLL
    for (int q = 0; q < 4; ++q) {
EDGE_UNROLL
      for (int b = 0; b < 4; ++b) {
        const int byte = static_cast<int>((words[q] >> (8 * b)) & 0xFFu);
        values[4 * q + b] = static_cast<float>((byte ^ 0x80) - 0x80);  // sign-extend
      }
    }
  }
};

template <>
struct Format<EDGE_Q4> {
  static constexpr int kPieceValues = 32;
  EDGE_HD static size_t row_bytes(int cols) { return static_cast<size_t>(cols) / 2; }
  // values[k] = low nibble of byte k, values[16 + k] = its high nibble (Q4_0 order), each a signed 4-bit code.
  EDGE_HD static void unpack(uint4 raw, float (&values)[kPieceValues]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
EDGE_UNROLL
    for (int q = 0; q < 4; ++q) {
EDGE_UNROLL
      for (int b = 0; b < 4; ++b) {
        const int byte = static_cast<int>((words[q] >> (8 * b)) & 0xFFu);
        values[4 * q + b] = static_cast<float>(((byte & 0xF) ^ 0x8) - 0x8);
        values[16 + 4 * q + b] = static_cast<float>(((byte >> 4) ^ 0x8) - 0x8);
      }
    }
  }
};

EDGE_HD bool valid_format(int format) { return format == EDGE_Q8 || format == EDGE_Q4; }
// Group minimums (mins non-NULL) belong to asymmetric int4 alone.
EDGE_HD bool valid_mins(int format, const uint16_t* mins) { return mins == nullptr || format == EDGE_Q4; }
EDGE_HD bool valid_group_size(int group_size) { return group_size == 32 || group_size == 64 || group_size == 128; }

EDGE_HD size_t row_bytes(int format, int cols) {
  return format == EDGE_Q4 ? Format<EDGE_Q4>::row_bytes(cols) : Format<EDGE_Q8>::row_bytes(cols);
}

EDGE_HD float as_float(float v) { return v; }
EDGE_HD float as_float(__half v) { return __half2float(v); }
EDGE_HD float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// The 16-byte piece at `offset` bytes into a row. aligned16: the row is 16-byte aligned (one vector load);
// otherwise it is 4-byte aligned and read as four words. Weights are streamed once per token: evict-first loads.
EDGE_HD uint4 load_piece(const uint8_t* row, size_t offset, bool aligned16) {
#ifdef __CUDA_ARCH__
  if (aligned16) return __ldcs(reinterpret_cast<const uint4*>(row + offset));
  const unsigned int* words = reinterpret_cast<const unsigned int*>(row + offset);
  return make_uint4(__ldcs(words), __ldcs(words + 1), __ldcs(words + 2), __ldcs(words + 3));
#else
  (void)aligned16;
  uint4 raw;
  std::memcpy(&raw, row + offset, sizeof(raw));
  return raw;
#endif
}

// Value `index` of a row's fp16 scales (or minimums), as fp32 (exact).
EDGE_HD float load_scale(const uint16_t* scales, size_t index) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(__ldg(scales + index)));
#else
  return __half2float(__ushort_as_half(scales[index]));
#endif
}

template <typename T>
EDGE_HD float load_value(const T* p) {
#ifdef __CUDA_ARCH__
  return as_float(__ldg(p));
#else
  return as_float(*p);
#endif
}

// ------------------------------------------------------------------------ x in two int8 planes (integer dots)
constexpr int kXBlock = 32;                    // values per block of x's quantization
constexpr uint32_t kFiniteLimitBits = 0x7f800000u;  // |x| bits at or above this: infinity or NaN

// x of one token quantized for the integer dot products: value j's high and low codes at j (16-byte aligned), and
// per block of 32 values `factor` = scale / 256 (a low code's weight; NaN for a block holding a non-finite value)
// and `code_sum` = the sum of 256 high + low over the block.
struct QuantX {
  const int8_t* high;
  const int8_t* low;
  const float* factor;
  const int32_t* code_sum;
};

// Where the planes of several tokens live in a buffer: token t's row at base + t * token_stride bytes holds its high
// codes at 0, its low codes at plane_stride, the blocks' factors at 2 plane_stride and their code sums after those
// (plane_stride / 32 of each). plane_stride: a multiple of 64, at least the values per token.
struct XPlanesLayout {
  char* base;
  size_t token_stride;
  size_t plane_stride;

  EDGE_HD char* row(int t) const { return base + static_cast<size_t>(t) * token_stride; }
  EDGE_HD int8_t* high(int t) const { return reinterpret_cast<int8_t*>(row(t)); }
  EDGE_HD int8_t* low(int t) const { return reinterpret_cast<int8_t*>(row(t) + plane_stride); }
  EDGE_HD float* factor(int t) const { return reinterpret_cast<float*>(row(t) + 2 * plane_stride); }
  EDGE_HD int32_t* code_sum(int t) const {
    return reinterpret_cast<int32_t*>(factor(t) + plane_stride / kXBlock);
  }
  EDGE_HD QuantX token(int t) const { return {high(t), low(t), factor(t), code_sum(t)}; }
  // Bytes a row of `values` values needs, and a buffer for `tokens` of them.
  EDGE_HD static size_t plane_stride_for(int values) { return (static_cast<size_t>(values) + 63) / 64 * 64; }
  EDGE_HD static size_t token_stride_for(int values) {
    const size_t plane = plane_stride_for(values);
    return (2 * plane + 2 * sizeof(float) * (plane / kXBlock) + 255) / 256 * 256;
  }
};

// a * b and a - b rounded once each, never fused into a multiply-add (the quantization must give the CPU kernels'
// codes, kernels/cpu/sparse_ffn.c quantize_block).
EDGE_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
EDGE_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// A block's factor from the largest magnitude's bits among its values: max|x| / 127 / 256, NaN when one is not
// finite.
EDGE_HD float x_factor(uint32_t largest_bits) {
  float largest;
  std::memcpy(&largest, &largest_bits, sizeof(largest));
  const float scale = largest_bits < kFiniteLimitBits ? largest / 127.0f : NAN;
  return scale / 256.0f;
}

// The high and low codes of `value` in a block whose largest magnitude has the bits largest_bits: t = value * (127 /
// max|x|) (0 for an all-zero block), high = round(t), low = clamp(round(256 (t - high)), -127, 127), ties to even;
// zeros for a block holding a non-finite value.
EDGE_HD void quantize_x_value(float value, uint32_t largest_bits, int8_t* high, int8_t* low) {
  *high = 0;
  *low = 0;
  if (largest_bits >= kFiniteLimitBits) return;
  float largest;
  std::memcpy(&largest, &largest_bits, sizeof(largest));
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  const float scaled = mul_rn(value, inverse);
  const float rounded = rintf(scaled);
  float rest = rintf(mul_rn(sub_rn(scaled, rounded), 256.0f));  // |scaled - rounded| <= 0.5: exact
  rest = rest < -127.0f ? -127.0f : rest;
  rest = rest > 127.0f ? 127.0f : rest;
  *high = static_cast<int8_t>(static_cast<int>(rounded));
  *low = static_cast<int8_t>(static_cast<int>(rest));
}

// c + the sum of the four products of a's and b's bytes as signed int8 (dp4a).
EDGE_HD int dot4(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k) {
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * k))) * static_cast<int>(static_cast<int8_t>(b >> (8 * k)));
  }
  return c;
#endif
}

// The 16 plane bytes at `offset` (16-byte aligned) as four words.
EDGE_HD uint4 load_plane(const int8_t* plane, size_t offset) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const uint4*>(plane + offset));
#else
  uint4 raw;
  std::memcpy(&raw, plane + offset, sizeof(raw));
  return raw;
#endif
}

template <typename T>
EDGE_HD T load_scalar(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

// x_hat at column j, the value the integer dot products compute with: (256 high + low) * factor (exact integer, one
// rounding), which equals (high + low / 256) * scale as quantized_activations computes it.
EDGE_HD float x_hat(const QuantX& x, int j) {
  const int combined = 256 * static_cast<int>(load_scalar(x.high + j)) + static_cast<int>(load_scalar(x.low + j));
  return mul_rn(static_cast<float>(combined), load_scalar(x.factor + j / kXBlock));
}

// A piece's codes times x's two planes: 256 (codes . high) + (codes . low), exact in int32.
template <int kFormat>
struct PieceDot;

template <>
struct PieceDot<EDGE_Q8> {
  // the piece's 16 values are columns 16 p ..: the codes as loaded against 16 bytes of each plane
  EDGE_HD static int combined(uint4 raw, const QuantX& x, int piece) {
    const size_t offset = static_cast<size_t>(piece) * 16;
    const uint4 high = load_plane(x.high, offset);
    const uint4 low = load_plane(x.low, offset);
    int h = dot4(raw.x, high.x, 0);
    h = dot4(raw.y, high.y, h);
    h = dot4(raw.z, high.z, h);
    h = dot4(raw.w, high.w, h);
    int l = dot4(raw.x, low.x, 0);
    l = dot4(raw.y, low.y, l);
    l = dot4(raw.z, low.z, l);
    l = dot4(raw.w, low.w, l);
    return 256 * h + l;
  }
};

template <>
struct PieceDot<EDGE_Q4> {
  // the piece is block p: word k's low nibbles are columns 32 p + 4 k .., its high nibbles 32 p + 16 + 4 k .. (plane
  // words k and 4 + k). The nibbles are taken as code + 8 (sign bit flipped, 0..15), whose products exceed the codes'
  // by 8 times the block's code sum.
  EDGE_HD static int combined(uint4 raw, const QuantX& x, int piece) {
    const size_t offset = static_cast<size_t>(piece) * kXBlock;
    const uint4 high[2] = {load_plane(x.high, offset), load_plane(x.high, offset + 16)};
    const uint4 low[2] = {load_plane(x.low, offset), load_plane(x.low, offset + 16)};
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    const uint32_t high_words[8] = {high[0].x, high[0].y, high[0].z, high[0].w,
                                    high[1].x, high[1].y, high[1].z, high[1].w};
    const uint32_t low_words[8] = {low[0].x, low[0].y, low[0].z, low[0].w, low[1].x, low[1].y, low[1].z, low[1].w};
    int h = 0;
    int l = 0;
EDGE_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint32_t offset_codes = words[k] ^ 0x88888888u;
      const uint32_t low_nibbles = offset_codes & 0x0F0F0F0Fu;
      const uint32_t high_nibbles = (offset_codes >> 4) & 0x0F0F0F0Fu;
      h = dot4(low_nibbles, high_words[k], h);
      h = dot4(high_nibbles, high_words[4 + k], h);
      l = dot4(low_nibbles, low_words[k], l);
      l = dot4(high_nibbles, low_words[4 + k], l);
    }
    return 256 * h + l - 8 * load_scalar(x.code_sum + piece);
  }
};

// A quantized matrix as the kernels see it. codes: row-major, 4-byte aligned; mins: asymmetric int4's group minimums
// (laid out as the scales), nullptr for symmetric rows; aligned16: codes is 16-byte aligned.
struct QuantMatrix {
  const uint8_t* codes;
  const uint16_t* scales;
  const uint16_t* mins;
  int cols;
  int group_size;
  bool aligned16;

  EDGE_HD const uint8_t* row_codes(int row, int format) const {
    return codes + static_cast<size_t>(row) * quant::row_bytes(format, cols);
  }
  EDGE_HD const uint16_t* row_scales(int row) const {
    return scales + static_cast<size_t>(row) * static_cast<size_t>(cols / group_size);
  }
  EDGE_HD const uint16_t* row_mins(int row) const {
    return mins + static_cast<size_t>(row) * static_cast<size_t>(cols / group_size);
  }
};

// The kinds of rows a quantized kernel is compiled for: int8, int4, and int4 with group minimums (asymmetric).
template <int kFormatValue, bool kAsymmetricValue>
struct RowsKind {
  static constexpr int kFormat = kFormatValue;
  static constexpr bool kAsymmetric = kAsymmetricValue;
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
};

// Calls launch(RowsKind<...>{}) for `format` (checked by valid_format) and whether the rows have minimums (checked by
// valid_mins), and returns what it returns.
template <typename Launch>
auto dispatch_rows(int format, bool asymmetric, Launch&& launch) {
  if (format == EDGE_Q8) return launch(RowsKind<EDGE_Q8, false>{});
  if (asymmetric) return launch(RowsKind<EDGE_Q4, true>{});
  return launch(RowsKind<EDGE_Q4, false>{});
}

// An asymmetric group's mid: value = code * scale + mid with mid = 8 * scale + min, rounded once (8 * scale is exact,
// so the fused multiply-add is the reference's rounding of the sum).
EDGE_HD float group_mid(float scale, float min) { return fmaf(8.0f, scale, min); }

// The sum of x_hat over x's block `block`: its code sum (exact: |sum| < 32 * 32639 < 2^21, so exact in fp32 too)
// times the block's factor, one rounding.
EDGE_HD float x_block_sum(const QuantX& x, int block) {
  return mul_rn(static_cast<float>(load_scalar(x.code_sum + block)), load_scalar(x.factor + block));
}

// acc plus piece `piece`'s share of row . x_hat: its integer dot with x's planes, converted to fp32, times the factor
// (its x block's factor * its group's scale, in that order everywhere); for asymmetric rows (int4: the piece is x's
// block `piece`), then plus its group's mid times the block's x_hat sum.
template <int kFormat, bool kAsymmetric>
EDGE_HD float add_piece_dot(uint4 raw, const QuantX& x, const uint16_t* scales, const uint16_t* mins, int piece,
                            int pieces_per_group, float acc) {
  constexpr int kPiecesPerXBlock = kXBlock / Format<kFormat>::kPieceValues;
  const int group = piece / pieces_per_group;
  const float scale = load_scale(scales, group);
  const float factor = load_scalar(x.factor + piece / kPiecesPerXBlock) * scale;
  acc = fmaf(static_cast<float>(PieceDot<kFormat>::combined(raw, x, piece)), factor, acc);
  if (kAsymmetric) acc = fmaf(group_mid(scale, load_scale(mins, group)), x_block_sum(x, piece), acc);
  return acc;
}

// Lane `lane`'s share of row . x_hat, the row read by one warp (the SparseFFN's gate and up rows, edge_matvec_q for
// one token): the lane takes pieces lane, lane + 32, ..., loading kLanePiecesInFlight of them before using any; a
// piece adds its share (add_piece_dot) to one of kLanePiecesInFlight accumulators (the u-th piece of a round of loads
// to accumulator u, the pieces past the last whole round to accumulator 0), which are then added pairwise. The warp
// sums the lanes' shares with a butterfly (warp_sum).
template <int kFormat, bool kAsymmetric>
EDGE_HD float lane_row_dot_planes(const QuantMatrix& m, int row, const QuantX& x, int lane) {
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
  constexpr int kV = Format<kFormat>::kPieceValues;
  constexpr int kStride = kWarpLanes;
  const uint8_t* codes = m.row_codes(row, kFormat);
  const uint16_t* scales = m.row_scales(row);
  const uint16_t* mins = kAsymmetric ? m.row_mins(row) : nullptr;
  const int n_pieces = m.cols / kV;
  const int pieces_per_group = m.group_size / kV;
  float acc[kLanePiecesInFlight] = {0.0f, 0.0f, 0.0f, 0.0f};
  int p = lane;
  for (; p + (kLanePiecesInFlight - 1) * kStride < n_pieces; p += kLanePiecesInFlight * kStride) {
    uint4 raw[kLanePiecesInFlight];
EDGE_UNROLL
    for (int u = 0; u < kLanePiecesInFlight; ++u) {
      raw[u] = load_piece(codes, static_cast<size_t>(p + u * kStride) * kPieceBytes, m.aligned16);
    }
EDGE_UNROLL
    for (int u = 0; u < kLanePiecesInFlight; ++u) {
      acc[u] = add_piece_dot<kFormat, kAsymmetric>(raw[u], x, scales, mins, p + u * kStride, pieces_per_group, acc[u]);
    }
  }
  for (; p < n_pieces; p += kStride) {
    const uint4 raw = load_piece(codes, static_cast<size_t>(p) * kPieceBytes, m.aligned16);
    acc[0] = add_piece_dot<kFormat, kAsymmetric>(raw, x, scales, mins, p, pieces_per_group, acc[0]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The GEMV of edge_matvec_q for 2 to kGemvTokens tokens: one row per warp, lane l reading pieces l, l + 32, ..., every
// piece loaded once and its integer dot with each token's planes (x.token(t)) added to that token's share as in
// lane_row_dot_planes (asymmetric rows: then the group's mid times the token's block sum), in piece order.
constexpr int kGemvTokens = 4;

template <int kFormat, bool kAsymmetric>
EDGE_HD void lane_row_dot_tokens_planes(const QuantMatrix& m, int row, const XPlanesLayout& x, int tokens, int lane,
                                        float (&acc)[kGemvTokens]) {
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
  constexpr int kV = Format<kFormat>::kPieceValues;
  constexpr int kPiecesPerXBlock = kXBlock / kV;
  const uint8_t* codes = m.row_codes(row, kFormat);
  const uint16_t* scales = m.row_scales(row);
  const uint16_t* mins = kAsymmetric ? m.row_mins(row) : nullptr;
  const int n_pieces = m.cols / kV;
  const int pieces_per_group = m.group_size / kV;
EDGE_UNROLL
  for (int t = 0; t < kGemvTokens; ++t) acc[t] = 0.0f;
  for (int p = lane; p < n_pieces; p += kWarpLanes) {
    const uint4 raw = load_piece(codes, static_cast<size_t>(p) * kPieceBytes, m.aligned16);
    const float scale = load_scale(scales, p / pieces_per_group);
    const float mid = kAsymmetric ? group_mid(scale, load_scale(mins, p / pieces_per_group)) : 0.0f;
EDGE_UNROLL
    for (int t = 0; t < kGemvTokens; ++t) {
      if (t < tokens) {
        const QuantX xt = x.token(t);
        const float factor = load_scalar(xt.factor + p / kPiecesPerXBlock) * scale;
        acc[t] = fmaf(static_cast<float>(PieceDot<kFormat>::combined(raw, xt, p)), factor, acc[t]);
        if (kAsymmetric) acc[t] = fmaf(mid, x_block_sum(xt, p), acc[t]);
      }
    }
  }
}

// The down projection of the quantized SparseFFN, for one lane of one warp: the lane owns the kPieceValues columns
// from `column` (one piece of every row); acc[e] += (h_r * scale) * code for each of the warp's rows r that is read
// (neuron[r] >= 0), in r order. Asymmetric rows: the piece lies in one group, so the rows' mids go into one correction
// c = fmaf(h_r, mid_r, c), in r order, added to each acc[e] after the last row.
template <int kFormat, bool kAsymmetric, int kRows>
EDGE_HD void lane_down(const QuantMatrix& m, int column, const float (&h)[kRows], const int (&neuron)[kRows],
                       float (&acc)[Format<kFormat>::kPieceValues]) {
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
  constexpr int kV = Format<kFormat>::kPieceValues;
  const size_t piece_offset = static_cast<size_t>(column / kV) * kPieceBytes;
  uint4 raw[kRows];
EDGE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    raw[r] = make_uint4(0, 0, 0, 0);
    if (neuron[r] >= 0) raw[r] = load_piece(m.row_codes(neuron[r], kFormat), piece_offset, m.aligned16);
  }
  float correction = 0.0f;
EDGE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    if (neuron[r] < 0) continue;
    const float scale = load_scale(m.row_scales(neuron[r]), column / m.group_size);
    const float factor = h[r] * scale;
    float codes[kV];
    Format<kFormat>::unpack(raw[r], codes);
EDGE_UNROLL
    for (int e = 0; e < kV; ++e) acc[e] = fmaf(factor, codes[e], acc[e]);
    if (kAsymmetric) {
      correction = fmaf(h[r], group_mid(scale, load_scale(m.row_mins(neuron[r]), column / m.group_size)), correction);
    }
  }
  if (kAsymmetric) {
EDGE_UNROLL
    for (int e = 0; e < kV; ++e) acc[e] += correction;
  }
}

// ------------------------------------------------------------------------ tiled GEMMs (edge_matvec_q, _q_t)
// A block computes kTileRows outputs x kTileTokens tokens, stepping through the inputs kTileK at a time, each thread
// adding the steps to its kThreadTokens x kThreadRows outputs in increasing order of k. edge_matvec_q's outputs are
// weight rows (W [out, in], y = W x): its GEMM multiplies the codes with x's int8 planes on the matrix units (the
// integer GEMM below); edge_matvec_q_t's are weight columns (W [in, out], y = W^T x, x in fp32): its threads stage the
// step's x values and dequantized weights in shared memory (tiles.x[k][token], tiles.w[k][output]) and add them with
// fmaf (gemm_accumulate).
constexpr int kGemmThreads = 256;
constexpr int kTileRows = 64;
constexpr int kTileTokens = 32;
constexpr int kTileK = 32;  // one int4 block, two int8 pieces, one block of x's planes; within one group
constexpr int kThreadRows = 4;
constexpr int kThreadTokens = 2;
static_assert((kTileRows / kThreadRows) * (kTileTokens / kThreadTokens) == kGemmThreads, "one output block per thread");
static_assert(kTileK == kXBlock, "a step is one block of x's planes");

struct GemmTiles {
  float x[kTileK][kTileTokens];
  float w[kTileK][kTileRows];
};

// values[e] = the value at column `column` + e of row `row`, e < kPieceValues, for the piece starting at `column` (a
// multiple of kPieceValues): code * scale, exact in fp32, or for asymmetric rows (code + 8) * scale + min, the exact
// product rounded once with the minimum (fmaf), edge_sdk/quant.py's value to the bit; zeros when the piece is not
// `inside` the matrix.
template <int kFormat, bool kAsymmetric>
EDGE_HD void dequantize_piece(const QuantMatrix& m, int row, int column, bool inside,
                              float (&values)[Format<kFormat>::kPieceValues]) {
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
  constexpr int kV = Format<kFormat>::kPieceValues;
  float codes[kV];
  float scale = 0.0f;
  float min = 0.0f;
  if (inside) {
    const size_t offset = static_cast<size_t>(column / kV) * kPieceBytes;
    Format<kFormat>::unpack(load_piece(m.row_codes(row, kFormat), offset, m.aligned16), codes);
    scale = load_scale(m.row_scales(row), column / m.group_size);
    if (kAsymmetric) min = load_scale(m.row_mins(row), column / m.group_size);
  } else {
EDGE_UNROLL
    for (int e = 0; e < kV; ++e) codes[e] = 0.0f;
  }
EDGE_UNROLL
  for (int e = 0; e < kV; ++e) values[e] = kAsymmetric ? fmaf(codes[e] + 8.0f, scale, min) : codes[e] * scale;
}

// Transposed layout (edge_matvec_q_t): the step covers rows k0.. k0 + kTileK - 1 of a matrix [n_in, n_out] stored
// row-major and quantized along its rows (m.cols = n_out), and output columns col0.. col0 + kTileRows - 1, so
// tiles.w[k][n] = W[k0 + k, col0 + n]. Thread `thread` stages one piece: row thread / (kTileRows / kPieceValues), the
// piece's kPieceValues columns from col0 + kPieceValues * (thread % (kTileRows / kPieceValues)), dequantized, or zeros
// past the last row or column.
template <int kFormat, bool kAsymmetric>
EDGE_HD void gemm_stage_weights_t(const QuantMatrix& m, int n_in, int col0, int k0, int thread, GemmTiles& tiles) {
  constexpr int kV = Format<kFormat>::kPieceValues;
  constexpr int kPiecesPerRow = kTileRows / kV;
  if (thread >= kTileK * kPiecesPerRow) return;
  const int k = thread / kPiecesPerRow;
  const int first = (thread % kPiecesPerRow) * kV;  // the piece's first column within the tile
  const int row = k0 + k;
  const int column = col0 + first;
  float values[kV];
  // m.cols is a multiple of kV: a piece that starts inside the row ends inside it
  dequantize_piece<kFormat, kAsymmetric>(m, row, column, row < n_in && column < m.cols, values);
EDGE_UNROLL
  for (int e = 0; e < kV; ++e) tiles.w[k][first + e] = values[e];
}

// The x values edge_matvec_q_t's GEMM stages: x [tokens, cols] of TX.
template <typename TX>
struct DenseX {
  const TX* x;
  int cols;
  EDGE_HD float operator()(int t, int column) const { return load_value(x + static_cast<size_t>(t) * cols + column); }
};

// Thread `thread`'s part of staging x: the values idx = thread + kGemmThreads q, token idx / kTileK, column
// idx % kTileK of the step, zero past the last token or the last column.
template <typename XValues>
EDGE_HD void gemm_stage_x(const XValues& x, int tokens, int cols, int token0, int k0, int thread,
                          GemmTiles& tiles) {
  constexpr int kPerThread = kTileTokens * kTileK / kGemmThreads;
EDGE_UNROLL
  for (int q = 0; q < kPerThread; ++q) {
    const int idx = thread + kGemmThreads * q;
    const int token = idx / kTileK;
    const int k = idx % kTileK;
    const int t = token0 + token;
    const bool inside = t < tokens && k0 + k < cols;
    tiles.x[k][token] = inside ? x(t, k0 + k) : 0.0f;
  }
}

// Thread `thread` owns tokens token0 + kThreadTokens * (thread / 16) + i and rows
// row0 + kThreadRows * (thread % 16) + j.
EDGE_HD int gemm_thread_token(int thread) { return kThreadTokens * (thread / (kTileRows / kThreadRows)); }
EDGE_HD int gemm_thread_row(int thread) { return kThreadRows * (thread % (kTileRows / kThreadRows)); }

EDGE_HD void gemm_accumulate(const GemmTiles& tiles, int thread, float (&acc)[kThreadTokens][kThreadRows]) {
  const int token = gemm_thread_token(thread);
  const int row = gemm_thread_row(thread);
EDGE_UNROLL
  for (int k = 0; k < kTileK; ++k) {
EDGE_UNROLL
    for (int i = 0; i < kThreadTokens; ++i) {
EDGE_UNROLL
      for (int j = 0; j < kThreadRows; ++j) acc[i][j] = fmaf(tiles.x[k][token + i], tiles.w[k][row + j], acc[i][j]);
    }
  }
}

// y[t, row] = acc (+ bias[row]) for the thread's outputs inside the matrix.
EDGE_HD void gemm_store(const float (&acc)[kThreadTokens][kThreadRows], int thread, int token0, int row0, int tokens,
                        int n_rows, const float* bias, float* y) {
EDGE_UNROLL
  for (int i = 0; i < kThreadTokens; ++i) {
    const int t = token0 + gemm_thread_token(thread) + i;
EDGE_UNROLL
    for (int j = 0; j < kThreadRows; ++j) {
      const int row = row0 + gemm_thread_row(thread) + j;
      if (t < tokens && row < n_rows) {
        y[static_cast<size_t>(t) * n_rows + row] = bias != nullptr ? acc[i][j] + bias[row] : acc[i][j];
      }
    }
  }
}

// ------------------------------------------------------------------------ integer GEMM (edge_matvec_q, a prompt)
// A block computes kTileRows rows x kTileTokens tokens in steps of kTileK = 32 columns (one block of x's planes,
// within one group). The block stages kStageSteps steps at a time in shared memory: the rows' codes as stored (int4
// packed), x's two planes, and per step the rows' group scales (and mids) and the tokens' block factors (and x_hat
// sums), converted to fp32; each thread loads the next stage from global memory into registers while the warps work
// on the current one (two stage buffers, one barrier per stage). Warp w takes rows (w % 4) * 16.. and tokens
// (w / 4) * 16..: per step it multiplies its rows' codes with the high and with the low plane of each group of 8
// tokens on the matrix units (mma m16n8k32, int8 operands, int32 sums: exact), and each lane adds, for each of the
// 8 outputs its product fragments hold, 256 high + low converted to fp32 times the factor (the x block's factor * the
// group's scale, in that order, as add_piece_dot) with one fmaf, and for asymmetric rows the group's mid times the
// block's x_hat sum with a second. So y is the reference's on x_hat, as the GEMV's, with one rounding per step and
// output, each output's steps added in column order (bit-identical run to run).
// The fragments follow the PTX ISA's layout for mma.m16n8k32 with .s8 operands: lane l, g = l / 4, q = l % 4,
// holds A (16 rows x 32 columns, row-major) as a0 = A[g][4q..4q+3], a1 = A[g+8][4q..], a2 = A[g][16+4q..],
// a3 = A[g+8][16+4q..] (four int8 per register, the lowest byte first), B (32 columns x 8 tokens) as
// b0 = B[4q..4q+3][g], b1 = B[16+4q..][g], and the sums C (16 x 8) as c0 = C[g][2q], c1 = C[g][2q+1],
// c2 = C[g+8][2q], c3 = C[g+8][2q+1]. A column of the step may stand in any k slot as long as the codes and the
// planes put it in the same one (the integer sum is the same): int4 rows keep the natural order (byte 4q.. of a block
// holds columns 4q.. and 16+4q..: a0 and a2 come from one word), int8 rows put columns 8q..8q+7 in slots 4q.. and
// 16+4q.. (one 8-byte load for a0 and a2, the same for b0 and b1).
constexpr int kStageSteps = 4;
constexpr int kStageColumns = kStageSteps * kTileK;
constexpr int kMmaRows = 16;     // mma.m16n8k32: rows, tokens and columns of one product
constexpr int kMmaTokens = 8;
constexpr int kMmaK = 32;
constexpr int kWarpRows = kMmaRows;  // a warp's outputs: 16 rows x 16 tokens, two products per plane and step
constexpr int kWarpTokenTiles = 2;
constexpr int kWarpTokens = kWarpTokenTiles * kMmaTokens;
constexpr int kLaneOutputs = 4;  // outputs of one product fragment per lane
static_assert(kMmaK == kTileK, "a step is one product");
static_assert((kTileRows / kWarpRows) * (kTileTokens / kWarpTokens) * kWarpLanes == kGemmThreads, "one piece per warp");
static_assert(kStageSteps * kTileRows == kGemmThreads, "one row's scale of one step per thread");

// Byte counts of a stage. A row's codes and a token's plane are padded by one step's bytes, so that the lanes of a
// fragment load (8 rows or tokens apart by the padded stride) fall in distinct shared-memory banks.
template <int kFormat>
struct IntGemmShape {
  static constexpr int kStepBytes = kFormat == EDGE_Q4 ? kTileK / 2 : kTileK;  // one row's codes of one step
  static constexpr int kCodeStride = (kStageSteps + 1) * kStepBytes;
  static constexpr int kPlaneStride = kStageColumns + kStepBytes;
  static constexpr int kRowPieces = kStageSteps * kStepBytes / kPieceBytes;  // 16-byte pieces of a row per stage
  static constexpr int kTokenPieces = kStageColumns / kPieceBytes;           // of a token's plane per stage
  static constexpr int kCodePieces = kTileRows * kRowPieces / kGemmThreads;  // per thread
  static constexpr int kPlanePieces = 2 * kTileTokens * kTokenPieces / kGemmThreads;
  static_assert(kCodePieces * kGemmThreads == kTileRows * kRowPieces, "the codes split evenly");
  static_assert(kPlanePieces * kGemmThreads == 2 * kTileTokens * kTokenPieces, "the planes split evenly");
};

template <int kFormat>
struct IntGemmStage {
  using Shape = IntGemmShape<kFormat>;
  alignas(16) int8_t codes[kTileRows][Shape::kCodeStride];          // row r: its stage's bytes as stored
  alignas(16) int8_t planes[2][kTileTokens][Shape::kPlaneStride];   // high, low: token t's stage columns
  float scale[kStageSteps][kTileRows];
  float mid[kStageSteps][kTileRows];             // asymmetric rows: the group's 8 * scale + min
  float x_factor[kStageSteps][kTileTokens];
  float block_sum[kStageSteps][kTileTokens];     // asymmetric rows: the block's x_hat sum
};

// What one thread carries from global memory into a stage buffer.
template <int kFormat>
struct IntGemmStaged {
  uint4 codes[IntGemmShape<kFormat>::kCodePieces];
  uint4 planes[IntGemmShape<kFormat>::kPlanePieces];
  float scale;
  float mid;
  float x_factor;
  float block_sum;
};

// The steps of the stage starting at column k0 (cols a multiple of kTileK).
EDGE_HD int stage_steps(int cols, int k0) {
  const int left = (cols - k0) / kTileK;
  return left < kStageSteps ? left : kStageSteps;
}

// Thread `thread`'s share of the stage at k0, from global memory: code pieces p = thread + kGemmThreads i (row
// p / kRowPieces, piece p % kRowPieces of the row's stage), plane pieces p (token p / (2 kTokenPieces), plane
// (p / kTokenPieces) % 2, piece p % kTokenPieces), the scale (and mid) of row thread % kTileRows at step
// thread / kTileRows, and for threads below kStageSteps * kTileTokens the factor (and x_hat sum) of token
// thread % kTileTokens at step thread / kTileTokens; zeros past the last row, token or step.
template <int kFormat, bool kAsymmetric>
EDGE_HD void int_gemm_load_stage(const QuantMatrix& m, int n_rows, const XPlanesLayout& x, int tokens, int row0,
                                 int token0, int k0, int thread, IntGemmStaged<kFormat>& staged) {
  static_assert(!kAsymmetric || kFormat == EDGE_Q4, "only int4 has group minimums");
  using Shape = IntGemmShape<kFormat>;
  constexpr int kV = Format<kFormat>::kPieceValues;
  const int steps = stage_steps(m.cols, k0);
EDGE_UNROLL
  for (int i = 0; i < Shape::kCodePieces; ++i) {
    const int p = thread + kGemmThreads * i;
    const int row = row0 + p / Shape::kRowPieces;
    const int piece = p % Shape::kRowPieces;
    staged.codes[i] = make_uint4(0, 0, 0, 0);
    if (row < n_rows && piece * kV < steps * kTileK) {
      const size_t offset = static_cast<size_t>(k0 / kV + piece) * kPieceBytes;
      staged.codes[i] = load_piece(m.row_codes(row, kFormat), offset, m.aligned16);
    }
  }
EDGE_UNROLL
  for (int i = 0; i < Shape::kPlanePieces; ++i) {
    const int p = thread + kGemmThreads * i;
    const int t = token0 + p / (2 * Shape::kTokenPieces);
    const int plane = (p / Shape::kTokenPieces) % 2;
    const int piece = p % Shape::kTokenPieces;
    staged.planes[i] = make_uint4(0, 0, 0, 0);
    if (t < tokens && piece * kPieceBytes < steps * kTileK) {
      staged.planes[i] = load_plane(plane == 0 ? x.high(t) : x.low(t), static_cast<size_t>(k0 + piece * kPieceBytes));
    }
  }
  {
    const int row = row0 + thread % kTileRows;
    const int step = thread / kTileRows;
    const bool inside = row < n_rows && step < steps;
    const int group = (k0 + step * kTileK) / m.group_size;
    staged.scale = inside ? load_scale(m.row_scales(row), group) : 0.0f;
    staged.mid = kAsymmetric && inside ? group_mid(staged.scale, load_scale(m.row_mins(row), group)) : 0.0f;
  }
  staged.x_factor = 0.0f;
  staged.block_sum = 0.0f;
  if (thread < kStageSteps * kTileTokens) {
    const int t = token0 + thread % kTileTokens;
    const int step = thread / kTileTokens;
    if (t < tokens && step < steps) {
      const QuantX xt = x.token(t);
      const int block = (k0 + step * kTileK) / kXBlock;
      staged.x_factor = load_scalar(xt.factor + block);
      if (kAsymmetric) staged.block_sum = x_block_sum(xt, block);
    }
  }
}

// 16 bytes to shared memory, `to` 16-byte aligned: one vector store on the GPU.
EDGE_HD void store16(int8_t* to, uint4 bytes) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint4*>(to) = bytes;
#else
  std::memcpy(to, &bytes, sizeof(bytes));
#endif
}

// Thread `thread`'s share loaded by int_gemm_load_stage, into a stage buffer (the same indices).
template <int kFormat>
EDGE_HD void int_gemm_store_stage(const IntGemmStaged<kFormat>& staged, int thread, IntGemmStage<kFormat>& stage) {
  using Shape = IntGemmShape<kFormat>;
EDGE_UNROLL
  for (int i = 0; i < Shape::kCodePieces; ++i) {
    const int p = thread + kGemmThreads * i;
    store16(&stage.codes[p / Shape::kRowPieces][(p % Shape::kRowPieces) * kPieceBytes], staged.codes[i]);
  }
EDGE_UNROLL
  for (int i = 0; i < Shape::kPlanePieces; ++i) {
    const int p = thread + kGemmThreads * i;
    const int token = p / (2 * Shape::kTokenPieces);
    const int plane = (p / Shape::kTokenPieces) % 2;
    store16(&stage.planes[plane][token][(p % Shape::kTokenPieces) * kPieceBytes], staged.planes[i]);
  }
  stage.scale[thread / kTileRows][thread % kTileRows] = staged.scale;
  stage.mid[thread / kTileRows][thread % kTileRows] = staged.mid;
  if (thread < kStageSteps * kTileTokens) {
    stage.x_factor[thread / kTileTokens][thread % kTileTokens] = staged.x_factor;
    stage.block_sum[thread / kTileTokens][thread % kTileTokens] = staged.block_sum;
  }
}

// The 4 (8) bytes at `from` in shared memory, 4- (8-) byte aligned, as one load on the GPU.
EDGE_HD uint32_t load_u32(const int8_t* from) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(from);
#else
  uint32_t word;
  std::memcpy(&word, from, sizeof(word));
  return word;
#endif
}
EDGE_HD uint2 load_u64(const int8_t* from) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint2*>(from);
#else
  uint2 words;
  std::memcpy(&words, from, sizeof(words));
  return words;
#endif
}

// Four 4-bit two's complement codes, one in the low nibble of each byte (the high nibbles zero), as four int8: per
// byte (n ^ 8) + 0x78 stays below 0x100 (no carry into the next byte) and ^ 0x80 makes it n ^ 8 - 8.
EDGE_HD uint32_t nibbles_as_int8(uint32_t nibbles) { return ((nibbles ^ 0x08080808u) + 0x78787878u) ^ 0x80808080u; }

// The warp's rows and tokens within the block's tile.
EDGE_HD int int_gemm_warp_rows(int warp) { return (warp % (kTileRows / kWarpRows)) * kWarpRows; }
EDGE_HD int int_gemm_warp_tokens(int warp) { return (warp / (kTileRows / kWarpRows)) * kWarpTokens; }

// Lane `lane`'s A fragment of step `step`: the codes of the stage's rows rows.. rows + 15.
template <int kFormat>
EDGE_HD void int_gemm_lane_codes(const IntGemmStage<kFormat>& stage, int step, int rows, int lane, uint32_t (&a)[4]) {
  constexpr int kStepBytes = IntGemmShape<kFormat>::kStepBytes;
  const int g = lane / 4;
  const int q = lane % 4;
EDGE_UNROLL
  for (int half = 0; half < 2; ++half) {  // rows g (a0, a2) and g + 8 (a1, a3)
    const int8_t* row = &stage.codes[rows + g + 8 * half][step * kStepBytes];
    if (kFormat == EDGE_Q4) {
      const uint32_t word = load_u32(row + 4 * q);  // columns 4q.. (low nibbles) and 16 + 4q.. (high nibbles)
      a[half] = nibbles_as_int8(word & 0x0F0F0F0Fu);
      a[2 + half] = nibbles_as_int8((word >> 4) & 0x0F0F0F0Fu);
    } else {
      const uint2 words = load_u64(row + 8 * q);  // columns 8q.. in slots 4q.. and 16 + 4q..
      a[half] = words.x;
      a[2 + half] = words.y;
    }
  }
}

// Lane `lane`'s B fragment of step `step`: plane `plane` of the stage's tokens tokens.. tokens + 7, its columns in
// the k slots of int_gemm_lane_codes.
template <int kFormat>
EDGE_HD void int_gemm_lane_plane(const IntGemmStage<kFormat>& stage, int plane, int step, int tokens, int lane,
                                 uint32_t (&b)[2]) {
  const int8_t* token = &stage.planes[plane][tokens + lane / 4][step * kTileK];
  const int q = lane % 4;
  if (kFormat == EDGE_Q4) {
    b[0] = load_u32(token + 4 * q);
    b[1] = load_u32(token + 16 + 4 * q);
  } else {
    const uint2 words = load_u64(token + 8 * q);
    b[0] = words.x;
    b[1] = words.y;
  }
}

// Output e of lane `lane`'s fragment of a product: row rows + g + 8 (e / 2), token tokens + 2 q + e % 2.
EDGE_HD int int_gemm_lane_row(int lane, int e) { return lane / 4 + 8 * (e / 2); }
EDGE_HD int int_gemm_lane_token(int lane, int e) { return 2 * (lane % 4) + e % 2; }

// Adds step `step` to lane `lane`'s outputs, high[n] and low[n] the products of its token tile n (tokens
// tokens + 8 n ..): fmaf(256 high + low, factor of x's block * scale of the row's group, acc), then for asymmetric
// rows fmaf(mid of the row's group, x_hat sum of the token's block, acc).
template <bool kAsymmetric, int kFormat>
EDGE_HD void int_gemm_lane_accumulate(const IntGemmStage<kFormat>& stage, int step, int rows, int tokens, int lane,
                                      const int32_t (&high)[kWarpTokenTiles][kLaneOutputs],
                                      const int32_t (&low)[kWarpTokenTiles][kLaneOutputs],
                                      float (&acc)[kWarpTokenTiles][kLaneOutputs]) {
EDGE_UNROLL
  for (int n = 0; n < kWarpTokenTiles; ++n) {
EDGE_UNROLL
    for (int e = 0; e < kLaneOutputs; ++e) {
      const int row = rows + int_gemm_lane_row(lane, e);
      const int token = tokens + kMmaTokens * n + int_gemm_lane_token(lane, e);
      const float factor = stage.x_factor[step][token] * stage.scale[step][row];
      acc[n][e] = fmaf(static_cast<float>(256 * high[n][e] + low[n][e]), factor, acc[n][e]);
      if (kAsymmetric) acc[n][e] = fmaf(stage.mid[step][row], stage.block_sum[step][token], acc[n][e]);
    }
  }
}

// y[t, row] = acc (+ bias[row]) for lane `lane`'s outputs inside the matrix; rows and tokens: the warp's first
// within the whole matrix.
EDGE_HD void int_gemm_lane_store(const float (&acc)[kWarpTokenTiles][kLaneOutputs], int rows, int tokens, int lane,
                                 int n_rows, int n_tokens, const float* bias, float* y) {
EDGE_UNROLL
  for (int n = 0; n < kWarpTokenTiles; ++n) {
EDGE_UNROLL
    for (int e = 0; e < kLaneOutputs; ++e) {
      const int row = rows + int_gemm_lane_row(lane, e);
      const int t = tokens + kMmaTokens * n + int_gemm_lane_token(lane, e);
      if (t < n_tokens && row < n_rows) {
        y[static_cast<size_t>(t) * n_rows + row] = bias != nullptr ? acc[n][e] + bias[row] : acc[n][e];
      }
    }
  }
}

}  // namespace quant
}  // namespace edge

#endif
