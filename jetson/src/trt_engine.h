/* The TensorRT engine (trt_engine.cpp): runs the model.engine (prefill and decode profiles) that
 * `edge-sdk build BUNDLE` cached for this bundle, TensorRT version and GPU, and says where that engine lives.
 * Compiled only when CMake finds TensorRT and the CUDA runtime (EDGE_SDK_HAVE_TENSORRT); C++ inside, this C interface
 * outside, no exception crosses it. */
#ifndef EDGE_TRT_ENGINE_H
#define EDGE_TRT_ENGINE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "model.h"

extern const struct engine_ops trt_engine_ops;

/* edge_backend_probe("tensorrt"): TensorRT 10.3 or later, a CUDA device, the plugin library registered;
 * *description (thread-local, valid until the next probe on this thread) says what runs. */
edge_status trt_probe(const char **description);

/* edge_tensorrt_engine_info of an opened bundle: *json is malloc'ed. */
edge_status trt_engine_info(const struct bundle *bundle, const char *cache_dir, char **json);

#ifdef __cplusplus
}
#endif

#endif
