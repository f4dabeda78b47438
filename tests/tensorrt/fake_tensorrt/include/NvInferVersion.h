/* The fake TensorRT of tests/tensorrt (fake_tensorrt/README.md): the version its headers declare. */
#ifndef EDGE_FAKE_NV_INFER_VERSION_H
#define EDGE_FAKE_NV_INFER_VERSION_H

#define NV_TENSORRT_MAJOR 10
#define NV_TENSORRT_MINOR 3
#define NV_TENSORRT_PATCH 0
#define NV_TENSORRT_BUILD 30
#define NV_TENSORRT_VERSION (NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH)

#endif
