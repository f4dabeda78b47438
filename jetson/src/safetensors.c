/* The safetensors header: parsed under the strict JSON rule, every tensor entry checked, the data section tiled. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_fields.h"
#include "json_strict.h"

#define MAX_HEADER_BYTES (UINT64_C(100) << 20) /* the limit the safetensors library applies */
#define MAX_ELEMENTS (UINT64_C(1) << 60)
#define METADATA_KEY "__metadata__"
#define SHOWN_NAME_BYTES 200

static const struct {
  const char *name;
  size_t size;
} dtype_table[DTYPE_COUNT] = {
    [DTYPE_BOOL] = {"BOOL", 1}, [DTYPE_U8] = {"U8", 1},     [DTYPE_I8] = {"I8", 1},
    [DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [DTYPE_I16] = {"I16", 2},
    [DTYPE_U16] = {"U16", 2}, [DTYPE_F16] = {"F16", 2},   [DTYPE_BF16] = {"BF16", 2},
    [DTYPE_I32] = {"I32", 4}, [DTYPE_U32] = {"U32", 4},   [DTYPE_F32] = {"F32", 4},
    [DTYPE_F64] = {"F64", 8}, [DTYPE_I64] = {"I64", 8},   [DTYPE_U64] = {"U64", 8},
};

const char *tensor_dtype_name(enum tensor_dtype dtype) {
  return (unsigned)dtype < DTYPE_COUNT ? dtype_table[dtype].name : "?";
}

size_t tensor_dtype_size(enum tensor_dtype dtype) { return (unsigned)dtype < DTYPE_COUNT ? dtype_table[dtype].size : 0; }

int tensor_dtype_parse(const char *name, enum tensor_dtype *dtype) {
  for (int i = 0; i < DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_table[i].name) == 0) {
      *dtype = (enum tensor_dtype)i;
      return 1;
    }
  }
  return 0;
}

const char *tensor_shape_text(const int64_t *shape, int rank, char *out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "[");
  for (int i = 0; i < rank && used < size; i++) {
    used += (size_t)snprintf(out + used, size - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  }
  if (used < size) snprintf(out + used, size - used, "]");
  return out;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(((const struct tensor *)a)->name, ((const struct tensor *)b)->name);
}

const struct tensor *safetensors_find(const struct tensor *tensors, size_t n_tensors, const char *name) {
  struct tensor key = {.name = (char *)name};
  if (n_tensors == 0) return NULL;
  return bsearch(&key, tensors, n_tensors, sizeof key, compare_names);
}

void safetensors_free(struct tensor *tensors, size_t n_tensors) {
  for (size_t i = 0; tensors != NULL && i < n_tensors; i++) free(tensors[i].name);
  free(tensors);
}

/* ---- One entry -------------------------------------------------------------------------------------------- */

/* dtype and shape of an entry (where: "PATH: tensor 'NAME'"); *elements, their count. */
static edge_status read_dtype_and_shape(const cJSON *entry, const char *where, struct tensor *tensor,
                                        uint64_t *elements) {
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
  if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected an object with a string 'dtype', a list 'shape' and two "
                     "'data_offsets'", where);
  }
  if (!tensor_dtype_parse(dtype->valuestring, &tensor->dtype)) {
    char shown[48];
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: unknown dtype '%s'; known: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, "
                     "F16, BF16, I32, U32, F32, F64, I64, U64", where, json_shown(dtype->valuestring, shown, sizeof shown));
  }
  int rank = cJSON_GetArraySize(shape);
  if (rank > SAFETENSORS_MAX_RANK) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: %d dimensions, at most %d are supported", where, rank,
                     SAFETENSORS_MAX_RANK);
  }
  *elements = 1;
  tensor->rank = 0;
  const cJSON *dim;
  cJSON_ArrayForEach(dim, shape) {
    int64_t value;
    if (!json_integer(dim, 0, SAFETENSORS_MAX_DIMENSION, &value)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: shape has an entry that is not an integer in [0, 2^40]", where);
    }
    tensor->shape[tensor->rank++] = value;
    if (value != 0 && *elements > MAX_ELEMENTS / (uint64_t)value) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: more than 2^60 elements", where);
    }
    *elements *= (uint64_t)value;
  }
  return EDGE_OK;
}

/* One tensor entry: its dtype, shape and byte range [begin, end) of the data section. */
static edge_status read_entry(const cJSON *entry, const char *path, uint64_t data_size, struct tensor *tensor,
                              uint64_t *begin, uint64_t *end) {
  char where[4096 + 2 * SHOWN_NAME_BYTES], shown[SHOWN_NAME_BYTES];
  snprintf(where, sizeof where, "%s: tensor '%s'", path, json_shown(entry->string, shown, sizeof shown));
  if (!cJSON_IsObject(entry)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected an object with 'dtype', 'shape' and 'data_offsets'", where);
  }
  uint64_t elements = 0;
  edge_status status = read_dtype_and_shape(entry, where, tensor, &elements);
  if (status != EDGE_OK) return status;
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
  int64_t first, last;
  if (!json_integer(cJSON_GetArrayItem(offsets, 0), 0, INT64_MAX, &first) ||
      !json_integer(cJSON_GetArrayItem(offsets, 1), 0, INT64_MAX, &last) || first > last) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: data_offsets must be two integers 0 <= begin <= end", where);
  }
  if ((uint64_t)last > data_size) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: truncated: tensor '%s' ends at data byte %lld, the file holds %llu", path,
                     shown, (long long)last, (unsigned long long)data_size);
  }
  uint64_t expected = elements * tensor_dtype_size(tensor->dtype); /* <= 2^63: elements <= 2^60, sizes <= 8 */
  if ((uint64_t)(last - first) != expected) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: spans %lld bytes, its dtype %s and shape need %llu", where,
                     (long long)(last - first), tensor_dtype_name(tensor->dtype), (unsigned long long)expected);
  }
  *begin = (uint64_t)first, *end = (uint64_t)last;
  return EDGE_OK;
}

/* ---- The data section ------------------------------------------------------------------------------------- */

struct span {
  uint64_t begin, end;
  const char *name;
};

static int compare_spans(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* The tensors ordered by (begin, end) cover [0, data_size) with no gap, overlap or trailing byte. */
static edge_status check_tiling(struct span *spans, size_t n, uint64_t data_size, const char *path) {
  qsort(spans, n, sizeof *spans, compare_spans);
  uint64_t position = 0;
  for (size_t i = 0; i < n; i++) {
    if (spans[i].begin != position) {
      char shown[SHOWN_NAME_BYTES];
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' starts at data byte %llu and %s (ends at %llu); the "
                       "tensors must tile the data section", path, json_shown(spans[i].name, shown, sizeof shown),
                       (unsigned long long)spans[i].begin,
                       spans[i].begin < position ? "overlaps the tensor before it" : "leaves a gap before it",
                       (unsigned long long)position);
    }
    position = spans[i].end;
  }
  if (position != data_size) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: the tensors cover %llu of the %llu data bytes; the rest belongs to none",
                     path, (unsigned long long)position, (unsigned long long)data_size);
  }
  return EDGE_OK;
}

static edge_status check_metadata(const cJSON *header, const char *path) {
  const cJSON *metadata = cJSON_GetObjectItemCaseSensitive(header, METADATA_KEY), *value;
  if (metadata == NULL) return EDGE_OK;
  int strings = cJSON_IsObject(metadata);
  cJSON_ArrayForEach(value, metadata) strings = strings && cJSON_IsString(value);
  if (strings) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: header field '%s' must be an object of strings", path, METADATA_KEY);
}

/* Every entry but __metadata__ into tensors[] (room for all), tiled as the file comment says. */
static edge_status read_entries(const cJSON *header, const uint8_t *data, uint64_t data_size, const char *path,
                                struct tensor *tensors, size_t *n_tensors, struct span *spans) {
  const cJSON *entry;
  cJSON_ArrayForEach(entry, header) {
    if (strcmp(entry->string, METADATA_KEY) == 0) continue;
    struct tensor *tensor = &tensors[*n_tensors];
    uint64_t begin, end;
    edge_status status = read_entry(entry, path, data_size, tensor, &begin, &end);
    if (status != EDGE_OK) return status;
    tensor->name = strdup(entry->string);
    if (tensor->name == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
    tensor->data = data + begin;
    tensor->nbytes = (size_t)(end - begin);
    spans[*n_tensors] = (struct span){begin, end, tensor->name};
    ++*n_tensors;
  }
  return check_tiling(spans, *n_tensors, data_size, path);
}

static edge_status parse_header(const uint8_t *file, size_t size, const char *path, cJSON **header,
                                uint64_t *header_size) {
  if (size < 8) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: %zu bytes, too short for a safetensors header (at least 8)", path, size);
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; i--) length = length << 8 | file[i];
  if (length > MAX_HEADER_BYTES || length > size - 8) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: header length %llu does not fit the %zu-byte file", path,
                     (unsigned long long)length, size);
  }
  char where[4096 + 16];
  snprintf(where, sizeof where, "%s: header", path);
  edge_status status = json_strict_parse_object((const char *)file + 8, (size_t)length, JSON_INTEGERS_ONLY, where, header);
  *header_size = length;
  return status;
}

edge_status safetensors_read_header(const uint8_t *file, size_t size, const char *path, struct tensor **tensors,
                                    size_t *n_tensors) {
  cJSON *header = NULL;
  uint64_t header_size = 0;
  edge_status status = parse_header(file, size, path, &header, &header_size);
  if (status == EDGE_OK) status = check_metadata(header, path);
  if (status != EDGE_OK) {
    cJSON_Delete(header);
    return status;
  }
  size_t count = (size_t)cJSON_GetArraySize(header);
  struct tensor *found = calloc(count + 1, sizeof *found);
  struct span *spans = calloc(count + 1, sizeof *spans);
  size_t n = 0;
  if (found == NULL || spans == NULL) {
    status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  } else {
    const uint8_t *data = file + 8 + header_size;
    status = read_entries(header, data, size - 8 - header_size, path, found, &n, spans);
  }
  free(spans);
  cJSON_Delete(header);
  if (status != EDGE_OK) {
    safetensors_free(found, n);
    return status;
  }
  qsort(found, n, sizeof *found, compare_names);
  *tensors = found;
  *n_tensors = n;
  return EDGE_OK;
}
