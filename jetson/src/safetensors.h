/* The safetensors header (edge_sdk/formats/safetensors.py): an 8-byte little-endian length N, N bytes of JSON,
 * then the data section. Read with the rules the safetensors library enforces plus the strict JSON rule:
 * - N at most 100 MiB and inside the file; the header a JSON object of integer literals only;
 * - `__metadata__`, when present, an object of strings;
 * - every other entry a tensor: a known dtype, at most SAFETENSORS_MAX_RANK dimensions in [0, 2^40], at most 2^60
 *   elements, and data_offsets [begin, end] spanning exactly the shape's bytes;
 * - the tensors, ordered by (begin, end), tile the data section: the first starts at 0, each starts where the one
 *   before ended, the last ends at the end of the file. */
#ifndef EDGE_SAFETENSORS_H
#define EDGE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "edge_sdk.h"

#define SAFETENSORS_MAX_RANK 8
#define SAFETENSORS_MAX_DIMENSION (INT64_C(1) << 40)

/* safetensors dtypes; tensor_dtype_size gives their element sizes. */
enum tensor_dtype {
  DTYPE_BOOL, DTYPE_U8, DTYPE_I8, DTYPE_F8_E5M2, DTYPE_F8_E4M3, DTYPE_I16, DTYPE_U16, DTYPE_F16, DTYPE_BF16,
  DTYPE_I32, DTYPE_U32, DTYPE_F32, DTYPE_F64, DTYPE_I64, DTYPE_U64, DTYPE_COUNT
};

struct tensor {
  char *name; /* as json_strict_parse spells it */
  enum tensor_dtype dtype;
  int rank;
  int64_t shape[SAFETENSORS_MAX_RANK];
  const void *data; /* inside the file's bytes */
  size_t nbytes;
};

const char *tensor_dtype_name(enum tensor_dtype dtype);
size_t tensor_dtype_size(enum tensor_dtype dtype);
/* The dtype called name; 0 when there is none. */
int tensor_dtype_parse(const char *name, enum tensor_dtype *dtype);
/* A shape as Python lists it, "[768, 192]", in out[size]. Returns out. */
const char *tensor_shape_text(const int64_t *shape, int rank, char *out, size_t size);

/* The tensors of the safetensors file file[0:size] at `path` (for messages), sorted by name (*tensors: free with
 * safetensors_free); EDGE_ERROR_BUNDLE when it breaks a rule above. */
edge_status safetensors_read_header(const uint8_t *file, size_t size, const char *path, struct tensor **tensors,
                                    size_t *n_tensors);
void safetensors_free(struct tensor *tensors, size_t n_tensors);

/* The tensor called name among tensors sorted by name, or NULL. */
const struct tensor *safetensors_find(const struct tensor *tensors, size_t n_tensors, const char *name);

#endif
