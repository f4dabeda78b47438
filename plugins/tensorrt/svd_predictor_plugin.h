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
  // int32 mask (OPS.md): TensorRT 10.3 refuses kBOOL and kUINT8 plugin outputs (getOutputDataTypes)
  static constexpr PluginSignature kSignature{4, "x, a, b, bias", nullptr, "mask", nvinfer1::DataType::kINT32};
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Rejects any attribute; throws PluginError.
  explicit SvdPredictorPlugin(nvinfer1::PluginFieldCollection const* fields);

  // PluginBase's hooks (plugin_common.h)
  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder& exprBuilder) const;
  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const;
  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const;
  size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept;
  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const;
};

using SvdPredictorPluginCreator = PluginCreator<SvdPredictorPlugin>;

}  // namespace edge_sdk::trt

#endif
