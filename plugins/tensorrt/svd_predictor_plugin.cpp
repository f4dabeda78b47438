#include "svd_predictor_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kA, kB, kBias };

}  // namespace

std::vector<nvinfer1::PluginField> SvdPredictorPlugin::fieldNames() { return {}; }

SvdPredictorPlugin::SvdPredictorPlugin(nvinfer1::PluginFieldCollection const* fields) { Attributes(fields, {}); }

nvinfer1::DimsExprs SvdPredictorPlugin::outputShape(nvinfer1::DimsExprs const* inputs,
                                                    nvinfer1::IExprBuilder&) const {
  if (inputs[kX].nbDims != 2 || inputs[kA].nbDims != 2) {
    throw PluginError("inputs 'x' and 'a': expected 2 dimensions each, found " + std::to_string(inputs[kX].nbDims) +
                      " and " + std::to_string(inputs[kA].nbDims));
  }
  nvinfer1::DimsExprs mask{};  // [T, D]
  mask.nbDims = 2;
  mask.d[0] = inputs[kX].d[0];
  mask.d[1] = inputs[kA].d[0];
  return mask;
}

bool SvdPredictorPlugin::supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
  nvinfer1::DataType const type = inOut[pos].desc.type;
  return pos == kX ? isFloatType(type) : type == nvinfer1::DataType::kFLOAT;  // a, b, bias: fp32
}

void SvdPredictorPlugin::expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
  nvinfer1::Dims const& x = in[kX].desc.dims;
  nvinfer1::Dims const& a = in[kA].desc.dims;
  nvinfer1::Dims const& b = in[kB].desc.dims;
  expectRank("x", x, 2);
  expectRank("a", a, 2);
  expectRank("b", b, 2);
  expectRank("bias", in[kBias].desc.dims, 1);
  expectDim("input 'b' columns (d, as x)", x.d[1], b.d[1]);
  expectDim("input 'b' rows (r, as a's columns)", a.d[1], b.d[0]);
  expectDim("input 'bias' length (D, as a's rows)", a.d[0], in[kBias].desc.dims.d[0]);
}

size_t SvdPredictorPlugin::workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs,
                                         int32_t nbInputs) const noexcept {
  if (nbInputs != kSignature.nbInputs) return 0;
  // scratch = x b^T: [T, r] floats
  return static_cast<size_t>(inputs[kX].max.d[0]) * static_cast<size_t>(inputs[kA].max.d[1]) * sizeof(float);
}

void SvdPredictorPlugin::launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output,
                                void* workspace, cudaStream_t stream) const {
  int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
  int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
  int const n_neurons = checkedDim("a", inputDesc[kA].dims.d[0]);
  int const rank = checkedDim("a", inputDesc[kA].dims.d[1]);
  if (tokens == 0) return;
  cudaError_t const status = edge_svd_predictor(
      stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, d, n_neurons, rank,
      static_cast<float const*>(inputs[kA]), static_cast<float const*>(inputs[kB]),
      static_cast<float const*>(inputs[kBias]), static_cast<int32_t*>(output), static_cast<float*>(workspace));
  if (status != cudaSuccess) throw PluginError(std::string("edge_svd_predictor: ") + cudaGetErrorString(status));
}

}  // namespace edge_sdk::trt
