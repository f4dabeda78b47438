// SparseFFN: one decode step of the sparse gated FFN (DESIGN 3.1), calling edge_sparse_ffn.
// Inputs: x [T, d] (fp32/fp16/bf16), w_gate, w_up, w_down_t [D, d] (one float type),
// mask [T, D] int32 (nonzero = active), optionally thresholds [D] fp32. Output: y [T, d] fp32. Attributes: activation, activation_threshold.
#ifndef EDGE_SDK_TRT_SPARSE_FFN_PLUGIN_H
#define EDGE_SDK_TRT_SPARSE_FFN_PLUGIN_H

#include <vector>

#include "plugin_common.h"

namespace edge_sdk::trt {

class SparseFfnPlugin : public PluginBase<SparseFfnPlugin> {
 public:
  static constexpr char const* kName = kSparseFfnName;
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates the attributes; throws PluginError.
  explicit SparseFfnPlugin(nvinfer1::PluginFieldCollection const* fields);

  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override;
  int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
  size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
  int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                  void const* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

 private:
  GateActivation mActivation;
  int32_t mNbInputs = 0;  // 5, or 6 with thresholds; known from configurePlugin / onShapeChange
  std::vector<nvinfer1::PluginField> mSerialized;
  nvinfer1::PluginFieldCollection mSerializedCollection{};
};

using SparseFfnPluginCreator = PluginCreator<SparseFfnPlugin>;

}  // namespace edge_sdk::trt

#endif
