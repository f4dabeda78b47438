// QuantizedMatMul: y = x W^T for a group-wise quantized W [N, K] (transposed = 1: a projection, the LM head, a prompt's
// gate and up; edge_matvec_q), or y = x W for W [K, N] (transposed = 0: a prompt's neuron-major down projection;
// edge_matvec_q_t). Inputs: x [T, K] (fp32/fp16/bf16), W's codes as INT32 words [rows, cols / v] (v = 4 for int8, 8
// for int4), the bundle's bytes, and its scales [rows, cols / G] fp16; groups run along W's rows; with weight_format
// int4_asymmetric also its group minimums [rows, cols / G] fp16. Output: y [T, N] fp32. Attributes: weight_format,
// group_size, transposed (default 1). A bias is the graph's own Add.
#include <cstdint>
#include <string>
#include <vector>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kCodes, kScales, kMins };
constexpr char kTransposedField[] = "transposed";

class QuantizedMatMulPlugin : public PluginBase<QuantizedMatMulPlugin> {
 public:
  static constexpr char const* kName = kQuantizedMatMulName;
  static constexpr PluginSignature kSignature{3, "x, w, w_scales", nullptr, "y", nvinfer1::DataType::kFLOAT};
  static constexpr PluginSignature kAsymmetricSignature{4, "x, w, w_scales, w_mins", nullptr, "y",
                                                        nvinfer1::DataType::kFLOAT};

  static std::vector<nvinfer1::PluginField> fieldNames() {
    std::vector<nvinfer1::PluginField> fields;
    QuantLayout::addFieldNames(fields);
    fields.emplace_back(kTransposedField, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
    return fields;
  }

  // Validates the attributes; throws PluginError.
  explicit QuantizedMatMulPlugin(nvinfer1::PluginFieldCollection const* fields) {
    Attributes const attributes(fields, {QuantLayout::kFormatField, QuantLayout::kGroupSizeField, kTransposedField});
    mLayout = QuantLayout::read(attributes);
    mTransposed = attributes.getInt(kTransposedField).value_or(1);
    if (mTransposed != 0 && mTransposed != 1) {
      throw PluginError("attribute 'transposed': expected 0 or 1, found " + std::to_string(mTransposed));
    }
  }

  PluginSignature const& signature() const { return mLayout.asymmetric ? kAsymmetricSignature : kSignature; }

  // y: [T, N], N being W's rows (transposed) or else its columns, v per INT32 word
  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder& exprBuilder) const {
    nvinfer1::DimsExprs y = tokensByRows(inputs, kCodes, "w");
    if (mTransposed == 0) {
      nvinfer1::IDimensionExpr const* perWord = exprBuilder.constant(mLayout.valuesPerWord());
      y.d[1] = exprBuilder.operation(nvinfer1::DimensionOperation::kPROD, *inputs[kCodes].d[1], *perWord);
    }
    return y;
  }

  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
    nvinfer1::DataType const type = inOut[pos].desc.type;
    switch (pos) {
      case kX:
        return isFloatType(type);
      case kCodes:  // the bundle's bytes as INT32 words: INT8 / UINT8 plugin inputs are not usable (OPS.md)
        return type == nvinfer1::DataType::kINT32;
      case kScales:
        return type == nvinfer1::DataType::kHALF;
      case kMins:
        return mLayout.asymmetric && type == nvinfer1::DataType::kHALF;
      default:
        return false;
    }
  }

  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
    nvinfer1::Dims const& x = in[kX].desc.dims;
    expectRank("x", x, 2);
    nvinfer1::Dims const& codes = in[kCodes].desc.dims;
    expectRank("w codes", codes, 2);
    nvinfer1::Dims const* mins = mLayout.asymmetric ? &in[kMins].desc.dims : nullptr;
    if (mTransposed != 0) {  // W [N, K]: rows N, cols K (x's columns)
      mLayout.expectMatrix("w", codes, in[kScales].desc.dims, mins, codes.d[0], x.d[1]);
    } else {  // W [K, N]: rows K (x's columns), cols N
      int64_t const cols = codes.d[1] < 0 ? -1 : codes.d[1] * mLayout.valuesPerWord();
      mLayout.expectMatrix("w", codes, in[kScales].desc.dims, mins, x.d[1], cols);
    }
  }

  // edge_matvec_q's: x quantized into two int8 planes per token, for the largest T of the profile; edge_matvec_q_t
  // needs none.
  size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept {
    if (mTransposed == 0 || nbInputs < kSignature.nbInputs) return 0;
    int64_t const tokens = inputs[kX].max.d[0];
    int64_t const n_in = inputs[kX].max.d[1];
    if (tokens > INT32_MAX || n_in > INT32_MAX) return 0;
    return edge_matvec_q_workspace_size(static_cast<int>(n_in), static_cast<int>(tokens));
  }

  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const n_in = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_out = mTransposed != 0 ? checkedDim("w", inputDesc[kCodes].dims.d[0])
                                       : checkedDim("w", inputDesc[kCodes].dims.d[1] * mLayout.valuesPerWord());
    if (tokens == 0) return;
    auto const* scales = static_cast<uint16_t const*>(inputs[kScales]);
    auto const* mins = mLayout.asymmetric ? static_cast<uint16_t const*>(inputs[kMins]) : nullptr;
    auto* y = static_cast<float*>(output);
    int const x_dtype = cudaDtype(inputDesc[kX].type);
    if (mTransposed != 0) {
      expectLaunched("edge_matvec_q", edge_matvec_q(stream, inputs[kX], x_dtype, tokens, n_in, n_out, inputs[kCodes],
                                                    scales, mins, mLayout.format, mLayout.groupSize, nullptr, y,
                                                    workspace));
    } else {
      expectLaunched("edge_matvec_q_t", edge_matvec_q_t(stream, inputs[kX], x_dtype, tokens, n_in, n_out,
                                                        inputs[kCodes], scales, mins, mLayout.format,
                                                        mLayout.groupSize, nullptr, y));
    }
  }

  void addFields(std::vector<nvinfer1::PluginField>& fields) const {
    mLayout.addFields(fields);
    fields.emplace_back(kTransposedField, &mTransposed, nvinfer1::PluginFieldType::kINT32, 1);
  }

 private:
  QuantLayout mLayout{};
  int32_t mTransposed = 1;  // 1: W [N, K], y = x W^T; 0: W [K, N], y = x W
};

}  // namespace

nvinfer1::IPluginCreatorV3One* quantizedMatMulCreator() {
  static PluginCreator<QuantizedMatMulPlugin> creator;
  return &creator;
}

}  // namespace edge_sdk::trt
