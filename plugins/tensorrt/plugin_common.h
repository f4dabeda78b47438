// What the edge-sdk TensorRT plugins share: their names, version and namespace (the one place they are written),
// error reporting through TensorRT's logger, reading and validating attributes from a PluginFieldCollection (the
// gate activation and the quantized weight layout, which several plugins take), every IPluginV3 override
// (PluginBase) and the IPluginCreatorV3One (PluginCreator). A plugin only validates, computes shapes and types, and
// calls a launcher of plugins/kernels/edge_cuda_kernels.h.
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
inline constexpr char kQuantizedSparseFfnName[] = "QuantizedSparseFFN";
inline constexpr char kQuantizedMatMulName[] = "QuantizedMatMul";

// The creators TensorRT gets from getCreators (plugin_library.cpp), one in each <op>_plugin.cpp, where the plugin
// class itself is private.
nvinfer1::IPluginCreatorV3One* svdPredictorCreator();
nvinfer1::IPluginCreatorV3One* signBitPredictorCreator();
nvinfer1::IPluginCreatorV3One* sparseFfnCreator();
nvinfer1::IPluginCreatorV3One* quantizedSparseFfnCreator();
nvinfer1::IPluginCreatorV3One* quantizedMatMulCreator();

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

// The output shape [T, R] from x [T, d] (input 0) and input `other` [R, ...], named `otherName` in the message;
// throws PluginError unless both are 2-D.
nvinfer1::DimsExprs tokensByRows(nvinfer1::DimsExprs const* inputs, int32_t other, char const* otherName);

// Throws PluginError "<launcher>: <CUDA's error string>" unless status is cudaSuccess.
void expectLaunched(char const* launcher, cudaError_t status);

// The attributes of one op, read from a PluginFieldCollection (the ONNX parser's or the serialized fields).
// Unknown names are an error: the parser only passes the names getFieldNames() lists.
class Attributes {
 public:
  Attributes(nvinfer1::PluginFieldCollection const* fields, std::vector<std::string> const& known);
  std::optional<float> getFloat(char const* name) const;
  std::optional<int32_t> getInt(char const* name) const;
  std::optional<std::string> getString(char const* name) const;

 private:
  nvinfer1::PluginField const* find(char const* name) const;
  nvinfer1::PluginFieldCollection const* mFields;
};

// The gate activation of the FFN plugins: attributes `activation` (relu, fatrelu, drelu, silu; required) and
// `activation_threshold` (fatrelu's t: finite, >= 0, and 0 for the other activations; default 0).
struct GateActivation {
  static constexpr char kField[] = "activation";
  static constexpr char kThresholdField[] = "activation_threshold";
  std::string name;
  int value;  // enum edge_activation
  float threshold;

  // Reads and validates the two attributes; throws PluginError.
  static GateActivation read(Attributes const& attributes);
  static void addFieldNames(std::vector<nvinfer1::PluginField>& fields);
  // The two fields pointing into this object, the string counting its NUL as the ONNX parser's do.
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;
};

// How a quantized matrix is stored (kernels/cpu/QUANT.md): attributes `weight_format` ("int8", "int4" or
// "int4_asymmetric", required) and `group_size` (32, 64 or 128, required). The codes cross TensorRT as INT32 words
// holding the bundle's bytes: 4 int8 codes or 8 int4 nibbles per word. "int4_asymmetric" is int4 whose matrices also
// have fp16 group minimums (value (code + 8) * scale + min), an input of their own beside the scales.
struct QuantLayout {
  static constexpr char kFormatField[] = "weight_format";
  static constexpr char kGroupSizeField[] = "group_size";
  std::string formatName;
  int format;  // enum edge_quant_format
  int32_t groupSize;
  bool asymmetric;  // the matrices have group minimums

  static QuantLayout read(Attributes const& attributes);
  static void addFieldNames(std::vector<nvinfer1::PluginField>& fields);
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;
  int64_t valuesPerWord() const;
  // Build-time checks of one matrix [rows, cols] given as codes [rows, cols / valuesPerWord()] INT32 and scales
  // [rows, cols / groupSize] (and, asymmetric, minimums `mins` of the scales' shape; nullptr otherwise): ranks, rows
  // against `rows`, widths against cols (each skipped where a value is -1), and cols a multiple of groupSize.
  // `matrix` names it in messages (e.g. "w_gate").
  void expectMatrix(char const* matrix, nvinfer1::Dims const& codes, nvinfer1::Dims const& scales,
                    nvinfer1::Dims const* mins, int64_t rows, int64_t cols) const;
};

// QuantizedSparseFFN's optional attribute `down_weight_format` (OPS.md): the FFN down projection's storage where it
// differs from weight_format. Absent (an engine built before the attribute existed, or today's nodes): the down rows
// are in weight_format. The only value is "int8", and only with weight_format "int4" or "int4_asymmetric": int8 codes
// [D, d / 4] INT32 words with fp16 scales of the group size, and no minimums (int8 is symmetric).
struct DownWeightFormat {
  static constexpr char kField[] = "down_weight_format";
  std::optional<std::string> name;  // nullopt: weight_format's

  // Reads and validates the attribute against the other matrices' layout; throws PluginError.
  static DownWeightFormat read(Attributes const& attributes, QuantLayout const& layout);
  static void addFieldNames(std::vector<nvinfer1::PluginField>& fields);
  // The field pointing into this object, only when the attribute was given (so a node without it serializes as before).
  void addFields(std::vector<nvinfer1::PluginField>& fields) const;
  // The down rows' layout: `layout` itself, or int8 codes of its group size without minimums.
  QuantLayout downLayout(QuantLayout const& layout) const;
};

// The tensors of a plugin, for the count checks and their messages: `nbInputs` inputs, named `inputs`, then one
// more, `optionalInput`, which a node may leave out (nullptr: none); one output, `output`, of type `outputType`.
struct PluginSignature {
  int32_t nbInputs;
  char const* inputs;
  char const* optionalInput;
  char const* output;
  nvinfer1::DataType outputType;
};

// Throws PluginError unless there are nbInputs (or, with the optional input, nbInputs + 1) inputs and one output.
void expectCounts(PluginSignature const& signature, int32_t nbInputs, int32_t nbOutputs);

// IPluginV3 with its three capabilities in one object. Every TensorRT override is written here, once: each is
// noexcept, and turns a PluginError into an error in TensorRT's log and a failure status. Derived has a copy
// constructor (clone and attachToContext copy the object) and these members, the functions throwing PluginError:
//   static constexpr char const* kName;                 the op type
//   static constexpr PluginSignature kSignature;        its inputs and output (unless signature() is hidden)
//   nvinfer1::DimsExprs outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::IExprBuilder& exprBuilder) const;
//   bool supportsInputType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut) const;
//       whether input pos may have type inOut[pos].desc.type (linear formats only, and the output's type, are
//       checked here)
//   void expectShapes(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs) const;
//       configurePlugin's checks of the inputs' dimensions against each other (their count is checked here)
//   void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* output,
//               void* workspace, cudaStream_t stream) const;
//       enqueue: reads the dimensions and calls the CUDA launcher
// and, where it needs them, these three, which hide the defaults below (kSignature, no workspace, no attributes):
//   PluginSignature const& signature() const;   the inputs of this plugin, where its attributes decide them
//   size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept;
//   void addFields(std::vector<nvinfer1::PluginField>& fields) const;   the attributes to serialize, pointing into
//                                                                        the plugin
template <typename Derived>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  // IPluginV3
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
      return new Derived(derived());
    } catch (std::exception const& error) {
      logError(Derived::kName, error.what());
      return nullptr;
    }
  }

  // IPluginV3OneCore
  char const* getPluginName() const noexcept override { return Derived::kName; }
  char const* getPluginVersion() const noexcept override { return kPluginVersion; }
  char const* getPluginNamespace() const noexcept override { return kPluginNamespace; }

  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return 1; }

  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const*,
                             int32_t nbInputs) const noexcept override {
    return reportFailure([&] {
      expectCounts(derived().signature(), nbInputs, nbOutputs);
      outputTypes[0] = derived().signature().outputType;
    });
  }

  int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const*, int32_t,
                          nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override {
    return reportFailure([&] {
      expectCounts(derived().signature(), nbInputs, nbOutputs);
      outputs[0] = derived().outputShape(inputs, exprBuilder);
    });
  }

  bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                 int32_t) noexcept override {
    nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != nvinfer1::TensorFormat::kLINEAR) return false;
    if (pos >= nbInputs) return pos == nbInputs && desc.type == derived().signature().outputType;
    return derived().supportsInputType(pos, inOut);
  }

  int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept override {
    return reportFailure([&] {
      expectCounts(derived().signature(), nbInputs, nbOutputs);
      derived().expectShapes(in, nbInputs);
      mNbInputs = nbInputs;
    });
  }

  size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                          nvinfer1::DynamicPluginTensorDesc const*, int32_t) const noexcept override {
    return derived().workspaceSize(inputs, nbInputs);
  }

  // IPluginV3OneRuntime
  int32_t onShapeChange(nvinfer1::PluginTensorDesc const*, int32_t nbInputs, nvinfer1::PluginTensorDesc const*,
                        int32_t nbOutputs) noexcept override {
    return reportFailure([&] {
      expectCounts(derived().signature(), nbInputs, nbOutputs);
      mNbInputs = nbInputs;
    });
  }

  int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const*,
                  void const* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override {
    return reportFailure([&] { derived().launch(inputDesc, inputs, outputs[0], workspace, stream); });
  }

  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }

  nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override {
    // The fields point into this object, so they are rebuilt here rather than copied with it.
    bool const built = reportFailure([&] {
      mSerialized.clear();
      derived().addFields(mSerialized);
    }) == 0;
    mSerializedCollection.nbFields = built ? static_cast<int32_t>(mSerialized.size()) : 0;
    mSerializedCollection.fields = mSerialized.data();
    return built ? &mSerializedCollection : nullptr;
  }

  // The defaults of the optional hooks: the inputs of kSignature, no workspace, no attributes.
  PluginSignature const& signature() const { return Derived::kSignature; }
  size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const*, int32_t) const noexcept { return 0; }
  void addFields(std::vector<nvinfer1::PluginField>&) const {}

 protected:
  // The buffer of kSignature's optional input, the input after its required ones, or nullptr when the node has none
  // (a signature() with more inputs keeps it there). Throws PluginError while the input count is not known yet
  // (configurePlugin and onShapeChange give it).
  void const* optionalInput(void const* const* inputs) const {
    if (mNbInputs == 0) throw PluginError("enqueue before the input count was known (no onShapeChange)");
    return mNbInputs > Derived::kSignature.nbInputs ? inputs[Derived::kSignature.nbInputs] : nullptr;
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  Derived const& derived() const { return static_cast<Derived const&>(*this); }

  // Runs a check that throws PluginError; returns 0, or logs the error and returns 1.
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

  int32_t mNbInputs = 0;  // known from configurePlugin / onShapeChange
  std::vector<nvinfer1::PluginField> mSerialized;
  nvinfer1::PluginFieldCollection mSerializedCollection{};
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
