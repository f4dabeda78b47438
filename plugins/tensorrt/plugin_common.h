// What the three edge-sdk TensorRT plugins share: their names, version and namespace (the one place they are
// written), error reporting through TensorRT's logger, reading attributes from a PluginFieldCollection, and
// the IPluginV3 / IPluginCreatorV3One boilerplate. The plugins only validate, compute shapes and types, and
// call the launchers of plugins/kernels/edge_cuda_kernels.h.
#ifndef EDGE_SDK_TRT_PLUGIN_COMMON_H
#define EDGE_SDK_TRT_PLUGIN_COMMON_H

#include <NvInferRuntime.h>

#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace edge_sdk::trt {

// The ONNX nodes' op types and plugin attributes (edge_sdk/bundle/graph_ops.py: PLUGIN_VERSION, PLUGIN_NAMESPACE).
inline constexpr char kPluginVersion[] = "1";
inline constexpr char kPluginNamespace[] = "edge_sdk";
inline constexpr char kSvdPredictorName[] = "SvdPredictor";
inline constexpr char kSignBitPredictorName[] = "SignBitPredictor";
inline constexpr char kSparseFfnName[] = "SparseFFN";

// An invalid attribute, shape or type; the message names the item, the expected and the found value (logError
// prefixes the op).
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Keeps the logger finder TensorRT hands the library through setLoggerFinder().
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

// Logs "edge_sdk <op>: <message>" as an error through TensorRT's logger (stderr when there is none).
void logError(char const* op, char const* message) noexcept;

// The enum edge_cuda_dtype value of a TensorRT float type, or -1 for any other type.
int cudaDtype(nvinfer1::DataType type) noexcept;
bool isFloatType(nvinfer1::DataType type) noexcept;

// A float as the shortest decimal that reads back as the same float32 (for messages).
std::string formatFloat(float value);

// A dimension as int, throwing PluginError naming the tensor when it is negative or does not fit.
int checkedDim(char const* tensor, int64_t value);

// Build-time checks on DynamicPluginTensorDesc::desc.dims, where -1 marks a runtime dimension; they throw
// PluginError. expectDim skips the comparison when either value is -1.
void expectRank(char const* tensor, nvinfer1::Dims const& dims, int32_t rank);
void expectDim(char const* what, int64_t expected, int64_t found);

// The attributes of one op, read from a PluginFieldCollection (the ONNX parser's or the serialized fields).
// Unknown names are an error: the parser only passes the names getFieldNames() lists.
class Attributes {
 public:
  Attributes(nvinfer1::PluginFieldCollection const* fields, std::vector<std::string> const& known);
  std::optional<float> getFloat(char const* name) const;
  std::optional<std::string> getString(char const* name) const;

 private:
  nvinfer1::PluginField const* find(char const* name) const;
  nvinfer1::PluginFieldCollection const* mFields;
};

// IPluginV3 with its three capabilities in one object. Derived provides kName, a copy constructor (clone and
// attachToContext copy the object), the shape/type/format methods, configurePlugin, getWorkspaceSize, enqueue
// and getFieldsToSerialize.
template <typename Derived>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kBUILD:
        return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME:
        return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
      case nvinfer1::PluginCapabilityType::kCORE:
        return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    }
    return nullptr;
  }

  nvinfer1::IPluginV3* clone() noexcept override {
    try {
      return new Derived(static_cast<Derived const&>(*this));
    } catch (std::exception const& error) {
      logError(Derived::kName, error.what());
      return nullptr;
    }
  }

  char const* getPluginName() const noexcept override { return Derived::kName; }
  char const* getPluginVersion() const noexcept override { return kPluginVersion; }
  char const* getPluginNamespace() const noexcept override { return kPluginNamespace; }
  int32_t getNbOutputs() const noexcept override { return 1; }

  int32_t onShapeChange(nvinfer1::PluginTensorDesc const*, int32_t, nvinfer1::PluginTensorDesc const*,
                        int32_t) noexcept override {
    return 0;
  }

  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }

 protected:
  // Runs a build-time check that throws PluginError; returns 0, or logs the error and returns 1.
  template <typename Check>
  static int32_t reportFailure(Check&& check) noexcept {
    try {
      check();
      return 0;
    } catch (std::exception const& error) {
      logError(Derived::kName, error.what());
      return 1;
    }
  }
};

// The creator of Plugin: Plugin::fieldNames() lists the attributes the ONNX parser should pass, and the
// constructor Plugin(PluginFieldCollection const*) validates them (throwing PluginError).
template <typename Plugin>
class PluginCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  PluginCreator() : mFieldNames(Plugin::fieldNames()) {
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
  }

  char const* getPluginName() const noexcept override { return Plugin::kName; }
  char const* getPluginVersion() const noexcept override { return kPluginVersion; }
  char const* getPluginNamespace() const noexcept override { return kPluginNamespace; }
  nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &mFieldCollection; }

  nvinfer1::IPluginV3* createPlugin(char const*, nvinfer1::PluginFieldCollection const* fields,
                                    nvinfer1::TensorRTPhase) noexcept override {
    try {
      return new Plugin(fields);
    } catch (std::exception const& error) {
      logError(Plugin::kName, error.what());
      return nullptr;
    }
  }

 private:
  std::vector<nvinfer1::PluginField> mFieldNames;
  nvinfer1::PluginFieldCollection mFieldCollection{};
};

}  // namespace edge_sdk::trt

#endif
