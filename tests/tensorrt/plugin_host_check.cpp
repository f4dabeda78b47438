// Host-side check of libedge_trt_plugins.so without a GPU and without libnvinfer: loads the library the way
// IPluginRegistry::loadLibrary does (dlopen, setLoggerFinder, getCreators) and drives the creators and plugins
// through TensorRT's interfaces: names, attribute validation and its messages, formats, output types and shapes,
// build-time shape checks, workspace sizes, serialization round trips. Compiled and run by
// test_plugin_library.py against the TensorRT headers; prints one line per failed check, exits 1 if any failed.
// Given a nodes file, it also makes the plugin of every custom node of an exported graph as TensorRT's ONNX parser
// would, and checks that it takes the node's inputs and gives the type the graph declares (checkGraphNode).
// QuantizedSparseFFN's enqueue is checked against edge_sparse_ffn_q interposed here (the program is linked with
// -rdynamic, so the plugin library's reference binds to this program's definition): the arguments it passes, nothing
// launched.
//
//   plugin_host_check <libedge_trt_plugins.so> <libedge_cuda_kernels.so> [nodes file]
#include <NvInferRuntime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace nvinfer1;

// enqueue's call of edge_sparse_ffn_q (plugins/kernels/edge_cuda_kernels.h), recorded by the definition below.
struct SparseFfnQCall {
  int calls;
  void const* codes[3];  // w_gate, w_up, w_down_t
  uint16_t const* scales[3];
  uint16_t const* mins[3];
  int quantFormat;
  int downFormat;
  int groupSize;
  int32_t const* mask;
  float const* thresholds;
};
SparseFfnQCall gSparseFfnQCall{};

extern "C" __attribute__((visibility("default"))) cudaError_t edge_sparse_ffn_q(
    cudaStream_t, void const*, int, int, int, int, void const* w_gate, uint16_t const* gate_scales,
    uint16_t const* gate_mins, void const* w_up, uint16_t const* up_scales, uint16_t const* up_mins,
    void const* w_down_t, uint16_t const* down_scales, uint16_t const* down_mins, int quant_format, int down_format,
    int group_size, int32_t const* mask, float const* thresholds, int, float, float*, void*, uint8_t*) {
  gSparseFfnQCall = {gSparseFfnQCall.calls + 1,
                     {w_gate, w_up, w_down_t},
                     {gate_scales, up_scales, down_scales},
                     {gate_mins, up_mins, down_mins},
                     quant_format,
                     down_format,
                     group_size,
                     mask,
                     thresholds};
  return cudaSuccess;
}

namespace {

// enum edge_quant_format (kernels/cpu/edge_cpu_kernels.h)
constexpr int kQ8 = 2;
constexpr int kQ4 = 3;

int gFailures = 0;

void expect(bool condition, std::string const& what) {
  if (!condition) {
    std::printf("FAILED: %s\n", what.c_str());
    ++gFailures;
  }
}

class RecordingLogger : public ILogger {
 public:
  void log(Severity severity, AsciiChar const* message) noexcept override {
    if (severity <= Severity::kERROR) last = message;
  }
  std::string last;
};

class Finder : public ILoggerFinder {
 public:
  explicit Finder(ILogger* logger) : mLogger(logger) {}
  ILogger* findLogger() override { return mLogger; }

 private:
  ILogger* mLogger;
};

class UnusedExprBuilder : public IExprBuilder {};

struct Fields {
  std::vector<PluginField> fields;
  PluginFieldCollection collection() const { return {static_cast<int32_t>(fields.size()), fields.data()}; }
};

// A string field as the ONNX parser passes it: the bytes and their NUL, counted in length.
PluginField stringField(char const* name, char const* value) {
  return PluginField(name, value, PluginFieldType::kCHAR, static_cast<int32_t>(std::strlen(value) + 1));
}

DynamicPluginTensorDesc tensor(DataType type, std::vector<int64_t> dims) {
  DynamicPluginTensorDesc desc{};
  desc.desc.type = type;
  desc.desc.format = TensorFormat::kLINEAR;
  desc.desc.dims.nbDims = static_cast<int32_t>(dims.size());
  desc.min.nbDims = desc.max.nbDims = desc.opt.nbDims = desc.desc.dims.nbDims;
  for (size_t i = 0; i < dims.size(); ++i) {
    desc.desc.dims.d[i] = desc.min.d[i] = desc.max.d[i] = desc.opt.d[i] = dims[i];
  }
  return desc;
}

IPluginV3* create(IPluginCreatorV3One* creator, std::vector<PluginField> fields, TensorRTPhase phase) {
  Fields holder{std::move(fields)};
  PluginFieldCollection const collection = holder.collection();
  return creator->createPlugin("node", &collection, phase);
}

IPluginV3OneBuild* build(IPluginV3* plugin) {
  return static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
}

IPluginV3OneRuntime* runtime(IPluginV3* plugin) {
  return static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

bool supports(IPluginV3* plugin, std::vector<DynamicPluginTensorDesc> const& inOut, int32_t nbInputs) {
  for (int32_t pos = 0; pos < static_cast<int32_t>(inOut.size()); ++pos) {
    if (!build(plugin)->supportsFormatCombination(pos, inOut.data(), nbInputs, 1)) return false;
  }
  return true;
}

void expectRejected(IPluginCreatorV3One* creator, std::vector<PluginField> fields, RecordingLogger& logger,
                    std::string const& message) {
  logger.last.clear();
  IPluginV3* plugin = create(creator, std::move(fields), TensorRTPhase::kBUILD);
  expect(plugin == nullptr, std::string("rejected: ") + message);
  expect(logger.last.find(message) != std::string::npos, "message '" + message + "', logged '" + logger.last + "'");
  delete plugin;
}

// The serialized fields, given back to the creator at runtime, make a plugin that serializes the same way.
void expectRoundTrip(IPluginCreatorV3One* creator, IPluginV3* plugin) {
  PluginFieldCollection const* serialized = runtime(plugin)->getFieldsToSerialize();
  expect(serialized != nullptr, std::string(creator->getPluginName()) + " serializes");
  if (serialized == nullptr) return;
  IPluginV3* restored = creator->createPlugin("node", serialized, TensorRTPhase::kRUNTIME);
  expect(restored != nullptr, std::string(creator->getPluginName()) + " restores from its serialized fields");
  if (restored == nullptr) return;
  PluginFieldCollection const* again = runtime(restored)->getFieldsToSerialize();
  expect(again->nbFields == serialized->nbFields, "same number of serialized fields");
  for (int32_t i = 0; i < again->nbFields && i < serialized->nbFields; ++i) {
    PluginField const& a = serialized->fields[i];
    PluginField const& b = again->fields[i];
    // strings: their bytes; every other field here is one float32 or int32
    size_t const bytes = a.type == PluginFieldType::kCHAR ? static_cast<size_t>(a.length) : sizeof(float);
    expect(std::strcmp(a.name, b.name) == 0 && a.type == b.type && a.length == b.length &&
               std::memcmp(a.data, b.data, bytes) == 0,
           std::string("serialized field ") + a.name + " survives the round trip");
  }
  delete restored;
}

void checkSparseFfn(IPluginCreatorV3One* creator, RecordingLogger& logger, size_t (*workspaceSize)(int, int, int)) {
  expectRejected(creator, {}, logger, "attribute 'activation' is required, found none");
  expectRejected(creator, {stringField("activation", "gelu")}, logger,
                 "attribute 'activation': expected one of relu, fatrelu, drelu, silu, found 'gelu'");
  float const half = 0.5f;
  float const negative = -1.0f;
  PluginField const halfThreshold("activation_threshold", &half, PluginFieldType::kFLOAT32, 1);
  expectRejected(creator, {stringField("activation", "relu"), halfThreshold}, logger,
                 "attribute 'activation_threshold': expected 0 for activation 'relu' (only fatrelu has a threshold), "
                 "found 0.5");
  expectRejected(creator,
                 {stringField("activation", "fatrelu"),
                  PluginField("activation_threshold", &negative, PluginFieldType::kFLOAT32, 1)},
                 logger, "attribute 'activation_threshold': expected a finite value >= 0");
  expectRejected(creator, {stringField("activation", "relu"), stringField("beta", "1")}, logger,
                 "unknown attribute 'beta'; expected only activation, activation_threshold");
  int32_t const wrongType = 1;
  expectRejected(creator,
                 {stringField("activation", "fatrelu"),
                  PluginField("activation_threshold", &wrongType, PluginFieldType::kINT32, 1)},
                 logger, "attribute 'activation_threshold': expected type float32, found int32");

  IPluginV3* plugin = create(creator, {stringField("activation", "fatrelu"), halfThreshold}, TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "SparseFFN fatrelu 0.5 is created");
  if (plugin == nullptr) return;
  auto const* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
  expect(std::strcmp(core->getPluginName(), "SparseFFN") == 0 && std::strcmp(core->getPluginVersion(), "1") == 0 &&
             std::strcmp(core->getPluginNamespace(), "edge_sdk") == 0,
         "SparseFFN core names");

  int64_t const T = 2, d = 192, D = 768;
  std::vector<DynamicPluginTensorDesc> io = {
      tensor(DataType::kFLOAT, {T, d}),  tensor(DataType::kHALF, {D, d}), tensor(DataType::kHALF, {D, d}),
      tensor(DataType::kHALF, {D, d}),   tensor(DataType::kINT32, {T, D}), tensor(DataType::kFLOAT, {T, d})};
  expect(supports(plugin, io, 5), "SparseFFN: x fp32, weights fp16, mask int32, y fp32");
  for (DataType weights : {DataType::kFLOAT, DataType::kBF16}) {
    auto other = io;
    other[1].desc.type = other[2].desc.type = other[3].desc.type = weights;
    other[0].desc.type = DataType::kBF16;
    expect(supports(plugin, other, 5), "SparseFFN: x bf16 and fp32 / bf16 weights");
  }
  auto mixed = io;
  mixed[2].desc.type = DataType::kFLOAT;
  expect(!supports(plugin, mixed, 5), "SparseFFN: w_up of another type than w_gate is refused");
  for (DataType mask : {DataType::kBOOL, DataType::kUINT8, DataType::kINT8}) {
    auto byteMask = io;
    byteMask[4].desc.type = mask;
    expect(!supports(plugin, byteMask, 5), "SparseFFN: a BOOL / UINT8 / INT8 mask is refused (OPS.md: int32)");
  }
  auto halfOutput = io;
  halfOutput[5].desc.type = DataType::kHALF;
  expect(!supports(plugin, halfOutput, 5), "SparseFFN: only fp32 y");
  auto withThresholds = io;
  withThresholds.insert(withThresholds.begin() + 5, tensor(DataType::kFLOAT, {D}));
  expect(supports(plugin, withThresholds, 6), "SparseFFN: fp32 thresholds");
  auto linear = io;
  linear[0].desc.format = TensorFormat::kCHW32;
  expect(!supports(plugin, linear, 5), "SparseFFN: only linear formats");

  DataType inputTypes[5] = {DataType::kFLOAT, DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kINT32};
  DataType outputType = DataType::kINT8;
  expect(build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes, 5) == 0 && outputType == DataType::kFLOAT,
         "SparseFFN: y is fp32");

  expect(build(plugin)->configurePlugin(io.data(), 5, &io[5], 1) == 0, "SparseFFN: consistent shapes configure");
  auto narrow = io;
  narrow[2].desc.dims.d[1] = d - 1;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(narrow.data(), 5, &narrow[5], 1) != 0,
         "SparseFFN: w_up [D, d-1] is refused");
  expect(logger.last.find("input 'w_up' columns (d, as x): expected 192, found 191") != std::string::npos,
         "SparseFFN shape message, logged '" + logger.last + "'");
  auto dynamic = io;
  dynamic[0].desc.dims.d[0] = dynamic[4].desc.dims.d[0] = -1;
  dynamic[0].max.d[0] = dynamic[4].max.d[0] = 8;
  expect(build(plugin)->configurePlugin(dynamic.data(), 5, &dynamic[5], 1) == 0, "SparseFFN: runtime T configures");
  expect(build(plugin)->getWorkspaceSize(dynamic.data(), 5, &dynamic[5], 1) == workspaceSize(192, 768, 8),
         "SparseFFN: workspace for the profile's largest T");

  UnusedExprBuilder exprBuilder;
  DimsExprs inputs[5]{};
  for (auto& dims : inputs) dims.nbDims = 2;
  DimsExprs output{};
  expect(build(plugin)->getOutputShapes(inputs, 5, nullptr, 0, &output, 1, exprBuilder) == 0 && output.nbDims == 2,
         "SparseFFN: y has x's shape");
  expect(build(plugin)->getOutputShapes(inputs, 4, nullptr, 0, &output, 1, exprBuilder) != 0,
         "SparseFFN: 4 inputs are refused");

  IPluginV3* clone = plugin->clone();
  expect(clone != nullptr, "SparseFFN clones");
  expectRoundTrip(creator, clone != nullptr ? clone : plugin);
  delete clone;
  delete plugin;
}

PluginField intField(char const* name, int32_t const* value) {
  return PluginField(name, value, PluginFieldType::kINT32, 1);
}

// Distinct stand-ins for dimension expressions: the plugins copy them into output shapes and never dereference them.
IDimensionExpr const* fakeDimension(int index) {
  static int anchors[8];
  return reinterpret_cast<IDimensionExpr const*>(&anchors[index]);
}

// An IExprBuilder whose expressions are recorded (TensorRT makes the real one; its methods forward to an
// apiv::VExprBuilder, which this one is): constants return fakeDimension(4), operations fakeDimension(5).
class RecordingExprBuilder : public apiv::VExprBuilder {
 public:
  struct Operation {
    DimensionOperation op;
    IDimensionExpr const* first;
    IDimensionExpr const* second;
  };
  IDimensionExpr const* constant(int64_t value) override {
    constants.push_back(value);
    return fakeDimension(4);
  }
  IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& first,
                                  IDimensionExpr const& second) override {
    operations.push_back({op, &first, &second});
    return fakeDimension(5);
  }
  IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override {
    return nullptr;
  }
  std::vector<int64_t> constants;
  std::vector<Operation> operations;
};

class ExprBuilderOver : public IExprBuilder {
 public:
  explicit ExprBuilderOver(apiv::VExprBuilder* impl) { mImpl = impl; }
};

// The rejections every plugin with a quantized weight layout shares; `valid` completes the other attributes.
void expectLayoutValidated(IPluginCreatorV3One* creator, RecordingLogger& logger, std::vector<PluginField> valid) {
  static int32_t const groupOf32 = 32;
  static int32_t const groupOf48 = 48;
  static float const floatGroup = 32.0f;
  auto with = [&](std::vector<PluginField> extra) {
    auto fields = valid;
    fields.insert(fields.end(), extra.begin(), extra.end());
    return fields;
  };
  expectRejected(creator, with({intField("group_size", &groupOf32)}), logger,
                 "attribute 'weight_format' is required, found none");
  expectRejected(creator, with({stringField("weight_format", "int4")}), logger,
                 "attribute 'group_size' is required, found none");
  expectRejected(creator, with({stringField("weight_format", "int2"), intField("group_size", &groupOf32)}), logger,
                 "attribute 'weight_format': expected one of int8, int4, int4_asymmetric, found 'int2'");
  expectRejected(creator, with({stringField("weight_format", "int8"), intField("group_size", &groupOf48)}), logger,
                 "attribute 'group_size': expected 32, 64 or 128, found 48");
  expectRejected(creator,
                 with({stringField("weight_format", "int8"),
                       PluginField("group_size", &floatGroup, PluginFieldType::kFLOAT32, 1)}),
                 logger, "attribute 'group_size': expected type int32, found float32");
}

void checkQuantizedSparseFfn(IPluginCreatorV3One* creator, RecordingLogger& logger,
                             size_t (*workspaceSize)(int, int, int)) {
  int32_t const groupOf32 = 32;
  std::vector<PluginField> const layout = {stringField("weight_format", "int4"), intField("group_size", &groupOf32)};
  auto withLayout = [&](std::vector<PluginField> fields) {
    fields.insert(fields.end(), layout.begin(), layout.end());
    return fields;
  };
  expectRejected(creator, withLayout({}), logger, "attribute 'activation' is required, found none");
  expectRejected(creator, withLayout({stringField("activation", "gelu")}), logger,
                 "attribute 'activation': expected one of relu, fatrelu, drelu, silu, found 'gelu'");
  expectRejected(creator, withLayout({stringField("activation", "relu"), stringField("alpha", "1")}), logger,
                 "unknown attribute 'alpha'; expected only activation, activation_threshold, weight_format, "
                 "group_size, down_weight_format");
  expectLayoutValidated(creator, logger, {stringField("activation", "relu")});

  IPluginV3* plugin = create(creator, withLayout({stringField("activation", "drelu")}), TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "QuantizedSparseFFN drelu int4 g32 is created");
  if (plugin == nullptr) return;
  auto const* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
  expect(std::strcmp(core->getPluginName(), "QuantizedSparseFFN") == 0 &&
             std::strcmp(core->getPluginVersion(), "1") == 0 &&
             std::strcmp(core->getPluginNamespace(), "edge_sdk") == 0,
         "QuantizedSparseFFN core names");

  // int4: 8 codes per INT32 word; groups of 32
  int64_t const T = 2, d = 192, D = 768, W = d / 8, G = d / 32;
  std::vector<DynamicPluginTensorDesc> io = {
      tensor(DataType::kFLOAT, {T, d}), tensor(DataType::kINT32, {D, W}), tensor(DataType::kHALF, {D, G}),
      tensor(DataType::kINT32, {D, W}), tensor(DataType::kHALF, {D, G}), tensor(DataType::kINT32, {D, W}),
      tensor(DataType::kHALF, {D, G}),  tensor(DataType::kINT32, {T, D}), tensor(DataType::kFLOAT, {T, d})};
  expect(supports(plugin, io, 8), "QuantizedSparseFFN: x fp32, codes int32, scales fp16, mask int32, y fp32");
  auto halfX = io;
  halfX[0].desc.type = DataType::kBF16;
  expect(supports(plugin, halfX, 8), "QuantizedSparseFFN: x bf16");
  for (DataType codes : {DataType::kINT8, DataType::kUINT8, DataType::kINT4}) {
    auto byteCodes = io;
    byteCodes[3].desc.type = codes;
    expect(!supports(plugin, byteCodes, 8), "QuantizedSparseFFN: codes other than INT32 words are refused");
  }
  auto floatScales = io;
  floatScales[6].desc.type = DataType::kFLOAT;
  expect(!supports(plugin, floatScales, 8), "QuantizedSparseFFN: only fp16 scales");
  auto boolMask = io;
  boolMask[7].desc.type = DataType::kBOOL;
  expect(!supports(plugin, boolMask, 8), "QuantizedSparseFFN: a BOOL mask is refused");
  auto withThresholds = io;
  withThresholds.insert(withThresholds.begin() + 8, tensor(DataType::kFLOAT, {D}));
  expect(supports(plugin, withThresholds, 9), "QuantizedSparseFFN: fp32 thresholds");

  DataType inputTypes[8] = {DataType::kFLOAT, DataType::kINT32, DataType::kHALF, DataType::kINT32,
                            DataType::kHALF, DataType::kINT32, DataType::kHALF, DataType::kINT32};
  DataType outputType = DataType::kINT8;
  expect(build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes, 8) == 0 && outputType == DataType::kFLOAT,
         "QuantizedSparseFFN: y is fp32");
  expect(build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes, 5) != 0,
         "QuantizedSparseFFN: SparseFFN's 5 inputs are refused");

  expect(build(plugin)->configurePlugin(io.data(), 8, &io[8], 1) == 0, "QuantizedSparseFFN: consistent shapes");
  expect(build(plugin)->configurePlugin(withThresholds.data(), 9, &withThresholds[9], 1) == 0,
         "QuantizedSparseFFN: consistent shapes with thresholds");
  auto int8Words = io;
  int8Words[3].desc.dims.d[1] = d / 4;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(int8Words.data(), 8, &int8Words[8], 1) != 0,
         "QuantizedSparseFFN: int8-sized w_up codes are refused for int4");
  expect(logger.last.find("input 'w_up codes' INT32 words per row (int4: columns / 8): expected 24, found 48") !=
             std::string::npos,
         "QuantizedSparseFFN codes message, logged '" + logger.last + "'");
  auto scalesOf64 = io;
  scalesOf64[6].desc.dims.d[1] = d / 64;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(scalesOf64.data(), 8, &scalesOf64[8], 1) != 0,
         "QuantizedSparseFFN: w_down_t scales of groups of 64 are refused for group_size 32");
  expect(logger.last.find("input 'w_down_t scales' per row (columns / group_size): expected 6, found 3") !=
             std::string::npos,
         "QuantizedSparseFFN scales message, logged '" + logger.last + "'");
  auto oddWidth = io;
  oddWidth[0].desc.dims.d[1] = oddWidth[8].desc.dims.d[1] = 200;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(oddWidth.data(), 8, &oddWidth[8], 1) != 0,
         "QuantizedSparseFFN: d = 200 is refused for group_size 32");
  expect(logger.last.find("input 'w_gate' columns: expected a multiple of group_size 32, found 200") !=
             std::string::npos,
         "QuantizedSparseFFN group message, logged '" + logger.last + "'");
  auto fewerRows = io;
  fewerRows[2].desc.dims.d[0] = D - 1;
  expect(build(plugin)->configurePlugin(fewerRows.data(), 8, &fewerRows[8], 1) != 0,
         "QuantizedSparseFFN: gate scales with D - 1 rows are refused");
  auto dynamic = io;
  dynamic[0].desc.dims.d[0] = dynamic[7].desc.dims.d[0] = -1;
  dynamic[0].max.d[0] = dynamic[7].max.d[0] = 8;
  expect(build(plugin)->configurePlugin(dynamic.data(), 8, &dynamic[8], 1) == 0,
         "QuantizedSparseFFN: runtime T configures");
  expect(build(plugin)->getWorkspaceSize(dynamic.data(), 8, &dynamic[8], 1) == workspaceSize(192, 768, 8),
         "QuantizedSparseFFN: workspace for the profile's largest T");

  UnusedExprBuilder exprBuilder;
  DimsExprs inputs[8]{};
  for (auto& dims : inputs) dims.nbDims = 2;
  inputs[0].d[0] = fakeDimension(0);
  inputs[0].d[1] = fakeDimension(1);
  DimsExprs output{};
  expect(build(plugin)->getOutputShapes(inputs, 8, nullptr, 0, &output, 1, exprBuilder) == 0 && output.nbDims == 2 &&
             output.d[0] == fakeDimension(0) && output.d[1] == fakeDimension(1),
         "QuantizedSparseFFN: y has x's shape");

  std::vector<DynamicPluginTensorDesc> asymmetricIo = withThresholds;  // then the three matrices' minimums
  asymmetricIo.insert(asymmetricIo.begin() + 9, 3, tensor(DataType::kHALF, {D, G}));
  expect(!supports(plugin, asymmetricIo, 12), "QuantizedSparseFFN int4: minimums are refused");
  logger.last.clear();
  expect(build(plugin)->configurePlugin(asymmetricIo.data(), 12, &asymmetricIo[12], 1) != 0 &&
             logger.last.find("expected 8 inputs (x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, "
                              "w_down_t_scales, mask) or 9 (and thresholds), found 12") != std::string::npos,
         "QuantizedSparseFFN int4: 12 inputs are refused, logged '" + logger.last + "'");

  IPluginV3* clone = plugin->clone();
  expect(clone != nullptr, "QuantizedSparseFFN clones");
  expectRoundTrip(creator, clone != nullptr ? clone : plugin);
  delete clone;
  delete plugin;

  // int4_asymmetric: thresholds always, then the minimums of w_gate, w_up and w_down_t, each shaped as its scales
  IPluginV3* asymmetric =
      create(creator,
             {stringField("activation", "silu"), stringField("weight_format", "int4_asymmetric"),
              intField("group_size", &groupOf32)},
             TensorRTPhase::kBUILD);
  expect(asymmetric != nullptr, "QuantizedSparseFFN silu int4_asymmetric g32 is created");
  if (asymmetric == nullptr) return;
  expect(supports(asymmetric, asymmetricIo, 12), "QuantizedSparseFFN int4_asymmetric: fp32 thresholds, fp16 mins");
  for (int m = 9; m < 12; ++m) {
    auto floatMins = asymmetricIo;
    floatMins[m].desc.type = DataType::kFLOAT;
    expect(!supports(asymmetric, floatMins, 12),
           "QuantizedSparseFFN int4_asymmetric: fp32 mins of input " + std::to_string(m) + " are refused");
  }
  expect(build(asymmetric)->configurePlugin(asymmetricIo.data(), 12, &asymmetricIo[12], 1) == 0,
         "QuantizedSparseFFN int4_asymmetric: consistent shapes");
  DataType asymmetricTypes[12] = {DataType::kFLOAT, DataType::kINT32, DataType::kHALF,  DataType::kINT32,
                                  DataType::kHALF,  DataType::kINT32, DataType::kHALF,  DataType::kINT32,
                                  DataType::kFLOAT, DataType::kHALF,  DataType::kHALF,  DataType::kHALF};
  expect(build(asymmetric)->getOutputDataTypes(&outputType, 1, asymmetricTypes, 12) == 0 &&
             outputType == DataType::kFLOAT,
         "QuantizedSparseFFN int4_asymmetric: y is fp32");
  for (int32_t count : {8, 9}) {
    logger.last.clear();
    expect(build(asymmetric)->configurePlugin(withThresholds.data(), count, &withThresholds[9], 1) != 0 &&
               logger.last.find("expected 12 inputs (x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, "
                                "w_down_t_scales, mask, thresholds, w_gate_mins, w_up_mins, w_down_t_mins), found " +
                                std::to_string(count)) != std::string::npos,
           "QuantizedSparseFFN int4_asymmetric: " + std::to_string(count) + " inputs are refused, logged '" +
               logger.last + "'");
  }
  auto minsOf64 = asymmetricIo;
  minsOf64[10].desc.dims.d[1] = d / 64;
  logger.last.clear();
  expect(build(asymmetric)->configurePlugin(minsOf64.data(), 12, &minsOf64[12], 1) != 0 &&
             logger.last.find("input 'w_up mins' dimension 1 (as its scales'): expected 6, found 3") !=
                 std::string::npos,
         "QuantizedSparseFFN int4_asymmetric: w_up mins of groups of 64 are refused, logged '" + logger.last + "'");
  auto fewerMinRows = asymmetricIo;
  fewerMinRows[11].desc.dims.d[0] = D - 1;
  expect(build(asymmetric)->configurePlugin(fewerMinRows.data(), 12, &fewerMinRows[12], 1) != 0,
         "QuantizedSparseFFN int4_asymmetric: w_down_t mins with D - 1 rows are refused");
  auto flatMins = asymmetricIo;
  flatMins[9] = tensor(DataType::kHALF, {D * G});
  expect(build(asymmetric)->configurePlugin(flatMins.data(), 12, &flatMins[12], 1) != 0,
         "QuantizedSparseFFN int4_asymmetric: 1-D w_gate mins are refused");
  expect(build(asymmetric)->getWorkspaceSize(asymmetricIo.data(), 12, &asymmetricIo[12], 1) == workspaceSize(192, 768, 2),
         "QuantizedSparseFFN int4_asymmetric: the symmetric workspace");
  expectRoundTrip(creator, asymmetric);
  delete asymmetric;
}

// The serialized fields of `plugin` by name (strings without their NUL).
std::map<std::string, std::string> serializedStrings(IPluginV3* plugin, int32_t* nbFields) {
  PluginFieldCollection const* serialized = runtime(plugin)->getFieldsToSerialize();
  std::map<std::string, std::string> strings;
  *nbFields = serialized == nullptr ? -1 : serialized->nbFields;
  for (int32_t i = 0; serialized != nullptr && i < serialized->nbFields; ++i) {
    PluginField const& field = serialized->fields[i];
    if (field.type == PluginFieldType::kCHAR) {
      char const* text = static_cast<char const*>(field.data);
      strings[field.name] = std::string(text, strnlen(text, static_cast<size_t>(field.length)));
    }
  }
  return strings;
}

// configurePlugin with `io` (nbInputs inputs, then y), then enqueue on distinct fake addresses: edge_sparse_ffn_q (the
// interposed recorder) gets the codes and scales of inputs 1..6, the formats, mask = input 7, thresholds = input 8 when
// the node has it, and mins[m] = input minsInputs[m] (-1: NULL).
void expectEnqueued(IPluginV3* plugin, std::vector<DynamicPluginTensorDesc> const& io, int32_t nbInputs,
                    int quantFormat, int downFormat, std::vector<int> const& minsInputs, std::string const& what) {
  expect(build(plugin)->configurePlugin(io.data(), nbInputs, io.data() + nbInputs, 1) == 0, what + ": configures");
  alignas(16) static char buffers[16][64];
  std::vector<void const*> inputs;
  std::vector<PluginTensorDesc> descs;
  for (int32_t i = 0; i < nbInputs; ++i) {
    inputs.push_back(buffers[i]);
    descs.push_back(io[i].desc);
  }
  void* outputs[1] = {buffers[15]};
  gSparseFfnQCall = {};
  int32_t const status =
      runtime(plugin)->enqueue(descs.data(), &io[nbInputs].desc, inputs.data(), outputs, buffers[14], nullptr);
  SparseFfnQCall const& call = gSparseFfnQCall;
  expect(status == 0 && call.calls == 1, what + ": enqueue calls edge_sparse_ffn_q once (found " +
                                             std::to_string(call.calls) + " calls; linked with -rdynamic?)");
  if (call.calls != 1) return;
  bool matrices = true;
  for (int m = 0; m < 3; ++m) {
    matrices = matrices && call.codes[m] == inputs[1 + 2 * m] &&
               static_cast<void const*>(call.scales[m]) == inputs[2 + 2 * m];
    void const* mins = minsInputs[m] < 0 ? nullptr : inputs[minsInputs[m]];
    expect(static_cast<void const*>(call.mins[m]) == mins,
           what + ": minimums of matrix " + std::to_string(m) + " are " +
               (minsInputs[m] < 0 ? std::string("NULL") : "input " + std::to_string(minsInputs[m])));
  }
  expect(matrices, what + ": codes and scales are inputs 1 to 6");
  expect(call.quantFormat == quantFormat && call.downFormat == downFormat,
         what + ": quant_format " + std::to_string(call.quantFormat) + " and down_format " +
             std::to_string(call.downFormat) + ", expected " + std::to_string(quantFormat) + " and " +
             std::to_string(downFormat));
  expect(call.groupSize == 32 && static_cast<void const*>(call.mask) == inputs[7], what + ": group size and mask");
  void const* thresholds = nbInputs > 8 ? inputs[8] : nullptr;
  expect(static_cast<void const*>(call.thresholds) == thresholds, what + ": thresholds are input 8 when given");
}

// QuantizedSparseFFN with down_weight_format "int8" (OPS.md): int4 or int4_asymmetric gate and up rows, int8 down rows
// ([D, d / 4] INT32 words, no minimums: an int4_asymmetric node has 11 inputs); edge_sparse_ffn_q's down_format.
// Without the attribute (today's nodes, an engine built before it existed) the down rows are in weight_format.
void checkQuantizedSparseFfnInt8Down(IPluginCreatorV3One* creator, RecordingLogger& logger,
                                     size_t (*workspaceSize)(int, int, int)) {
  int32_t const groupOf32 = 32;
  auto fields = [&](char const* activation, char const* format, std::vector<PluginField> extra) {
    std::vector<PluginField> all = {stringField("activation", activation), stringField("weight_format", format),
                                    intField("group_size", &groupOf32)};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  for (char const* wrong : {"int4", "fp16", "int4_asymmetric", ""}) {
    expectRejected(creator, fields("relu", "int4", {stringField("down_weight_format", wrong)}), logger,
                   std::string("attribute 'down_weight_format': expected int8 (or no attribute: the down rows in "
                               "weight_format), found '") +
                       wrong + "'");
  }
  expectRejected(creator, fields("relu", "int8", {stringField("down_weight_format", "int8")}), logger,
                 "attribute 'down_weight_format': int8 down rows need weight_format int4 or int4_asymmetric, found "
                 "weight_format 'int8'");
  expectRejected(creator, fields("relu", "int4", {intField("down_weight_format", &groupOf32)}), logger,
                 "attribute 'down_weight_format': expected type string, found int32");

  int64_t const T = 2, d = 192, D = 768, G = d / 32;
  std::vector<DynamicPluginTensorDesc> io = {
      tensor(DataType::kFLOAT, {T, d}),     tensor(DataType::kINT32, {D, d / 8}), tensor(DataType::kHALF, {D, G}),
      tensor(DataType::kINT32, {D, d / 8}), tensor(DataType::kHALF, {D, G}),      tensor(DataType::kINT32, {D, d / 4}),
      tensor(DataType::kHALF, {D, G}),      tensor(DataType::kINT32, {T, D}),     tensor(DataType::kFLOAT, {T, d})};
  auto withThresholds = io;
  withThresholds.insert(withThresholds.begin() + 8, tensor(DataType::kFLOAT, {D}));
  auto asymmetricIo = withThresholds;  // then the minimums of w_gate and w_up
  asymmetricIo.insert(asymmetricIo.begin() + 9, 2, tensor(DataType::kHALF, {D, G}));
  auto withDownMins = asymmetricIo;
  withDownMins.insert(withDownMins.begin() + 11, tensor(DataType::kHALF, {D, G}));
  // a shape change in input `input` of `io` that configurePlugin refuses with `message`
  auto expectRefusedShape = [&](IPluginV3* plugin, std::vector<DynamicPluginTensorDesc> io, int32_t nbInputs,
                                int input, int axis, int64_t value, std::string const& message) {
    io[input].desc.dims.d[axis] = value;
    logger.last.clear();
    expect(build(plugin)->configurePlugin(io.data(), nbInputs, &io[nbInputs], 1) != 0 &&
               logger.last.find(message) != std::string::npos,
           "int8 down rows: input " + std::to_string(input) + " refused with '" + message + "', logged '" +
               logger.last + "'");
  };
  std::string const downWords = "input 'w_down_t codes' INT32 words per row (int8: columns / 4): expected 48, found 24";

  // int4 gate and up rows: 8 or 9 inputs, as a symmetric node
  IPluginV3* plugin = create(creator, fields("relu", "int4", {stringField("down_weight_format", "int8")}),
                             TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "QuantizedSparseFFN int4 with int8 down rows is created");
  if (plugin == nullptr) return;
  expect(supports(plugin, io, 8), "int4 + int8 down: codes int32, scales fp16");
  expect(supports(plugin, withThresholds, 9), "int4 + int8 down: fp32 thresholds");
  expect(!supports(plugin, asymmetricIo, 11), "int4 + int8 down: minimums are refused");
  expect(build(plugin)->configurePlugin(withThresholds.data(), 9, &withThresholds[9], 1) == 0,
         "int4 + int8 down: consistent shapes with thresholds");
  expectRefusedShape(plugin, io, 8, 5, 1, d / 8, downWords);
  expectRefusedShape(plugin, io, 8, 1, 1, d / 4,
                     "input 'w_gate codes' INT32 words per row (int4: columns / 8): expected 24, found 48");
  expectRefusedShape(plugin, io, 8, 6, 1, d / 64,
                     "input 'w_down_t scales' per row (columns / group_size): expected 6, found 3");
  expectRefusedShape(plugin, io, 8, 5, 0, D - 1, "input 'w_down_t codes' rows: expected 768, found 767");
  logger.last.clear();
  expect(build(plugin)->configurePlugin(asymmetricIo.data(), 11, &asymmetricIo[11], 1) != 0 &&
             logger.last.find("expected 8 inputs (x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, "
                              "w_down_t_scales, mask) or 9 (and thresholds), found 11") != std::string::npos,
         "int4 + int8 down: 11 inputs are refused, logged '" + logger.last + "'");
  expect(build(plugin)->getWorkspaceSize(io.data(), 8, &io[8], 1) == workspaceSize(192, 768, 2),
         "int4 + int8 down: the single format's workspace");
  int32_t nbFields = 0;
  std::map<std::string, std::string> strings = serializedStrings(plugin, &nbFields);
  expect(nbFields == 5 && strings["down_weight_format"] == "int8" && strings["weight_format"] == "int4",
         "int4 + int8 down: serializes down_weight_format int8 beside its other 4 fields");
  expectRoundTrip(creator, plugin);
  expectEnqueued(plugin, io, 8, kQ4, kQ8, {-1, -1, -1}, "int4 + int8 down, 8 inputs");
  expectEnqueued(plugin, withThresholds, 9, kQ4, kQ8, {-1, -1, -1}, "int4 + int8 down, 9 inputs");
  delete plugin;

  // int4_asymmetric gate and up rows: 11 inputs, the minimums of w_gate and w_up only
  IPluginV3* asymmetric = create(
      creator, fields("silu", "int4_asymmetric", {stringField("down_weight_format", "int8")}), TensorRTPhase::kBUILD);
  expect(asymmetric != nullptr, "QuantizedSparseFFN int4_asymmetric with int8 down rows is created");
  if (asymmetric == nullptr) return;
  expect(supports(asymmetric, asymmetricIo, 11), "int4_asymmetric + int8 down: fp32 thresholds, fp16 mins");
  expect(!supports(asymmetric, withDownMins, 12), "int4_asymmetric + int8 down: a twelfth input is refused");
  for (int m = 9; m < 11; ++m) {
    auto floatMins = asymmetricIo;
    floatMins[m].desc.type = DataType::kFLOAT;
    expect(!supports(asymmetric, floatMins, 11),
           "int4_asymmetric + int8 down: fp32 mins of input " + std::to_string(m) + " are refused");
  }
  DataType types[11] = {DataType::kFLOAT, DataType::kINT32, DataType::kHALF, DataType::kINT32,
                        DataType::kHALF,  DataType::kINT32, DataType::kHALF, DataType::kINT32,
                        DataType::kFLOAT, DataType::kHALF,  DataType::kHALF};
  DataType outputType = DataType::kINT8;
  expect(build(asymmetric)->getOutputDataTypes(&outputType, 1, types, 11) == 0 && outputType == DataType::kFLOAT,
         "int4_asymmetric + int8 down: y is fp32 from 11 inputs");
  std::string const elevenInputs =
      "expected 11 inputs (x, w_gate, w_gate_scales, w_up, w_up_scales, w_down_t, w_down_t_scales, mask, thresholds, "
      "w_gate_mins, w_up_mins), found ";
  for (auto const& [candidate, count] : {std::pair{withDownMins, 12}, std::pair{withThresholds, 9}}) {
    logger.last.clear();
    expect(build(asymmetric)->configurePlugin(candidate.data(), count, &candidate[count], 1) != 0 &&
               logger.last.find(elevenInputs + std::to_string(count)) != std::string::npos,
           "int4_asymmetric + int8 down: " + std::to_string(count) + " inputs are refused, logged '" + logger.last +
               "'");
  }
  expectRefusedShape(asymmetric, asymmetricIo, 11, 5, 1, d / 8, downWords);
  expectRefusedShape(asymmetric, asymmetricIo, 11, 10, 1, d / 64,
                     "input 'w_up mins' dimension 1 (as its scales'): expected 6, found 3");
  expect(build(asymmetric)->getWorkspaceSize(asymmetricIo.data(), 11, &asymmetricIo[11], 1) ==
             workspaceSize(192, 768, 2),
         "int4_asymmetric + int8 down: the symmetric workspace");
  expectRoundTrip(creator, asymmetric);
  expectEnqueued(asymmetric, asymmetricIo, 11, kQ4, kQ8, {9, 10, -1}, "int4_asymmetric + int8 down");

  // an engine built before down_weight_format: the same fields without it mean int4_asymmetric down rows (12 inputs)
  PluginFieldCollection const* serialized = runtime(asymmetric)->getFieldsToSerialize();
  std::vector<PluginField> older;
  for (int32_t i = 0; serialized != nullptr && i < serialized->nbFields; ++i) {
    if (std::strcmp(serialized->fields[i].name, "down_weight_format") != 0) older.push_back(serialized->fields[i]);
  }
  expect(older.size() == 4, "int4_asymmetric + int8 down: 4 fields besides down_weight_format");
  IPluginV3* restored = create(creator, older, TensorRTPhase::kRUNTIME);
  expect(restored != nullptr, "fields without down_weight_format restore a plugin");
  if (restored != nullptr) {
    auto int4Down = withDownMins;
    int4Down[5].desc.dims.d[1] = d / 8;
    expect(build(restored)->configurePlugin(asymmetricIo.data(), 11, &asymmetricIo[11], 1) != 0,
           "without down_weight_format: 11 inputs are refused");
    expectEnqueued(restored, int4Down, 12, kQ4, kQ4, {9, 10, 11}, "without down_weight_format, int4_asymmetric");
    expect(serializedStrings(restored, &nbFields).count("down_weight_format") == 0 && nbFields == 4,
           "without down_weight_format: serializes the 4 fields of before");
    delete restored;
  }
  delete asymmetric;

  // today's nodes pass down_format = quant_format
  for (char const* format : {"int8", "int4"}) {
    IPluginV3* single = create(creator, fields("relu", format, {}), TensorRTPhase::kBUILD);
    expect(single != nullptr, std::string("QuantizedSparseFFN ") + format + " is created");
    if (single == nullptr) continue;
    auto singleIo = io;
    int64_t const words = std::strcmp(format, "int8") == 0 ? d / 4 : d / 8;
    singleIo[1].desc.dims.d[1] = singleIo[3].desc.dims.d[1] = singleIo[5].desc.dims.d[1] = words;
    int const value = std::strcmp(format, "int8") == 0 ? kQ8 : kQ4;
    expectEnqueued(single, singleIo, 8, value, value, {-1, -1, -1},
                   std::string(format) + " without down_weight_format");
    delete single;
  }
}

void checkQuantizedMatMul(IPluginCreatorV3One* creator, RecordingLogger& logger,
                          size_t (*matvecWorkspaceSize)(int, int)) {
  int32_t const groupOf64 = 64;
  int32_t const groupOf32 = 32;
  int32_t const two = 2;
  int32_t const one = 1;
  int32_t const zero = 0;
  expectRejected(creator,
                 {stringField("weight_format", "int8"), intField("group_size", &groupOf64),
                  stringField("activation", "relu")},
                 logger, "unknown attribute 'activation'; expected only weight_format, group_size, transposed");
  expectRejected(creator,
                 {stringField("weight_format", "int8"), intField("group_size", &groupOf64),
                  intField("transposed", &two)},
                 logger, "attribute 'transposed': expected 0 or 1, found 2");
  expectLayoutValidated(creator, logger, {});
  IPluginV3* plugin = create(creator, {stringField("weight_format", "int8"), intField("group_size", &groupOf64)},
                             TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "QuantizedMatMul int8 g64 is created");
  if (plugin == nullptr) return;
  // transposed (the default): W [N, K], int8: 4 codes per INT32 word; groups of 64
  int64_t const T = 3, K = 256, N = 77;
  std::vector<DynamicPluginTensorDesc> io = {tensor(DataType::kHALF, {T, K}), tensor(DataType::kINT32, {N, K / 4}),
                                             tensor(DataType::kHALF, {N, K / 64}), tensor(DataType::kFLOAT, {T, N})};
  expect(supports(plugin, io, 3), "QuantizedMatMul: x fp16, codes int32, scales fp16, y fp32");
  auto int8Codes = io;
  int8Codes[1].desc.type = DataType::kINT8;
  expect(!supports(plugin, int8Codes, 3), "QuantizedMatMul: INT8 codes are refused");
  auto halfOutput = io;
  halfOutput[3].desc.type = DataType::kHALF;
  expect(!supports(plugin, halfOutput, 3), "QuantizedMatMul: only fp32 y");
  DataType inputTypes[3] = {DataType::kHALF, DataType::kINT32, DataType::kHALF};
  DataType outputType = DataType::kINT8;
  expect(build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes, 3) == 0 && outputType == DataType::kFLOAT,
         "QuantizedMatMul: y is fp32");
  expect(build(plugin)->configurePlugin(io.data(), 3, &io[3], 1) == 0, "QuantizedMatMul: consistent shapes");
  auto int4Words = io;
  int4Words[1].desc.dims.d[1] = K / 8;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(int4Words.data(), 3, &int4Words[3], 1) != 0,
         "QuantizedMatMul: int4-sized codes are refused for int8");
  expect(logger.last.find("input 'w codes' INT32 words per row (int8: columns / 4): expected 64, found 32") !=
             std::string::npos,
         "QuantizedMatMul codes message, logged '" + logger.last + "'");
  auto profile = io;  // x [1..8, K]: the workspace holds x's planes for the largest T
  profile[0].min.d[0] = 1;
  profile[0].max.d[0] = 8;
  expect(build(plugin)->getWorkspaceSize(profile.data(), 3, &profile[3], 1) == matvecWorkspaceSize(K, 8),
         "QuantizedMatMul: workspace for x's planes at the profile's largest T");

  UnusedExprBuilder exprBuilder;
  DimsExprs inputs[3]{};
  for (auto& dims : inputs) dims.nbDims = 2;
  inputs[0].d[0] = fakeDimension(2);
  inputs[1].d[0] = fakeDimension(3);
  inputs[1].d[1] = fakeDimension(6);
  DimsExprs output{};
  expect(build(plugin)->getOutputShapes(inputs, 3, nullptr, 0, &output, 1, exprBuilder) == 0 && output.nbDims == 2 &&
             output.d[0] == fakeDimension(2) && output.d[1] == fakeDimension(3),
         "QuantizedMatMul: y is [T, N], N = W's rows");
  expect(build(plugin)->getOutputShapes(inputs, 2, nullptr, 0, &output, 1, exprBuilder) != 0,
         "QuantizedMatMul: 2 inputs are refused");
  expectRoundTrip(creator, plugin);
  delete plugin;

  // transposed = 0: W [K, N] (a prompt's neuron-major down rows), int4: 8 codes per word; groups of 32 along N
  plugin = create(creator,
                  {stringField("weight_format", "int4"), intField("group_size", &groupOf32),
                   intField("transposed", &zero)},
                  TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "QuantizedMatMul int4 g32 transposed 0 is created");
  if (plugin == nullptr) return;
  int64_t const rows = 300, columns = 96;
  std::vector<DynamicPluginTensorDesc> down = {
      tensor(DataType::kFLOAT, {T, rows}), tensor(DataType::kINT32, {rows, columns / 8}),
      tensor(DataType::kHALF, {rows, columns / 32}), tensor(DataType::kFLOAT, {T, columns})};
  expect(build(plugin)->configurePlugin(down.data(), 3, &down[3], 1) == 0,
         "QuantizedMatMul transposed 0: W [K, N] with K = x's columns configures");
  auto otherRows = down;
  otherRows[1].desc.dims.d[0] = rows + 1;
  logger.last.clear();
  expect(build(plugin)->configurePlugin(otherRows.data(), 3, &otherRows[3], 1) != 0,
         "QuantizedMatMul transposed 0: W with other rows than x's columns is refused");
  expect(logger.last.find("input 'w codes' rows: expected 300, found 301") != std::string::npos,
         "QuantizedMatMul transposed 0 rows message, logged '" + logger.last + "'");
  auto scalesOf64 = down;
  scalesOf64[2].desc.dims.d[1] = columns / 64 + 1;
  expect(build(plugin)->configurePlugin(scalesOf64.data(), 3, &scalesOf64[3], 1) != 0,
         "QuantizedMatMul transposed 0: scales of another group size are refused");
  RecordingExprBuilder recording;
  ExprBuilderOver builder(&recording);
  expect(build(plugin)->getOutputShapes(inputs, 3, nullptr, 0, &output, 1, builder) == 0 && output.nbDims == 2 &&
             output.d[0] == fakeDimension(2) && output.d[1] == fakeDimension(5),
         "QuantizedMatMul transposed 0: y is [T, N], N an expression");
  expect(recording.constants == std::vector<int64_t>{8} && recording.operations.size() == 1 &&
             recording.operations[0].op == DimensionOperation::kPROD &&
             recording.operations[0].first == fakeDimension(6) && recording.operations[0].second == fakeDimension(4),
         "QuantizedMatMul transposed 0: N = W's INT32 words per row x 8");
  expect(build(plugin)->getWorkspaceSize(down.data(), 3, &down[3], 1) == 0,
         "QuantizedMatMul transposed 0: no workspace (x stays fp32)");
  expectRoundTrip(creator, plugin);
  delete plugin;

  // int4_asymmetric, both orientations: W's group minimums, shaped as its scales, a fourth input
  for (int32_t const* transposed : {&one, &zero}) {
    plugin = create(creator,
                    {stringField("weight_format", "int4_asymmetric"), intField("group_size", &groupOf32),
                     intField("transposed", transposed)},
                    TensorRTPhase::kBUILD);
    std::string const what = "QuantizedMatMul int4_asymmetric transposed " + std::to_string(*transposed);
    expect(plugin != nullptr, what + " is created");
    if (plugin == nullptr) return;
    std::vector<DynamicPluginTensorDesc> asymmetric =
        *transposed != 0 ? std::vector<DynamicPluginTensorDesc>{tensor(DataType::kFLOAT, {T, K}),
                                                                tensor(DataType::kINT32, {N, K / 8}),
                                                                tensor(DataType::kHALF, {N, K / 32}),
                                                                tensor(DataType::kFLOAT, {T, N})}
                         : down;
    asymmetric.insert(asymmetric.begin() + 3, asymmetric[2]);  // the minimums: fp16, the scales' shape
    expect(supports(plugin, asymmetric, 4), what + ": fp16 mins");
    auto floatMins = asymmetric;
    floatMins[3].desc.type = DataType::kFLOAT;
    expect(!supports(plugin, floatMins, 4), what + ": fp32 mins are refused");
    DataType types[4] = {DataType::kFLOAT, DataType::kINT32, DataType::kHALF, DataType::kHALF};
    expect(build(plugin)->getOutputDataTypes(&outputType, 1, types, 4) == 0 && outputType == DataType::kFLOAT,
           what + ": y is fp32");
    expect(build(plugin)->configurePlugin(asymmetric.data(), 4, &asymmetric[4], 1) == 0,
           what + ": consistent shapes");
    logger.last.clear();
    expect(build(plugin)->configurePlugin(asymmetric.data(), 3, &asymmetric[3], 1) != 0 &&
               logger.last.find("expected 4 inputs (x, w, w_scales, w_mins), found 3") != std::string::npos,
           what + ": 3 inputs are refused, logged '" + logger.last + "'");
    auto moreMinRows = asymmetric;
    moreMinRows[3].desc.dims.d[0] += 1;
    logger.last.clear();
    expect(build(plugin)->configurePlugin(moreMinRows.data(), 4, &moreMinRows[4], 1) != 0 &&
               logger.last.find("input 'w mins' dimension 0 (as its scales'): expected") != std::string::npos,
           what + ": mins with a row more than the scales are refused, logged '" + logger.last + "'");
    expectRoundTrip(creator, plugin);
    delete plugin;
  }
  plugin = create(creator, {stringField("weight_format", "int4"), intField("group_size", &groupOf32)},
                  TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "QuantizedMatMul int4 g32 is created");
  if (plugin == nullptr) return;
  std::vector<DynamicPluginTensorDesc> withMins = {
      tensor(DataType::kFLOAT, {T, K}), tensor(DataType::kINT32, {N, K / 8}), tensor(DataType::kHALF, {N, K / 32}),
      tensor(DataType::kHALF, {N, K / 32}), tensor(DataType::kFLOAT, {T, N})};
  expect(!supports(plugin, withMins, 4), "QuantizedMatMul int4: a fourth input is refused");
  expect(build(plugin)->configurePlugin(withMins.data(), 4, &withMins[4], 1) != 0,
         "QuantizedMatMul int4: 4 inputs do not configure");
  delete plugin;
}

void checkSignBit(IPluginCreatorV3One* creator, RecordingLogger& logger) {
  expectRejected(creator, {}, logger, "attribute 'alpha' is required, found none");
  float const zero = 0.0f;
  expectRejected(creator, {PluginField("alpha", &zero, PluginFieldType::kFLOAT32, 1)}, logger,
                 "attribute 'alpha': expected a finite value > 0, found 0");
  float const nan = std::nanf("");
  expectRejected(creator, {PluginField("alpha", &nan, PluginFieldType::kFLOAT32, 1)}, logger,
                 "attribute 'alpha': expected a finite value > 0, found nan");
  float const alpha = 1.25f;
  IPluginV3* plugin =
      create(creator, {PluginField("alpha", &alpha, PluginFieldType::kFLOAT32, 1)}, TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "SignBitPredictor alpha 1.25 is created");
  if (plugin == nullptr) return;
  std::vector<DynamicPluginTensorDesc> io = {tensor(DataType::kHALF, {1, 100}), tensor(DataType::kINT32, {700, 4}),
                                             tensor(DataType::kINT32, {1, 700})};
  expect(supports(plugin, io, 2), "SignBitPredictor: x fp16, packed int32, mask int32");
  DataType inputTypes[2] = {DataType::kHALF, DataType::kINT32};
  DataType outputType = DataType::kFLOAT;
  expect(build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes, 2) == 0 && outputType == DataType::kINT32,
         "SignBitPredictor: mask is int32");
  expect(build(plugin)->configurePlugin(io.data(), 2, &io[2], 1) == 0, "SignBitPredictor: ceil(100 / 32) = 4 words");
  io[1].desc.dims.d[1] = 3;
  expect(build(plugin)->configurePlugin(io.data(), 2, &io[2], 1) != 0,
         "SignBitPredictor: 3 words for d = 100 is refused");
  expectRoundTrip(creator, plugin);
  delete plugin;
}

void checkSvd(IPluginCreatorV3One* creator, RecordingLogger& logger) {
  float const alpha = 1.0f;
  expectRejected(creator, {PluginField("alpha", &alpha, PluginFieldType::kFLOAT32, 1)}, logger,
                 "unknown attribute 'alpha'; expected only none");
  IPluginV3* plugin = create(creator, {}, TensorRTPhase::kBUILD);
  expect(plugin != nullptr, "SvdPredictor is created");
  if (plugin == nullptr) return;
  std::vector<DynamicPluginTensorDesc> io = {tensor(DataType::kBF16, {3, 256}), tensor(DataType::kFLOAT, {1000, 32}),
                                             tensor(DataType::kFLOAT, {32, 256}), tensor(DataType::kFLOAT, {1000}),
                                             tensor(DataType::kINT32, {3, 1000})};
  expect(supports(plugin, io, 4), "SvdPredictor: x bf16, factors fp32, mask int32");
  io[4].desc.type = DataType::kBOOL;
  expect(!supports(plugin, io, 4), "SvdPredictor: a BOOL mask output is refused");
  io[4].desc.type = DataType::kINT32;
  io[1].desc.type = DataType::kHALF;
  expect(!supports(plugin, io, 4), "SvdPredictor: fp16 factors are refused");
  io[1].desc.type = DataType::kFLOAT;
  expect(build(plugin)->configurePlugin(io.data(), 4, &io[4], 1) == 0, "SvdPredictor: consistent shapes configure");
  expect(build(plugin)->getWorkspaceSize(io.data(), 4, &io[4], 1) == 3 * 32 * sizeof(float),
         "SvdPredictor: workspace holds x b^T");
  io[2].desc.dims.d[0] = 31;
  expect(build(plugin)->configurePlugin(io.data(), 4, &io[4], 1) != 0,
         "SvdPredictor: b with 31 rows for rank 32 is refused");
  expectRoundTrip(creator, plugin);
  delete plugin;
}

// One custom node of an exported graph, as test_plugin_library.py writes it (one item per line):
//   node <name> <op type>
//   attribute <name> int|float|string <value>      (floats in C99 hexadecimal, exact)
//   input <TensorRT DataType value> <rank> <dims>  (-1: a dimension known only at runtime)
//   output <TensorRT DataType value> <rank> <dims>
struct NodeAttribute {
  std::string name, type, value;
};

struct GraphNode {
  std::string name, op;
  std::vector<NodeAttribute> attributes;
  std::vector<DynamicPluginTensorDesc> inputs;
  std::vector<DynamicPluginTensorDesc> outputs;
};

DynamicPluginTensorDesc readTensor(std::istream& in) {
  int32_t type = 0, rank = 0;
  in >> type >> rank;
  std::vector<int64_t> dims(rank > 0 && rank <= Dims::MAX_DIMS ? rank : 0);
  for (int64_t& dim : dims) in >> dim;
  return tensor(static_cast<DataType>(type), dims);
}

std::vector<GraphNode> readNodes(char const* path) {
  std::ifstream in(path);
  expect(in.good(), std::string("nodes file ") + path + " opens");
  std::vector<GraphNode> nodes;
  std::string item;
  while (in >> item) {
    if (item == "node") {
      nodes.emplace_back();
      in >> nodes.back().name >> nodes.back().op;
    } else if (!nodes.empty() && item == "attribute") {
      NodeAttribute attribute;
      in >> attribute.name >> attribute.type >> attribute.value;
      nodes.back().attributes.push_back(attribute);
    } else if (!nodes.empty() && (item == "input" || item == "output")) {
      (item == "input" ? nodes.back().inputs : nodes.back().outputs).push_back(readTensor(in));
    } else {
      expect(false, "nodes file: unexpected item '" + item + "'");
      break;
    }
  }
  return nodes;
}

// The plugin of `node` made as onnx-tensorrt's loadFields makes it (onnxOpImporters.cpp, 10.x): one field for each
// of the creator's field names the node has, INT as one kINT32, FLOAT as one kFLOAT32, STRING as kCHAR counting its
// NUL; an attribute that is none of the creator's field names never reaches the plugin, so every attribute of the
// node but plugin_version / plugin_namespace (which only pick the creator) must be one. The plugin then takes the
// node's input types (kLINEAR), gives the output type the graph declares, and configures with the node's shapes.
void checkGraphNode(IPluginCreatorV3One* creator, GraphNode const& node) {
  std::string const where = node.op + " node '" + node.name + "'";
  PluginFieldCollection const* known = creator->getFieldNames();
  std::map<std::string, NodeAttribute const*> attributes;
  for (NodeAttribute const& attribute : node.attributes) {
    if (attribute.name == "plugin_version" || attribute.name == "plugin_namespace") continue;
    attributes[attribute.name] = &attribute;
    bool isField = false;
    for (int32_t i = 0; i < known->nbFields; ++i) isField = isField || attribute.name == known->fields[i].name;
    expect(isField, where + ": attribute '" + attribute.name + "' is one of the creator's field names");
  }
  std::vector<int32_t> ints;
  std::vector<float> floats;
  ints.reserve(attributes.size());
  floats.reserve(attributes.size());
  std::vector<PluginField> fields;
  for (int32_t i = 0; i < known->nbFields; ++i) {
    auto const found = attributes.find(known->fields[i].name);
    if (found == attributes.end()) continue;
    NodeAttribute const& attribute = *found->second;
    if (attribute.type == "int") {
      ints.push_back(static_cast<int32_t>(std::strtol(attribute.value.c_str(), nullptr, 10)));
      fields.emplace_back(known->fields[i].name, &ints.back(), PluginFieldType::kINT32, 1);
    } else if (attribute.type == "float") {
      floats.push_back(std::strtof(attribute.value.c_str(), nullptr));
      fields.emplace_back(known->fields[i].name, &floats.back(), PluginFieldType::kFLOAT32, 1);
    } else {
      fields.push_back(stringField(known->fields[i].name, attribute.value.c_str()));
    }
  }
  IPluginV3* plugin = create(creator, fields, TensorRTPhase::kBUILD);
  expect(plugin != nullptr, where + ": the creator makes a plugin from the node's attributes");
  if (plugin == nullptr) return;
  int32_t const nbInputs = static_cast<int32_t>(node.inputs.size());
  expect(node.outputs.size() == 1, where + ": one output");
  std::vector<DataType> inputTypes;
  for (DynamicPluginTensorDesc const& input : node.inputs) inputTypes.push_back(input.desc.type);
  DataType outputType = DataType::kBOOL;
  bool const typed = build(plugin)->getOutputDataTypes(&outputType, 1, inputTypes.data(), nbInputs) == 0;
  expect(typed && !node.outputs.empty() && outputType == node.outputs[0].desc.type,
         where + ": the plugin's output type (TensorRT DataType " + std::to_string(static_cast<int32_t>(outputType)) +
             ") is the graph's");
  std::vector<DynamicPluginTensorDesc> io = node.inputs;
  io.insert(io.end(), node.outputs.begin(), node.outputs.end());
  for (int32_t pos = 0; pos < static_cast<int32_t>(io.size()); ++pos) {
    expect(build(plugin)->supportsFormatCombination(pos, io.data(), nbInputs, 1),
           where + ": takes " + (pos < nbInputs ? "input " : "output ") +
               std::to_string(pos < nbInputs ? pos : pos - nbInputs) + " as the graph types it (TensorRT DataType " +
               std::to_string(static_cast<int32_t>(io[pos].desc.type)) + ")");
  }
  expect(build(plugin)->configurePlugin(io.data(), nbInputs, io.data() + nbInputs, 1) == 0,
         where + ": configures with the graph's shapes");
  delete plugin;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s libedge_trt_plugins.so libedge_cuda_kernels.so [nodes file]\n", argv[0]);
    return 2;
  }
  void* kernels = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (kernels == nullptr || library == nullptr) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  using SetLoggerFinder = void (*)(ILoggerFinder*);
  using WorkspaceSize = size_t (*)(int, int, int);
  auto getCreators = reinterpret_cast<GetCreators>(dlsym(library, "getCreators"));
  auto setLoggerFinder = reinterpret_cast<SetLoggerFinder>(dlsym(library, "setLoggerFinder"));
  auto workspaceSize = reinterpret_cast<WorkspaceSize>(dlsym(kernels, "edge_sparse_ffn_workspace_size"));
  using MatvecWorkspaceSize = size_t (*)(int, int);
  auto matvecWorkspaceSize =
      reinterpret_cast<MatvecWorkspaceSize>(dlsym(kernels, "edge_matvec_q_workspace_size"));
  expect(getCreators != nullptr && setLoggerFinder != nullptr, "getCreators and setLoggerFinder are exported");
  if (getCreators == nullptr || setLoggerFinder == nullptr || workspaceSize == nullptr ||
      matvecWorkspaceSize == nullptr) {
    return 1;
  }

  RecordingLogger logger;
  Finder finder(&logger);
  setLoggerFinder(&finder);
  int32_t count = 0;
  IPluginCreatorInterface* const* creators = getCreators(count);
  expect(count == 5, "five creators");
  std::vector<std::string> names;
  std::map<std::string, IPluginCreatorV3One*> byName;
  for (int32_t i = 0; i < count; ++i) {
    expect(std::strcmp(creators[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0, "IPluginCreatorV3One");
    auto* creator = static_cast<IPluginCreatorV3One*>(creators[i]);
    expect(std::strcmp(creator->getPluginVersion(), "1") == 0, "creator version 1");
    expect(std::strcmp(creator->getPluginNamespace(), "edge_sdk") == 0, "creator namespace edge_sdk");
    std::string const name = creator->getPluginName();
    names.push_back(name);
    byName[name] = creator;
    if (name == "SparseFFN") checkSparseFfn(creator, logger, workspaceSize);
    if (name == "SignBitPredictor") checkSignBit(creator, logger);
    if (name == "SvdPredictor") checkSvd(creator, logger);
    if (name == "QuantizedSparseFFN") {
      checkQuantizedSparseFfn(creator, logger, workspaceSize);
      checkQuantizedSparseFfnInt8Down(creator, logger, workspaceSize);
    }
    if (name == "QuantizedMatMul") checkQuantizedMatMul(creator, logger, matvecWorkspaceSize);
  }
  expect(names == std::vector<std::string>{"SvdPredictor", "SignBitPredictor", "SparseFFN", "QuantizedSparseFFN",
                                           "QuantizedMatMul"},
         "creator names");
  if (argc == 4) {
    std::vector<GraphNode> const nodes = readNodes(argv[3]);
    expect(!nodes.empty(), "the nodes file lists nodes");
    for (GraphNode const& node : nodes) {
      auto const creator = byName.find(node.op);
      expect(creator != byName.end(), node.op + " node '" + node.name + "': a creator of that name");
      if (creator != byName.end()) checkGraphNode(creator->second, node);
    }
  }
  std::printf("%s\n", gFailures == 0 ? "all checks passed" : "some checks failed");
  return gFailures == 0 ? 0 : 1;
}
