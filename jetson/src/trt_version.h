/* The TensorRT version in an engine cache key (trt_engine.cpp, the only place the key is computed, for the engine
 * `edge-sdk build` writes and the one the C engine reads): MAJOR.MINOR.PATCH of the library, never the build number.
 * JetPack 6.1 and 6.2 ship TensorRT 10.3.0.30, whose Python bindings report "10.3.0.30" while getInferLibVersion()
 * returns 100300: cache layout 2 keyed both as 10.3.0, and engines cached then are found under the same key. */
#ifndef EDGE_SDK_TRT_VERSION_H
#define EDGE_SDK_TRT_VERSION_H

#include <cstdint>
#include <string>

/* getInferLibVersion() as "M.m.p": TensorRT 10 encodes it as MAJOR * 10000 + MINOR * 100 + PATCH
 * (NvInferRuntimeBase.h 10.3: NV_TENSORRT_VERSION = NV_TENSORRT_VERSION_INT(major, minor, patch)), so 100300 is
 * 10.3.0 and 101303 is 10.13.3. */
inline std::string tensorrt_version(int32_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

#endif
