/* Bundle reader: manifest.json, the listed files (regular, no links, sizes and sha256), weights.safetensors mapped
 * and checked against the manifest, and the graphs' external data (bundle.h). */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "json_strict.h"
#include "onnx_wire.h"
#include "sha256.h"

#define MAX_MANIFEST_BYTES ((size_t)64 << 20)
#define MAX_GRAPH_BYTES ((size_t)1 << 30) /* graphs hold no weights (external data): real ones are a few MB */
#define HASH_CHUNK_BYTES ((size_t)1 << 20)
#define MAX_DECIMAL_DIGITS 17
#define SHOWN_NAME_BYTES 200

/* ---- Files -------------------------------------------------------------------------------------------------- */

static char *join_path(const char *root, const char *name) {
  size_t n = strlen(root) + strlen(name) + 2;
  char *path = malloc(n);
  if (path != NULL) snprintf(path, n, "%s/%s", root, name);
  return path;
}

/* A read-only descriptor of path, a regular file opened without following a symbolic link (files.py open_regular). */
static edge_status open_regular(const char *path, int *fd, struct stat *info) {
  /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is then refused as not a regular file) */
  int descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (descriptor < 0 && errno == ENOENT) return edge_fail(EDGE_ERROR_IO, "%s: file not found", path);
  if (descriptor < 0 && errno == ELOOP) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: is a symbolic link; a bundle holds regular files only", path);
  }
  if (descriptor < 0) return edge_fail(EDGE_ERROR_IO, "%s: cannot open (%s)", path, strerror(errno));
  if (fstat(descriptor, info) != 0) {
    edge_status status = edge_fail(EDGE_ERROR_IO, "%s: cannot stat (%s)", path, strerror(errno));
    close(descriptor);
    return status;
  }
  if (!S_ISREG(info->st_mode)) {
    close(descriptor);
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: is %s; expected a regular file", path,
                     S_ISDIR(info->st_mode) ? "a directory" : "not a regular file");
  }
  *fd = descriptor;
  return EDGE_OK;
}

static edge_status read_exactly(int fd, const char *path, char *buffer, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = read(fd, buffer + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return edge_fail(EDGE_ERROR_IO, "%s: read failed after %zu of %zu bytes", path, done, size);
    done += (size_t)n;
  }
  return EDGE_OK;
}

/* path read whole into a NUL-terminated buffer: a regular file (no link) of at most max_size bytes. */
static edge_status read_regular_file(const char *path, size_t max_size, char **data, size_t *size) {
  int fd = -1;
  struct stat info;
  edge_status status = open_regular(path, &fd, &info);
  if (status != EDGE_OK) return status;
  if ((uint64_t)info.st_size > max_size) {
    close(fd);
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: %lld bytes, more than the %zu this reader accepts", path,
                     (long long)info.st_size, max_size);
  }
  size_t total = (size_t)info.st_size;
  char *buffer = malloc(total + 1);
  status = buffer != NULL ? read_exactly(fd, path, buffer, total)
                          : edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading %zu bytes", path, total);
  close(fd);
  if (status != EDGE_OK) {
    free(buffer);
    return status;
  }
  buffer[total] = '\0';
  *data = buffer;
  *size = total;
  return EDGE_OK;
}

static edge_status hash_file(const char *path, char hex[65]) {
  int fd = -1;
  struct stat info;
  edge_status status = open_regular(path, &fd, &info);
  if (status != EDGE_OK) return status;
  unsigned char *chunk = malloc(HASH_CHUNK_BYTES);
  if (chunk == NULL) {
    close(fd);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  }
  struct sha256 hash;
  sha256_init(&hash);
  for (;;) {
    ssize_t n = read(fd, chunk, HASH_CHUNK_BYTES);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = edge_fail(EDGE_ERROR_IO, "%s: read failed (%s)", path, strerror(errno));
      break;
    }
    if (n == 0) break;
    sha256_update(&hash, chunk, (size_t)n);
  }
  free(chunk);
  close(fd);
  uint8_t digest[32];
  sha256_final(&hash, digest);
  sha256_hex(digest, hex);
  return status;
}

static edge_status check_size(const char *path, const cJSON *entry) {
  int fd = -1;
  struct stat info;
  edge_status status = open_regular(path, &fd, &info);
  if (status != EDGE_OK) return status;
  close(fd);
  int64_t size = (int64_t)cJSON_GetObjectItemCaseSensitive(entry, "size")->valuedouble; /* validated */
  if ((int64_t)info.st_size == size) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: size is %lld bytes, manifest.json says %lld", path, (long long)info.st_size,
                   (long long)size);
}

static edge_status check_checksum(const char *path, const cJSON *entry) {
  char hex[65];
  edge_status status = hash_file(path, hex);
  if (status != EDGE_OK) return status;
  const char *expected = cJSON_GetObjectItemCaseSensitive(entry, "sha256")->valuestring; /* validated */
  if (strcmp(hex, expected) == 0) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: sha256 is %s, manifest.json says %s (the file changed)", path, hex, expected);
}

/* The size of every listed file first (cheap), then (verify) their sha256. */
static edge_status check_files(const struct bundle *bundle, int verify) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "files"), *entry;
  edge_status (*const checks[2])(const char *, const cJSON *) = {check_size, check_checksum};
  for (int pass = 0; pass < 1 + (verify != 0); pass++) {
    cJSON_ArrayForEach(entry, files) {
      char *path = join_path(bundle->root, entry->string);
      if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
      edge_status status = checks[pass](path, entry);
      free(path);
      if (status != EDGE_OK) return status;
    }
  }
  return EDGE_OK;
}

/* ---- Manifest ----------------------------------------------------------------------------------------------- */

static edge_status read_manifest(struct bundle *bundle, const char *path) {
  struct stat info;
  if (lstat(path, &info) != 0 && errno == ENOENT) {
    return edge_fail(EDGE_ERROR_IO, "%s: manifest.json is missing (is %s an edge-sdk bundle?)", path, bundle->root);
  }
  char *text = NULL;
  size_t size = 0;
  edge_status status = read_regular_file(path, MAX_MANIFEST_BYTES, &text, &size);
  if (status == EDGE_OK) status = json_strict_parse(text, size, JSON_ANY_NUMBERS, path, &bundle->manifest);
  if (status == EDGE_OK) status = manifest_validate(bundle->manifest, text, size, path, &bundle->info);
  free(text);
  return status;
}

/* ---- weights.safetensors ------------------------------------------------------------------------------------ */

static edge_status map_weights(struct bundle *bundle, const char *path) {
  int fd = -1;
  struct stat info;
  edge_status status = open_regular(path, &fd, &info);
  if (status != EDGE_OK) return status;
  if (info.st_size > 0) {
    void *base = mmap(NULL, (size_t)info.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: mmap failed (%s)", path, strerror(errno));
    if (status == EDGE_OK) bundle->weights = base, bundle->weights_size = (size_t)info.st_size;
  }
  close(fd);
  if (status != EDGE_OK) return status;
  return safetensors_read_header(bundle->weights, bundle->weights_size, path, &bundle->tensors, &bundle->n_tensors);
}

/* The header's tensor of a manifest entry {dtype, shape}: the same dtype and shape, aligned to its elements. */
static edge_status check_declared(const struct bundle *bundle, const cJSON *declared, const char *path) {
  char shown[SHOWN_NAME_BYTES], shape[160], manifest_shape[160];
  json_shown(declared->string, shown, sizeof shown);
  const struct tensor *tensor = bundle_tensor(bundle, declared->string);
  if (tensor == NULL) return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' listed in manifest.json is missing", path, shown);
  enum tensor_dtype dtype;
  const cJSON *dims = cJSON_GetObjectItemCaseSensitive(declared, "shape"), *dim;
  int64_t values[BUNDLE_MAX_RANK] = {0};
  int rank = 0;
  cJSON_ArrayForEach(dim, dims) json_integer(dim, 0, INT64_MAX, &values[rank++]); /* validated: at most 8 */
  int same = tensor_dtype_parse(cJSON_GetObjectItemCaseSensitive(declared, "dtype")->valuestring, &dtype) &&
             dtype == tensor->dtype && rank == tensor->rank;
  for (int i = 0; same && i < rank; i++) same = values[i] == tensor->shape[i];
  if (!same) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is %s %s, manifest.json says %s %s", path, shown,
                     tensor_dtype_name(tensor->dtype), tensor_shape_text(tensor->shape, tensor->rank, shape, sizeof shape),
                     cJSON_GetObjectItemCaseSensitive(declared, "dtype")->valuestring,
                     tensor_shape_text(values, rank, manifest_shape, sizeof manifest_shape));
  }
  size_t element_size = tensor_dtype_size(tensor->dtype);
  if ((uintptr_t)tensor->data % element_size != 0) { /* the mapping starts on a page: file offsets align alike */
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is not aligned to its %zu-byte elements", path, shown,
                     element_size);
  }
  return EDGE_OK;
}

/* The sign-bit rule compares alpha * positives with negatives: a NaN or infinite alpha is no rule at all. */
static edge_status check_signbit_alphas(const struct bundle *bundle, const char *path) {
  if (bundle->info.sparsity.predictor != PREDICTOR_SIGNBIT) return EDGE_OK;
  for (int layer = 0; layer < bundle->info.model.num_layers; layer++) {
    char name[64];
    snprintf(name, sizeof name, "layers.%d.signbit.alpha", layer);
    const uint8_t *bytes = bundle_tensor(bundle, name)->data; /* the layout check made it F32 [1] */
    uint32_t bits = (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 | (uint32_t)bytes[3] << 24;
    float alpha;
    memcpy(&alpha, &bits, sizeof alpha);
    if (!isfinite(alpha)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is %g, expected a finite number", path, name, (double)alpha);
    }
  }
  return EDGE_OK;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The first header tensor (by name) the manifest does not list; tensors outnumber the manifest's. */
static edge_status refuse_extra(const struct bundle *bundle, const cJSON *tensors, size_t listed, const char *path) {
  const char **names = malloc((listed + 1) * sizeof *names), *first = NULL;
  if (names == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  const cJSON *declared;
  size_t n = 0;
  cJSON_ArrayForEach(declared, tensors) names[n++] = declared->string;
  qsort(names, n, sizeof *names, compare_names);
  for (size_t i = 0; i < bundle->n_tensors && first == NULL; i++) {
    const char *name = bundle->tensors[i].name;
    if (bsearch(&name, names, n, sizeof *names, compare_names) == NULL) first = name;
  }
  free(names);
  char shown[SHOWN_NAME_BYTES];
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%s' is not listed in manifest.json (%zu such)", path,
                   json_shown(first, shown, sizeof shown), bundle->n_tensors - listed);
}

/* weights.safetensors holds exactly the manifest's tensors. */
static edge_status check_weights(const struct bundle *bundle, const char *path) {
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "tensors"), *declared;
  size_t listed = 0;
  cJSON_ArrayForEach(declared, tensors) {
    edge_status status = check_declared(bundle, declared, path);
    if (status != EDGE_OK) return status;
    listed++;
  }
  if (bundle->n_tensors > listed) return refuse_extra(bundle, tensors, listed, path); /* names unique on both sides */
  return check_signbit_alphas(bundle, path);
}

/* ---- Graphs ------------------------------------------------------------------------------------------------- */

/* 1 to 17 ASCII digits; *value their number. */
static int decimal(const struct wire_text *text, uint64_t *value) {
  if (!text->present || text->length < 1 || text->length > MAX_DECIMAL_DIGITS) return 0;
  *value = 0;
  for (size_t i = 0; i < text->length; i++) {
    if (text->data[i] < '0' || text->data[i] > '9') return 0;
    *value = *value * 10 + (uint64_t)(text->data[i] - '0');
  }
  return 1;
}

static const char *shown_text(const struct wire_text *text, char *out, size_t size) {
  if (!text->present) return "nothing";
  char *copy = json_string_from_bytes((const char *)text->data, text->length);
  if (copy == NULL) return "?";
  json_shown(copy, out, size);
  free(copy);
  return out;
}

static int same_dims(const struct onnx_summary *summary, const struct onnx_external_tensor *external,
                     const struct tensor *tensor) {
  if (external->n_dims != (size_t)tensor->rank) return 0;
  for (size_t i = 0; i < external->n_dims; i++) {
    if (summary->dims[external->first_dim + i] != tensor->shape[i]) return 0;
  }
  return 1;
}

/* An external tensor names weights.safetensors, and exactly the bytes, type and dims of the tensor of its name. */
/* Packed int4 codes: ONNX INT4 [rows, cols] over the bundle's U8 [rows, cols / 2], two signed values per byte. */
#define ONNX_INT4 22
#define ONNX_INT32 6

static int int4_over_bytes(const struct onnx_summary *summary, const struct onnx_external_tensor *external,
                           const struct tensor *tensor) {
  if (external->data_type != ONNX_INT4 || tensor->dtype != DTYPE_U8 || external->n_dims != 2 || tensor->rank != 2) {
    return 0;
  }
  uint64_t rows = summary->dims[external->first_dim], cols = summary->dims[external->first_dim + 1];
  return cols % 2 == 0 && rows == (uint64_t)tensor->shape[0] && cols / 2 == (uint64_t)tensor->shape[1];
}

/* Quantized codes as the decode graph's custom ops take them: ONNX INT32 [rows, n] over the bundle's I8 or U8
 * [rows, 4 n], the same bytes as little-endian words (edge_sdk/bundle/reader.py, _same_type). */
static int words_over_bytes(const struct onnx_summary *summary, const struct onnx_external_tensor *external,
                            const struct tensor *tensor) {
  if (external->data_type != ONNX_INT32 || (tensor->dtype != DTYPE_I8 && tensor->dtype != DTYPE_U8) ||
      external->n_dims != 2 || tensor->rank != 2) {
    return 0;
  }
  uint64_t rows = summary->dims[external->first_dim], words = summary->dims[external->first_dim + 1];
  return rows == (uint64_t)tensor->shape[0] && words <= UINT64_MAX / 4 && 4 * words == (uint64_t)tensor->shape[1];
}

static edge_status check_external(const struct bundle *bundle, const char *path, const struct onnx_summary *summary,
                                  const struct onnx_external_tensor *external) {
  char shown[SHOWN_NAME_BYTES], where[4096 + 2 * SHOWN_NAME_BYTES], other[SHOWN_NAME_BYTES];
  snprintf(where, sizeof where, "%s: tensor '%s' stored outside the graph", path, shown_text(&external->name, shown, sizeof shown));
  if (!external->location.present || external->location.length != strlen(BUNDLE_WEIGHTS_FILE) ||
      memcmp(external->location.data, BUNDLE_WEIGHTS_FILE, external->location.length) != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s refers to '%s'; a bundle's graphs refer to %s only", where,
                     shown_text(&external->location, other, sizeof other), BUNDLE_WEIGHTS_FILE);
  }
  uint64_t offset, length;
  if (!decimal(&external->offset, &offset) || !decimal(&external->length, &length)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s needs decimal 'offset' and 'length', found '%s', '%s'", where,
                     shown_text(&external->offset, shown, sizeof shown), shown_text(&external->length, other, sizeof other));
  }
  char *name = json_string_from_bytes((const char *)external->name.data, external->name.length);
  if (name == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  const struct tensor *tensor = bundle_tensor(bundle, name);
  free(name);
  uint64_t begin = tensor != NULL ? (uint64_t)((const uint8_t *)tensor->data - (const uint8_t *)bundle->weights) : 0;
  if (tensor == NULL || offset != begin || length != tensor->nbytes) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s points at bytes %llu..%llu of %s, which do not hold that tensor", where,
                     (unsigned long long)offset, (unsigned long long)(offset + length), BUNDLE_WEIGHTS_FILE);
  }
  const char *dtype = onnx_safetensors_dtype(external->data_type);
  int same = dtype != NULL && strcmp(dtype, tensor_dtype_name(tensor->dtype)) == 0 && same_dims(summary, external, tensor);
  if (!same && !int4_over_bytes(summary, external, tensor) && !words_over_bytes(summary, external, tensor)) {
    char dims[160], shape[160];
    return edge_fail(EDGE_ERROR_BUNDLE, "%s is declared ONNX type %llu %s, but %s holds it as %s %s", where,
                     (unsigned long long)external->data_type,
                     tensor_shape_text(summary->dims + external->first_dim, (int)external->n_dims, dims, sizeof dims),
                     BUNDLE_WEIGHTS_FILE, tensor_dtype_name(tensor->dtype),
                     tensor_shape_text(tensor->shape, tensor->rank, shape, sizeof shape));
  }
  return EDGE_OK;
}

static edge_status check_graph_structure(const struct onnx_summary *summary, const char *path) {
  if (summary->ir_version >= 1 && summary->opset_imports >= 1 && summary->graphs == 1) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: not an ONNX model (ir_version %llu, %llu opset imports, %llu graphs; "
                   "expected an ir_version >= 1, an opset import and one graph)", path,
                   (unsigned long long)summary->ir_version, (unsigned long long)summary->opset_imports,
                   (unsigned long long)summary->graphs);
}

static edge_status check_graph(const struct bundle *bundle, const char *name) {
  char *path = join_path(bundle->root, name), *data = NULL;
  if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
  size_t size = 0;
  struct onnx_summary summary;
  memset(&summary, 0, sizeof summary);
  edge_status status = read_regular_file(path, MAX_GRAPH_BYTES, &data, &size);
  if (status == EDGE_OK) status = onnx_wire_summarize((const uint8_t *)data, size, path, &summary);
  if (status == EDGE_OK) status = check_graph_structure(&summary, path);
  for (size_t i = 0; status == EDGE_OK && i < summary.n_tensors; i++) {
    status = check_external(bundle, path, &summary, &summary.tensors[i]);
  }
  onnx_summary_free(&summary);
  free(data);
  free(path);
  return status;
}

/* ---- The bundle --------------------------------------------------------------------------------------------- */

edge_status bundle_open(const char *root, int verify_checksums, struct bundle *bundle) {
  memset(bundle, 0, sizeof *bundle);
  struct stat info;
  if (stat(root, &info) != 0 || !S_ISDIR(info.st_mode)) return edge_fail(EDGE_ERROR_IO, "%s: bundle directory not found", root);
  bundle->root = strdup(root);
  char *manifest_path = join_path(root, BUNDLE_MANIFEST_FILE);
  char *weights_path = join_path(root, BUNDLE_WEIGHTS_FILE);
  edge_status status = EDGE_OK;
  if (bundle->root == NULL || manifest_path == NULL || weights_path == NULL) {
    status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", root);
  }
  if (status == EDGE_OK) status = read_manifest(bundle, manifest_path);
  if (status == EDGE_OK) status = check_files(bundle, verify_checksums);
  if (status == EDGE_OK) status = map_weights(bundle, weights_path);
  if (status == EDGE_OK) status = check_weights(bundle, weights_path);
  for (int phase = 0; status == EDGE_OK && phase < BUNDLE_GRAPH_PHASES; phase++) {
    status = check_graph(bundle, bundle->info.graphs[phase]);
  }
  free(manifest_path);
  free(weights_path);
  if (status != EDGE_OK) bundle_close(bundle);
  return status;
}

void bundle_close(struct bundle *bundle) {
  if (bundle == NULL) return;
  safetensors_free(bundle->tensors, bundle->n_tensors);
  if (bundle->weights != NULL) munmap(bundle->weights, bundle->weights_size);
  cJSON_Delete(bundle->manifest);
  free(bundle->root);
  memset(bundle, 0, sizeof *bundle);
}

const struct tensor *bundle_tensor(const struct bundle *bundle, const char *name) {
  return safetensors_find(bundle->tensors, bundle->n_tensors, name);
}

int bundle_lists(const struct bundle *bundle, const char *name) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "files");
  return cJSON_GetObjectItemCaseSensitive(files, name) != NULL;
}

edge_status bundle_read_file(const struct bundle *bundle, const char *name, size_t max_size, char **data,
                             size_t *size) {
  if (!bundle_lists(bundle, name)) {
    return edge_fail(EDGE_ERROR_IO, "%s/%s: not in the bundle (manifest.json files does not list it)", bundle->root, name);
  }
  char *path = join_path(bundle->root, name);
  if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
  edge_status status = read_regular_file(path, max_size, data, size);
  free(path);
  return status;
}
