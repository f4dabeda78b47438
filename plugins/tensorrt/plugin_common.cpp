#include "plugin_common.h"

#include <climits>
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

}  // namespace edge_sdk::trt
