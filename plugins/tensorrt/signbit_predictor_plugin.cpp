// SignBitPredictor: the sign-bit predictor (DESIGN 3.2, SparseInfer), calling edge_signbit_predictor.
// Inputs: x [T, d] (fp32/fp16/bf16), packed [D, ceil(d/32)] int32. Output: mask [T, D] int32 (1 = active).
// Attribute: alpha (float32, finite, > 0).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"

namespace edge_sdk::trt {
namespace {

constexpr char kAlphaField[] = "alpha";
constexpr int kBitsPerWord = 32;

enum Input { kX = 0, kPacked };

class SignBitPredictorPlugin : public PluginBase<SignBitPredictorPlugin> {
 public:
  static constexpr char const* kName = kSignBitPredictorName;
  // int32 mask (OPS.md): TensorRT 10.3 refuses kBOOL and kUINT8 plugin outputs (getOutputDataTypes)
  static constexpr PluginSignature kSignature{2, "x, packed", nullptr, "mask", nvinfer1::DataType::kINT32};

  static std::vector<nvinfer1::PluginField> fieldNames() {
    return {nvinfer1::PluginField(kAlphaField, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1)};
  }

  // Validates alpha; throws PluginError.
  explicit SignBitPredictorPlugin(nvinfer1::PluginFieldCollection const* fields) {
    Attributes const attributes(fields, {kAlphaField});
    std::optional<float> const alpha = attributes.getFloat(kAlphaField);
    if (!alpha) throw PluginError("attribute 'alpha' is required, found none");
    if (!std::isfinite(*alpha) || *alpha <= 0.0f) {
      throw PluginError("attribute 'alpha': expected a finite value > 0, found " + formatFloat(*alpha));
    }
    mAlpha = *alpha;
  }

  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder&) const {
    return tokensByRows(inputs, kPacked, "packed");  // mask: [T, D]
  }

  bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const {
    nvinfer1::DataType const type = inOut[pos].desc.type;
    return pos == kX ? isFloatType(type) : type == nvinfer1::DataType::kINT32;  // packed
  }

  void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t) const {
    nvinfer1::Dims const& x = in[kX].desc.dims;
    nvinfer1::Dims const& packed = in[kPacked].desc.dims;
    expectRank("x", x, 2);
    expectRank("packed", packed, 2);
    int64_t const words = x.d[1] < 0 ? -1 : (x.d[1] + kBitsPerWord - 1) / kBitsPerWord;
    expectDim("input 'packed' columns (ceil(d / 32), d from x)", words, packed.d[1]);
  }

  // No workspace: each block packs x's sign bits into shared memory.
  void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output, void*,
              cudaStream_t stream) const {
    int const tokens = checkedDim("x", inputDesc[kX].dims.d[0]);
    int const d = checkedDim("x", inputDesc[kX].dims.d[1]);
    int const n_neurons = checkedDim("packed", inputDesc[kPacked].dims.d[0]);
    if (tokens == 0) return;
    cudaError_t const status =
        edge_signbit_predictor(stream, inputs[kX], cudaDtype(inputDesc[kX].type), tokens, d, n_neurons,
                               static_cast<int32_t const*>(inputs[kPacked]), mAlpha, static_cast<int32_t*>(output));
    expectLaunched("edge_signbit_predictor", status);
  }

  void addFields(std::vector<nvinfer1::PluginField>& fields) const {
    fields.emplace_back(kAlphaField, &mAlpha, nvinfer1::PluginFieldType::kFLOAT32, 1);
  }

 private:
  float mAlpha;
};

}  // namespace

nvinfer1::IPluginCreatorV3One* signBitPredictorCreator() {
  static PluginCreator<SignBitPredictorPlugin> creator;
  return &creator;
}

}  // namespace edge_sdk::trt
