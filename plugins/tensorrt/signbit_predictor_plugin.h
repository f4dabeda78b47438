// SignBitPredictor: the sign-bit predictor (DESIGN 3.2, SparseInfer), calling edge_signbit_predictor.
// Inputs: x [T, d] (fp32/fp16/bf16), packed [D, ceil(d/32)] int32. Output: mask [T, D] int32 (1 = active).
// Attribute: alpha (float32, finite, > 0).
#ifndef EDGE_SDK_TRT_SIGNBIT_PREDICTOR_PLUGIN_H
#define EDGE_SDK_TRT_SIGNBIT_PREDICTOR_PLUGIN_H

#include <vector>

#include "plugin_common.h"

namespace edge_sdk::trt {

class SignBitPredictorPlugin : public PluginBase<SignBitPredictorPlugin> {
 public:
  static constexpr char const* kName = kSignBitPredictorName;
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates alpha; throws PluginError.
  explicit SignBitPredictorPlugin(nvinfer1::PluginFieldCollection const* fields);

  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override;
  int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
  int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                  void const* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

 private:
  float mAlpha;
  nvinfer1::PluginField mSerialized;
  nvinfer1::PluginFieldCollection mSerializedCollection{};
};

using SignBitPredictorPluginCreator = PluginCreator<SignBitPredictorPlugin>;

}  // namespace edge_sdk::trt

#endif
