#include "svd_predictor_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kA, kB, kBias };
constexpr int32_t kInputs = 4;

void expectCounts(int32_t nbInputs, int32_t nbOutputs) {
  if (nbInputs != kInputs) throw PluginError("expected 4 inputs (x, a, b, bias), found " + std::to_string(nbInputs));
  if (nbOutputs != 1) throw PluginError("expected 1 output (mask), found " + std::to_string(nbOutputs));
}

}  // namespace

std::vector<nvinfer1::PluginField> SvdPredictorPlugin::fieldNames() { return {}; }

SvdPredictorPlugin::SvdPredictorPlugin(nvinfer1::PluginFieldCollection const* fields) { Attributes(fields, {}); }

int32_t SvdPredictorPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                               nvinfer1::DataType const*, int32_t nbInputs) const noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    // int32 mask (OPS.md): NvInferRuntime.h 10.3, IPluginV3OneBuild::getOutputDataTypes: "DataType:kBOOL and
    // DataType::kUINT8 are not supported."
    outputTypes[0] = nvinfer1::DataType::kINT32;
  });
}

int32_t SvdPredictorPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                            nvinfer1::DimsExprs const*, int32_t, nvinfer1::DimsExprs* outputs,
                                            int32_t nbOutputs, nvinfer1::IExprBuilder&) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
    if (inputs[kX].nbDims != 2 || inputs[kA].nbDims != 2) {
      throw PluginError("inputs 'x' and 'a': expected 2 dimensions each, found " + std::to_string(inputs[kX].nbDims) +
                        " and " + std::to_string(inputs[kA].nbDims));
    }
    outputs[0].nbDims = 2;  // mask: [T, D]
    outputs[0].d[0] = inputs[kX].d[0];
    outputs[0].d[1] = inputs[kA].d[0];
  });
}

bool SvdPredictorPlugin::supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
                                                   int32_t nbInputs, int32_t) noexcept {
  nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
  if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
  if (pos == kX) return isFloatType(desc.type);
  // a: float, or half (the F16 factors of bundles whose weights are not fp32); b: a's type; bias: float
  if (pos == kA) return desc.type == nvinfer1::DataType::kFLOAT || desc.type == nvinfer1::DataType::kHALF;
  if (pos == kB) return desc.type == inOut[kA].desc.type;
  if (pos < nbInputs) return desc.type == nvinfer1::DataType::kFLOAT;
  return desc.type == nvinfer1::DataType::kINT32;                     // mask, 1 = predicted active
}

int32_t SvdPredictorPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                            nvinfer1::DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept {
  return reportFailure([&] {
    expectCounts(nbInputs, nbOutputs);
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
  });
}

size_t SvdPredictorPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                                            nvinfer1::DynamicPluginTensorDesc const*, int32_t) const noexcept {
  if (nbInputs != kInputs) return 0;
  // scratch = x b^T: [T, r] floats
  return static_cast<size_t>(inputs[kX].max.d[0]) * static_cast<size_t>(inputs[kA].max.d[1]) * sizeof(float);
}

int32_t SvdPredictorPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const*,
                                    void const* const* inputs, void* const* outputs, void* workspace,
                                    cudaStream_t stream) noexcept {
  return reportFailure([&] {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_neurons = checkedDim("a", inputDesc[kA].dims.d[0]);
    int const rank = checkedDim("a", inputDesc[kA].dims.d[1]);
    if (tokens == 0) return;
    bool const half_factors = inputDesc[kA].type == nvinfer1::DataType::kHALF;
    auto const* bias = static_cast<float const*>(inputs[kBias]);
    auto* mask = static_cast<int32_t*>(outputs[0]);
    auto* scratch = static_cast<float*>(workspace);
    int const x_dtype = cudaDtype(inputDesc[kX].type);
    cudaError_t const status =
        half_factors ? edge_svd_predictor_f16(stream, inputs[kX], x_dtype, tokens, d, n_neurons, rank, inputs[kA],
                                              inputs[kB], bias, mask, scratch)
                     : edge_svd_predictor(stream, inputs[kX], x_dtype, tokens, d, n_neurons, rank,
                                          static_cast<float const*>(inputs[kA]), static_cast<float const*>(inputs[kB]),
                                          bias, mask, scratch);
    if (status != cudaSuccess) {
      throw PluginError(std::string(half_factors ? "edge_svd_predictor_f16: " : "edge_svd_predictor: ") +
                        cudaGetErrorString(status));
    }
  });
}

nvinfer1::PluginFieldCollection const* SvdPredictorPlugin::getFieldsToSerialize() noexcept { return &mNoFields; }

}  // namespace edge_sdk::trt
