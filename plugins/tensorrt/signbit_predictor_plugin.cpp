#include "signbit_predictor_plugin.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

constexpr char kAlphaField[] = "alpha";
constexpr int kBitsPerWord = 32;

enum Input { kX = 0, kPacked };
constexpr int32_t kInputs = 2;

void expectCounts(int32_t nbInputs, int32_t nbOutputs) {
  if (nbInputs != kInputs) throw PluginError("expected 2 inputs (x, packed), found " + std::to_string(nbInputs));
  if (nbOutputs != 1) throw PluginError("expected 1 output (mask), found " + std::to_string(nbOutputs));
}

}  // namespace

std::vector<nvinfer1::PluginField> SignBitPredictorPlugin::fieldNames() {
  return {nvinfer1::PluginField(kAlphaField, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1)};
}

SignBitPredictorPlugin::SignBitPredictorPlugin(nvinfer1::PluginFieldCollection const* fields) {
  Attributes const attributes(fields, {kAlphaField});
  std::optional<float> const alpha = attributes.getFloat(kAlphaField);
  if (!alpha) throw PluginError("attribute 'alpha' is required, found none");
  if (!std::isfinite(*alpha) || *alpha <= 0.0f) {
    throw PluginError("attribute 'alpha': expected a finite value > 0, found " + formatFloat(*alpha));
  }
  mAlpha = *alpha;
}

int32_t SignBitPredictorPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                                   nvinfer1::DataType const*, int32_t nbInputs) const noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    // int32 mask (OPS.md): NvInferRuntime.h 10.3, IPluginV3OneBuild::getOutputDataTypes: "DataType:kBOOL and
    // DataType::kUINT8 are not supported."
    outputTypes[0] = nvinfer1::DataType::kINT32;
  });
}

int32_t SignBitPredictorPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                                nvinfer1::DimsExprs const*, int32_t, nvinfer1::DimsExprs* outputs,
                                                int32_t nbOutputs, nvinfer1::IExprBuilder&) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    if (inputs[kX].nbDims != 2 || inputs[kPacked].nbDims != 2) {
      throw PluginError("inputs 'x' and 'packed': expected 2 dimensions each, found " +
                        std::to_string(inputs[kX].nbDims) + " and " + std::to_string(inputs[kPacked].nbDims));
    }
    outputs[0].nbDims = 2;  // mask: [T, D]
    outputs[0].d[0] = inputs[kX].d[0];
    outputs[0].d[1] = inputs[kPacked].d[0];
  });
}

bool SignBitPredictorPlugin::supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
                                                       int32_t, int32_t) noexcept {
  nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
  if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
  switch (pos) {
    case kX:
      return isFloatType(desc.type);
    case kPacked:
      return desc.type == nvinfer1::DataType::kINT32;
    default:  // mask, 1 = predicted active
      return desc.type == nvinfer1::DataType::kINT32;
  }
}

int32_t SignBitPredictorPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                                nvinfer1::DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    nvinfer1::Dims const& x = in[kX].desc.dims;
    nvinfer1::Dims const& packed = in[kPacked].desc.dims;
    expectRank("x", x, 2);
    expectRank("packed", packed, 2);
    int64_t const words = x.d[1] < 0 ? -1 : (x.d[1] + kBitsPerWord - 1) / kBitsPerWord;
    expectDim("input 'packed' columns (ceil(d / 32), d from x)", words, packed.d[1]);
  });
}

int32_t SignBitPredictorPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
                                        nvinfer1::PluginTensorDesc const*, void const* const* inputs,
                                        void* const* outputs, void*, cudaStream_t stream) noexcept {
  return reportFailure([&] {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_neurons = checkedDim("packed", inputDesc[kPacked].dims.d[0]);
    if (tokens == 0) return;
    cudaError_t const status =
        edge_signbit_predictor(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, d, n_neurons,
                               static_cast<int32_t const*>(inputs[kPacked]), mAlpha, static_cast<int32_t*>(outputs[0]));
    if (status != cudaSuccess) throw PluginError(std::string("edge_signbit_predictor: ") + cudaGetErrorString(status));
  });
}

nvinfer1::PluginFieldCollection const* SignBitPredictorPlugin::getFieldsToSerialize() noexcept {
  mSerialized = nvinfer1::PluginField(kAlphaField, &mAlpha, nvinfer1::PluginFieldType::kFLOAT32, 1);
  mSerializedCollection.nbFields = 1;
  mSerializedCollection.fields = &mSerialized;
  return &mSerializedCollection;
}

}  // namespace edge_sdk::trt
