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
  // int32 mask (OPS.md): TensorRT 10.3 refuses kBOOL and kUINT8 plugin outputs (getOutputDataTypes)
  static constexpr PluginSignature kSignature{2, "x, packed", nullptr, "mask", nvinfer1::DataType::kINT32};
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates alpha; throws PluginError.
  explicit SignBitPredictorPlugin(nvinfer1::PluginFieldCollection const* fields);

  // PluginBase's hooks (plugin_common.h); no workspace
  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder& exprBuilder) const;
  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const;
  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const;
  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const;
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;

 private:
  float mAlpha;
};

using SignBitPredictorPluginCreator = PluginCreator<SignBitPredictorPlugin>;

}  // namespace edge_sdk::trt

#endif
