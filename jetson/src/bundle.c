/* Bundle reader: manifest.json, the listed files (regular, no links, sizes and sha256), weights.safetensors mapped
 * and checked against the manifest, and the graphs' external data (bundle.h). */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
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

/* bytes[0:length] shown on one line for a message ("?" when out of memory). */
static const char *shown_bytes(const char *bytes, size_t length, char *out, size_t size) {
  char *copy = json_string_from_bytes(bytes, length);
  if (copy == NULL) return "?";
  json_shown(copy, out, size);
  free(copy);
  return out;
}

static const char *shown_text(const struct wire_text *text, char *out, size_t size) {
  if (!text->present) return "nothing";
  return shown_bytes((const char *)text->data, text->length, out, size);
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

/* ---- Graph inputs and outputs (edge_sdk/bundle/graph_io.py) -------------------------------------------------- */

/* Both graphs take input_ids and position_ids [batch, seq] int64 and the KV cache past_key_values.{i}.key / .value
 * [batch, kv_heads, past_seq, head_dim] float32, and give logits [batch, seq, vocab] float32 and present.{i}.key /
 * .value [batch, kv_heads, total_seq, head_dim] float32; the decode graph also takes sparsity_level (int64 scalar)
 * and dense (bool scalar). A found value matches an expected one with the same element type and rank, and the
 * expected size wherever the exporter writes a size (a symbol matches any dimension). No name is declared twice;
 * inputs beyond these only in the decode graph of a kind fixed at prefill; the outputs beyond these (the
 * predictor's prompt outputs) the same in both graphs. */

#define ONNX_FLOAT 1
#define ONNX_INT64 7
#define ONNX_BOOL 9
#define EXPECTED_MAX_RANK 4
#define DESCRIBED_BYTES 320
#define PROBLEM_BYTES 900

enum graph_phase { PHASE_PREFILL, PHASE_DECODE }; /* the order of manifest graphs */
enum value_role { ROLE_INPUT, ROLE_OUTPUT };
static const char *const phase_names[BUNDLE_GRAPH_PHASES] = {"prefill", "decode"};
static const char *const role_names[] = {"input", "output"};

/* A value the exporter declares: dimension i is symbols[i] when that is not NULL, else sizes[i]. */
struct expected_value {
  char name[64];
  uint64_t elem_type;
  int rank;
  int64_t sizes[EXPECTED_MAX_RANK];
  const char *symbols[EXPECTED_MAX_RANK];
};

static size_t expected_count(const struct model_config *config, enum graph_phase phase, enum value_role role) {
  size_t cache = 2 * (size_t)config->num_layers;
  return role == ROLE_INPUT ? 2 + cache + (phase == PHASE_DECODE ? 2 : 0) : 1 + cache;
}

/* The index-th value of graph_interface(config, phase)'s inputs or outputs, in the exporter's order (the decode
 * graph's own inputs come last: expected_count says whether the phase has them). */
static void expected_value(const struct model_config *config, enum value_role role, size_t index,
                           struct expected_value *out) {
  memset(out, 0, sizeof *out);
  size_t cache = 2 * (size_t)config->num_layers, first_cache = role == ROLE_INPUT ? 2 : 1;
  if (index >= first_cache && index < first_cache + cache) {
    size_t layer = (index - first_cache) / 2;
    const char *part = (index - first_cache) % 2 ? "value" : "key";
    *out = (struct expected_value){.elem_type = ONNX_FLOAT, .rank = 4,
                                   .sizes = {0, config->num_kv_heads, 0, config->head_dim},
                                   .symbols = {"batch", NULL, role == ROLE_INPUT ? "past_seq" : "total_seq", NULL}};
    snprintf(out->name, sizeof out->name, "%s.%zu.%s", role == ROLE_INPUT ? "past_key_values" : "present", layer,
             part);
    return;
  }
  if (role == ROLE_OUTPUT) {
    *out = (struct expected_value){"logits", ONNX_FLOAT, 3, {0, 0, config->vocab_size}, {"batch", "seq", NULL}};
  } else if (index < first_cache) {
    *out = (struct expected_value){"input_ids", ONNX_INT64, 2, {0}, {"batch", "seq"}};
    if (index == 1) snprintf(out->name, sizeof out->name, "position_ids");
  } else if (index == first_cache + cache) {
    *out = (struct expected_value){"sparsity_level", ONNX_INT64, 0, {0}, {NULL}};
  } else {
    *out = (struct expected_value){"dense", ONNX_BOOL, 0, {0}, {NULL}};
  }
}

/* Appends to a message buffer, cut to fit. */
struct message {
  char *text;
  size_t size, used; /* used < size */
};

static void append(struct message *m, const char *format, ...) EDGE_PRINTF(2, 3);

static void append(struct message *m, const char *format, ...) {
  va_list args;
  va_start(args, format);
  int n = vsnprintf(m->text + m->used, m->size - m->used, format, args);
  va_end(args);
  if (n > 0) m->used = (size_t)n < m->size - m->used ? m->used + (size_t)n : m->size - 1;
}

static void append_dtype(struct message *m, uint64_t elem_type) {
  const char *dtype = onnx_safetensors_dtype(elem_type);
  if (dtype != NULL) {
    append(m, "%s", dtype);
  } else {
    append(m, "ONNX type %llu", (unsigned long long)elem_type);
  }
}

/* GraphValue.describe of a found value. */
static const char *describe_found(const struct onnx_interface *found, const struct onnx_value *value, char *out,
                                  size_t size) {
  struct message m = {out, size, 0};
  out[0] = '\0';
  if (!value->tensor) {
    append(&m, "not a tensor");
    return out;
  }
  append_dtype(&m, value->elem_type);
  if (!value->has_shape) {
    append(&m, " without a shape");
    return out;
  }
  append(&m, " [");
  for (size_t i = 0; i < value->rank && m.used + 1 < m.size; i++) {
    const struct onnx_dim *dim = &found->dims[value->first_dim + i];
    char shown[SHOWN_NAME_BYTES];
    if (dim->is_symbol) {
      const char *symbol = shown_bytes(found->text + dim->symbol, dim->symbol_length, shown, sizeof shown);
      append(&m, "%s%s", i ? ", " : "", symbol);
    } else {
      append(&m, "%s%lld", i ? ", " : "", (long long)dim->size);
    }
  }
  append(&m, "] (rank %zu)", value->rank);
  return out;
}

/* GraphValue.describe of an expected value. */
static const char *describe_expected(const struct expected_value *value, char *out, size_t size) {
  struct message m = {out, size, 0};
  out[0] = '\0';
  append_dtype(&m, value->elem_type);
  append(&m, " [");
  for (int i = 0; i < value->rank; i++) {
    if (value->symbols[i] != NULL) {
      append(&m, "%s%s", i ? ", " : "", value->symbols[i]);
    } else {
      append(&m, "%s%lld", i ? ", " : "", (long long)value->sizes[i]);
    }
  }
  append(&m, "] (rank %d)", value->rank);
  return out;
}

/* GraphValue.matches: the element type and rank of the expected value, and its sizes where it has sizes. */
static int value_matches(const struct onnx_interface *found, const struct onnx_value *value,
                         const struct expected_value *expected) {
  if (!value->tensor || !value->has_shape || value->elem_type != expected->elem_type ||
      value->rank != (size_t)expected->rank) {
    return 0;
  }
  for (int i = 0; i < expected->rank; i++) {
    const struct onnx_dim *dim = &found->dims[value->first_dim + (size_t)i];
    if (expected->symbols[i] == NULL && (dim->is_symbol || dim->size != expected->sizes[i])) return 0;
  }
  return 1;
}

/* Two found values are the same (GraphValue ==): name, element type and every dimension. */
static int same_value(const struct onnx_interface *a, const struct onnx_value *x, const struct onnx_interface *b,
                      const struct onnx_value *y) {
  if (x->name_length != y->name_length || memcmp(a->text + x->name, b->text + y->name, x->name_length) != 0) return 0;
  if (x->tensor != y->tensor) return 0;
  if (!x->tensor) return 1;
  if (x->elem_type != y->elem_type || x->has_shape != y->has_shape || x->rank != y->rank) return 0;
  for (size_t i = 0; x->has_shape && i < x->rank; i++) {
    const struct onnx_dim *p = &a->dims[x->first_dim + i], *q = &b->dims[y->first_dim + i];
    if (p->is_symbol != q->is_symbol) return 0;
    if (!p->is_symbol && p->size != q->size) return 0;
    if (p->is_symbol && (p->symbol_length != q->symbol_length ||
                         memcmp(a->text + p->symbol, b->text + q->symbol, p->symbol_length) != 0)) {
      return 0;
    }
  }
  return 1;
}

/* The found values of one role sorted by name (then file order), for lookups; expected[i]: value i of the file
 * bears the name of a value the exporter declares. */
struct named_value {
  const char *name;
  size_t length, index;
};

struct value_index {
  struct named_value *sorted;
  unsigned char *expected;
  size_t n;
};

static int compare_named_values(const void *a, const void *b) {
  const struct named_value *x = a, *y = b;
  size_t common = x->length < y->length ? x->length : y->length;
  int order = common ? memcmp(x->name, y->name, common) : 0;
  if (order != 0) return order;
  if (x->length != y->length) return x->length < y->length ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

static void value_index_free(struct value_index *index) {
  free(index->sorted);
  free(index->expected);
  memset(index, 0, sizeof *index);
}

/* The first value named name[0:length] (in file order), or NULL. */
static const struct named_value *lookup(const struct value_index *index, const char *name, size_t length) {
  struct named_value key = {name, length, 0};
  size_t low = 0, high = index->n;
  while (low < high) { /* the first entry not before key (index 0 sorts before every other of its name) */
    size_t middle = low + (high - low) / 2;
    if (compare_named_values(&index->sorted[middle], &key) < 0) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  if (low == index->n) return NULL;
  const struct named_value *hit = &index->sorted[low];
  return hit->length == length && (length == 0 || memcmp(hit->name, name, length) == 0) ? hit : NULL;
}

/* Sorts the values and marks those named as the exporter's (0: out of memory). */
static int index_values(const struct onnx_interface *found, const struct onnx_values *values,
                        const struct model_config *config, enum graph_phase phase, enum value_role role,
                        struct value_index *index) {
  memset(index, 0, sizeof *index);
  index->sorted = malloc((values->n ? values->n : 1) * sizeof *index->sorted);
  index->expected = calloc(values->n ? values->n : 1, 1);
  if (index->sorted == NULL || index->expected == NULL) {
    value_index_free(index);
    return 0;
  }
  index->n = values->n;
  for (size_t i = 0; i < values->n; i++) {
    index->sorted[i] = (struct named_value){found->text + values->items[i].name, values->items[i].name_length, i};
  }
  qsort(index->sorted, index->n, sizeof *index->sorted, compare_named_values);
  size_t count = expected_count(config, phase, role);
  for (size_t i = 0; i < count; i++) {
    struct expected_value expected;
    expected_value(config, role, i, &expected);
    const struct named_value *hit = lookup(index, expected.name, strlen(expected.name));
    if (hit != NULL) index->expected[hit->index] = 1;
  }
  return 1;
}

/* graph_io._listing of the expected values' names: their count and names (at most 3, "...", and the last 2). */
static void append_listing(struct message *m, const struct model_config *config, enum graph_phase phase,
                           enum value_role role) {
  size_t count = expected_count(config, phase, role);
  append(m, "%zu: ", count);
  for (size_t i = 0; i < count; i++) {
    if (count > 6 && i >= 3 && i < count - 2) {
      if (i == 3) append(m, ", ...");
      continue;
    }
    struct expected_value expected;
    expected_value(config, role, i, &expected);
    append(m, "%s%s", i ? ", " : "", expected.name);
  }
}

/* The first way one role's found values differ from the exporter's (graph_io.interface_problem, one role):
 * 1 with the message in problem, 0 when they match, -1 when out of memory. */
static int role_problem(const struct onnx_interface *found, const struct model_config *config, enum graph_phase phase,
                        enum value_role role, int kind_inputs, struct message *problem) {
  const struct onnx_values *values = role == ROLE_INPUT ? &found->inputs : &found->outputs;
  const char *role_name = role_names[role], *phase_name = phase_names[phase];
  struct value_index index;
  if (!index_values(found, values, config, phase, role, &index)) return -1;
  char shown[SHOWN_NAME_BYTES], have[DESCRIBED_BYTES], want[DESCRIBED_BYTES];
  int result = 0;
  /* the first value (in file order) whose name an earlier one has: of the entries sorted after one of their name,
   * the one earliest in the file */
  size_t twice = SIZE_MAX;
  for (size_t i = 1; i < index.n; i++) {
    const struct named_value *before = &index.sorted[i - 1], *here = &index.sorted[i];
    int same = before->length == here->length &&
               (here->length == 0 || memcmp(before->name, here->name, here->length) == 0);
    if (same && here->index < twice) twice = here->index;
  }
  if (twice != SIZE_MAX) {
    const struct onnx_value *value = &values->items[twice];
    append(problem, "%s '%s' is declared twice", role_name,
           shown_bytes(found->text + value->name, value->name_length, shown, sizeof shown));
    result = 1;
  }
  size_t count = expected_count(config, phase, role);
  for (size_t i = 0; result == 0 && i < count; i++) {
    struct expected_value expected;
    expected_value(config, role, i, &expected);
    const struct named_value *hit = lookup(&index, expected.name, strlen(expected.name));
    if (hit == NULL) {
      append(problem, "the %s graph's %s '%s' is missing: expected %s", phase_name, role_name,
             shown_bytes(expected.name, strlen(expected.name), shown, sizeof shown),
             describe_expected(&expected, want, sizeof want));
      result = 1;
    } else if (!value_matches(found, &values->items[hit->index], &expected)) {
      append(problem, "%s '%s' is %s, expected %s as the %s graph's", role_name,
             shown_bytes(expected.name, strlen(expected.name), shown, sizeof shown),
             describe_found(found, &values->items[hit->index], have, sizeof have),
             describe_expected(&expected, want, sizeof want), phase_name);
      result = 1;
    }
  }
  if (result == 0 && role == ROLE_INPUT && (phase == PHASE_PREFILL || !kind_inputs)) {
    for (size_t i = 0; i < values->n; i++) {
      if (index.expected[i]) continue;
      const struct onnx_value *value = &values->items[i];
      append(problem, "input '%s' is not an input of the %s graph%s (expected its inputs, ",
             shown_bytes(found->text + value->name, value->name_length, shown, sizeof shown), phase_name,
             phase == PHASE_PREFILL ? "" : " of a bundle whose predictor takes no decode inputs");
      append_listing(problem, config, phase, role);
      append(problem, ")");
      result = 1;
      break;
    }
  }
  value_index_free(&index);
  return result;
}

static int interface_problem(const struct onnx_interface *found, const struct model_config *config,
                             enum graph_phase phase, int kind_inputs, char *out, size_t size) {
  struct message problem = {out, size, 0};
  out[0] = '\0';
  int result = role_problem(found, config, phase, ROLE_INPUT, kind_inputs, &problem);
  return result != 0 ? result : role_problem(found, config, phase, ROLE_OUTPUT, kind_inputs, &problem);
}

/* The graph's inputs and outputs are the exporter's for its phase, so that a runtime never feeds a graph of the
 * other phase, or one that lost an input (reader.py _check_interface, with its hint for swapped graphs). */
static edge_status check_interface(const struct bundle *bundle, const char *path, enum graph_phase phase,
                                   const struct onnx_interface *found) {
  const struct model_config *config = &bundle->info.model;
  int kind_inputs = predictor_fixed_at_prefill(bundle->info.sparsity.predictor);
  char problem[PROBLEM_BYTES], other_problem[PROBLEM_BYTES];
  int result = interface_problem(found, config, phase, kind_inputs, problem, sizeof problem);
  if (result == 0) return EDGE_OK;
  enum graph_phase other = phase == PHASE_PREFILL ? PHASE_DECODE : PHASE_PREFILL;
  int swapped =
      result < 0 ? -1 : interface_problem(found, config, other, kind_inputs, other_problem, sizeof other_problem);
  if (swapped < 0) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  if (swapped == 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: %s; it has the %s graph's inputs and outputs (are %s and %s swapped?)",
                     path, problem, phase_names[other], bundle->info.graphs[PHASE_PREFILL],
                     bundle->info.graphs[PHASE_DECODE]);
  }
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: %s", path, problem);
}

/* The outputs beyond the exporter's (the predictor's prompt outputs) are the same in both graphs
 * (graph_io.prompt_outputs_problem): each graph's, in file order, is in the other graph, and alike. */
static edge_status check_prompt_outputs(const struct bundle *bundle, const struct onnx_interface *found) {
  const struct model_config *config = &bundle->info.model;
  struct value_index indexes[BUNDLE_GRAPH_PHASES];
  memset(indexes, 0, sizeof indexes);
  edge_status status = EDGE_OK;
  for (int phase = 0; status == EDGE_OK && phase < BUNDLE_GRAPH_PHASES; phase++) {
    if (!index_values(&found[phase], &found[phase].outputs, config, (enum graph_phase)phase, ROLE_OUTPUT,
                      &indexes[phase])) {
      status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
    }
  }
  /* the decode graph has the prefill graph's, then the prefill graph the decode graph's */
  static const enum graph_phase order[][2] = {{PHASE_DECODE, PHASE_PREFILL}, {PHASE_PREFILL, PHASE_DECODE}};
  for (size_t pass = 0; status == EDGE_OK && pass < 2; pass++) {
    enum graph_phase phase = order[pass][0], other = order[pass][1];
    const struct onnx_values *wanted = &found[other].outputs;
    for (size_t i = 0; status == EDGE_OK && i < wanted->n; i++) {
      if (indexes[other].expected[i]) continue;
      const struct onnx_value *want = &wanted->items[i];
      const char *name = found[other].text + want->name;
      const struct named_value *hit = lookup(&indexes[phase], name, want->name_length);
      const struct onnx_value *have = hit != NULL ? &found[phase].outputs.items[hit->index] : NULL;
      if (have != NULL && same_value(&found[phase], have, &found[other], want)) continue;
      char *path = join_path(bundle->root, bundle->info.graphs[phase]);
      char shown[SHOWN_NAME_BYTES], described[DESCRIBED_BYTES], expected[DESCRIBED_BYTES];
      if (path == NULL) {
        status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
      } else if (have == NULL) {
        status = edge_fail(EDGE_ERROR_BUNDLE, "%s: the %s graph's output '%s' is missing: expected %s, as the %s "
                           "graph has it (the predictor's outputs are the same in both graphs)", path,
                           phase_names[phase], shown_bytes(name, want->name_length, shown, sizeof shown),
                           describe_found(&found[other], want, expected, sizeof expected), phase_names[other]);
      } else {
        status = edge_fail(EDGE_ERROR_BUNDLE, "%s: output '%s' is %s, expected %s as the %s graph's (the "
                           "predictor's outputs are the same in both graphs)", path,
                           shown_bytes(name, want->name_length, shown, sizeof shown),
                           describe_found(&found[phase], have, described, sizeof described),
                           describe_found(&found[other], want, expected, sizeof expected), phase_names[other]);
      }
      free(path);
    }
  }
  for (int phase = 0; phase < BUNDLE_GRAPH_PHASES; phase++) value_index_free(&indexes[phase]);
  return status;
}

static edge_status check_graph_structure(const struct onnx_summary *summary, const char *path) {
  if (summary->ir_version >= 1 && summary->opset_imports >= 1 && summary->graphs == 1) return EDGE_OK;
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: not an ONNX model (ir_version %llu, %llu opset imports, %llu graphs; "
                   "expected an ir_version >= 1, an opset import and one graph)", path,
                   (unsigned long long)summary->ir_version, (unsigned long long)summary->opset_imports,
                   (unsigned long long)summary->graphs);
}

/* The graph of phase: a well-formed ONNX model with the exporter's inputs and outputs for its phase (into *found,
 * which the caller frees, on failure too) and external data exactly of weights.safetensors. */
static edge_status check_graph(const struct bundle *bundle, enum graph_phase phase, struct onnx_interface *found) {
  char *path = join_path(bundle->root, bundle->info.graphs[phase]), *data = NULL;
  if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
  size_t size = 0;
  struct onnx_summary summary;
  memset(&summary, 0, sizeof summary);
  edge_status status = read_regular_file(path, MAX_GRAPH_BYTES, &data, &size);
  if (status == EDGE_OK) status = onnx_wire_summarize((const uint8_t *)data, size, path, &summary);
  if (status == EDGE_OK) status = check_graph_structure(&summary, path);
  if (status == EDGE_OK) status = onnx_wire_interface((const uint8_t *)data, size, path, found);
  if (status == EDGE_OK) status = check_interface(bundle, path, phase, found);
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
  if (stat(root, &info) != 0) return edge_fail(EDGE_ERROR_IO, "%s: bundle directory not found", root);
  /* Bundle.open's words: the path is there, so "not found" would send the user looking in the wrong place */
  if (!S_ISDIR(info.st_mode)) return edge_fail(EDGE_ERROR_IO, "%s: is a file, not a bundle directory", root);
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
  struct onnx_interface interfaces[BUNDLE_GRAPH_PHASES];
  memset(interfaces, 0, sizeof interfaces);
  for (int phase = 0; status == EDGE_OK && phase < BUNDLE_GRAPH_PHASES; phase++) {
    status = check_graph(bundle, (enum graph_phase)phase, &interfaces[phase]);
  }
  if (status == EDGE_OK) status = check_prompt_outputs(bundle, interfaces);
  for (int phase = 0; phase < BUNDLE_GRAPH_PHASES; phase++) onnx_interface_free(&interfaces[phase]);
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
