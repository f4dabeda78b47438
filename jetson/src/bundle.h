/* The bundle reader (DESIGN.md 3.4): manifest.json, file sizes and sha256, and weights.safetensors mapped
 * read-only with its header parsed and bounds-checked. Nothing here knows the model: engines look tensors up
 * by name and check their dtypes and shapes against the model config. */
#ifndef EDGE_BUNDLE_H
#define EDGE_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edge_sdk.h"

#define BUNDLE_FORMAT "edge-sdk-bundle"
#define BUNDLE_FORMAT_VERSION 1
#define BUNDLE_MANIFEST_FILE "manifest.json"
#define BUNDLE_WEIGHTS_FILE "weights.safetensors"
#define BUNDLE_TOKENIZER_FILE "tokenizer.json"
#define BUNDLE_TOKENIZER_CONFIG_FILE "tokenizer_config.json"
#define BUNDLE_MAX_RANK 8

/* safetensors dtypes; tensor_dtype_size gives their element sizes. */
enum tensor_dtype {
  DTYPE_BOOL, DTYPE_U8, DTYPE_I8, DTYPE_F8_E5M2, DTYPE_F8_E4M3, DTYPE_I16, DTYPE_U16, DTYPE_F16, DTYPE_BF16,
  DTYPE_I32, DTYPE_U32, DTYPE_F32, DTYPE_F64, DTYPE_I64, DTYPE_U64, DTYPE_COUNT
};

struct tensor {
  char *name;
  enum tensor_dtype dtype;
  int rank;
  int64_t shape[BUNDLE_MAX_RANK];
  const void *data; /* inside the read-only mapping of weights.safetensors, aligned to the element size */
  size_t nbytes;
};

struct bundle {
  char *root;              /* the directory as given */
  cJSON *manifest;         /* parsed manifest.json */
  void *weights;           /* mmap of weights.safetensors (PROT_READ, MAP_PRIVATE) */
  size_t weights_size;
  struct tensor *tensors;  /* sorted by name */
  size_t n_tensors;
};

const char *tensor_dtype_name(enum tensor_dtype dtype);
size_t tensor_dtype_size(enum tensor_dtype dtype);

/* Opens root: every check of the file comment above. On failure the bundle is left empty (nothing to free). */
edge_status bundle_open(const char *root, int verify_checksums, struct bundle *bundle);
void bundle_close(struct bundle *bundle);

/* The tensor called name, or NULL. */
const struct tensor *bundle_tensor(const struct bundle *bundle, const char *name);

/* root/name read whole into a NUL-terminated buffer (free it); name must be listed in the manifest's files
 * (so its size and checksum were verified). EDGE_ERROR_IO when not listed or unreadable. */
edge_status bundle_read_file(const struct bundle *bundle, const char *name, char **data, size_t *size);

/* JSON field readers: the message names `where` (e.g. "BUNDLE/manifest.json: model") and the field. */
edge_status json_object_field(const cJSON *object, const char *field, const char *where, const cJSON **out);
edge_status json_int_field(const cJSON *object, const char *field, const char *where, int64_t min, int64_t max,
                           int64_t *out);
edge_status json_number_field(const cJSON *object, const char *field, const char *where, double *out);
edge_status json_bool_field(const cJSON *object, const char *field, const char *where, int *out);
edge_status json_string_field(const cJSON *object, const char *field, const char *where, const char **out);
/* An integer-valued JSON number in [min, max] (exact: |value| <= 2^53). */
int json_integer(const cJSON *item, int64_t min, int64_t max, int64_t *out);

#endif
