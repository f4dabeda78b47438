// SparseFFN: one decode step of the sparse gated FFN (DESIGN 3.1), calling edge_sparse_ffn.
// Inputs: x [T, d] (fp32/fp16/bf16), w_gate, w_up, w_down_t [D, d] (one float type), mask [T, D] int32 (nonzero =
// active), optionally thresholds [D] fp32. Output: y [T, d] fp32. Attributes: activation, activation_threshold.
#include <cstdint>
#include <string>
#include <vector>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"
#include "sparse_ffn_plugin_base.h"

namespace edge_sdk::trt {
namespace {

// then the optional thresholds
enum Input { kX = 0, kWGate, kWUp, kWDownT, kMask };

// outputShape and workspaceSize: SparseFfnPluginBase's
class SparseFfnPlugin : public SparseFfnPluginBase<SparseFfnPlugin> {
 public:
  static constexpr char const* kName = kSparseFfnName;
  static constexpr PluginSignature kSignature{5, "x, w_gate, w_up, w_down_t, mask", "thresholds", "y",
                                              nvinfer1::DataType::kFLOAT};

  static std::vector<nvinfer1::PluginField> fieldNames() {
    std::vector<nvinfer1::PluginField> fields;
    GateActivation::addFieldNames(fields);
    return fields;
  }

  // Validates the attributes; throws PluginError.
  explicit SparseFfnPlugin(nvinfer1::PluginFieldCollection const* fields)
      : mActivation(
            GateActivation::read(Attributes(fields, {GateActivation::kField, GateActivation::kThresholdField}))) {}

  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
    nvinfer1::DataType const type = inOut[pos].desc.type;
    switch (pos) {
      case kX:
      case kWGate:
        return isFloatType(type);
      case kWUp:
      case kWDownT:
        return type == inOut[kWGate].desc.type;
      case kMask:  // int32 (OPS.md): TensorRT#3959, BOOL / INT8 plugin inputs find no supported format
        return type == nvinfer1::DataType::kINT32;
      default:  // thresholds
        return type == nvinfer1::DataType::kFLOAT;
    }
  }

  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const {
    nvinfer1::Dims const& x = in[kX].desc.dims;
    nvinfer1::Dims const& gate = in[kWGate].desc.dims;
    expectRank("x", x, 2);
    char const* weightNames[] = {"w_gate", "w_up", "w_down_t"};
    for (int input = kWGate; input <= kWDownT; ++input) {
      nvinfer1::Dims const& w = in[input].desc.dims;
      std::string const name = weightNames[input - kWGate];
      expectRank(name.c_str(), w, 2);
      expectDim(("input '" + name + "' rows (D, as w_gate)").c_str(), gate.d[0], w.d[0]);
      expectDim(("input '" + name + "' columns (d, as x)").c_str(), x.d[1], w.d[1]);
    }
    expectMaskAndThresholds(in, nbInputs, x, gate.d[0]);
  }

  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const {
    StepArguments const step = stepArguments(inputDesc, inputs);
    if (step.tokens == 0) return;
    cudaError_t const status = edge_sparse_ffn(
        stream, inputs[kX], cudaDtype(inputDesc[kX].type), step.tokens, step.d, step.n_neurons, inputs[kWGate],
        inputs[kWUp], inputs[kWDownT], cudaDtype(inputDesc[kWGate].type), static_cast<int32_t const*>(inputs[kMask]),
        step.thresholds, mActivation.value, mActivation.threshold, static_cast<float*>(output), workspace, nullptr);
    expectLaunched("edge_sparse_ffn", status);
  }

  void addFields(std::vector<nvinfer1::PluginField>& fields) const { mActivation.addFields(fields); }

 private:
  GateActivation mActivation;
};

}  // namespace

nvinfer1::IPluginCreatorV3One* sparseFfnCreator() {
  static PluginCreator<SparseFfnPlugin> creator;
  return &creator;
}

}  // namespace edge_sdk::trt
