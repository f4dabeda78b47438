// SparseFfnPluginBase: what SparseFFN (sparse_ffn_plugin.cpp) and QuantizedSparseFFN (quantized_sparse_ffn_plugin.cpp)
// share.
#ifndef EDGE_SDK_TRT_SPARSE_FFN_PLUGIN_BASE_H
#define EDGE_SDK_TRT_SPARSE_FFN_PLUGIN_BASE_H

#include <cstdint>
#include <string>

#include "edge_cuda_kernels.h"
#include "plugin_common.h"

namespace edge_sdk::trt {

// What SparseFFN and QuantizedSparseFFN share around their weights: input 0 is x [T, d]; the weight inputs follow,
// the first (w_gate, or its codes) with D rows; mask [T, D] int32 is the last required input of Derived::kSignature
// and thresholds [D] fp32 the input after it, optional there (an asymmetric QuantizedSparseFFN's signature() always
// has it, and its minimums after it); y is [T, d] fp32, and both launchers take the same workspace.
template <typename Derived>
class SparseFfnPluginBase : public PluginBase<Derived> {
 public:
  // PluginBase's hooks (plugin_common.h)
  nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder&) const {
    if (inputs[kXInput].nbDims != 2) {
      throw PluginError("input 'x': expected 2 dimensions [T, d], found " + std::to_string(inputs[kXInput].nbDims));
    }
    return inputs[kXInput];  // y: [T, d]
  }

  size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept {
    if (nbInputs < Derived::kSignature.nbInputs) return 0;
    int64_t const tokens = inputs[kXInput].max.d[0];
    int64_t const d = inputs[kXInput].max.d[1];
    int64_t const n_neurons = inputs[kGateInput].max.d[0];
    if (tokens > INT32_MAX || d > INT32_MAX || n_neurons > INT32_MAX) return 0;
    return edge_sparse_ffn_workspace_size(static_cast<int>(d), static_cast<int>(n_neurons), static_cast<int>(tokens));
  }

 protected:
  // expectShapes' checks of mask and thresholds against x [T, d] and D (-1 where a dimension is not known yet).
  static void expectMaskAndThresholds(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                      nvinfer1::Dims const& x, int64_t n_neurons) {
    int32_t const maskInput = Derived::kSignature.nbInputs - 1;
    nvinfer1::Dims const& mask = in[maskInput].desc.dims;
    expectRank("mask", mask, 2);
    expectDim("input 'mask' rows (T, as x)", x.d[0], mask.d[0]);
    expectDim("input 'mask' columns (D, as w_gate)", n_neurons, mask.d[1]);
    if (nbInputs > Derived::kSignature.nbInputs) {
      nvinfer1::Dims const& thresholds = in[maskInput + 1].desc.dims;
      expectRank("thresholds", thresholds, 1);
      expectDim("input 'thresholds' length (D, as w_gate)", n_neurons, thresholds.d[0]);
    }
  }

  // What enqueue passes the launcher besides x, the weights and mask.
  struct StepArguments {
    int tokens;
    int d;
    int n_neurons;
    float const* thresholds;  // nullptr: the node has none
  };
  StepArguments stepArguments(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs) const {
    float const* thresholds = static_cast<float const*>(this->optionalInput(inputs));
    return {checkedDim("x", inputDesc[kXInput].dims.d[0]), checkedDim("x", inputDesc[kXInput].dims.d[1]),
            checkedDim("w_gate", inputDesc[kGateInput].dims.d[0]), thresholds};
  }

 private:
  static constexpr int32_t kXInput = 0;
  static constexpr int32_t kGateInput = 1;
};

}  // namespace edge_sdk::trt

#endif
