/* The fake CUDA runtime of tests/tensorrt (fake_tensorrt/README.md): the part of cuda_runtime_api.h that
 * jetson/src/trt_engine.cpp uses, with the CUDA runtime's names, values and signatures, implemented by
 * fake_tensorrt.cpp on host memory. */
#ifndef EDGE_FAKE_CUDA_RUNTIME_API_H
#define EDGE_FAKE_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

typedef struct CUstream_st *cudaStream_t;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);
cudaError_t cudaMalloc(void **pointer, size_t size);
cudaError_t cudaFree(void *pointer);
cudaError_t cudaMallocHost(void **pointer, size_t size);
cudaError_t cudaFreeHost(void *pointer);
cudaError_t cudaMemcpy(void *destination, const void *source, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *destination, const void *source, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *pointer, int value, size_t count);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
