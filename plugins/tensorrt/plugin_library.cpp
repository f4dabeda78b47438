// The library's entry points for IPluginRegistry::loadLibrary and trtexec --dynamicPlugins: the creators
// (getCreators) and the logger (setLoggerFinder). Nothing registers itself statically: TensorRT registers the
// creators once, under their namespace, when it loads the library. Everything is compiled with hidden
// visibility, and edge_trt_plugins.map also hides what the C++ library's templates would export, so these two
// symbols are all the library exports.
#include <NvInferRuntime.h>

#include "plugin_common.h"

#define EDGE_TRT_EXPORT __attribute__((visibility("default")))

extern "C" EDGE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  edge_sdk::trt::setLoggerFinder(finder);
}

extern "C" EDGE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  using namespace edge_sdk::trt;
  static nvinfer1::IPluginCreatorInterface* const creators[] = {svdPredictorCreator(), signBitPredictorCreator(),
                                                                sparseFfnCreator(), quantizedSparseFfnCreator(),
                                                                quantizedMatMulCreator()};
  nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
  return creators;
}
