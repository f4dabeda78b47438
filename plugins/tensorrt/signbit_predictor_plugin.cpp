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

nvinfer1::DimsExprs SignBitPredictorPlugin::outputShape(nvinfer1::DimsExprs const* inputs,
                                                        nvinfer1::IExprBuilder&) const {
  if (inputs[kX].nbDims != 2 || inputs[kPacked].nbDims != 2) {
    throw PluginError("inputs 'x' and 'packed': expected 2 dimensions each, found " +
                      std::to_string(inputs[kX].nbDims) + " and " + std::to_string(inputs[kPacked].nbDims));
  }
  nvinfer1::DimsExprs mask{};  // [T, D]
  mask.nbDims = 2;
  mask.d[0] = inputs[kX].d[0];
  mask.d[1] = inputs[kPacked].d[0];
  return mask;
}

bool SignBitPredictorPlugin::supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
  nvinfer1::DataType const type = inOut[pos].desc.type;
  return pos == kX ? isFloatType(type) : type == nvinfer1::DataType::kINT32;  // packed
}

void SignBitPredictorPlugin::expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
  nvinfer1::Dims const& x = in[kX].desc.dims;
  nvinfer1::Dims const& packed = in[kPacked].desc.dims;
  expectRank("x", x, 2);
  expectRank("packed", packed, 2);
  int64_t const words = x.d[1] < 0 ? -1 : (x.d[1] + kBitsPerWord - 1) / kBitsPerWord;
  expectDim("input 'packed' columns (ceil(d / 32), d from x)", words, packed.d[1]);
}

void SignBitPredictorPlugin::launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs,
                                    void* output, void*, cudaStream_t stream) const {
  int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
  int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
  int const n_neurons = checkedDim("packed", inputDesc[kPacked].dims.d[0]);
  if (tokens == 0) return;
  cudaError_t const status =
      edge_signbit_predictor(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, d, n_neurons,
                             static_cast<int32_t const*>(inputs[kPacked]), mAlpha, static_cast<int32_t*>(output));
  if (status != cudaSuccess) throw PluginError(std::string("edge_signbit_predictor: ") + cudaGetErrorString(status));
}

void SignBitPredictorPlugin::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  fields.emplace_back(kAlphaField, &mAlpha, nvinfer1::PluginFieldType::kFLOAT32, 1);
}

}  // namespace edge_sdk::trt
