#include "quantized_matmul_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kCodes, kScales };
constexpr int32_t kInputs = 3;
constexpr char kTransposedField[] = "transposed";

void expectCounts(int32_t nbInputs, int32_t nbOutputs) {
  if (nbInputs != kInputs) {
    throw PluginError("expected 3 inputs (x, w, w_scales), found " + std::to_string(nbInputs));
  }
  if (nbOutputs != 1) throw PluginError("expected 1 output (y), found " + std::to_string(nbOutputs));
}

}  // namespace

std::vector<nvinfer1::PluginField> QuantizedMatMulPlugin::fieldNames() {
  std::vector<nvinfer1::PluginField> fields;
  QuantLayout::addFieldNames(fields);
  fields.emplace_back(kTransposedField, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
  return fields;
}

QuantizedMatMulPlugin::QuantizedMatMulPlugin(nvinfer1::PluginFieldCollection const* fields) {
  Attributes const attributes(fields, {QuantLayout::kFormatField, QuantLayout::kGroupSizeField, kTransposedField});
  mLayout = QuantLayout::read(attributes);
  mTransposed = attributes.getInt(kTransposedField).value_or(1);
  if (mTransposed != 0 && mTransposed != 1) {
    throw PluginError("attribute 'transposed': expected 0 or 1, found " + std::to_string(mTransposed));
  }
}

int32_t QuantizedMatMulPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                                  nvinfer1::DataType const*, int32_t nbInputs) const noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    outputTypes[0] = nvinfer1::DataType::kFLOAT;
  });
}

int32_t QuantizedMatMulPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                               nvinfer1::DimsExprs const*, int32_t, nvinfer1::DimsExprs* outputs,
                                               int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    if (inputs[kX].nbDims != 2 || inputs[kCodes].nbDims != 2) {
      throw PluginError("inputs 'x' and 'w': expected 2 dimensions each, found " + std::to_string(inputs[kX].nbDims) +
                        " and " + std::to_string(inputs[kCodes].nbDims));
    }
    outputs[0].nbDims = 2;  // y: [T, N]: N is W's rows (transposed), else its columns, v per INT32 word
    outputs[0].d[0] = inputs[kX].d[0];
    if (mTransposed != 0) {
      outputs[0].d[1] = inputs[kCodes].d[0];
    } else {
      nvinfer1::IDimensionExpr const* perWord = exprBuilder.constant(mLayout.valuesPerWord());
      outputs[0].d[1] = exprBuilder.operation(nvinfer1::DimensionOperation::kPROD, *inputs[kCodes].d[1], *perWord);
    }
  });
}

bool QuantizedMatMulPlugin::supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
                                                      int32_t nbInputs, int32_t) noexcept {
  nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
  if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
  switch (pos) {
    case kX:
      return isFloatType(desc.type);
    case kCodes:  // the bundle's bytes as INT32 words: INT8 / UINT8 plugin inputs are not usable (OPS.md)
      return desc.type == nvinfer1::DataType::kINT32;
    case kScales:
      return desc.type == nvinfer1::DataType::kHALF;
    default:
      return pos == nbInputs && desc.type == nvinfer1::DataType::kFLOAT;  // y
  }
}

int32_t QuantizedMatMulPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                               nvinfer1::DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    nvinfer1::Dims const& x = in[kX].desc.dims;
    expectRank("x", x, 2);
    nvinfer1::Dims const& codes = in[kCodes].desc.dims;
    expectRank("w codes", codes, 2);
    if (mTransposed != 0) {  // W [N, K]: rows N, cols K (x's columns)
      mLayout.expectMatrix("w", codes, in[kScales].desc.dims, codes.d[0], x.d[1]);
    } else {  // W [K, N]: rows K (x's columns), cols N
      int64_t const cols = codes.d[1] < 0 ? -1 : codes.d[1] * mLayout.valuesPerWord();
      mLayout.expectMatrix("w", codes, in[kScales].desc.dims, x.d[1], cols);
    }
  });
}

size_t QuantizedMatMulPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const*, int32_t,
                                               nvinfer1::DynamicPluginTensorDesc const*, int32_t) const noexcept {
  return 0;
}

int32_t QuantizedMatMulPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const*,
                                       void const* const* inputs, void* const* outputs, void*,
                                       cudaStream_t stream) noexcept {
  return reportFailure([&] {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const n_in = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_out = mTransposed != 0 ? checkedDim("w", inputDesc[kCodes].dims.d[0])
                                       : checkedDim("w", inputDesc[kCodes].dims.d[1] * mLayout.valuesPerWord());
    if (tokens == 0) return;
    auto launcher = mTransposed != 0 ? edge_matvec_q : edge_matvec_q_t;
    cudaError_t const status =
        launcher(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, n_in, n_out, inputs[kCodes],
                 static_cast<uint16_t const*>(inputs[kScales]), mLayout.format, mLayout.groupSize, nullptr,
                 static_cast<float*>(outputs[0]));
    char const* name = mTransposed != 0 ? "edge_matvec_q: " : "edge_matvec_q_t: ";
    if (status != cudaSuccess) throw PluginError(std::string(name) + cudaGetErrorString(status));
  });
}

nvinfer1::PluginFieldCollection const* QuantizedMatMulPlugin::getFieldsToSerialize() noexcept {
  // The fields point into this object, so they are rebuilt here rather than copied with it.
  bool const built = reportFailure([&] {
    mSerialized.clear();
    mLayout.addFields(mSerialized);
    mSerialized.emplace_back(kTransposedField, &mTransposed, nvinfer1::PluginFieldType::kINT32, 1);
  }) == 0;
  mSerializedCollection.nbFields = built ? static_cast<int32_t>(mSerialized.size()) : 0;
  mSerializedCollection.fields = mSerialized.data();
  return built ? &mSerializedCollection : nullptr;
}

}  // namespace edge_sdk::trt
