/* edge-sdk CPU kernels: the C side shared by the Python CPU backend (through ctypes) and the C runtime.
 * Every kernel keeps the argument order of its CUDA launcher in plugins/kernels (DESIGN.md 3.6). */
#ifndef EDGE_CPU_KERNELS_H
#define EDGE_CPU_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Version of edge-sdk the library was built from, e.g. "0.1.0". */
const char *edge_cpu_version(void);

/* Threads the kernels use: OpenMP's maximum, or 1 when built without OpenMP. */
int edge_cpu_max_threads(void);

#ifdef __cplusplus
}
#endif

#endif
