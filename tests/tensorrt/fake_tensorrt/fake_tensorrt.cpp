/* A fake libnvinfer and CUDA runtime in one library, for testing jetson/src/trt_engine.cpp without TensorRT or a
 * GPU (README.md). Device memory is host memory, every allocation recorded; an "engine" is a JSON plan naming the
 * graph's tensors, its optimization profiles and activation sizes; enqueueV3 hands the bound addresses and shapes to
 * a runner the test registers (edge_fake_set_runner), which runs the bundle's graph in ONNX Runtime on that memory.
 *
 * What a real GPU or TensorRT would refuse, and tests should catch, fails here with a message in the TensorRT log or
 * a CUDA error: a copy or a binding outside a device allocation (or of the wrong direction), an address not
 * 256-byte aligned, an output bound to an input's memory, a shape outside the selected profile, an unknown tensor, a
 * stream that does not exist, an enqueue before every input shape, address and (user-managed) activation memory is
 * set, a second registration of the plugins. edge_fake_report() says what happened: live allocations and streams, allocation calls, the file the plan
 * was mapped from, each execution context's activation memory, profiles and enqueues.
 *
 * Behaviour controlled by environment variables, read at each call: EDGE_FAKE_TENSORRT_VERSION (getInferLibVersion,
 * default 100300), EDGE_FAKE_CUDA_DEVICES (default 1; -1: cudaGetDeviceCount fails), EDGE_FAKE_CUDA_DEVICE_NAME
 * (default "Fake Orin", compute capability 8.7), EDGE_FAKE_CUDA_FREE_BYTES (cudaMemGetInfo, default 8 GiB). */
#include <NvInfer.h>
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
/* Runs one enqueueV3: request is JSON {"graph", "profile", "context", "tensors": {name: {"address", "type",
 * "input", "shape" (inputs)}}}; returns nonzero on success. */
typedef int (*edge_fake_runner)(const char *request);
void edge_fake_set_runner(edge_fake_runner runner);
int edge_fake_set_output_shape(const char *name, int32_t nb_dims, const int64_t *dims);
int64_t edge_fake_device_bytes_from(uint64_t address);
const char *edge_fake_report(void);
}

namespace {

using nvinfer1::DataType;
using nvinfer1::Dims;

long long env_int(const char *name, long long fallback) {
  const char *value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? std::atoll(value) : fallback;
}

/* ---- memory ---------------------------------------------------------------------------------------------------- */

struct Allocation {
  size_t size;
  bool device;
};

std::map<uintptr_t, Allocation> allocations; /* by start address */
long long allocation_calls = 0;
long long memory_errors = 0;
std::string last_memory_error;
std::set<cudaStream_t> streams;
long long next_stream = 1;

bool memory_error(const std::string &message) {
  memory_errors++;
  last_memory_error = message;
  std::fprintf(stderr, "[fake CUDA] %s\n", message.c_str());
  return false;
}

/* The allocation holding [pointer, pointer + bytes), or nullptr. */
const Allocation *allocation_of(const void *pointer, size_t bytes) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  auto next = allocations.upper_bound(address);
  if (next == allocations.begin()) return nullptr;
  auto found = std::prev(next);
  if (address + bytes > found->first + found->second.size) return nullptr;
  return &found->second;
}

bool on_device(const void *pointer, size_t bytes) {
  const Allocation *allocation = allocation_of(pointer, bytes);
  return allocation != nullptr && allocation->device;
}

bool not_on_device(const void *pointer) {
  const Allocation *allocation = allocation_of(pointer, 1);
  return allocation == nullptr || !allocation->device;
}

cudaError_t allocate(void **pointer, size_t size, bool device) {
  if (pointer == nullptr) return cudaErrorInvalidValue;
  size_t rounded = (std::max<size_t>(size, 1) + 255) / 256 * 256;
  void *memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return cudaErrorMemoryAllocation;
  std::memset(memory, 0xa5, rounded); /* no engine may read what it did not write */
  allocations[reinterpret_cast<uintptr_t>(memory)] = Allocation{size, device};
  allocation_calls++;
  *pointer = memory;
  return cudaSuccess;
}

cudaError_t release(void *pointer, bool device) {
  if (pointer == nullptr) return cudaSuccess;
  auto found = allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (found == allocations.end() || found->second.device != device) {
    memory_error(std::string(device ? "cudaFree" : "cudaFreeHost") + " of an address it did not allocate");
    return cudaErrorInvalidValue;
  }
  allocations.erase(found);
  std::free(pointer);
  return cudaSuccess;
}

bool copy_allowed(void *destination, const void *source, size_t count, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return (on_device(destination, count) && not_on_device(source)) ||
             memory_error("cudaMemcpy host to device of " + std::to_string(count) + " bytes: the destination is not "
                          "inside one device allocation, or the source is device memory");
    case cudaMemcpyDeviceToHost:
      return (on_device(source, count) && not_on_device(destination)) ||
             memory_error("cudaMemcpy device to host of " + std::to_string(count) + " bytes: the source is not "
                          "inside one device allocation, or the destination is device memory");
    case cudaMemcpyDeviceToDevice:
      return (on_device(source, count) && on_device(destination, count)) ||
             memory_error("cudaMemcpy device to device outside the device allocations");
    default:
      return memory_error("cudaMemcpy of kind " + std::to_string((int)kind) + ": give the direction");
  }
}

/* ---- TensorRT ------------------------------------------------------------------------------------------------- */

nvinfer1::ILogger *logger = nullptr; /* the last runtime's */
long long runtimes_alive = 0, engines_alive = 0, contexts_alive = 0;
std::vector<std::string> plugin_libraries;
std::string plan_mapping; /* the file the last plan was mapped from; "" when it was not a mapped file */
edge_fake_runner runner = nullptr;

void log_error(const std::string &message) {
  std::string text = "fake TensorRT: " + message;
  if (logger != nullptr) logger->log(nvinfer1::ILogger::Severity::kERROR, text.c_str());
  else std::fprintf(stderr, "[fake TensorRT] %s\n", text.c_str());
}

/* What a context did, kept after it is destroyed so the test can read it. */
struct ContextRecord {
  int strategy = 0;
  uintptr_t device_memory = 0;
  int64_t device_memory_size = -1;
  std::vector<int> profiles_set;
  std::vector<long long> enqueues;
};
std::vector<ContextRecord> context_records;

struct Tensor {
  std::string name;
  DataType type;
  bool input;
  Dims shape; /* static shape, or nbDims -1 for a dynamic input / an output */
};

using Bounds = std::pair<std::vector<int64_t>, std::vector<int64_t>>; /* min, max */

class FakeEngine;

/* The file holding the mapped page at pointer (/proc/self/maps), or "". */
std::string mapping_of(const void *pointer) {
  std::ifstream maps("/proc/self/maps");
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, path);
    size_t dash = range.find('-');
    uintptr_t start = std::stoull(range.substr(0, dash), nullptr, 16);
    uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (start <= address && address < end) return inode != "0" ? path : "";
  }
  return "";
}

class FakeContext final : public nvinfer1::IExecutionContext {
 public:
  FakeContext(const FakeEngine &engine, nvinfer1::ExecutionContextAllocationStrategy strategy);
  ~FakeContext() noexcept override { contexts_alive--; }

  void setDeviceMemoryV2(void *memory, int64_t size) noexcept override {
    if (!on_device(memory, (size_t)size)) memory_error("setDeviceMemoryV2 outside the device allocations");
    record().device_memory = reinterpret_cast<uintptr_t>(memory);
    record().device_memory_size = size;
  }

  bool setInputShape(char const *name, Dims const &dims) noexcept override;
  Dims getTensorShape(char const *name) const noexcept override;
  bool allInputDimensionsSpecified() const noexcept override;

  bool setOptimizationProfileAsync(int32_t index, cudaStream_t stream) noexcept override;

  bool setTensorAddress(char const *name, void *data) noexcept override {
    if (find(name) == nullptr) {
      log_error(std::string("setTensorAddress: no tensor '") + name + "'");
      return false;
    }
    if (reinterpret_cast<uintptr_t>(data) % 256 != 0 || !on_device(data, 1)) {
      log_error(std::string("setTensorAddress: '") + name + "' bound to memory that is not a 256-byte aligned "
                "address inside a device allocation");
      return false;
    }
    addresses_[name] = data;
    return true;
  }

  bool enqueueV3(cudaStream_t stream) noexcept override;

  static FakeContext *running; /* during the runner's call */
  std::map<std::string, Dims> output_shapes;

 private:
  const Tensor *find(const std::string &name) const;
  ContextRecord &record() { return context_records[record_]; }

  const FakeEngine &engine_;
  size_t record_;
  int profile_ = 0; /* a new context starts in profile 0 */
  std::map<std::string, Dims> input_shapes_;
  std::map<std::string, void *> addresses_;
};

FakeContext *FakeContext::running = nullptr;

class FakeEngine final : public nvinfer1::ICudaEngine {
 public:
  FakeEngine(std::string graph, std::vector<Tensor> tensors, std::vector<std::map<std::string, Bounds>> profiles,
             std::vector<int64_t> device_memory)
      : graph(std::move(graph)), tensors(std::move(tensors)), profiles(std::move(profiles)),
        device_memory(std::move(device_memory)) {
    engines_alive++;
  }
  ~FakeEngine() noexcept override { engines_alive--; }

  DataType getTensorDataType(char const *name) const noexcept override {
    for (const Tensor &tensor : tensors) {
      if (tensor.name == name) return tensor.type;
    }
    return DataType::kFLOAT;
  }
  nvinfer1::IExecutionContext *createExecutionContext(
      nvinfer1::ExecutionContextAllocationStrategy strategy) noexcept override {
    return new (std::nothrow) FakeContext(*this, strategy);
  }
  int64_t getDeviceMemorySizeForProfileV2(int32_t index) const noexcept override {
    return index >= 0 && (size_t)index < device_memory.size() ? device_memory[(size_t)index] : -1;
  }
  int32_t getNbOptimizationProfiles() const noexcept override { return (int32_t)profiles.size(); }
  int32_t getNbIOTensors() const noexcept override { return (int32_t)tensors.size(); }
  char const *getIOTensorName(int32_t index) const noexcept override {
    return index >= 0 && (size_t)index < tensors.size() ? tensors[(size_t)index].name.c_str() : nullptr;
  }

  std::string graph;
  std::vector<Tensor> tensors;
  std::vector<std::map<std::string, Bounds>> profiles;
  std::vector<int64_t> device_memory;
};

FakeContext::FakeContext(const FakeEngine &engine, nvinfer1::ExecutionContextAllocationStrategy strategy)
    : engine_(engine), record_(context_records.size()) {
  contexts_alive++;
  context_records.emplace_back();
  record().strategy = (int)strategy;
  record().enqueues.assign(engine.profiles.size(), 0);
}

const Tensor *FakeContext::find(const std::string &name) const {
  for (const Tensor &tensor : engine_.tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

bool FakeContext::setOptimizationProfileAsync(int32_t index, cudaStream_t stream) noexcept {
  if (streams.count(stream) == 0) {
    log_error("setOptimizationProfileAsync on a stream that does not exist");
    return false;
  }
  if (index < 0 || (size_t)index >= engine_.profiles.size()) {
    log_error("setOptimizationProfileAsync: no profile " + std::to_string(index));
    return false;
  }
  profile_ = index;
  input_shapes_.clear(); /* shapes are per profile */
  record().profiles_set.push_back(index);
  return true;
}

bool FakeContext::setInputShape(char const *name, Dims const &dims) noexcept {
  const Tensor *tensor = find(name);
  auto bounds = engine_.profiles[(size_t)profile_].find(name);
  if (tensor == nullptr || !tensor->input || bounds == engine_.profiles[(size_t)profile_].end()) {
    log_error(std::string("setInputShape: '") + name + "' is no dynamic input of the engine");
    return false;
  }
  const std::vector<int64_t> &low = bounds->second.first, &high = bounds->second.second;
  bool inside = (size_t)dims.nbDims == low.size();
  for (int32_t i = 0; inside && i < dims.nbDims; i++) inside = low[(size_t)i] <= dims.d[i] && dims.d[i] <= high[(size_t)i];
  if (!inside) {
    log_error(std::string("setInputShape: the shape of '") + name + "' is outside profile " + std::to_string(profile_));
    return false;
  }
  input_shapes_[name] = dims;
  return true;
}

Dims FakeContext::getTensorShape(char const *name) const noexcept {
  Dims unknown{};
  unknown.nbDims = -1;
  const Tensor *tensor = find(name);
  if (tensor == nullptr) return unknown;
  if (tensor->shape.nbDims >= 0) return tensor->shape;
  const std::map<std::string, Dims> &shapes = tensor->input ? input_shapes_ : output_shapes;
  auto found = shapes.find(name);
  return found == shapes.end() ? unknown : found->second;
}

bool FakeContext::allInputDimensionsSpecified() const noexcept {
  for (const auto &bounds : engine_.profiles[(size_t)profile_]) {
    if (input_shapes_.count(bounds.first) == 0) return false;
  }
  return true;
}

cJSON *dims_json(const Dims &dims) {
  cJSON *list = cJSON_CreateArray();
  for (int32_t i = 0; i < dims.nbDims; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber((double)dims.d[i]));
  return list;
}

bool FakeContext::enqueueV3(cudaStream_t stream) noexcept {
  if (streams.count(stream) == 0) {
    log_error("enqueueV3 on a stream that does not exist");
    return false;
  }
  if (record().strategy == (int)nvinfer1::ExecutionContextAllocationStrategy::kUSER_MANAGED &&
      record().device_memory_size < engine_.device_memory[(size_t)profile_]) {
    log_error("enqueueV3 without the activation memory of profile " + std::to_string(profile_));
    return false;
  }
  if (!allInputDimensionsSpecified()) {
    log_error("enqueueV3 before every input shape of profile " + std::to_string(profile_) + " was set");
    return false;
  }
  if (runner == nullptr) {
    log_error("enqueueV3 without a runner (edge_fake_set_runner)");
    return false;
  }
  std::map<void *, std::string> inputs_at;
  for (const Tensor &tensor : engine_.tensors) {
    auto address = addresses_.find(tensor.name);
    if (tensor.input && address != addresses_.end()) inputs_at[address->second] = tensor.name;
  }
  for (const Tensor &tensor : engine_.tensors) {
    auto address = addresses_.find(tensor.name);
    if (!tensor.input && address != addresses_.end() && inputs_at.count(address->second) != 0) {
      log_error("enqueueV3: output '" + tensor.name + "' is bound to the memory of input '" +
                inputs_at[address->second] + "'");
      return false;
    }
  }
  std::unique_ptr<cJSON, void (*)(cJSON *)> request(cJSON_CreateObject(), cJSON_Delete);
  cJSON_AddStringToObject(request.get(), "graph", engine_.graph.c_str());
  cJSON_AddNumberToObject(request.get(), "profile", profile_);
  cJSON_AddNumberToObject(request.get(), "context", (double)record_);
  cJSON *tensors = cJSON_AddObjectToObject(request.get(), "tensors");
  for (const Tensor &tensor : engine_.tensors) {
    auto address = addresses_.find(tensor.name);
    if (address == addresses_.end()) {
      log_error("enqueueV3 without an address for '" + tensor.name + "'");
      return false;
    }
    cJSON *entry = cJSON_AddObjectToObject(tensors, tensor.name.c_str());
    cJSON_AddNumberToObject(entry, "address", (double)reinterpret_cast<uintptr_t>(address->second));
    cJSON_AddNumberToObject(entry, "type", (double)(int)tensor.type);
    cJSON_AddBoolToObject(entry, "input", tensor.input);
    if (tensor.input) cJSON_AddItemToObject(entry, "shape", dims_json(getTensorShape(tensor.name.c_str())));
  }
  char *text = cJSON_PrintUnformatted(request.get());
  output_shapes.clear();
  running = this;
  int ok = runner(text);
  running = nullptr;
  cJSON_free(text);
  record().enqueues[(size_t)profile_]++;
  if (!ok) log_error("the runner failed (see the test's output)");
  return ok != 0;
}

class FakeRuntime final : public nvinfer1::IRuntime {
 public:
  FakeRuntime() { runtimes_alive++; }
  ~FakeRuntime() noexcept override { runtimes_alive--; }

  /* The plan is JSON: {"graph", "tensors": [{"name", "type", "input", "shape"?}], "profiles": [{name: [min, max]}],
   * "device_memory": [bytes per profile]}; anything else is refused as TensorRT refuses a foreign plan. */
  nvinfer1::ICudaEngine *deserializeCudaEngine(void const *blob, std::size_t size) noexcept override {
    plan_mapping = mapping_of(blob);
    std::string text(static_cast<const char *>(blob), size);
    std::unique_ptr<cJSON, void (*)(cJSON *)> plan(cJSON_Parse(text.c_str()), cJSON_Delete);
    const cJSON *graph = cJSON_GetObjectItemCaseSensitive(plan.get(), "graph");
    const cJSON *tensor_list = cJSON_GetObjectItemCaseSensitive(plan.get(), "tensors");
    const cJSON *profile_list = cJSON_GetObjectItemCaseSensitive(plan.get(), "profiles");
    const cJSON *memory_list = cJSON_GetObjectItemCaseSensitive(plan.get(), "device_memory");
    if (!cJSON_IsString(graph) || !cJSON_IsArray(tensor_list) || !cJSON_IsArray(profile_list) ||
        !cJSON_IsArray(memory_list)) {
      log_error("the plan is no fake engine (serialized by another TensorRT?)");
      return nullptr;
    }
    std::vector<Tensor> tensors;
    const cJSON *item;
    cJSON_ArrayForEach(item, tensor_list) {
      Tensor tensor;
      tensor.name = cJSON_GetObjectItemCaseSensitive(item, "name")->valuestring;
      tensor.type = (DataType)cJSON_GetObjectItemCaseSensitive(item, "type")->valueint;
      tensor.input = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(item, "input"));
      tensor.shape.nbDims = -1;
      const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
      if (cJSON_IsArray(shape)) {
        tensor.shape.nbDims = 0;
        const cJSON *extent;
        cJSON_ArrayForEach(extent, shape) tensor.shape.d[tensor.shape.nbDims++] = (int64_t)extent->valuedouble;
      }
      tensors.push_back(tensor);
    }
    std::vector<std::map<std::string, Bounds>> profiles;
    cJSON_ArrayForEach(item, profile_list) {
      std::map<std::string, Bounds> bounds;
      const cJSON *input;
      cJSON_ArrayForEach(input, item) {
        Bounds range;
        const cJSON *extent;
        cJSON_ArrayForEach(extent, cJSON_GetArrayItem(input, 0)) range.first.push_back((int64_t)extent->valuedouble);
        cJSON_ArrayForEach(extent, cJSON_GetArrayItem(input, 1)) range.second.push_back((int64_t)extent->valuedouble);
        bounds[input->string] = range;
      }
      profiles.push_back(bounds);
    }
    std::vector<int64_t> device_memory;
    cJSON_ArrayForEach(item, memory_list) device_memory.push_back((int64_t)item->valuedouble);
    return new (std::nothrow) FakeEngine(graph->valuestring, tensors, profiles, device_memory);
  }
};

class FakeRegistry final : public nvinfer1::IPluginRegistry {
 public:
  PluginLibraryHandle loadLibrary(char const *path) noexcept override {
    struct stat info;
    if (std::strchr(path, '/') == nullptr || stat(path, &info) != 0 || !S_ISREG(info.st_mode)) {
      log_error(std::string("no plugin library at ") + path);
      return nullptr;
    }
    if (!plugin_libraries.empty()) {
      log_error(std::string("loadLibrary(") + path + "): the plugins are already registered");
      return nullptr;
    }
    plugin_libraries.push_back(path);
    return &plugin_libraries;
  }
  ~FakeRegistry() noexcept override = default;
};

FakeRegistry registry;
std::string report_text;

}  // namespace

/* ---- libnvinfer ----------------------------------------------------------------------------------------------- */

extern "C" int32_t getInferLibVersion() noexcept { return (int32_t)env_int("EDGE_FAKE_TENSORRT_VERSION", 100300); }

extern "C" void *createInferRuntime_INTERNAL(void *runtime_logger, int32_t) noexcept {
  logger = static_cast<nvinfer1::ILogger *>(runtime_logger);
  return static_cast<nvinfer1::IRuntime *>(new (std::nothrow) FakeRuntime());
}

extern "C" nvinfer1::IPluginRegistry *getPluginRegistry() noexcept { return &registry; }

/* ---- CUDA runtime --------------------------------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
  long long devices = env_int("EDGE_FAKE_CUDA_DEVICES", 1);
  if (devices < 0) return cudaErrorNoDevice;
  *count = (int)devices;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= env_int("EDGE_FAKE_CUDA_DEVICES", 1)) return cudaErrorInvalidValue;
  const char *name = std::getenv("EDGE_FAKE_CUDA_DEVICE_NAME");
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", name != nullptr ? name : "Fake Orin");
  prop->major = 8;
  prop->minor = 7;
  prop->totalGlobalMem = (size_t)16 << 30;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void **pointer, size_t size) { return allocate(pointer, size, true); }
cudaError_t cudaFree(void *pointer) { return release(pointer, true); }
cudaError_t cudaMallocHost(void **pointer, size_t size) { return allocate(pointer, size, false); }
cudaError_t cudaFreeHost(void *pointer) { return release(pointer, false); }

cudaError_t cudaMemcpy(void *destination, const void *source, size_t count, enum cudaMemcpyKind kind) {
  if (!copy_allowed(destination, source, count, kind)) return cudaErrorInvalidValue;
  std::memcpy(destination, source, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *destination, const void *source, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (streams.count(stream) == 0) return cudaErrorInvalidResourceHandle;
  return cudaMemcpy(destination, source, count, kind);
}

cudaError_t cudaMemset(void *pointer, int value, size_t count) {
  if (!on_device(pointer, count)) {
    memory_error("cudaMemset outside the device allocations");
    return cudaErrorInvalidValue;
  }
  std::memset(pointer, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  *free = (size_t)env_int("EDGE_FAKE_CUDA_FREE_BYTES", 8LL << 30);
  *total = (size_t)16 << 30;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  *stream = reinterpret_cast<cudaStream_t>(next_stream++);
  streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return streams.count(stream) != 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return streams.erase(stream) != 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

/* ---- the test's side ------------------------------------------------------------------------------------------ */

void edge_fake_set_runner(edge_fake_runner function) { runner = function; }

int edge_fake_set_output_shape(const char *name, int32_t nb_dims, const int64_t *dims) {
  if (FakeContext::running == nullptr || nb_dims < 0 || nb_dims > Dims::MAX_DIMS) return 0;
  Dims shape{};
  shape.nbDims = nb_dims;
  for (int32_t i = 0; i < nb_dims; i++) shape.d[i] = dims[i];
  FakeContext::running->output_shapes[name] = shape;
  return 1;
}

int64_t edge_fake_device_bytes_from(uint64_t address) {
  const void *pointer = reinterpret_cast<const void *>((uintptr_t)address);
  auto next = allocations.upper_bound((uintptr_t)address);
  if (next == allocations.begin() || !on_device(pointer, 1)) return -1;
  auto found = std::prev(next);
  return (int64_t)(found->first + found->second.size - (uintptr_t)address);
}

const char *edge_fake_report(void) {
  std::unique_ptr<cJSON, void (*)(cJSON *)> report(cJSON_CreateObject(), cJSON_Delete);
  long long device_allocations = 0, host_allocations = 0, device_bytes = 0;
  for (const auto &entry : allocations) {
    if (entry.second.device) device_allocations++, device_bytes += (long long)entry.second.size;
    else host_allocations++;
  }
  cJSON_AddNumberToObject(report.get(), "device_allocations", (double)device_allocations);
  cJSON_AddNumberToObject(report.get(), "device_bytes", (double)device_bytes);
  cJSON_AddNumberToObject(report.get(), "host_allocations", (double)host_allocations);
  cJSON_AddNumberToObject(report.get(), "allocation_calls", (double)allocation_calls);
  cJSON_AddNumberToObject(report.get(), "memory_errors", (double)memory_errors);
  cJSON_AddStringToObject(report.get(), "last_memory_error", last_memory_error.c_str());
  cJSON_AddNumberToObject(report.get(), "streams", (double)streams.size());
  cJSON_AddNumberToObject(report.get(), "runtimes", (double)runtimes_alive);
  cJSON_AddNumberToObject(report.get(), "engines", (double)engines_alive);
  cJSON_AddNumberToObject(report.get(), "contexts", (double)contexts_alive);
  cJSON_AddStringToObject(report.get(), "plan_mapping", plan_mapping.c_str());
  cJSON *plugins = cJSON_AddArrayToObject(report.get(), "plugin_libraries");
  for (const std::string &path : plugin_libraries) cJSON_AddItemToArray(plugins, cJSON_CreateString(path.c_str()));
  cJSON *records = cJSON_AddArrayToObject(report.get(), "context_records");
  for (const ContextRecord &record : context_records) {
    cJSON *entry = cJSON_CreateObject();
    cJSON_AddNumberToObject(entry, "strategy", record.strategy);
    cJSON_AddNumberToObject(entry, "device_memory", (double)record.device_memory);
    cJSON_AddNumberToObject(entry, "device_memory_size", (double)record.device_memory_size);
    cJSON *profiles = cJSON_AddArrayToObject(entry, "profiles_set");
    for (int profile : record.profiles_set) cJSON_AddItemToArray(profiles, cJSON_CreateNumber(profile));
    cJSON *enqueues = cJSON_AddArrayToObject(entry, "enqueues");
    for (long long count : record.enqueues) cJSON_AddItemToArray(enqueues, cJSON_CreateNumber((double)count));
    cJSON_AddItemToArray(records, entry);
  }
  char *text = cJSON_PrintUnformatted(report.get());
  report_text = text;
  cJSON_free(text);
  return report_text.c_str();
}

}  // extern "C"
