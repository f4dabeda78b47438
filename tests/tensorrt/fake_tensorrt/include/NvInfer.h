/* The fake TensorRT of tests/tensorrt (fake_tensorrt/README.md): the part of TensorRT 10.3's runtime API that
 * jetson/src/trt_engine.cpp uses, with TensorRT's names, enumerator values and method signatures, as plain virtual
 * interfaces that fake_tensorrt.cpp implements. Not TensorRT's ABI: only a libedge_sdk compiled against this header
 * runs on the fake library. That trt_engine.cpp compiles against TensorRT's own headers is checked separately
 * (tests/jetson/test_trt_engine_build.py, $TENSORRT_INCLUDE_DIR). */
#ifndef EDGE_FAKE_NV_INFER_H
#define EDGE_FAKE_NV_INFER_H

#include <cstddef>
#include <cstdint>

#include "NvInferVersion.h"
#include "cuda_runtime_api.h"

namespace nvinfer1 {

enum class DataType : int32_t {
  kFLOAT = 0,
  kHALF = 1,
  kINT8 = 2,
  kINT32 = 3,
  kBOOL = 4,
  kUINT8 = 5,
  kFP8 = 6,
  kBF16 = 7,
  kINT64 = 8,
  kINT4 = 9,
};

class Dims64 {
 public:
  static constexpr int32_t MAX_DIMS{8};
  int32_t nbDims;
  int64_t d[MAX_DIMS];
};
using Dims = Dims64;

class ILogger {
 public:
  enum class Severity : int32_t { kINTERNAL_ERROR = 0, kERROR = 1, kWARNING = 2, kINFO = 3, kVERBOSE = 4 };
  virtual void log(Severity severity, char const *msg) noexcept = 0;
  ILogger() = default;
  virtual ~ILogger() = default;

 protected:
  ILogger(ILogger const &) = default;
  ILogger &operator=(ILogger const &) & = default;
};

enum class ExecutionContextAllocationStrategy : int32_t { kSTATIC = 0, kON_PROFILE_CHANGE = 1, kUSER_MANAGED = 2 };

class IExecutionContext {
 public:
  virtual ~IExecutionContext() noexcept = default;
  virtual void setDeviceMemoryV2(void *memory, int64_t size) noexcept = 0;
  virtual bool setInputShape(char const *tensorName, Dims const &dims) noexcept = 0;
  virtual Dims getTensorShape(char const *tensorName) const noexcept = 0;
  virtual bool allInputDimensionsSpecified() const noexcept = 0;
  virtual bool setOptimizationProfileAsync(int32_t profileIndex, cudaStream_t stream) noexcept = 0;
  virtual bool setTensorAddress(char const *tensorName, void *data) noexcept = 0;
  virtual bool enqueueV3(cudaStream_t stream) noexcept = 0;
};

class ICudaEngine {
 public:
  virtual ~ICudaEngine() noexcept = default;
  virtual DataType getTensorDataType(char const *tensorName) const noexcept = 0;
  virtual IExecutionContext *createExecutionContext(
      ExecutionContextAllocationStrategy strategy = ExecutionContextAllocationStrategy::kSTATIC) noexcept = 0;
  virtual int64_t getDeviceMemorySizeForProfileV2(int32_t profileIndex) const noexcept = 0;
  virtual int32_t getNbOptimizationProfiles() const noexcept = 0;
  virtual int32_t getNbIOTensors() const noexcept = 0;
  virtual char const *getIOTensorName(int32_t index) const noexcept = 0;
};

class IRuntime {
 public:
  virtual ~IRuntime() noexcept = default;
  virtual ICudaEngine *deserializeCudaEngine(void const *blob, std::size_t size) noexcept = 0;
};

class IPluginRegistry {
 public:
  using PluginLibraryHandle = void *;
  virtual PluginLibraryHandle loadLibrary(char const *pluginPath) noexcept = 0;

 protected:
  virtual ~IPluginRegistry() noexcept = default;
};

}  // namespace nvinfer1

extern "C" int32_t getInferLibVersion() noexcept;
extern "C" void *createInferRuntime_INTERNAL(void *logger, int32_t version) noexcept;
extern "C" nvinfer1::IPluginRegistry *getPluginRegistry() noexcept;

namespace nvinfer1 {
inline IRuntime *createInferRuntime(ILogger &logger) noexcept {
  return static_cast<IRuntime *>(createInferRuntime_INTERNAL(&logger, NV_TENSORRT_VERSION));
}
}  // namespace nvinfer1

#endif
