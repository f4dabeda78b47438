// QuantizedSparseFFN: one decode step of the sparse gated FFN (DESIGN 3.1) over group-wise quantized rows, calling
// edge_sparse_ffn_q. Inputs: x [T, d] (fp32/fp16/bf16); for w_gate, w_up and w_down_t (each [D, d], down transposed)
// its codes as INT32 words [D, d / 4] (int8) or [D, d / 8] (int4), the bundle's bytes, and its scales [D, d / G]
// fp16; mask [T, D] int32 (nonzero = active); optionally thresholds [D] fp32. With weight_format int4_asymmetric the
// node has 12 inputs: thresholds, always given (zeros where the model has none: an input left out in the middle
// cannot reach a plugin), then each matrix's group minimums [D, d / G] fp16. Output: y [T, d] fp32. Attributes:
// activation, activation_threshold (as SparseFFN), weight_format, group_size, and the optional down_weight_format:
// "int8" with weight_format int4 or int4_asymmetric (an int4 bundle that keeps its FFN down rows in int8), w_down_t
// is then int8 codes [D, d / 4] with scales [D, d / G] and no minimums, so an int4_asymmetric node has 11 inputs (the
// minimums of w_gate and w_up only); absent, the down rows are in weight_format (edge_sparse_ffn_q's down_format).
#include <cstdint>
#include <string>
#include <vector>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"
#include "sparse_ffn_plugin_base.h"

namespace edge_sdk::trt {
namespace {

// then the optional thresholds; an asymmetric node's thresholds and minimums (w_down_t's only when its rows are int4)
enum Input { kX = 0, kGateCodes, kGateScales, kUpCodes, kUpScales, kDownCodes, kDownScales, kMask };
enum AsymmetricInput { kThresholds = kMask + 1, kGateMins, kUpMins, kDownMins };
constexpr char const* kMatrices[] = {"w_gate", "w_up", "w_down_t"};

// outputShape and workspaceSize: SparseFfnPluginBase's
class QuantizedSparseFfnPlugin : public SparseFfnPluginBase<QuantizedSparseFfnPlugin> {
 public:
  static constexpr char const* kName = kQuantizedSparseFfnName;
  static constexpr PluginSignature kSignature{
      8, "x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask", "thresholds", "y",
      nvinfer1::DataType::kFLOAT};
  static constexpr PluginSignature kAsymmetricSignature{
      12,
      "x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask, thresholds, w_gate_mins, "
      "w_up_mins, w_down_t_mins",
      nullptr, "y", nvinfer1::DataType::kFLOAT};
  // int4_asymmetric gate and up rows, int8 down rows (down_weight_format "int8"): no w_down_t_mins
  static constexpr PluginSignature kAsymmetricInt8DownSignature{
      11,
      "x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask, thresholds, w_gate_mins, "
      "w_up_mins",
      nullptr, "y", nvinfer1::DataType::kFLOAT};

  static std::vector<nvinfer1::PluginField> fieldNames() {
    std::vector<nvinfer1::PluginField> fields;
    GateActivation::addFieldNames(fields);
    QuantLayout::addFieldNames(fields);
    DownWeightFormat::addFieldNames(fields);
    return fields;
  }

  // Validates the attributes; throws PluginError. Serialized fields without down_weight_format (an engine built before
  // it existed) mean the down rows in weight_format, as a node without it.
  explicit QuantizedSparseFfnPlugin(nvinfer1::PluginFieldCollection const* fields) {
    Attributes const attributes(fields, {GateActivation::kField, GateActivation::kThresholdField,
                                         QuantLayout::kFormatField, QuantLayout::kGroupSizeField,
                                         DownWeightFormat::kField});
    mActivation = GateActivation::read(attributes);
    mLayout = QuantLayout::read(attributes);
    mDownFormat = DownWeightFormat::read(attributes, mLayout);
    mDownLayout = mDownFormat.downLayout(mLayout);
  }

  PluginSignature const& signature() const {
    if (!mLayout.asymmetric) return kSignature;
    return mDownLayout.asymmetric ? kAsymmetricSignature : kAsymmetricInt8DownSignature;
  }

  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
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
      case kThresholds:
        return type == nvinfer1::DataType::kFLOAT;
      default:  // an asymmetric node's minimums (w_down_t's only when its rows are int4)
        return mLayout.asymmetric && pos < signature().nbInputs && type == nvinfer1::DataType::kHALF;
    }
  }

  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const {
    nvinfer1::Dims const& x = in[kX].desc.dims;
    expectRank("x", x, 2);
    int64_t const n_neurons = in[kGateCodes].desc.dims.nbDims == 2 ? in[kGateCodes].desc.dims.d[0] : -1;
    for (int m = 0; m < 3; ++m) {
      QuantLayout const& layout = m == 2 ? mDownLayout : mLayout;
      nvinfer1::Dims const* mins = layout.asymmetric ? &in[kGateMins + m].desc.dims : nullptr;
      layout.expectMatrix(kMatrices[m], in[kGateCodes + 2 * m].desc.dims, in[kGateScales + 2 * m].desc.dims, mins,
                          n_neurons, x.d[1]);
    }
    expectMaskAndThresholds(in, nbInputs, x, n_neurons);
  }

  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const {
    StepArguments const step = stepArguments(inputDesc, inputs);
    if (step.tokens == 0) return;
    auto halves = [&](int input) { return static_cast<uint16_t const*>(inputs[input]); };
    auto mins = [&](QuantLayout const& layout, int input) { return layout.asymmetric ? halves(input) : nullptr; };
    cudaError_t const status = edge_sparse_ffn_q(
        stream, inputs[kX], cudaDtype(inputDesc[kX].type), step.tokens, step.d, step.n_neurons, inputs[kGateCodes],
        halves(kGateScales), mins(mLayout, kGateMins), inputs[kUpCodes], halves(kUpScales), mins(mLayout, kUpMins),
        inputs[kDownCodes], halves(kDownScales), mins(mDownLayout, kDownMins), mLayout.format, mDownLayout.format,
        mLayout.groupSize,
        static_cast<int32_t const*>(inputs[kMask]), step.thresholds, mActivation.value, mActivation.threshold,
        static_cast<float*>(output), workspace, nullptr);
    expectLaunched("edge_sparse_ffn_q", status);
  }

  void addFields(std::vector<nvinfer1::PluginField>& fields) const {
    mActivation.addFields(fields);
    mLayout.addFields(fields);
    mDownFormat.addFields(fields);
  }

 private:
  GateActivation mActivation{};
  QuantLayout mLayout{};  // w_gate and w_up, and w_down_t unless down_weight_format says otherwise
  DownWeightFormat mDownFormat{};
  QuantLayout mDownLayout{};  // w_down_t
};

}  // namespace

nvinfer1::IPluginCreatorV3One* quantizedSparseFfnCreator() {
  static PluginCreator<QuantizedSparseFfnPlugin> creator;
  return &creator;
}

}  // namespace edge_sdk::trt
