#include "quantized_matmul_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kCodes, kScales };
constexpr int32_t kInputs = 3;

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
  return fields;
}

QuantizedMatMulPlugin::QuantizedMatMulPlugin(nvinfer1::PluginFieldCollection const* fields)
    : mLayout(QuantLayout::read(Attributes(fields, {QuantLayout::kFormatField, QuantLayout::kGroupSizeField}))) {}

int32_t QuantizedMatMulPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                                  nvinfer1::DataType const*, int32_t nbInputs) const noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    outputTypes[0] = nvinfer1::DataType::kFLOAT;
  });
}

int32_t QuantizedMatMulPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                               nvinfer1::DimsExprs const*, int32_t, nvinfer1::DimsExprs* outputs,
                                               int32_t nbOutputs, nvinfer1::IExprBuilder&) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    if (inputs[kX].nbDims != 2 || inputs[kCodes].nbDims != 2) {
      throw PluginError("inputs 'x' and 'w': expected 2 dimensions each, found " + std::to_string(inputs[kX].nbDims) +
                        " and " + std::to_string(inputs[kCodes].nbDims));
    }
    outputs[0].nbDims = 2;  // y: [T, N]
    outputs[0].d[0] = inputs[kX].d[0];
    outputs[0].d[1] = inputs[kCodes].d[0];
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
    mLayout.expectMatrix("w", codes, in[kScales].desc.dims, codes.nbDims == 2 ? codes.d[0] : -1, x.d[1]);
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
    int const n_out = checkedDim("w", inputDesc[kCodes].dims.d[0]);
    if (tokens == 0) return;
    cudaError_t const status = edge_matvec_q(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, n_in, n_out,
                                             inputs[kCodes], static_cast<uint16_t const*>(inputs[kScales]),
                                             mLayout.format, mLayout.groupSize, nullptr,
                                             static_cast<float*>(outputs[0]));
    if (status != cudaSuccess) throw PluginError(std::string("edge_matvec_q: ") + cudaGetErrorString(status));
  });
}

nvinfer1::PluginFieldCollection const* QuantizedMatMulPlugin::getFieldsToSerialize() noexcept {
  // The fields point into this object, so they are rebuilt here rather than copied with it.
  bool const built = reportFailure([&] {
    mSerialized.clear();
    mLayout.addFields(mSerialized);
  }) == 0;
  mSerializedCollection.nbFields = built ? static_cast<int32_t>(mSerialized.size()) : 0;
  mSerializedCollection.fields = mSerialized.data();
  return built ? &mSerializedCollection : nullptr;
}

}  // namespace edge_sdk::trt
