// SvdPredictor: the low-rank predictor mask = ((x b^T) a^T + bias) > 0 (DESIGN 3.2), calling edge_svd_predictor.
// Inputs: x [T, d] (fp32/fp16/bf16), a [D, r], b [r, d], bias [D] (fp32). Output: mask [T, D] int32 (1 = active).
// No attributes besides plugin_version / plugin_namespace, which the parser uses to find the creator.
#ifndef EDGE_SDK_TRT_SVD_PREDICTOR_PLUGIN_H
#define EDGE_SDK_TRT_SVD_PREDICTOR_PLUGIN_H

#include <vector>

#include "plugin_common.h"

namespace edge_sdk::trt {

class SvdPredictorPlugin : public PluginBase<SvdPredictorPlugin> {
 public:
  static constexpr char const* kName = kSvdPredictorName;
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Rejects any attribute; throws PluginError.
  explicit SvdPredictorPlugin(nvinfer1::PluginFieldCollection const* fields);

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
  int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                  void const* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

 private:
  nvinfer1::PluginFieldCollection mNoFields{0, nullptr};
};

using SvdPredictorPluginCreator = PluginCreator<SvdPredictorPlugin>;

}  // namespace edge_sdk::trt

#endif
