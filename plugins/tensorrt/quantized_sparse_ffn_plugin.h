// QuantizedSparseFFN: one decode step of the sparse gated FFN (DESIGN 3.1) over group-wise quantized rows, calling
// edge_sparse_ffn_q. Inputs: x [T, d] (fp32/fp16/bf16); for w_gate, w_up and w_down_t (each [D, d], down transposed)
// its codes as INT32 words [D, d / 4] (int8) or [D, d / 8] (int4), the bundle's bytes, and its scales [D, d / G]
// fp16; mask [T, D] int32 (nonzero = active); optionally thresholds [D] fp32. Output: y [T, d] fp32. Attributes:
// activation, activation_threshold (as SparseFFN), weight_format, group_size.
#ifndef EDGE_SDK_TRT_QUANTIZED_SPARSE_FFN_PLUGIN_H
#define EDGE_SDK_TRT_QUANTIZED_SPARSE_FFN_PLUGIN_H

#include <vector>

#include "plugin_common.h"
#include "sparse_ffn_plugin.h"

namespace edge_sdk::trt {

class QuantizedSparseFfnPlugin : public SparseFfnPluginBase<QuantizedSparseFfnPlugin> {
 public:
  static constexpr char const* kName = kQuantizedSparseFfnName;
  static constexpr PluginSignature kSignature{
      8, "x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask", "thresholds", "y",
      nvinfer1::DataType::kFLOAT};
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates the attributes; throws PluginError.
  explicit QuantizedSparseFfnPlugin(nvinfer1::PluginFieldCollection const* fields);

  // PluginBase's hooks (plugin_common.h) besides SparseFfnPluginBase's
  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const;
  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const;
  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const;
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;

 private:
  GateActivation mActivation{};
  QuantLayout mLayout{};
};

using QuantizedSparseFfnPluginCreator = PluginCreator<QuantizedSparseFfnPlugin>;

}  // namespace edge_sdk::trt

#endif
