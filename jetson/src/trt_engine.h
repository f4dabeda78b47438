/* The TensorRT engine (trt_engine.cpp): runs the model.engine (prefill and decode profiles) that
 * `edge-sdk build BUNDLE` cached for this bundle, TensorRT version and GPU. Compiled only when CMake finds TensorRT and the CUDA runtime
 * (EDGE_SDK_HAVE_TENSORRT); C++ inside, this C interface outside, no exception crosses it. */
#ifndef EDGE_TRT_ENGINE_H
#define EDGE_TRT_ENGINE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "model.h"

extern const struct engine_ops trt_engine_ops;

#ifdef __cplusplus
}
#endif

#endif
