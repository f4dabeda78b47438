// QuantizedMatMul: y = x W^T for a group-wise quantized W [N, K] (transposed = 1: a projection, the LM head, a prompt's
// gate and up; edge_matvec_q), or y = x W for W [K, N] (transposed = 0: a prompt's neuron-major down projection;
// edge_matvec_q_t). Inputs: x [T, K] (fp32/fp16/bf16), W's codes as INT32 words [rows, cols / v] (v = 4 for int8, 8
// for int4), the bundle's bytes, and its scales [rows, cols / G] fp16; groups run along W's rows. Output: y [T, N]
// fp32. Attributes: weight_format, group_size, transposed (default 1). A bias is the graph's own Add.
#ifndef EDGE_SDK_TRT_QUANTIZED_MATMUL_PLUGIN_H
#define EDGE_SDK_TRT_QUANTIZED_MATMUL_PLUGIN_H

#include <vector>

#include "plugin_common.h"

namespace edge_sdk::trt {

class QuantizedMatMulPlugin : public PluginBase<QuantizedMatMulPlugin> {
 public:
  static constexpr char const* kName = kQuantizedMatMulName;
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates the attributes; throws PluginError.
  explicit QuantizedMatMulPlugin(nvinfer1::PluginFieldCollection const* fields);

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
  QuantLayout mLayout{};
  int32_t mTransposed = 1;  // 1: W [N, K], y = x W^T; 0: W [K, N], y = x W
  std::vector<nvinfer1::PluginField> mSerialized;
  nvinfer1::PluginFieldCollection mSerializedCollection{};
};

using QuantizedMatMulPluginCreator = PluginCreator<QuantizedMatMulPlugin>;

}  // namespace edge_sdk::trt

#endif
