#include "quantized_matmul_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kCodes, kScales };
constexpr char kTransposedField[] = "transposed";

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

nvinfer1::DimsExprs QuantizedMatMulPlugin::outputShape(nvinfer1::DimsExprs const* inputs,
                                                       nvinfer1::IExprBuilder& exprBuilder) const {
  if (inputs[kX].nbDims != 2 || inputs[kCodes].nbDims != 2) {
    throw PluginError("inputs 'x' and 'w': expected 2 dimensions each, found " + std::to_string(inputs[kX].nbDims) +
                      " and " + std::to_string(inputs[kCodes].nbDims));
  }
  nvinfer1::DimsExprs y{};  // [T, N]: N is W's rows (transposed), else its columns, v per INT32 word
  y.nbDims = 2;
  y.d[0] = inputs[kX].d[0];
  if (mTransposed != 0) {
    y.d[1] = inputs[kCodes].d[0];
  } else {
    nvinfer1::IDimensionExpr const* perWord = exprBuilder.constant(mLayout.valuesPerWord());
    y.d[1] = exprBuilder.operation(nvinfer1::DimensionOperation::kPROD, *inputs[kCodes].d[1], *perWord);
  }
  return y;
}

bool QuantizedMatMulPlugin::supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
  nvinfer1::DataType const type = inOut[pos].desc.type;
  switch (pos) {
    case kX:
      return isFloatType(type);
    case kCodes:  // the bundle's bytes as INT32 words: INT8 / UINT8 plugin inputs are not usable (OPS.md)
      return type == nvinfer1::DataType::kINT32;
    case kScales:
      return type == nvinfer1::DataType::kHALF;
    default:
      return false;
  }
}

void QuantizedMatMulPlugin::expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
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
}

void QuantizedMatMulPlugin::launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs,
                                   void* output, void*, cudaStream_t stream) const {
  int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
  int const n_in = checkedDim("x", inputDesc[kX].dims.d[1]);
  int const n_out = mTransposed != 0 ? checkedDim("w", inputDesc[kCodes].dims.d[0])
                                     : checkedDim("w", inputDesc[kCodes].dims.d[1] * mLayout.valuesPerWord());
  if (tokens == 0) return;
  auto launcher = mTransposed != 0 ? edge_matvec_q : edge_matvec_q_t;
  cudaError_t const status = launcher(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, n_in, n_out,
                                      inputs[kCodes], static_cast<uint16_t const*>(inputs[kScales]), mLayout.format,
                                      mLayout.groupSize, nullptr, static_cast<float*>(output));
  char const* name = mTransposed != 0 ? "edge_matvec_q: " : "edge_matvec_q_t: ";
  if (status != cudaSuccess) throw PluginError(std::string(name) + cudaGetErrorString(status));
}

void QuantizedMatMulPlugin::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  mLayout.addFields(fields);
  fields.emplace_back(kTransposedField, &mTransposed, nvinfer1::PluginFieldType::kINT32, 1);
}

}  // namespace edge_sdk::trt
