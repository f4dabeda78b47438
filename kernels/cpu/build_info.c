/* Build facts the runtime reports (edge-sdk doctor) and checks against the Python package. */
#include "edge_cpu_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef EDGE_SDK_VERSION
#define EDGE_SDK_VERSION "unknown"
#endif

const char *edge_cpu_version(void) { return EDGE_SDK_VERSION; }

int edge_cpu_max_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
