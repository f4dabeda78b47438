#include "quantized_sparse_ffn_plugin.h"

#include <climits>
#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kGateCodes, kGateScales, kUpCodes, kUpScales, kDownCodes, kDownScales, kMask, kThresholds };
constexpr int32_t kRequiredInputs = 8;
constexpr int32_t kAllInputs = 9;
constexpr char const* kMatrices[] = {"w_gate", "w_up", "w_down_t"};

void expectInputCount(int32_t nbInputs) {
  if (nbInputs != kRequiredInputs && nbInputs != kAllInputs) {
    throw PluginError(
        "expected 8 inputs (x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask) or 9 (and "
        "thresholds), found " +
        std::to_string(nbInputs));
  }
}

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

int32_t QuantizedSparseFfnPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                                     nvinfer1::DataType const*, int32_t nbInputs) const noexcept {
  return reportFailure([&] {
    expectInputCount(nbInputs);
    if (nbOutputs != 1) throw PluginError("expected 1 output (y), found " + std::to_string(nbOutputs));
    outputTypes[0] = nvinfer1::DataType::kFLOAT;
  });
}

int32_t QuantizedSparseFfnPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                                  nvinfer1::DimsExprs const*, int32_t, nvinfer1::DimsExprs* outputs,
                                                  int32_t nbOutputs, nvinfer1::IExprBuilder&) noexcept {
  return reportFailure([&] {
    expectInputCount(nbInputs);
    if (nbOutputs != 1) throw PluginError("expected 1 output (y), found " + std::to_string(nbOutputs));
    if (inputs[kX].nbDims != 2) {
      throw PluginError("input 'x': expected 2 dimensions [T, d], found " + std::to_string(inputs[kX].nbDims));
    }
    outputs[0] = inputs[kX];  // y: [T, d]
  });
}

bool QuantizedSparseFfnPlugin::supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
                                                         int32_t nbInputs, int32_t) noexcept {
  nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
  if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
  if (pos == nbInputs) return desc.type == nvinfer1::DataType::kFLOAT;  // y
  switch (pos) {
    case kX:
      return isFloatType(desc.type);
    case kGateCodes:
    case kUpCodes:
    case kDownCodes:  // the bundle's bytes as INT32 words: INT8 / UINT8 plugin inputs are not usable (OPS.md)
    case kMask:
      return desc.type == nvinfer1::DataType::kINT32;
    case kGateScales:
    case kUpScales:
    case kDownScales:
      return desc.type == nvinfer1::DataType::kHALF;
    default:  // thresholds
      return desc.type == nvinfer1::DataType::kFLOAT;
  }
}

int32_t QuantizedSparseFfnPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                                  nvinfer1::DynamicPluginTensorDesc const*, int32_t) noexcept {
  return reportFailure([&] {
    expectInputCount(nbInputs);
    nvinfer1::Dims const& x = in[kX].desc.dims;
    expectRank("x", x, 2);
    int64_t const n_neurons = in[kGateCodes].desc.dims.nbDims == 2 ? in[kGateCodes].desc.dims.d[0] : -1;
    for (int m = 0; m < 3; ++m) {
      mLayout.expectMatrix(kMatrices[m], in[kGateCodes + 2 * m].desc.dims, in[kGateScales + 2 * m].desc.dims,
                           n_neurons, x.d[1]);
    }
    nvinfer1::Dims const& mask = in[kMask].desc.dims;
    expectRank("mask", mask, 2);
    expectDim("input 'mask' rows (T, as x)", x.d[0], mask.d[0]);
    expectDim("input 'mask' columns (D, as w_gate)", n_neurons, mask.d[1]);
    if (nbInputs == kAllInputs) {
      expectRank("thresholds", in[kThresholds].desc.dims, 1);
      expectDim("input 'thresholds' length (D, as w_gate)", n_neurons, in[kThresholds].desc.dims.d[0]);
    }
    mNbInputs = nbInputs;
  });
}

size_t QuantizedSparseFfnPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                                                  nvinfer1::DynamicPluginTensorDesc const*, int32_t) const noexcept {
  if (nbInputs < kRequiredInputs) return 0;
  int64_t const tokens = inputs[kX].max.d[0];
  int64_t const d = inputs[kX].max.d[1];
  int64_t const n_neurons = inputs[kGateCodes].max.d[0];
  if (tokens > INT32_MAX || d > INT32_MAX || n_neurons > INT32_MAX) return 0;
  return edge_sparse_ffn_workspace_size(static_cast<int>(d), static_cast<int>(n_neurons), static_cast<int>(tokens));
}

int32_t QuantizedSparseFfnPlugin::onShapeChange(nvinfer1::PluginTensorDesc const*, int32_t nbInputs,
                                                nvinfer1::PluginTensorDesc const*, int32_t) noexcept {
  return reportFailure([&] {
    expectInputCount(nbInputs);
    mNbInputs = nbInputs;
  });
}

int32_t QuantizedSparseFfnPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
                                          nvinfer1::PluginTensorDesc const*, void const* const* inputs,
                                          void* const* outputs, void* workspace, cudaStream_t stream) noexcept {
  return reportFailure([&] {
    if (mNbInputs == 0) throw PluginError("enqueue before the input count was known (no onShapeChange)");
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_neurons = checkedDim("w_gate", inputDesc[kGateCodes].dims.d[0]);
    if (tokens == 0) return;
    float const* thresholds = mNbInputs == kAllInputs ? static_cast<float const*>(inputs[kThresholds]) : nullptr;
    auto scales = [&](int input) { return static_cast<uint16_t const*>(inputs[input]); };
    cudaError_t const status = edge_sparse_ffn_q(
        stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, d, n_neurons, inputs[kGateCodes],
        scales(kGateScales), inputs[kUpCodes], scales(kUpScales), inputs[kDownCodes], scales(kDownScales),
        mLayout.format, mLayout.groupSize, static_cast<int32_t const*>(inputs[kMask]), thresholds, mActivation.value,
        mActivation.threshold, static_cast<float*>(outputs[0]), workspace, nullptr);
    if (status != cudaSuccess) throw PluginError(std::string("edge_sparse_ffn_q: ") + cudaGetErrorString(status));
  });
}

nvinfer1::PluginFieldCollection const* QuantizedSparseFfnPlugin::getFieldsToSerialize() noexcept {
  // The fields point into this object, so they are rebuilt here rather than copied with it.
  bool const built = reportFailure([&] {
    mSerialized.clear();
    mActivation.addFields(mSerialized);
    mLayout.addFields(mSerialized);
  }) == 0;
  mSerializedCollection.nbFields = built ? static_cast<int32_t>(mSerialized.size()) : 0;
  mSerializedCollection.fields = mSerialized.data();
  return built ? &mSerializedCollection : nullptr;
}

}  // namespace edge_sdk::trt
