#include "quantized_sparse_ffn_plugin.h"

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

// then the optional thresholds
enum Input { kX = 0, kGateCodes, kGateScales, kUpCodes, kUpScales, kDownCodes, kDownScales, kMask };
constexpr char const* kMatrices[] = {"w_gate", "w_up", "w_down_t"};

}  // namespace

std::vector<nvinfer1::PluginField> QuantizedSparseFfnPlugin::fieldNames() {
  std::vector<nvinfer1::PluginField> fields;
  GateActivation::addFieldNames(fields);
  QuantLayout::addFieldNames(fields);
  return fields;
}

QuantizedSparseFfnPlugin::QuantizedSparseFfnPlugin(nvinfer1::PluginFieldCollection const* fields) {
  Attributes const attributes(fields, {GateActivation::kField, GateActivation::kThresholdField,
                                       QuantLayout::kFormatField, QuantLayout::kGroupSizeField});
  mActivation = GateActivation::read(attributes);
  mLayout = QuantLayout::read(attributes);
}

bool QuantizedSparseFfnPlugin::supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
  nvinfer1::DataType const type = inOut[pos].desc.type;
  switch (pos) {
    case kX:
      return isFloatType(type);
    case kGateCodes:
    case kUpCodes:
    case kDownCodes:  // the bundle's bytes as INT32 words: INT8 / UINT8 plugin inputs are not usable (OPS.md)
    case kMask:
      return type == nvinfer1::DataType::kINT32;
    case kGateScales:
    case kUpScales:
    case kDownScales:
      return type == nvinfer1::DataType::kHALF;
    default:  // thresholds
      return type == nvinfer1::DataType::kFLOAT;
  }
}

void QuantizedSparseFfnPlugin::expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const {
  nvinfer1::Dims const& x = in[kX].desc.dims;
  expectRank("x", x, 2);
  int64_t const n_neurons = in[kGateCodes].desc.dims.nbDims == 2 ? in[kGateCodes].desc.dims.d[0] : -1;
  for (int m = 0; m < 3; ++m) {
    mLayout.expectMatrix(kMatrices[m], in[kGateCodes + 2 * m].desc.dims, in[kGateScales + 2 * m].desc.dims, n_neurons,
                         x.d[1]);
  }
  expectMaskAndThresholds(in, nbInputs, x, n_neurons);
}

void QuantizedSparseFfnPlugin::launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs,
                                      void* output, void* workspace, cudaStream_t stream) const {
  StepArguments const step = stepArguments(inputDesc, inputs);
  if (step.tokens == 0) return;
  auto scales = [&](int input) { return static_cast<uint16_t const*>(inputs[input]); };
  cudaError_t const status = edge_sparse_ffn_q(
      stream, inputs[kX], cudaDtype(inputDesc[kX].type), step.tokens, step.d, step.n_neurons, inputs[kGateCodes],
      scales(kGateScales), inputs[kUpCodes], scales(kUpScales), inputs[kDownCodes], scales(kDownScales),
      mLayout.format, mLayout.groupSize, static_cast<int32_t const*>(inputs[kMask]), step.thresholds,
      mActivation.value, mActivation.threshold, static_cast<float*>(output), workspace, nullptr);
  if (status != cudaSuccess) throw PluginError(std::string("edge_sparse_ffn_q: ") + cudaGetErrorString(status));
}

void QuantizedSparseFfnPlugin::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  mActivation.addFields(fields);
  mLayout.addFields(fields);
}

}  // namespace edge_sdk::trt
