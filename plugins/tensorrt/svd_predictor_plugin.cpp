// SvdPredictor: the low-rank predictor mask = ((x b^T) a^T + bias) > 0 (DESIGN 3.2), calling edge_svd_predictor.
// Inputs: x [T, d] (fp32/fp16/bf16), a [D, r], b [r, d] (both fp32 or both fp16: edge_svd_predictor_f16), bias
// [D] (fp32). Output: mask [T, D] int32 (1 = active).
// No attributes besides plugin_version / plugin_namespace, which the parser uses to find the creator.
#include <cstdint>
#include <string>
#include <vector>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"

namespace edge_sdk::trt {
namespace {

enum Input { kX = 0, kA, kB, kBias };

class SvdPredictorPlugin : public PluginBase<SvdPredictorPlugin> {
 public:
  static constexpr char const* kName = kSvdPredictorName;
  // int32 mask (OPS.md): TensorRT 10.3 refuses kBOOL and kUINT8 plugin outputs (getOutputDataTypes)
  static constexpr PluginSignature kSignature{4, "x, a, b, bias", nullptr, "mask", nvinfer1::DataType::kINT32};

  static std::vector<nvinfer1::PluginField> fieldNames() { return {}; }

  // Rejects any attribute; throws PluginError.
  explicit SvdPredictorPlugin(nvinfer1::PluginFieldCollection const* fields) { Attributes(fields, {}); }

  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder&) const {
    return tokensByRows(inputs, kA, "a");  // mask: [T, D]
  }

  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
    nvinfer1::DataType const type = inOut[pos].desc.type;
    if (pos == kX) return isFloatType(type);
    // a: fp32, or fp16 (the F16 factors of bundles whose weights are not fp32); b: a's type; bias: fp32
    if (pos == kA) return type == nvinfer1::DataType::kFLOAT || type == nvinfer1::DataType::kHALF;
    if (pos == kB) return type == inOut[kA].desc.type;
    return type == nvinfer1::DataType::kFLOAT;
  }

  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
    nvinfer1::Dims const& x = in[kX].desc.dims;
    nvinfer1::Dims const& a = in[kA].desc.dims;
    nvinfer1::Dims const& b = in[kB].desc.dims;
    expectRank("x", x, 2);
    expectRank("a", a, 2);
    expectRank("b", b, 2);
    expectRank("bias", in[kBias].desc.dims, 1);
    expectDim("input 'b' columns (d, as x)", x.d[1], b.d[1]);
    expectDim("input 'b' rows (r, as a's columns)", a.d[1], b.d[0]);
    expectDim("input 'bias' length (D, as a's rows)", a.d[0], in[kBias].desc.dims.d[0]);
  }

  size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept {
    if (nbInputs != kSignature.nbInputs) return 0;
    // scratch = x b^T: [T, r] floats
    return static_cast<size_t>(inputs[kX].max.d[0]) * static_cast<size_t>(inputs[kA].max.d[1]) * sizeof(float);
  }

  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void* workspace,
              cudaStream_t stream) const {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_neurons = checkedDim("a", inputDesc[kA].dims.d[0]);
    int const rank = checkedDim("a", inputDesc[kA].dims.d[1]);
    if (tokens == 0) return;
    auto const* bias = static_cast<float const*>(inputs[kBias]);
    auto* mask = static_cast<int32_t*>(output);
    auto* scratch = static_cast<float*>(workspace);
    int const x_dtype = cudaDtype(inputDesc[kX].type);
    if (inputDesc[kA].type == nvinfer1::DataType::kHALF) {
      expectLaunched("edge_svd_predictor_f16",
                     edge_svd_predictor_f16(stream, inputs[kX], x_dtype, tokens, d, n_neurons, rank, inputs[kA],
                                            inputs[kB], bias, mask, scratch));
      return;
    }
    expectLaunched("edge_svd_predictor",
                   edge_svd_predictor(stream, inputs[kX], x_dtype, tokens, d, n_neurons, rank,
                                      static_cast<float const*>(inputs[kA]), static_cast<float const*>(inputs[kB]),
                                      bias, mask, scratch));
  }
};

}  // namespace

nvinfer1::IPluginCreatorV3One* svdPredictorCreator() {
  static PluginCreator<SvdPredictorPlugin> creator;
  return &creator;
}

}  // namespace edge_sdk::trt
