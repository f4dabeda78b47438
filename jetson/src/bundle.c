/* Bundle reader: manifest checks, file verification, weights mapping and the safetensors header. */
#define _GNU_SOURCE /* realpath */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "json_canonical.h"
#include "sha256.h"

#define MAX_MANIFEST_BYTES (64u << 20)
#define MAX_SAFETENSORS_HEADER_BYTES (100u << 20) /* the limit the safetensors library applies */
#define HASH_CHUNK_BYTES (1u << 20)
#define MAX_EXACT_INTEGER 9007199254740992.0 /* 2^53 */

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

static int parse_dtype(const char *name, enum tensor_dtype *dtype) {
  for (int i = 0; i < DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_table[i].name) == 0) {
      *dtype = (enum tensor_dtype)i;
      return 1;
    }
  }
  return 0;
}

/* ---- JSON fields ------------------------------------------------------------------------------------ */

int json_integer(const cJSON *item, int64_t min, int64_t max, int64_t *out) {
  if (!cJSON_IsNumber(item)) return 0;
  double value = item->valuedouble;
  if (!isfinite(value) || value != floor(value) || fabs(value) > MAX_EXACT_INTEGER) return 0;
  if (value < (double)min || value > (double)max) return 0;
  *out = (int64_t)value;
  return 1;
}

static const cJSON *field_item(const cJSON *object, const char *field) {
  return cJSON_IsObject(object) ? cJSON_GetObjectItemCaseSensitive(object, field) : NULL;
}

edge_status json_object_field(const cJSON *object, const char *field, const char *where, const cJSON **out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsObject(item)) return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' is missing or not a JSON object", where, field);
  *out = item;
  return EDGE_OK;
}

edge_status json_int_field(const cJSON *object, const char *field, const char *where, int64_t min, int64_t max,
                           int64_t *out) {
  const cJSON *item = field_item(object, field);
  if (item == NULL) return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' is missing", where, field);
  if (!json_integer(item, min, max, out)) {
    char *found = cJSON_PrintUnformatted(item);
    edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' must be an integer in [%lld, %lld], found %.64s", where, field,
              (long long)min, (long long)max, found ? found : "?");
    cJSON_free(found);
    return EDGE_ERROR_BUNDLE;
  }
  return EDGE_OK;
}

edge_status json_number_field(const cJSON *object, const char *field, const char *where, double *out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' is missing or not a finite number", where, field);
  }
  *out = item->valuedouble;
  return EDGE_OK;
}

edge_status json_bool_field(const cJSON *object, const char *field, const char *where, int *out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsBool(item)) return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' is missing or not true/false", where, field);
  *out = cJSON_IsTrue(item);
  return EDGE_OK;
}

edge_status json_string_field(const cJSON *object, const char *field, const char *where, const char **out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsString(item) || item->valuestring == NULL) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' is missing or not a string", where, field);
  }
  *out = item->valuestring;
  return EDGE_OK;
}

/* ---- Files -------------------------------------------------------------------------------------------- */

static char *join_path(const char *root, const char *name) {
  size_t n = strlen(root) + strlen(name) + 2;
  char *path = malloc(n);
  if (path != NULL) snprintf(path, n, "%s/%s", root, name);
  return path;
}

/* Reads path whole (at most max_size bytes) into a NUL-terminated buffer. */
static edge_status read_whole_file(const char *path, size_t max_size, char **data, size_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return edge_fail(EDGE_ERROR_IO, "%s: cannot open (%s)", path, strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return edge_fail(EDGE_ERROR_IO, "%s: not a regular file", path);
  }
  if ((uint64_t)info.st_size > max_size) {
    close(fd);
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: %lld bytes, more than the %zu this reader accepts", path,
                     (long long)info.st_size, max_size);
  }
  size_t total = (size_t)info.st_size;
  char *buffer = malloc(total + 1);
  if (buffer == NULL) {
    close(fd);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading %zu bytes", path, total);
  }
  size_t done = 0;
  while (done < total) {
    ssize_t n = read(fd, buffer + done, total - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      free(buffer);
      close(fd);
      return edge_fail(EDGE_ERROR_IO, "%s: read failed after %zu of %zu bytes", path, done, total);
    }
    done += (size_t)n;
  }
  close(fd);
  buffer[total] = '\0';
  *data = buffer;
  *size = total;
  return EDGE_OK;
}

/* name must be relative, without '..' components or backslashes, and resolve inside root (symlinks too). */
static edge_status safe_path(const char *root, const char *name, const char *where, char **out) {
  int bad = name[0] == '\0' || name[0] == '/' || strchr(name, '\\') != NULL;
  for (const char *part = name; !bad && part != NULL; part = strchr(part, '/')) {
    if (*part == '/') part++;
    if (strncmp(part, "..", 2) == 0 && (part[2] == '/' || part[2] == '\0')) bad = 1;
  }
  if (bad) return edge_fail(EDGE_ERROR_BUNDLE, "%s: path '%.200s' must be relative and inside the bundle directory", where, name);
  char *path = join_path(root, name);
  if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  char *real_root = realpath(root, NULL), *real_path = realpath(path, NULL);
  edge_status status = EDGE_OK;
  if (real_root == NULL || real_path == NULL) {
    status = edge_fail(EDGE_ERROR_IO, "%s: file listed in manifest.json is missing", path);
  } else {
    size_t n = strlen(real_root);
    if (strncmp(real_path, real_root, n) != 0 || (real_path[n] != '/' && strcmp(real_root, "/") != 0)) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: path '%.200s' points outside the bundle directory", where, name);
    }
  }
  free(real_root);
  free(real_path);
  if (status != EDGE_OK) {
    free(path);
    return status;
  }
  *out = path;
  return EDGE_OK;
}

static edge_status hash_file(const char *path, char hex[65]) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return edge_fail(EDGE_ERROR_IO, "%s: cannot open (%s)", path, strerror(errno));
  unsigned char *chunk = malloc(HASH_CHUNK_BYTES);
  if (chunk == NULL) {
    close(fd);
    return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
  }
  struct sha256 hash;
  sha256_init(&hash);
  edge_status status = EDGE_OK;
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

static int is_sha256_hex(const char *text) {
  if (strlen(text) != 64) return 0;
  for (int i = 0; i < 64; i++) {
    if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f'))) return 0;
  }
  return 1;
}

/* Sizes of every listed file, then (verify) their sha256; weights.safetensors must be listed. */
static edge_status check_files(const char *root, const cJSON *files, const char *where, int verify) {
  const cJSON *entry;
  int has_weights = 0;
  cJSON_ArrayForEach(entry, files) {
    const char *name = entry->string;
    const char *sha = NULL;
    int64_t size = 0;
    char *path = NULL;
    if (!cJSON_IsObject(entry) || json_int_field(entry, "size", where, 0, INT64_MAX, &size) != EDGE_OK ||
        json_string_field(entry, "sha256", where, &sha) != EDGE_OK || !is_sha256_hex(sha)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: files['%.200s'] needs an integer 'size' and a 64-digit hex 'sha256'",
                       where, name);
    }
    edge_status status = safe_path(root, name, where, &path);
    if (status != EDGE_OK) return status;
    struct stat info;
    if (stat(path, &info) != 0 || !S_ISREG(info.st_mode)) {
      status = edge_fail(EDGE_ERROR_IO, "%s: file listed in manifest.json is missing", path);
    } else if ((int64_t)info.st_size != size) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: size is %lld bytes, manifest.json says %lld", path,
                         (long long)info.st_size, (long long)size);
    }
    free(path);
    if (status != EDGE_OK) return status;
    if (strcmp(name, BUNDLE_WEIGHTS_FILE) == 0) has_weights = 1;
  }
  if (!has_weights) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'files' does not list %s, so it cannot be verified", where,
                     BUNDLE_WEIGHTS_FILE);
  }
  if (!verify) return EDGE_OK;
  cJSON_ArrayForEach(entry, files) {
    char *path = join_path(root, entry->string);
    if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
    char hex[65];
    edge_status status = hash_file(path, hex);
    const char *expected = cJSON_GetObjectItemCaseSensitive(entry, "sha256")->valuestring;
    if (status == EDGE_OK && strcmp(hex, expected) != 0) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: sha256 is %s, manifest.json says %s (the file changed)", path, hex,
                         expected);
    }
    free(path);
    if (status != EDGE_OK) return status;
  }
  return EDGE_OK;
}

/* ---- Manifest ------------------------------------------------------------------------------------------ */

static edge_status check_manifest(const char *text, size_t size, const cJSON *manifest, const char *where) {
  if (!cJSON_IsObject(manifest)) return edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object", where);
  const char *format = NULL;
  if (json_string_field(manifest, "format", where, &format) != EDGE_OK || strcmp(format, BUNDLE_FORMAT) != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: field 'format' must be '%s'", where, BUNDLE_FORMAT);
  }
  int64_t version;
  if (json_int_field(manifest, "format_version", where, INT64_MIN / 2, INT64_MAX / 2, &version) != EDGE_OK) {
    return EDGE_ERROR_BUNDLE;
  }
  if (version > BUNDLE_FORMAT_VERSION) {
    return edge_fail(EDGE_ERROR_UNSUPPORTED,
                     "%s: bundle format version %lld is newer than this edge-sdk supports (%d); upgrade libedge_sdk "
                     "or re-export the bundle", where, (long long)version, BUNDLE_FORMAT_VERSION);
  }
  const char *recorded = NULL;
  if (json_string_field(manifest, "manifest_sha256", where, &recorded) != EDGE_OK) return EDGE_ERROR_BUNDLE;
  char digest[65];
  edge_status status = json_canonical_digest(text, size, "manifest_sha256", where, digest);
  if (status != EDGE_OK) return status;
  if (strcmp(recorded, digest) != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE,
                     "%s: field 'manifest_sha256' does not match the manifest's content (the manifest changed)", where);
  }
  static const char *objects[] = {"model", "sparsity", "files", "tensors"};
  for (size_t i = 0; i < sizeof objects / sizeof *objects; i++) {
    const cJSON *unused;
    if (json_object_field(manifest, objects[i], where, &unused) != EDGE_OK) return EDGE_ERROR_BUNDLE;
  }
  return EDGE_OK;
}

/* ---- safetensors ---------------------------------------------------------------------------------------- */

static int compare_tensors(const void *a, const void *b) {
  return strcmp(((const struct tensor *)a)->name, ((const struct tensor *)b)->name);
}

static edge_status parse_tensor_entry(const cJSON *entry, const char *where, const uint8_t *data, uint64_t data_size,
                                      struct tensor *tensor) {
  const char *name = entry->string, *dtype_name = NULL;
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
  if (!cJSON_IsObject(entry) || json_string_field(entry, "dtype", where, &dtype_name) != EDGE_OK ||
      !cJSON_IsArray(shape) || !cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' needs 'dtype', 'shape' and two 'data_offsets'", where, name);
  }
  if (!parse_dtype(dtype_name, &tensor->dtype)) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' has unknown dtype '%.32s'", where, name, dtype_name);
  }
  int rank = cJSON_GetArraySize(shape);
  if (rank > BUNDLE_MAX_RANK) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' has %d dimensions, at most %d are supported", where, name,
                     rank, BUNDLE_MAX_RANK);
  }
  uint64_t elements = 1;
  const cJSON *dim;
  tensor->rank = 0;
  cJSON_ArrayForEach(dim, shape) {
    int64_t value;
    if (!json_integer(dim, 0, INT64_C(1) << 40, &value)) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' has a shape entry that is not an integer in [0, 2^40]",
                       where, name);
    }
    tensor->shape[tensor->rank++] = value;
    if (value != 0 && elements > (UINT64_C(1) << 60) / (uint64_t)value) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' has more than 2^60 elements", where, name);
    }
    elements *= (uint64_t)value;
  }
  int64_t begin, end;
  if (!json_integer(cJSON_GetArrayItem(offsets, 0), 0, INT64_MAX, &begin) ||
      !json_integer(cJSON_GetArrayItem(offsets, 1), 0, INT64_MAX, &end) || begin > end ||
      (uint64_t)end > data_size) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' has data_offsets outside the %llu data bytes", where, name,
                     (unsigned long long)data_size);
  }
  size_t element_size = tensor_dtype_size(tensor->dtype);
  if ((uint64_t)(end - begin) != elements * element_size) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' spans %lld bytes, its dtype and shape need %llu", where,
                     name, (long long)(end - begin), (unsigned long long)(elements * element_size));
  }
  const uint8_t *start = data + begin;
  if ((uintptr_t)start % element_size != 0) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' is not aligned to its %zu-byte elements", where, name,
                     element_size);
  }
  tensor->name = strdup(name);
  if (tensor->name == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  tensor->data = start;
  tensor->nbytes = (size_t)(end - begin);
  return EDGE_OK;
}

static edge_status parse_safetensors(struct bundle *bundle, const char *where) {
  const uint8_t *base = bundle->weights;
  if (bundle->weights_size < 8) return edge_fail(EDGE_ERROR_BUNDLE, "%s: %zu bytes, too short for a safetensors header", where, bundle->weights_size);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; i--) header_size = header_size << 8 | base[i];
  if (header_size > bundle->weights_size - 8 || header_size > MAX_SAFETENSORS_HEADER_BYTES) {
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: header length %llu does not fit the %zu-byte file", where,
                     (unsigned long long)header_size, bundle->weights_size);
  }
  cJSON *header = cJSON_ParseWithLength((const char *)base + 8, (size_t)header_size);
  if (!cJSON_IsObject(header)) {
    cJSON_Delete(header);
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: the header is not a JSON object", where);
  }
  const uint8_t *data = base + 8 + header_size;
  uint64_t data_size = bundle->weights_size - 8 - header_size;
  size_t count = (size_t)cJSON_GetArraySize(header);
  bundle->tensors = calloc(count ? count : 1, sizeof *bundle->tensors);
  edge_status status = bundle->tensors ? EDGE_OK : edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", where);
  const cJSON *entry;
  cJSON_ArrayForEach(entry, header) {
    if (status != EDGE_OK) break;
    if (entry->string == NULL) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: the header has an entry without a name", where);
    } else if (strcmp(entry->string, "__metadata__") == 0) {
      if (!cJSON_IsObject(entry)) status = edge_fail(EDGE_ERROR_BUNDLE, "%s: '__metadata__' is not an object", where);
    } else {
      status = parse_tensor_entry(entry, where, data, data_size, &bundle->tensors[bundle->n_tensors]);
      if (status == EDGE_OK) bundle->n_tensors++;
    }
  }
  cJSON_Delete(header);
  if (status != EDGE_OK) return status;
  qsort(bundle->tensors, bundle->n_tensors, sizeof *bundle->tensors, compare_tensors);
  for (size_t i = 1; i < bundle->n_tensors; i++) {
    if (strcmp(bundle->tensors[i - 1].name, bundle->tensors[i].name) == 0) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s: tensor '%.200s' appears twice in the header", where, bundle->tensors[i].name);
    }
  }
  return EDGE_OK;
}

const struct tensor *bundle_tensor(const struct bundle *bundle, const char *name) {
  struct tensor key = {.name = (char *)name};
  if (bundle->n_tensors == 0) return NULL;
  return bsearch(&key, bundle->tensors, bundle->n_tensors, sizeof key, compare_tensors);
}

/* Every tensor the manifest lists must be in the header with the same dtype and shape. */
static edge_status check_manifest_tensors(const struct bundle *bundle, const cJSON *tensors, const char *where) {
  const cJSON *declared;
  cJSON_ArrayForEach(declared, tensors) {
    const struct tensor *tensor = bundle_tensor(bundle, declared->string);
    if (tensor == NULL) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%.200s' listed in manifest.json is missing", bundle->root,
                       BUNDLE_WEIGHTS_FILE, declared->string);
    }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(declared, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(declared, "shape");
    int same = cJSON_IsString(dtype) && strcmp(dtype->valuestring, tensor_dtype_name(tensor->dtype)) == 0 &&
               cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == tensor->rank;
    for (int i = 0; same && i < tensor->rank; i++) {
      int64_t dim;
      same = json_integer(cJSON_GetArrayItem(shape, i), 0, INT64_MAX, &dim) && dim == tensor->shape[i];
    }
    if (!same) {
      return edge_fail(EDGE_ERROR_BUNDLE, "%s/%s: tensor '%.200s' (%s, %d dims) differs from manifest.json's %s entry",
                       bundle->root, BUNDLE_WEIGHTS_FILE, declared->string, tensor_dtype_name(tensor->dtype),
                       tensor->rank, where);
    }
  }
  return EDGE_OK;
}

static edge_status map_weights(struct bundle *bundle, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return edge_fail(EDGE_ERROR_IO, "%s: cannot open (%s)", path, strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0 || info.st_size <= 0) {
    close(fd);
    return edge_fail(EDGE_ERROR_BUNDLE, "%s: empty or unreadable", path);
  }
  void *base = mmap(NULL, (size_t)info.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: mmap failed (%s)", path, strerror(errno));
  bundle->weights = base;
  bundle->weights_size = (size_t)info.st_size;
  return EDGE_OK;
}

edge_status bundle_open(const char *root, int verify_checksums, struct bundle *bundle) {
  memset(bundle, 0, sizeof *bundle);
  struct stat info;
  if (stat(root, &info) != 0 || !S_ISDIR(info.st_mode)) return edge_fail(EDGE_ERROR_IO, "%s: bundle directory not found", root);
  bundle->root = strdup(root);
  char *manifest_path = join_path(root, BUNDLE_MANIFEST_FILE);
  char *weights_path = join_path(root, BUNDLE_WEIGHTS_FILE);
  char *text = NULL;
  size_t size = 0;
  edge_status status = EDGE_OK;
  if (bundle->root == NULL || manifest_path == NULL || weights_path == NULL) {
    status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", root);
  } else if (access(manifest_path, F_OK) != 0) {
    status = edge_fail(EDGE_ERROR_IO, "%s: manifest.json is missing (is %s an edge-sdk bundle?)", manifest_path, root);
  } else {
    status = read_whole_file(manifest_path, MAX_MANIFEST_BYTES, &text, &size);
  }
  if (status == EDGE_OK) {
    const char *end = NULL;
    bundle->manifest = cJSON_ParseWithLengthOpts(text, size, &end, 0); /* trailing text: see the digest check */
    if (bundle->manifest == NULL) {
      status = edge_fail(EDGE_ERROR_BUNDLE, "%s: not valid JSON (near byte %td)", manifest_path,
                         end != NULL && end >= text ? end - text : (ptrdiff_t)0);
    } else {
      status = check_manifest(text, size, bundle->manifest, manifest_path);
    }
  }
  free(text);
  if (status == EDGE_OK) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "files");
    status = check_files(root, files, manifest_path, 0);
  }
  if (status == EDGE_OK) status = map_weights(bundle, weights_path);
  if (status == EDGE_OK && verify_checksums) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "files");
    status = check_files(root, files, manifest_path, 1);
  }
  if (status == EDGE_OK) status = parse_safetensors(bundle, weights_path);
  if (status == EDGE_OK) {
    status = check_manifest_tensors(bundle, cJSON_GetObjectItemCaseSensitive(bundle->manifest, "tensors"), "tensors");
  }
  free(manifest_path);
  free(weights_path);
  if (status != EDGE_OK) bundle_close(bundle);
  return status;
}

void bundle_close(struct bundle *bundle) {
  if (bundle == NULL) return;
  for (size_t i = 0; i < bundle->n_tensors; i++) free(bundle->tensors[i].name);
  free(bundle->tensors);
  if (bundle->weights != NULL) munmap(bundle->weights, bundle->weights_size);
  cJSON_Delete(bundle->manifest);
  free(bundle->root);
  memset(bundle, 0, sizeof *bundle);
}

edge_status bundle_read_file(const struct bundle *bundle, const char *name, char **data, size_t *size) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(bundle->manifest, "files");
  if (cJSON_GetObjectItemCaseSensitive(files, name) == NULL) {
    return edge_fail(EDGE_ERROR_IO, "%s/%s: not in the bundle (manifest.json files does not list it)", bundle->root, name);
  }
  char *path = join_path(bundle->root, name);
  if (path == NULL) return edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory", bundle->root);
  edge_status status = read_whole_file(path, MAX_MANIFEST_BYTES, data, size);
  free(path);
  return status;
}
