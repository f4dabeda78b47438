/* The bundle reader (edge_sdk/bundle/README.md, the rules of edge_sdk/bundle/reader.py): a bundle is one flat
 * directory that is treated as hostile until every check passed:
 * - manifest.json passes the strict JSON rule (json_strict.h) and every field's rule (manifest.h);
 * - manifest.json and every file it lists is a regular file of the directory itself, opened without following a
 *   symbolic link, of the listed size and (when verifying) sha256; files it does not list are never read;
 * - weights.safetensors (mapped read-only) holds exactly the manifest's tensors with its dtypes and shapes,
 *   tiling its data section (safetensors.h), each aligned to its element size, every signbit alpha finite;
 * - each graph is a well-formed ONNX model whose external data all points at exactly the bytes of the tensor of
 *   its name in weights.safetensors (onnx_wire.h), and whose inputs and outputs are those the exporter declares for
 *   its phase, prefill or decode (names, element types, ranks and sizes; the predictor's prompt outputs the same in
 *   both graphs: edge_sdk/bundle/graph_io.py, bundle.c). */
#ifndef EDGE_BUNDLE_H
#define EDGE_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edge_sdk.h"
#include "json_fields.h"
#include "manifest.h"
#include "safetensors.h"

#define BUNDLE_MAX_RANK SAFETENSORS_MAX_RANK

struct bundle {
  char *root;              /* the directory as given */
  cJSON *manifest;         /* parsed manifest.json */
  struct manifest info;    /* its validated fields */
  void *weights;           /* mmap of weights.safetensors (PROT_READ, MAP_PRIVATE) */
  size_t weights_size;
  struct tensor *tensors;  /* sorted by name; data inside `weights` */
  size_t n_tensors;
};

/* Opens root: every check of the file comment above. On failure the bundle is left empty (nothing to free). */
edge_status bundle_open(const char *root, int verify_checksums, struct bundle *bundle);
void bundle_close(struct bundle *bundle);

/* The tensor called name, or NULL. */
const struct tensor *bundle_tensor(const struct bundle *bundle, const char *name);

/* Nonzero when the manifest's files lists name. */
int bundle_lists(const struct bundle *bundle, const char *name);

/* root/name read whole (at most max_size bytes) into a NUL-terminated buffer (free it); name must be listed in the
 * manifest's files, and is read as a regular file without following a link. */
edge_status bundle_read_file(const struct bundle *bundle, const char *name, size_t max_size, char **data,
                             size_t *size);

#endif
