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
  static constexpr PluginSignature kSignature{3, "x, w, w_scales", nullptr, "y", nvinfer1::DataType::kFLOAT};
  static std::vector<nvinfer1::PluginField> fieldNames();

  // Validates the attributes; throws PluginError.
  explicit QuantizedMatMulPlugin(nvinfer1::PluginFieldCollection const* fields);

  // PluginBase's hooks (plugin_common.h); no workspace
  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder& exprBuilder) const;
  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const;
  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const;
  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const;
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;

 private:
  QuantLayout mLayout{};
  int32_t mTransposed = 1;  // 1: W [N, K], y = x W^T; 0: W [K, N], y = x W
};

using QuantizedMatMulPluginCreator = PluginCreator<QuantizedMatMulPlugin>;

}  // namespace edge_sdk::trt

#endif
