/* The TensorRT engine behind backend "tensorrt" (struct engine_ops of model.h), and the one place that knows where an
 * engine is cached and how the plugins are loaded: the Python TensorRT backend runs this engine through libedge_sdk
 * (backends/c_runtime.py), and `edge-sdk build` (backends/tensorrt/builder.py, which builds with TensorRT's Python
 * API) learns from edge_tensorrt_engine_info where to write the engine and gets the plugins registered here. It
 * never builds engines: it runs the model.engine that `edge-sdk build BUNDLE` cached under <cache>/<key digest>/,
 * with the edge-sdk plugin library (libedge_trt_plugins.so) registered through IPluginRegistry::loadLibrary. That one
 * engine, built from decode.onnx, holds the weights once and has two optimization profiles
 * (backends/tensorrt/profiles.py): 0 = prefill (a prompt on an empty cache: the graph's dense FFN), 1 = decode (one
 * token after the prompt: predictor and SparseFFN).
 *
 * C++ inside, C outside: every entry point catches everything (Failure, std::bad_alloc, any std::exception) and
 * turns it into an edge_status plus the thread's message (edge_fail), like the CPU engine.
 *
 * Probe (edge_backend_probe): TensorRT 10.3 or later, a CUDA device, the plugin library registered.
 * Model (load): the probe, the cache key and the engine's directory, one IRuntime and the deserialized ICudaEngine.
 * Session (session_create): one execution context per profile, each set to its profile once (switching a context's
 * profile makes TensorRT update its layers on the next enqueue, NvInferRuntime.h 10.3 setOptimizationProfileAsync),
 * both over one block of activation memory (kUSER_MANAGED: they run one after the other on the session's stream),
 * a CUDA stream and every device buffer, allocated once:
 *  - KV cache, ping-pong: the graphs read past_key_values.{i}.{key,value} [1, kv_heads, past, head_dim] and write
 *    present.{i}.{key,value} [1, kv_heads, past + seq, head_dim] (past and new tokens concatenated, packed for that
 *    length). Each of those 2 * num_layers tensors has two device buffers of the full capacity
 *    [1, kv_heads, max_seq_len, head_dim] float32: a step reads the cache from set `current` and writes the grown
 *    cache into set 1 - current, and the next step swaps them. No copy of our own and nothing allocated per token;
 *    the price is twice the KV memory (an in-place update is impossible: present is computed from past, and TensorRT
 *    does not allow an input and an output to alias).
 *  - input_ids / position_ids [1, max_seq_len] in the type the engine reports (int64, or int32),
 *  - logits [1, seq, vocab] float32, grown when a longer prompt comes; only the last row is copied back,
 *  - decode's scalars sparsity_level (the option's level index) and dense, uploaded once,
 *  - core bundles: core_activations.{i} [1, seq, D] float32 (the prompt's gate activations) written by prefill,
 *    core_mask.{i} [1, D] int32 (1 = core neuron) read by decode; the token-wise core neurons are counted and the
 *    masks chosen on the host with the rule of predictors/core.py.
 *  Both profiles bind every tensor: each reads only its own (the other branch of the graph has zero rows).
 *  - one pinned host staging buffer for the uploads of ids and positions and the download of the logits row.
 * tests/tensorrt/test_engine_buffers.py runs all of it against a fake libnvinfer and CUDA runtime (tests/tensorrt/
 * fake_tensorrt) whose engine runs decode.onnx in ONNX Runtime on the buffers bound here. */
#include <NvInfer.h>
#include <NvInferVersion.h>
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "sha256.h"
#include "trt_version.h"
}
#include "trt_engine.h"

#if NV_TENSORRT_MAJOR < 10
#error "the TensorRT engine of libedge_sdk needs TensorRT 10.3 or later (IPluginV3 plugins, loadLibrary)"
#endif

namespace {

using nvinfer1::DataType;

/* The engine cache (cache layout 2: one model.engine with two profiles, backends/tensorrt/profiles.py). Bump the
 * layout version when the engine's inputs, profiles or build settings change, so older entries are not reused. */
constexpr int kCacheLayoutVersion = 2;
constexpr const char *kCacheEnv = "EDGE_SDK_ENGINE_CACHE";
constexpr const char *kMetadataFile = "engine.json";
constexpr const char *kEngineFile = "model.engine";
constexpr int32_t kPrefillProfile = 0, kDecodeProfile = 1, kProfiles = 2;
constexpr const char *kPluginLibrary = "libedge_trt_plugins.so";
constexpr const char *kPluginEnv = "EDGE_SDK_TRT_PLUGINS";
constexpr int kMinVersion = 100300; /* 10.3: IPluginV3 plugins loaded by IPluginRegistry::loadLibrary */
constexpr size_t kAlignment = 256;  /* TensorRT wants I/O addresses 256-byte aligned */

#ifndef EDGE_SDK_TRT_PLUGIN_DIR
#define EDGE_SDK_TRT_PLUGIN_DIR ""
#endif

/* A failure on its way to the C boundary. */
struct Failure {
  edge_status status;
  std::string message;
};

[[noreturn]] void fail(edge_status status, std::string message) {
  throw Failure{status, "backend 'tensorrt': " + std::move(message)};
}

template <class Body>
edge_status guarded(const char *what, Body &&body) noexcept {
  try {
    body();
    return EDGE_OK;
  } catch (const Failure &failure) {
    return edge_fail(failure.status, "%s", failure.message.c_str());
  } catch (const std::bad_alloc &) {
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "backend 'tensorrt': %s: out of host memory", what);
  } catch (const std::exception &error) {
    return edge_fail(EDGE_ERROR_INTERNAL, "backend 'tensorrt': %s: %s", what, error.what());
  } catch (...) {
    return edge_fail(EDGE_ERROR_INTERNAL, "backend 'tensorrt': %s: unknown C++ exception", what);
  }
}

/* ---- TensorRT logger: warnings and errors to the log callback (edge_set_log_callback; the library never prints);
 * the thread's last error is kept so failures can quote it. ------------------------------------------------------ */

thread_local char last_tensorrt_error[512];

class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char *message) noexcept override {
    if (severity > Severity::kWARNING || message == nullptr) return;
    bool error = severity <= Severity::kERROR;
    edge_log(error ? EDGE_LOG_ERROR : EDGE_LOG_WARNING, "TensorRT", message);
    if (error) std::snprintf(last_tensorrt_error, sizeof last_tensorrt_error, "%s", message);
  }
};

Logger &logger() {
  static Logger instance;
  return instance;
}

std::string tensorrt_said() {
  if (last_tensorrt_error[0] == '\0') return " (see the TensorRT log on stderr)";
  return std::string(" (TensorRT: ") + last_tensorrt_error + ")";
}

void check_cuda(cudaError_t error, const char *call) {
  if (error == cudaSuccess) return;
  cudaGetLastError(); /* reset the runtime's last error (non-sticky errors) */
  fail(error == cudaErrorMemoryAllocation ? EDGE_ERROR_OUT_OF_MEMORY : EDGE_ERROR_INTERNAL,
       std::string(call) + " failed: " + cudaGetErrorString(error));
}

/* ---- The cache key ------------------------------------------------------------------------------------------ */

/* tensorrt_version(getInferLibVersion()): MAJOR.MINOR.PATCH (trt_version.h), refused below 10.3. */
std::string checked_tensorrt_version() {
  int32_t version = getInferLibVersion();
  std::string text = tensorrt_version(version);
  if (version < kMinVersion) {
    fail(EDGE_ERROR_UNAVAILABLE, "TensorRT " + text + " is too old: the edge-sdk plugins implement IPluginV3, which "
                                 "needs TensorRT 10.3 or later (JetPack 6.1); JetPack 6.0's TensorRT 8.6 lacks it");
  }
  return text;
}

struct Device {
  std::string name;       /* cudaDeviceProp.name */
  std::string capability; /* "8.7" */
};

Device device_description() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::string why = error != cudaSuccess ? std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(error)
                                           : std::string("cudaGetDeviceCount found 0 devices");
    cudaGetLastError();
    fail(EDGE_ERROR_UNAVAILABLE, "no CUDA device: " + why);
  }
  cudaDeviceProp properties;
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  Device device;
  device.name.assign(properties.name, strnlen(properties.name, sizeof properties.name));
  device.capability = std::to_string(properties.major) + "." + std::to_string(properties.minor);
  return device;
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii): \" \\ \b \f \n \r \t, other characters outside
 * ' '..'~' as a \u escape with four lowercase hex digits (UTF-16). */
std::string json_string(const std::string &text) {
  std::string out = "\"";
  char escape[16];
  auto unicode = [&](unsigned unit) {
    std::snprintf(escape, sizeof escape, "\\u%04x", unit);
    out += escape;
  };
  for (size_t i = 0; i < text.size();) {
    unsigned char c = (unsigned char)text[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += (char)c;
      i++;
    } else if (c >= 0x20 && c < 0x7f) {
      out += (char)c;
      i++;
    } else if (c < 0x80) {
      const char *named = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : nullptr;
      if (named != nullptr) out += named; else unicode(c);
      i++;
    } else {
      int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
      unsigned point = extra == 3 ? c & 0x07u : extra == 2 ? c & 0x0fu : c & 0x1fu;
      bool valid = extra > 0 && i + (size_t)extra < text.size();
      for (int k = 1; valid && k <= extra; k++) {
        unsigned char next = (unsigned char)text[i + (size_t)k];
        if ((next & 0xc0) != 0x80) valid = false; else point = (point << 6) | (next & 0x3fu);
      }
      if (!valid) { /* not UTF-8 (a device name never is): escape the byte */
        unicode(c);
        i++;
        continue;
      }
      if (point > 0xffff) {
        point -= 0x10000;
        unicode(0xd800 + (point >> 10));
        unicode(0xdc00 + (point & 0x3ff));
      } else {
        unicode(point);
      }
      i += (size_t)extra + 1;
    }
  }
  return out + "\"";
}

/* What an engine is only valid for. */
struct EngineKey {
  std::string tensorrt_version, gpu_name, compute_capability, bundle_sha256;

  /* sha256 of the key's fields and the cache layout version as Python's json.dumps(fields, sort_keys=True) writes
   * them: the rule of cache layout 2, so engines cached before the key moved here are still found. */
  std::string digest() const {
    std::string text = "{\"bundle_sha256\": " + json_string(bundle_sha256) +
                       ", \"cache_layout_version\": " + std::to_string(kCacheLayoutVersion) +
                       ", \"compute_capability\": " + json_string(compute_capability) +
                       ", \"gpu_name\": " + json_string(gpu_name) +
                       ", \"tensorrt_version\": " + json_string(tensorrt_version) + "}";
    struct sha256 hash;
    uint8_t bytes[32];
    char hex[65];
    sha256_init(&hash);
    sha256_update(&hash, text.data(), text.size());
    sha256_final(&hash, bytes);
    sha256_hex(bytes, hex);
    return hex;
  }

  std::string describe() const {
    return "TensorRT " + tensorrt_version + ", " + gpu_name + " (compute capability " + compute_capability +
           "), bundle " + bundle_sha256.substr(0, 12);
  }
};

/* What backend "tensorrt" needs before any bundle: TensorRT 10.3 or later, a CUDA device, the plugins registered. */
struct Backend {
  std::string tensorrt_version;
  Device device;
  std::string plugins; /* the plugin library's path */

  std::string describe() const {
    return "TensorRT " + tensorrt_version + " on " + device.name + " (compute capability " + device.capability +
           "), plugins " + plugins;
  }
};

std::string load_plugin_library();

Backend probe_backend() {
  Backend backend;
  backend.tensorrt_version = checked_tensorrt_version();
  backend.device = device_description();
  backend.plugins = load_plugin_library();
  return backend;
}

/* The key of a bundle (its verified manifest) on this backend. */
EngineKey engine_key(const Backend &backend, const cJSON *manifest) {
  EngineKey key;
  key.tensorrt_version = backend.tensorrt_version;
  key.gpu_name = backend.device.name;
  key.compute_capability = backend.device.capability;
  const char *sha = nullptr;
  if (json_string_field(manifest, "manifest_sha256", "manifest.json", &sha) != EDGE_OK) {
    fail(EDGE_ERROR_BUNDLE, std::string("the bundle's manifest: ") + edge_last_error());
  }
  key.bundle_sha256 = sha;
  return key;
}

/* The cache directory: `chosen` when given (edge-sdk build --cache-dir), else $EDGE_SDK_ENGINE_CACHE, else
 * $XDG_CACHE_HOME/edge-sdk/tensorrt, else ~/.cache/edge-sdk/tensorrt. */
std::string cache_dir(const char *chosen) {
  if (chosen != nullptr && chosen[0] != '\0') return chosen;
  const char *value = std::getenv(kCacheEnv);
  if (value != nullptr && value[0] != '\0') return value;
  value = std::getenv("XDG_CACHE_HOME");
  if (value != nullptr && value[0] != '\0') return std::string(value) + "/edge-sdk/tensorrt";
  const char *home = std::getenv("HOME");
  if (home == nullptr || home[0] == '\0') {
    const struct passwd *entry = getpwuid(getuid());
    home = entry != nullptr ? entry->pw_dir : nullptr;
  }
  if (home == nullptr) fail(EDGE_ERROR_UNAVAILABLE, std::string("no engine cache: set $") + kCacheEnv);
  return std::string(home) + "/.cache/edge-sdk/tensorrt";
}

bool is_file(const std::string &path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool read_file(const std::string &path, std::vector<char> &data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

/* engine.json's string fields (missing or unreadable: an empty map). */
std::map<std::string, std::string> read_metadata(const std::string &directory) {
  std::map<std::string, std::string> fields;
  std::vector<char> text;
  if (!read_file(directory + "/" + kMetadataFile, text)) return fields;
  text.push_back('\0');
  cJSON *root = cJSON_Parse(text.data());
  if (root == nullptr) return fields;
  for (const char *name : {"tensorrt_version", "gpu_name", "compute_capability", "bundle_sha256", "bundle"}) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (cJSON_IsString(item) && item->valuestring != nullptr) fields[name] = item->valuestring;
  }
  cJSON_Delete(root);
  return fields;
}

std::string version_message(const std::string &built, const std::string &current, const std::string &directory,
                            const std::string &bundle) {
  return "engine built by TensorRT " + built + ", this is " + current + ": rebuild with `edge-sdk build " + bundle +
         " --force` (engine in " + directory + ")";
}

/* Where the engine of a key lives, and whether it is there: cached when model.engine is a file and engine.json
 * records exactly this key; otherwise `message` says why, as edge_model_open reports it. */
struct EngineLookup {
  std::string directory;
  bool cached = false;
  std::string message;
};

EngineLookup look_up_engine(const EngineKey &key, const std::string &cache, const std::string &bundle) {
  EngineLookup found;
  found.directory = cache + "/" + key.digest().substr(0, 32);
  std::map<std::string, std::string> recorded = read_metadata(found.directory);
  if (is_file(found.directory + "/" + kEngineFile) && !recorded.empty()) {
    if (recorded["tensorrt_version"] != key.tensorrt_version) {
      found.message = version_message(recorded["tensorrt_version"], key.tensorrt_version, found.directory, bundle);
    } else if (recorded["gpu_name"] != key.gpu_name || recorded["compute_capability"] != key.compute_capability ||
               recorded["bundle_sha256"] != key.bundle_sha256) {
      found.message = found.directory + "/" + kMetadataFile + " records another GPU or bundle than " +
                      key.describe() + ": rebuild with `edge-sdk build " + bundle + " --force`";
    } else {
      found.cached = true;
    }
    return found;
  }
  /* Not cached for this key: an engine of this bundle and GPU built by another TensorRT is worth naming. */
  if (DIR *entries = opendir(cache.c_str())) {
    while (const struct dirent *entry = readdir(entries)) {
      if (entry->d_name[0] == '.') continue;
      std::string candidate = cache + "/" + entry->d_name;
      std::map<std::string, std::string> fields = read_metadata(candidate);
      if (!fields.empty() && fields["bundle_sha256"] == key.bundle_sha256 && fields["gpu_name"] == key.gpu_name &&
          fields["tensorrt_version"] != key.tensorrt_version) {
        found.message = version_message(fields["tensorrt_version"], key.tensorrt_version, candidate, bundle);
        break;
      }
    }
    closedir(entries);
  }
  if (found.message.empty()) {
    found.message = "no TensorRT engine cached for this bundle on this device: run `edge-sdk build " + bundle +
                    "` first (looked in " + found.directory + ", for " + key.describe() + ")";
  }
  return found;
}

/* ---- The plugin library: $EDGE_SDK_TRT_PLUGINS, else next to libedge_sdk (the Python package keeps both in
 * edge_sdk/_native), else EDGE_SDK_TRT_PLUGIN_DIR (the install libdir), else the dynamic loader's search path.
 * Registered once per process: loadLibrary refuses plugins already registered, so a program that builds engines with
 * TensorRT's API in this process (edge-sdk build) gets them from here too. --------------------------------------- */

std::mutex plugin_lock;
std::string plugin_loaded; /* guarded by plugin_lock */

/* The directory of the file this code was loaded from (libedge_sdk.so, or a program linking the static library). */
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string plugin_library_path() {
  const char *value = std::getenv(kPluginEnv);
  if (value != nullptr && value[0] != '\0') {
    if (!is_file(value)) fail(EDGE_ERROR_UNAVAILABLE, std::string("$") + kPluginEnv + " = " + value + " is not a file");
    return value;
  }
  for (const std::string &directory : {own_directory(), std::string(EDGE_SDK_TRT_PLUGIN_DIR)}) {
    if (!directory.empty() && is_file(directory + "/" + kPluginLibrary)) return directory + "/" + kPluginLibrary;
  }
  return kPluginLibrary; /* dlopen's search: LD_LIBRARY_PATH, the ld.so cache */
}

/* Registers the plugin library with TensorRT's plugin registry (once per process); its path. */
std::string load_plugin_library() {
  std::lock_guard<std::mutex> guard(plugin_lock);
  if (!plugin_loaded.empty()) return plugin_loaded;
  std::string path = plugin_library_path();
  nvinfer1::IPluginRegistry *registry = getPluginRegistry();
  last_tensorrt_error[0] = '\0';
  if (registry == nullptr || registry->loadLibrary(path.c_str()) == nullptr) {
    std::string next_to = own_directory();
    fail(EDGE_ERROR_UNAVAILABLE,
         "TensorRT could not load the plugin library " + path + tensorrt_said() + "; build " + kPluginLibrary +
             " on this device (plugins/tensorrt/JETSON.md) and set $" + kPluginEnv + " to its path" +
             (next_to.empty() ? std::string() : " or put it in " + next_to) +
             (EDGE_SDK_TRT_PLUGIN_DIR[0] != '\0' ? std::string(" or ") + EDGE_SDK_TRT_PLUGIN_DIR : ""));
  }
  plugin_loaded = path;
  return path;
}

/* ---- Engine info ---------------------------------------------------------------------------------------------- */

thread_local std::string probe_description;

/* edge_tensorrt_engine_info's JSON: the key, where the engine and its engine.json go, whether they are there (and
 * why not), the record engine.json holds, the backend, the plugin library and the device's free memory. */
std::string engine_info_json(const cJSON *manifest, const std::string &bundle, const char *chosen_cache) {
  Backend backend = probe_backend();
  EngineKey key = engine_key(backend, manifest);
  EngineLookup lookup = look_up_engine(key, cache_dir(chosen_cache), bundle);
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  std::unique_ptr<cJSON, void (*)(cJSON *)> info(cJSON_CreateObject(), cJSON_Delete);
  cJSON *metadata = info ? cJSON_AddObjectToObject(info.get(), "metadata") : nullptr;
  if (metadata == nullptr) throw std::bad_alloc();
  cJSON_AddNumberToObject(metadata, "cache_layout_version", kCacheLayoutVersion);
  cJSON_AddStringToObject(metadata, "bundle", bundle.c_str());
  for (cJSON *object : {info.get(), metadata}) {
    cJSON_AddStringToObject(object, "tensorrt_version", key.tensorrt_version.c_str());
    cJSON_AddStringToObject(object, "gpu_name", key.gpu_name.c_str());
    cJSON_AddStringToObject(object, "compute_capability", key.compute_capability.c_str());
    cJSON_AddStringToObject(object, "bundle_sha256", key.bundle_sha256.c_str());
  }
  cJSON_AddStringToObject(info.get(), "description", key.describe().c_str());
  cJSON_AddStringToObject(info.get(), "directory", lookup.directory.c_str());
  cJSON_AddStringToObject(info.get(), "engine_file", (lookup.directory + "/" + kEngineFile).c_str());
  cJSON_AddStringToObject(info.get(), "metadata_file", (lookup.directory + "/" + kMetadataFile).c_str());
  cJSON_AddBoolToObject(info.get(), "cached", lookup.cached);
  if (lookup.cached) cJSON_AddNullToObject(info.get(), "reason");
  else cJSON_AddStringToObject(info.get(), "reason", lookup.message.c_str());
  cJSON_AddStringToObject(info.get(), "backend", backend.describe().c_str());
  cJSON_AddStringToObject(info.get(), "plugin_library", backend.plugins.c_str());
  cJSON_AddNumberToObject(info.get(), "device_memory_free", (double)free_bytes);
  cJSON_AddNumberToObject(info.get(), "device_memory_total", (double)total_bytes);
  char *text = cJSON_PrintUnformatted(info.get());
  if (text == nullptr) throw std::bad_alloc();
  std::string result = text;
  cJSON_free(text);
  return result;
}

/* ---- Model ---------------------------------------------------------------------------------------------------- */

/* A default, not every enumerator: later TensorRT versions add types (kFP4 in 10.8, kE8M0 in 10.12), and a switch that names
 * each of 10.3's fails -Wswitch against their headers. */
std::string type_name(DataType type) {
  switch (type) {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kINT8: return "int8";
    case DataType::kINT32: return "int32";
    case DataType::kBOOL: return "bool";
    case DataType::kUINT8: return "uint8";
    case DataType::kFP8: return "fp8";
    case DataType::kBF16: return "bfloat16";
    case DataType::kINT64: return "int64";
    case DataType::kINT4: return "int4";
    default: return "TensorRT data type " + std::to_string(static_cast<int>(type));
  }
}

size_t type_size(DataType type) {
  switch (type) {
    case DataType::kINT64: return 8;
    case DataType::kFLOAT: case DataType::kINT32: return 4;
    case DataType::kHALF: case DataType::kBF16: return 2;
    default: return 1;
  }
}

struct Graph {
  std::string path;
  std::unique_ptr<nvinfer1::ICudaEngine> engine;
  std::map<std::string, DataType> tensors; /* every I/O tensor and its type */

  bool has(const std::string &name) const { return tensors.count(name) != 0; }

  /* The type of a tensor the graph must have, one of `allowed`. */
  DataType need(const std::string &name, std::initializer_list<DataType> allowed) const {
    auto found = tensors.find(name);
    if (found == tensors.end()) fail(EDGE_ERROR_BUNDLE, path + ": the engine has no tensor '" + name + "'");
    if (std::find(allowed.begin(), allowed.end(), found->second) == allowed.end()) {
      std::string expected;
      for (DataType type : allowed) expected += (expected.empty() ? "" : " or ") + type_name(type);
      fail(EDGE_ERROR_UNSUPPORTED, path + ": the engine gives '" + name + "' as " + type_name(found->second) +
                                       ", expected " + expected);
    }
    return found->second;
  }
};

struct TrtModel {
  const struct model_config *config = nullptr;
  const struct sparsity_config *sparsity = nullptr;
  std::string bundle;
  bool core = false;
  /* declared first, destroyed last: the engine it made goes before it */
  std::unique_ptr<nvinfer1::IRuntime> runtime;
  Graph graph;
  std::mutex context_lock; /* createExecutionContext from sessions on several threads */
  DataType ids_type = DataType::kINT64, level_type = DataType::kINT64;
  std::vector<std::string> past, present, activations, masks; /* past/present: [layer * 2 + part] */
};

/* The plan is mapped, not read: its pages are the file's, which the kernel can drop again, so deserializing holds
 * the weights once in the engine and not a second time in a heap copy of the plan (on Orin both share one memory). */
class MappedFile {
 public:
  explicit MappedFile(const std::string &path) {
    int descriptor = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) fail(EDGE_ERROR_IO, path + ": cannot read the engine: " + std::strerror(errno));
    struct stat info;
    if (fstat(descriptor, &info) == 0 && info.st_size > 0) {
      size_ = (size_t)info.st_size;
      data_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, descriptor, 0);
    }
    int error = errno;
    close(descriptor);
    if (data_ == MAP_FAILED || data_ == nullptr) {
      data_ = nullptr;
      fail(EDGE_ERROR_IO, path + ": cannot map the engine: " + (size_ == 0 ? "empty file" : std::strerror(error)));
    }
  }
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  const void *data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void *data_ = nullptr;
  size_t size_ = 0;
};

void deserialize(TrtModel &model, Graph &graph, const std::string &path, const EngineKey &key) {
  graph.path = path;
  MappedFile plan(path);
  last_tensorrt_error[0] = '\0';
  graph.engine.reset(model.runtime->deserializeCudaEngine(plan.data(), plan.size()));
  if (!graph.engine) {
    fail(EDGE_ERROR_UNAVAILABLE, path + ": TensorRT could not load this engine" + tensorrt_said() +
                                     "; this process has " + key.describe() + "; rebuild it on this device with "
                                     "`edge-sdk build " + model.bundle + " --force`");
  }
  if (graph.engine->getNbOptimizationProfiles() != kProfiles) {
    fail(EDGE_ERROR_BUNDLE, path + ": an engine with " + std::to_string(graph.engine->getNbOptimizationProfiles()) +
                                " optimization profiles, expected " + std::to_string(kProfiles) +
                                " (prefill, decode): rebuild with `edge-sdk build " + model.bundle + " --force`");
  }
  for (int32_t index = 0; index < graph.engine->getNbIOTensors(); index++) {
    const char *name = graph.engine->getIOTensorName(index);
    graph.tensors[name] = graph.engine->getTensorDataType(name);
  }
}

/* Every tensor the engine exchanges with us, in a type this engine can feed or read. */
void check_interface(TrtModel &model) {
  const int layers = model.config->num_layers;
  for (int layer = 0; layer < layers; layer++) {
    for (const char *part : {"key", "value"}) {
      model.past.push_back("past_key_values." + std::to_string(layer) + "." + part);
      model.present.push_back("present." + std::to_string(layer) + "." + part);
    }
    model.activations.push_back("core_activations." + std::to_string(layer));
    model.masks.push_back("core_mask." + std::to_string(layer));
  }
  const std::initializer_list<DataType> ints = {DataType::kINT64, DataType::kINT32};
  const Graph &graph = model.graph;
  model.ids_type = graph.need("input_ids", ints);
  if (graph.need("position_ids", ints) != model.ids_type) {
    fail(EDGE_ERROR_UNSUPPORTED, graph.path + ": input_ids and position_ids differ in type");
  }
  graph.need("logits", {DataType::kFLOAT});
  for (size_t i = 0; i < model.past.size(); i++) {
    graph.need(model.past[i], {DataType::kFLOAT});
    graph.need(model.present[i], {DataType::kFLOAT});
  }
  if (graph.has("sparsity_level")) model.level_type = graph.need("sparsity_level", ints);
  if (graph.has("dense")) graph.need("dense", {DataType::kBOOL});
  if (!model.core) return;
  for (int layer = 0; layer < layers; layer++) {
    graph.need(model.activations[layer], {DataType::kFLOAT});
    graph.need(model.masks[layer], {DataType::kINT32}); /* OPS.md: masks are int32 */
  }
}

void load(struct edge_model *edge, TrtModel &model) {
  model.config = &edge->config;
  model.sparsity = &edge->sparsity;
  model.bundle = edge->bundle.root;
  model.core = edge->sparsity.predictor == PREDICTOR_CORE;
  EngineKey key = engine_key(probe_backend(), edge->bundle.manifest);
  EngineLookup lookup = look_up_engine(key, cache_dir(nullptr), model.bundle);
  if (!lookup.cached) fail(EDGE_ERROR_UNAVAILABLE, lookup.message);
  last_tensorrt_error[0] = '\0';
  model.runtime.reset(nvinfer1::createInferRuntime(logger()));
  if (!model.runtime) fail(EDGE_ERROR_INTERNAL, "createInferRuntime failed" + tensorrt_said());
  deserialize(model, model.graph, lookup.directory + "/" + kEngineFile, key);
  check_interface(model);
}

/* ---- Session -------------------------------------------------------------------------------------------------- */

/* Device memory from cudaMalloc, or pinned host memory from cudaMallocHost; freed with its owner. */
struct Memory {
  void *pointer = nullptr;
  size_t size = 0;
  bool host = false;

  Memory() = default;
  Memory(const Memory &) = delete;
  Memory &operator=(const Memory &) = delete;
  ~Memory() { release(); }

  void allocate(size_t bytes, bool pinned_host = false) {
    release();
    host = pinned_host;
    bytes = std::max<size_t>(bytes, 1);
    if (host) check_cuda(cudaMallocHost(&pointer, bytes), "cudaMallocHost");
    else check_cuda(cudaMalloc(&pointer, bytes), "cudaMalloc");
    size = bytes;
  }
  void release() noexcept {
    if (pointer != nullptr) {
      if (host) cudaFreeHost(pointer); else cudaFree(pointer);
    }
    pointer = nullptr;
    size = 0;
  }
  char *bytes(size_t offset = 0) const { return static_cast<char *>(pointer) + offset; }
};

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

void put_int(void *to, DataType type, int64_t value) {
  if (type == DataType::kINT64) std::memcpy(to, &value, 8);
  else {
    int32_t narrow = (int32_t)value;
    std::memcpy(to, &narrow, 4);
  }
}

/* Bindings of one step: addresses of the tensors, shapes of the dynamic inputs. */
struct Step {
  std::map<std::string, void *> addresses;
  std::vector<std::pair<std::string, nvinfer1::Dims>> shapes;
};

nvinfer1::Dims dims(std::initializer_list<int64_t> extents) {
  nvinfer1::Dims result{};
  result.nbDims = 0;
  for (int64_t extent : extents) result.d[result.nbDims++] = extent;
  return result;
}

std::string dims_text(const nvinfer1::Dims &shape) {
  std::string text = "(";
  for (int32_t i = 0; i < shape.nbDims; i++) text += (i ? ", " : "") + std::to_string(shape.d[i]);
  return text + ")";
}

/* cache.py's rule for ceil(ratio * n), as cpu_engine.c: ratio read as its shortest round-tripping decimal. */
int64_t ceil_ratio_times(double ratio, int64_t n) {
  char text[40];
  for (int precision = 1; precision <= 17; precision++) {
    std::snprintf(text, sizeof text, "%.*e", precision - 1, ratio);
    if (std::strtod(text, nullptr) == ratio) break;
  }
  unsigned __int128 mantissa = 0;
  int digits = 0;
  const char *p = text;
  for (; *p != 'e' && *p != '\0'; p++) {
    if (*p >= '0' && *p <= '9') mantissa = mantissa * 10 + (unsigned)(*p - '0'), digits++;
  }
  int exponent = (*p == 'e' ? std::atoi(p + 1) : 0) - (digits - 1);
  unsigned __int128 numerator = mantissa * (unsigned __int128)n;
  if (exponent >= 0) return n;
  if (exponent < -36) return numerator > 0 ? 1 : 0;
  unsigned __int128 denominator = 1;
  for (int i = 0; i < -exponent; i++) denominator *= 10;
  return (int64_t)((numerator + denominator - 1) / denominator);
}

struct TrtSession {
  TrtModel *model = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<nvinfer1::IExecutionContext> prefill_context, decode_context;
  Memory activation_memory; /* TensorRT's scratch, shared by both contexts: the larger profile's size */
  Memory kv;        /* 2 sets x layers x {key, value}, each [1, kv_heads, max_seq_len, head_dim] float32 */
  size_t kv_slot = 0;
  Memory ids, positions, logits, level, dense;
  Memory core_activations, core_masks; /* per layer: [1, max_seq_len, D] float32 and [1, D] int32 */
  size_t activation_slot = 0, mask_slot = 0;
  Memory staging;   /* pinned host */
  int length = 0;   /* positions in the cache */
  int current = 0;  /* the KV set holding the cache */

  TrtSession() = default;
  TrtSession(const TrtSession &) = delete;
  TrtSession &operator=(const TrtSession &) = delete;
  ~TrtSession() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    prefill_context.reset();
    decode_context.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void *kv_buffer(int set, size_t index) const { return kv.bytes(((size_t)set * model->past.size() + index) * kv_slot); }
  void *activation_buffer(int layer) const { return core_activations.bytes((size_t)layer * activation_slot); }
  void *mask_buffer(int layer) const { return core_masks.bytes((size_t)layer * mask_slot); }

  void create(TrtModel &owner) {
    model = &owner;
    const struct model_config *c = owner.config;
    check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    nvinfer1::ICudaEngine &engine = *owner.graph.engine;
    int64_t scratch = std::max(engine.getDeviceMemorySizeForProfileV2(kPrefillProfile),
                               engine.getDeviceMemorySizeForProfileV2(kDecodeProfile));
    activation_memory.allocate((size_t)scratch);
    {
      std::lock_guard<std::mutex> guard(owner.context_lock);
      last_tensorrt_error[0] = '\0';
      const auto strategy = nvinfer1::ExecutionContextAllocationStrategy::kUSER_MANAGED;
      prefill_context.reset(engine.createExecutionContext(strategy));
      if (prefill_context) decode_context.reset(engine.createExecutionContext(strategy));
    }
    if (!prefill_context || !decode_context) {
      fail(EDGE_ERROR_OUT_OF_MEMORY, "TensorRT could not create an execution context" + tensorrt_said());
    }
    for (auto profile : {std::make_pair(prefill_context.get(), kPrefillProfile),
                         std::make_pair(decode_context.get(), kDecodeProfile)}) {
      profile.first->setDeviceMemoryV2(activation_memory.pointer, scratch);
      if (!profile.first->setOptimizationProfileAsync(profile.second, stream)) {
        fail(EDGE_ERROR_BUNDLE, owner.graph.path + ": TensorRT refused optimization profile " +
                                    std::to_string(profile.second) + tensorrt_said() + "; rebuild with `edge-sdk build " +
                                    owner.bundle + " --force`");
      }
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    size_t seq = (size_t)c->max_seq_len, D = (size_t)c->intermediate_size;
    kv_slot = aligned((size_t)c->num_kv_heads * seq * (size_t)c->head_dim * sizeof(float));
    try {
      kv.allocate(2 * owner.past.size() * kv_slot);
    } catch (const Failure &failure) {
      if (failure.status != EDGE_ERROR_OUT_OF_MEMORY) throw;
      fail(EDGE_ERROR_OUT_OF_MEMORY, "cudaMalloc of the KV cache (" + std::to_string(2 * owner.past.size() * kv_slot >> 20) +
                                         " MiB: two buffer sets for " + std::to_string(seq) +
                                         " positions) failed; lower max_seq_len");
    }
    size_t id_size = type_size(owner.ids_type);
    ids.allocate(seq * id_size);
    positions.allocate(seq * id_size);
    logits.allocate((size_t)c->vocab_size * sizeof(float));
    staging.allocate(std::max({2 * seq * 8, (size_t)c->vocab_size * sizeof(float), D * 8}), true);
    /* decode's scalars: the level index (0 for predictors without levels) and the dense switch */
    level.allocate(8);
    dense.allocate(1);
    put_int(staging.bytes(), owner.level_type, owner.sparsity->level_index < 0 ? 0 : owner.sparsity->level_index);
    check_cuda(cudaMemcpy(level.pointer, staging.bytes(), type_size(owner.level_type), cudaMemcpyHostToDevice), "cudaMemcpy");
    uint8_t dense_flag = owner.sparsity->dense ? 1 : 0;
    check_cuda(cudaMemcpy(dense.pointer, &dense_flag, 1, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (owner.core) {
      activation_slot = aligned(seq * D * sizeof(float));
      mask_slot = aligned(D * sizeof(int32_t));
      core_activations.allocate((size_t)c->num_layers * activation_slot);
      core_masks.allocate((size_t)c->num_layers * mask_slot);
      check_cuda(cudaMemset(core_masks.pointer, 0, core_masks.size), "cudaMemset");
    }
  }

  /* Runs ids (at positions length..) in the prefill or decode profile; the last position's logits into out [vocab]. */
  void run(bool prefill, const int32_t *tokens, int seq, float *out) {
    const struct model_config *c = model->config;
    const Graph &graph = model->graph;
    nvinfer1::IExecutionContext *context = prefill ? prefill_context.get() : decode_context.get();
    if (prefill) length = 0, current = 0;
    int past = length;
    if (past + seq > c->max_seq_len) {
      fail(EDGE_ERROR_SEQUENCE_FULL, std::to_string(past + seq) + " tokens do not fit the KV cache of " +
                                         std::to_string(c->max_seq_len) + " positions");
    }
    size_t vocab = (size_t)c->vocab_size;
    if ((size_t)seq * vocab * sizeof(float) > logits.size) logits.allocate((size_t)seq * vocab * sizeof(float));
    size_t id_size = type_size(model->ids_type);
    for (int i = 0; i < seq; i++) {
      put_int(staging.bytes((size_t)i * id_size), model->ids_type, tokens[i]);
      put_int(staging.bytes(((size_t)c->max_seq_len + (size_t)i) * id_size), model->ids_type, past + i);
    }
    check_cuda(cudaMemcpyAsync(ids.pointer, staging.bytes(), (size_t)seq * id_size, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaMemcpyAsync(positions.pointer, staging.bytes((size_t)c->max_seq_len * id_size), (size_t)seq * id_size,
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");

    Step step;
    step.shapes.emplace_back("input_ids", dims({1, seq}));
    step.shapes.emplace_back("position_ids", dims({1, seq}));
    step.addresses["input_ids"] = ids.pointer;
    step.addresses["position_ids"] = positions.pointer;
    step.addresses["logits"] = logits.pointer;
    for (size_t i = 0; i < model->past.size(); i++) {
      step.shapes.emplace_back(model->past[i], dims({1, c->num_kv_heads, past, c->head_dim}));
      step.addresses[model->past[i]] = kv_buffer(current, i);
      step.addresses[model->present[i]] = kv_buffer(1 - current, i);
    }
    step.addresses["sparsity_level"] = level.pointer;
    step.addresses["dense"] = dense.pointer;
    if (model->core) {
      for (int layer = 0; layer < c->num_layers; layer++) {
        step.addresses[model->activations[layer]] = activation_buffer(layer);
        step.shapes.emplace_back(model->masks[layer], dims({1, c->intermediate_size}));
        step.addresses[model->masks[layer]] = mask_buffer(layer);
      }
    }
    enqueue(graph, context, step);
    nvinfer1::Dims shape = context->getTensorShape("logits");
    if (shape.nbDims != 3 || shape.d[0] != 1 || shape.d[1] != seq || shape.d[2] != (int64_t)vocab) {
      cudaStreamSynchronize(stream);
      fail(EDGE_ERROR_BUNDLE, graph.path + ": logits of shape " + dims_text(shape) + ", expected (1, " +
                                  std::to_string(seq) + ", " + std::to_string(vocab) + "): the engine does not match "
                                  "the bundle; rebuild with `edge-sdk build " + model->bundle + " --force`");
    }
    check_cuda(cudaMemcpyAsync(staging.bytes(), logits.bytes((size_t)(seq - 1) * vocab * sizeof(float)),
                               vocab * sizeof(float), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::memcpy(out, staging.pointer, vocab * sizeof(float));
    current = 1 - current;
    length = past + seq;
  }

  void enqueue(const Graph &graph, nvinfer1::IExecutionContext *context, const Step &step) {
    for (const auto &input : step.shapes) {
      if (graph.has(input.first) && !context->setInputShape(input.first.c_str(), input.second)) {
        fail(EDGE_ERROR_INVALID_ARGUMENT, graph.path + ": TensorRT refused shape " + dims_text(input.second) +
                                              " for input '" + input.first + "' (outside the engine profile)" +
                                              tensorrt_said());
      }
    }
    for (const auto &tensor : graph.tensors) {
      auto address = step.addresses.find(tensor.first);
      if (address == step.addresses.end()) {
        fail(EDGE_ERROR_BUNDLE, graph.path + ": no device buffer for the engine's tensor '" + tensor.first +
                                    "' (an engine of another graph interface: rebuild with `edge-sdk build " +
                                    model->bundle + " --force`)");
      }
      if (!context->setTensorAddress(tensor.first.c_str(), address->second)) {
        fail(EDGE_ERROR_INTERNAL, graph.path + ": TensorRT refused the address of '" + tensor.first + "'" + tensorrt_said());
      }
    }
    if (!context->allInputDimensionsSpecified()) {
      fail(EDGE_ERROR_INTERNAL, graph.path + ": an input shape of the engine is not set" + tensorrt_said());
    }
    last_tensorrt_error[0] = '\0';
    if (!context->enqueueV3(stream)) {
      cudaStreamSynchronize(stream);
      fail(EDGE_ERROR_INTERNAL, graph.path + ": TensorRT failed to run the engine" + tensorrt_said());
    }
  }

  /* sparsity/core.py, from the prompt's seq tokens of gate activations: per token its ceil(alpha * n_pos) largest
   * positive activations (equal values: lower index first) are counted and summed per neuron; per layer the
   * ceil(beta * D) neurons by (count desc, sum desc, index asc) form the mask, never one of count 0. */
  void choose_core_masks(int seq) {
    const struct model_config *c = model->config;
    const size_t D = (size_t)c->intermediate_size;
    const int64_t keep = ceil_ratio_times(model->sparsity->core_beta, (int64_t)D);
    std::vector<float> activations((size_t)seq * D);
    std::vector<int64_t> counts(D);
    std::vector<double> sums(D);
    std::vector<int32_t> order(D);
    std::vector<int32_t> masks((size_t)c->num_layers * D, 0);
    for (int layer = 0; layer < c->num_layers; layer++) {
      check_cuda(cudaMemcpyAsync(activations.data(), activation_buffer(layer), activations.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync");
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      std::fill(counts.begin(), counts.end(), 0);
      std::fill(sums.begin(), sums.end(), 0.0);
      for (int token = 0; token < seq; token++) {
        const float *row = activations.data() + (size_t)token * D;
        size_t n_positive = 0;
        for (size_t i = 0; i < D; i++) {
          if (row[i] > 0.0f) order[n_positive++] = (int32_t)i;
        }
        const int64_t taken = ceil_ratio_times(model->sparsity->core_alpha, (int64_t)n_positive);
        std::partial_sort(order.begin(), order.begin() + taken, order.begin() + (int64_t)n_positive,
                          [&](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
        for (int64_t r = 0; r < taken; r++) {
          counts[order[r]] += 1;
          sums[order[r]] += (double)row[order[r]];
        }
      }
      for (size_t i = 0; i < D; i++) order[i] = (int32_t)i;
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (counts[a] != counts[b]) return counts[a] > counts[b];
        if (sums[a] != sums[b]) return sums[a] > sums[b];
        return a < b;
      });
      int32_t *mask = masks.data() + (size_t)layer * D;
      for (int64_t r = 0; r < keep && r < (int64_t)D; r++) {
        if (counts[order[r]] > 0) mask[order[r]] = 1;
      }
    }
    for (int layer = 0; layer < c->num_layers; layer++) {
      check_cuda(cudaMemcpyAsync(mask_buffer(layer), masks.data() + (size_t)layer * D, D * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync");
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

/* ---- engine_ops ----------------------------------------------------------------------------------------------- */

edge_status trt_load(struct edge_model *edge, void **out) {
  *out = nullptr;
  std::unique_ptr<TrtModel> model;
  edge_status status = guarded("load", [&] {
    model.reset(new TrtModel());
    load(edge, *model);
  });
  if (status != EDGE_OK) {
    if (model) {
      try { model.reset(); } catch (...) {} /* destructors of TensorRT objects do not throw; be safe anyway */
    }
    return status;
  }
  *out = model.release();
  return EDGE_OK;
}

void trt_unload(void *engine) {
  try {
    delete static_cast<TrtModel *>(engine);
  } catch (...) {
  }
}

edge_status trt_session_create(const struct edge_model *edge, void **out) {
  *out = nullptr;
  std::unique_ptr<TrtSession> session;
  edge_status status = guarded("session", [&] {
    session.reset(new TrtSession());
    session->create(*static_cast<TrtModel *>(edge->engine));
  });
  if (status != EDGE_OK) return status; /* session's destructor freed what create made */
  *out = session.release();
  return EDGE_OK;
}

void trt_session_destroy(void *state) {
  try {
    delete static_cast<TrtSession *>(state);
  } catch (...) {
  }
}

edge_status trt_prefill(void *state, const int32_t *ids, int n, float *logits) {
  auto *session = static_cast<TrtSession *>(state);
  return guarded("prefill", [&] {
    session->length = 0;
    session->run(true, ids, n, logits);
    if (session->model->core) {
      try {
        session->choose_core_masks(n);
      } catch (...) {
        session->length = 0; /* no masks: decode must not run */
        throw;
      }
    }
  });
}

edge_status trt_decode(void *state, int32_t token, int position, float *logits) {
  auto *session = static_cast<TrtSession *>(state);
  return guarded("decode", [&] {
    if (session->length == 0) fail(EDGE_ERROR_STATE, "decode: call edge_session_prefill first");
    if (position != session->length) {
      fail(EDGE_ERROR_STATE, "decode at position " + std::to_string(position) + ", but the KV cache holds " +
                                 std::to_string(session->length) + " positions");
    }
    session->run(false, &token, 1, logits);
  });
}

}  // namespace

extern "C" edge_status trt_probe(const char **description) {
  return guarded("probe", [&] {
    probe_description = probe_backend().describe();
    *description = probe_description.c_str();
  });
}

extern "C" edge_status trt_engine_info(const struct bundle *bundle, const char *cache_dir, char **json) {
  *json = nullptr;
  return guarded("engine info", [&] {
    std::string text = engine_info_json(bundle->manifest, bundle->root, cache_dir);
    char *copy = static_cast<char *>(std::malloc(text.size() + 1));
    if (copy == nullptr) throw std::bad_alloc();
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *json = copy;
  });
}

extern "C" const struct engine_ops trt_engine_ops = {
    "tensorrt", trt_load, trt_unload, trt_session_create, trt_session_destroy, trt_prefill, trt_decode,
};
