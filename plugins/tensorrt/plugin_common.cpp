#include "plugin_common.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "edge_cuda_kernels.h"

namespace edge_sdk::trt {
namespace {

std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder = nullptr;

char const* fieldTypeName(nvinfer1::PluginFieldType type) {
  switch (type) {
    case nvinfer1::PluginFieldType::kFLOAT32:
      return "float32";
    case nvinfer1::PluginFieldType::kFLOAT64:
      return "float64";
    case nvinfer1::PluginFieldType::kCHAR:
      return "string";
    case nvinfer1::PluginFieldType::kINT32:
      return "int32";
    default:
      return "another type";
  }
}

}  // namespace

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept {
  std::lock_guard<std::mutex> lock(gLoggerMutex);
  gLoggerFinder = finder;
}

void logError(char const* op, char const* message) noexcept {
  try {
    std::string const line = std::string("edge_sdk ") + op + ": " + message;
    nvinfer1::ILogger* logger = nullptr;
    {
      std::lock_guard<std::mutex> lock(gLoggerMutex);
      if (gLoggerFinder != nullptr) logger = gLoggerFinder->findLogger();
    }
    if (logger != nullptr) {
      logger->log(nvinfer1::ILogger::Severity::kERROR, line.c_str());
    } else {
      std::fprintf(stderr, "[E] %s\n", line.c_str());
    }
  } catch (...) {
    std::fprintf(stderr, "[E] edge_sdk %s: %s\n", op, message);
  }
}

int cudaDtype(nvinfer1::DataType type) noexcept {
  switch (type) {
    case nvinfer1::DataType::kFLOAT:
      return EDGE_CUDA_F32;
    case nvinfer1::DataType::kHALF:
      return EDGE_CUDA_F16;
    case nvinfer1::DataType::kBF16:
      return EDGE_CUDA_BF16;
    default:
      return -1;
  }
}

bool isFloatType(nvinfer1::DataType type) noexcept { return cudaDtype(type) >= 0; }

std::string formatFloat(float value) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  return text;
}

int checkedDim(char const* tensor, int64_t value) {
  if (value < 0 || value > INT_MAX) {
    throw PluginError(std::string("input '") + tensor + "': expected a dimension in [0, " +
                      std::to_string(INT_MAX) + "], found " + std::to_string(value));
  }
  return static_cast<int>(value);
}

void expectRank(char const* tensor, nvinfer1::Dims const& dims, int32_t rank) {
  if (dims.nbDims != rank) {
    throw PluginError(std::string("input '") + tensor + "': expected " + std::to_string(rank) + " dimensions, found " +
                      std::to_string(dims.nbDims));
  }
}

void expectDim(char const* what, int64_t expected, int64_t found) {
  if (expected >= 0 && found >= 0 && expected != found) {
    throw PluginError(std::string(what) + ": expected " + std::to_string(expected) + ", found " +
                      std::to_string(found));
  }
}

nvinfer1::DimsExprs tokensByRows(nvinfer1::DimsExprs const* inputs, int32_t other, char const* otherName) {
  if (inputs[0].nbDims != 2 || inputs[other].nbDims != 2) {
    throw PluginError(std::string("inputs 'x' and '") + otherName + "': expected 2 dimensions each, found " +
                      std::to_string(inputs[0].nbDims) + " and " + std::to_string(inputs[other].nbDims));
  }
  nvinfer1::DimsExprs shape{};
  shape.nbDims = 2;
  shape.d[0] = inputs[0].d[0];
  shape.d[1] = inputs[other].d[0];
  return shape;
}

void expectLaunched(char const* launcher, cudaError_t status) {
  if (status != cudaSuccess) throw PluginError(std::string(launcher) + ": " + cudaGetErrorString(status));
}

void expectCounts(PluginSignature const& signature, int32_t nbInputs, int32_t nbOutputs) {
  bool const optional = signature.optionalInput != nullptr && nbInputs == signature.nbInputs + 1;
  if (nbInputs != signature.nbInputs && !optional) {
    std::string expected = "expected " + std::to_string(signature.nbInputs) + " inputs (" + signature.inputs + ")";
    if (signature.optionalInput != nullptr) {
      expected += " or " + std::to_string(signature.nbInputs + 1) + " (and " + signature.optionalInput + ")";
    }
    throw PluginError(expected + ", found " + std::to_string(nbInputs));
  }
  if (nbOutputs != 1) {
    throw PluginError(std::string("expected 1 output (") + signature.output + "), found " + std::to_string(nbOutputs));
  }
}

Attributes::Attributes(nvinfer1::PluginFieldCollection const* fields, std::vector<std::string> const& known)
    : mFields(fields) {
  if (fields == nullptr || (fields->nbFields > 0 && fields->fields == nullptr)) {
    throw PluginError(std::string("no attribute collection was given"));
  }
  for (int32_t i = 0; i < fields->nbFields; ++i) {
    char const* name = fields->fields[i].name;
    bool isKnown = false;
    for (std::string const& candidate : known) isKnown = isKnown || (name != nullptr && candidate == name);
    if (!isKnown) {
      std::string expected;
      for (std::string const& candidate : known) expected += (expected.empty() ? "" : ", ") + candidate;
      throw PluginError(std::string("unknown attribute '") + (name == nullptr ? "(null)" : name) +
                        "'; expected only " + (expected.empty() ? "none" : expected));
    }
  }
}

nvinfer1::PluginField const* Attributes::find(char const* name) const {
  for (int32_t i = 0; i < mFields->nbFields; ++i) {
    if (std::strcmp(mFields->fields[i].name, name) == 0) return &mFields->fields[i];
  }
  return nullptr;
}

std::optional<float> Attributes::getFloat(char const* name) const {
  nvinfer1::PluginField const* field = find(name);
  if (field == nullptr) return std::nullopt;
  if (field->length != 1 || field->data == nullptr) {
    throw PluginError(std::string("attribute '") + name + "': expected one float32 value, found " +
                      std::to_string(field->length) + " values");
  }
  if (field->type == nvinfer1::PluginFieldType::kFLOAT32) return *static_cast<float const*>(field->data);
  if (field->type == nvinfer1::PluginFieldType::kFLOAT64) {
    return static_cast<float>(*static_cast<double const*>(field->data));
  }
  throw PluginError(std::string("attribute '") + name + "': expected type float32, found " +
                    fieldTypeName(field->type));
}

std::optional<int32_t> Attributes::getInt(char const* name) const {
  nvinfer1::PluginField const* field = find(name);
  if (field == nullptr) return std::nullopt;
  if (field->type != nvinfer1::PluginFieldType::kINT32) {
    throw PluginError(std::string("attribute '") + name + "': expected type int32, found " +
                      fieldTypeName(field->type));
  }
  if (field->length != 1 || field->data == nullptr) {
    throw PluginError(std::string("attribute '") + name + "': expected one int32 value, found " +
                      std::to_string(field->length) + " values");
  }
  return *static_cast<int32_t const*>(field->data);
}

std::optional<std::string> Attributes::getString(char const* name) const {
  nvinfer1::PluginField const* field = find(name);
  if (field == nullptr) return std::nullopt;
  if (field->type != nvinfer1::PluginFieldType::kCHAR) {
    throw PluginError(std::string("attribute '") + name + "': expected type string, found " +
                      fieldTypeName(field->type));
  }
  if (field->length < 0 || (field->length > 0 && field->data == nullptr)) {
    throw PluginError(std::string("attribute '") + name + "': malformed string field");
  }
  // The ONNX parser counts the terminating NUL in `length`; a serialized field may not have one.
  char const* text = static_cast<char const*>(field->data);
  return std::string(text, field->length == 0 ? 0 : strnlen(text, static_cast<size_t>(field->length)));
}

namespace {

struct NamedValue {
  char const* name;
  int value;
};
constexpr NamedValue kActivations[] = {
    {"relu", EDGE_ACT_RELU}, {"fatrelu", EDGE_ACT_FATRELU}, {"drelu", EDGE_ACT_DRELU}, {"silu", EDGE_ACT_SILU}};
constexpr char kAsymmetricInt4[] = "int4_asymmetric";
constexpr NamedValue kQuantFormats[] = {{"int8", EDGE_Q8}, {"int4", EDGE_Q4}, {kAsymmetricInt4, EDGE_Q4}};
constexpr int32_t kGroupSizes[] = {32, 64, 128};

// The value of `found` among `choices`, or a PluginError naming the attribute and every choice.
template <size_t N>
int chooseNamed(char const* attribute, std::string const& found, NamedValue const (&choices)[N]) {
  std::string expected;
  for (NamedValue const& choice : choices) {
    if (found == choice.name) return choice.value;
    expected += std::string(expected.empty() ? "" : ", ") + choice.name;
  }
  throw PluginError(std::string("attribute '") + attribute + "': expected one of " + expected + ", found '" + found +
                    "'");
}

nvinfer1::PluginField stringField(char const* name, std::string const& value) {
  return nvinfer1::PluginField(name, value.c_str(), nvinfer1::PluginFieldType::kCHAR,
                               static_cast<int32_t>(value.size() + 1));
}

}  // namespace

GateActivation GateActivation::read(Attributes const& attributes) {
  std::optional<std::string> const name = attributes.getString(kField);
  if (!name) throw PluginError("attribute 'activation' is required, found none");
  GateActivation activation{*name, chooseNamed(kField, *name, kActivations),
                            attributes.getFloat(kThresholdField).value_or(0.0f)};
  if (!std::isfinite(activation.threshold) || activation.threshold < 0.0f) {
    throw PluginError("attribute 'activation_threshold': expected a finite value >= 0, found " +
                      formatFloat(activation.threshold));
  }
  if (activation.value != EDGE_ACT_FATRELU && activation.threshold != 0.0f) {
    throw PluginError("attribute 'activation_threshold': expected 0 for activation '" + activation.name +
                      "' (only fatrelu has a threshold), found " + formatFloat(activation.threshold));
  }
  return activation;
}

void GateActivation::addFieldNames(std::vector<nvinfer1::PluginField>& fields) {
  fields.emplace_back(kField, nullptr, nvinfer1::PluginFieldType::kCHAR, 0);
  fields.emplace_back(kThresholdField, nullptr, nvinfer1::PluginFieldType::kFLOAT32, 1);
}

void GateActivation::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  fields.push_back(stringField(kField, name));
  fields.emplace_back(kThresholdField, &threshold, nvinfer1::PluginFieldType::kFLOAT32, 1);
}

QuantLayout QuantLayout::read(Attributes const& attributes) {
  std::optional<std::string> const format = attributes.getString(kFormatField);
  if (!format) throw PluginError("attribute 'weight_format' is required, found none");
  std::optional<int32_t> const groupSize = attributes.getInt(kGroupSizeField);
  if (!groupSize) throw PluginError("attribute 'group_size' is required, found none");
  bool known = false;
  for (int32_t size : kGroupSizes) known = known || size == *groupSize;
  if (!known) throw PluginError("attribute 'group_size': expected 32, 64 or 128, found " + std::to_string(*groupSize));
  return QuantLayout{*format, chooseNamed(kFormatField, *format, kQuantFormats), *groupSize, *format == kAsymmetricInt4};
}

void QuantLayout::addFieldNames(std::vector<nvinfer1::PluginField>& fields) {
  fields.emplace_back(kFormatField, nullptr, nvinfer1::PluginFieldType::kCHAR, 0);
  fields.emplace_back(kGroupSizeField, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
}

void QuantLayout::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  fields.push_back(stringField(kFormatField, formatName));
  fields.emplace_back(kGroupSizeField, &groupSize, nvinfer1::PluginFieldType::kINT32, 1);
}

int64_t QuantLayout::valuesPerWord() const { return format == EDGE_Q4 ? 8 : 4; }

namespace {
constexpr char kInt8[] = "int8";
}  // namespace

DownWeightFormat DownWeightFormat::read(Attributes const& attributes, QuantLayout const& layout) {
  std::optional<std::string> const name = attributes.getString(kField);
  if (!name) return DownWeightFormat{};
  if (*name != kInt8) {
    throw PluginError("attribute 'down_weight_format': expected int8 (or no attribute: the down rows in "
                      "weight_format), found '" +
                      *name + "'");
  }
  if (layout.format != EDGE_Q4) {
    throw PluginError("attribute 'down_weight_format': int8 down rows need weight_format int4 or int4_asymmetric, "
                      "found weight_format '" +
                      layout.formatName + "'");
  }
  return DownWeightFormat{name};
}

void DownWeightFormat::addFieldNames(std::vector<nvinfer1::PluginField>& fields) {
  fields.emplace_back(kField, nullptr, nvinfer1::PluginFieldType::kCHAR, 0);
}

void DownWeightFormat::addFields(std::vector<nvinfer1::PluginField>& fields) const {
  if (name) fields.push_back(stringField(kField, *name));
}

QuantLayout DownWeightFormat::downLayout(QuantLayout const& layout) const {
  if (!name) return layout;
  return QuantLayout{*name, EDGE_Q8, layout.groupSize, false};
}

void QuantLayout::expectMatrix(char const* matrix, nvinfer1::Dims const& codes, nvinfer1::Dims const& scales,
                               nvinfer1::Dims const* mins, int64_t rows, int64_t cols) const {
  std::string const name(matrix);
  expectRank((name + " codes").c_str(), codes, 2);
  expectRank((name + " scales").c_str(), scales, 2);
  if (mins != nullptr) {
    expectRank((name + " mins").c_str(), *mins, 2);
    for (int axis = 0; axis < 2; ++axis) {
      expectDim(("input '" + name + " mins' dimension " + std::to_string(axis) + " (as its scales')").c_str(),
                scales.d[axis], mins->d[axis]);
    }
  }
  if (cols >= 0 && cols % groupSize != 0) {
    throw PluginError("input '" + name + "' columns: expected a multiple of group_size " + std::to_string(groupSize) +
                      ", found " + std::to_string(cols));
  }
  expectDim(("input '" + name + " codes' rows").c_str(), rows, codes.d[0]);
  expectDim(("input '" + name + " scales' rows").c_str(), rows, scales.d[0]);
  int64_t const words = cols < 0 ? -1 : cols / valuesPerWord();
  expectDim(("input '" + name + " codes' INT32 words per row (" + formatName + ": columns / " +
             std::to_string(valuesPerWord()) + ")")
                .c_str(),
            words, codes.d[1]);
  expectDim(("input '" + name + " scales' per row (columns / group_size)").c_str(), cols < 0 ? -1 : cols / groupSize,
            scales.d[1]);
}

}  // namespace edge_sdk::trt
