/* Test driver for tests/jetson: fuzzes the bundle reader. Every mutated bundle must open with an error status
 * and a message, or open successfully and then run (prefill, decode, tokenizer) without fault; under
 * AddressSanitizer any out-of-bounds access aborts the run.
 *   edge_fuzz_bundle BUNDLE_COPY ITERATIONS SEED [-v]     (-v: one line per iteration with its outcome)
 * BUNDLE_COPY is a writable copy of a bundle: its manifest.json and the header of weights.safetensors are
 * mutated in place and restored after each iteration. Mutations rotate through four kinds:
 *   text       random byte edits of manifest.json (the digest check or the JSON parser must refuse them)
 *   structure  a JSON value of the manifest replaced, removed or renamed, with manifest_sha256 recomputed so
 *              the reader gets past the digest check to the field checks
 *   header     byte and digit edits inside the safetensors JSON header (checksums off, so the parser sees them)
 *   length     the safetensors header length prefix replaced */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_sdk.h"
#include "json_canonical.h"

static uint64_t rng_state;
static int verbose;

static uint64_t next_random(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static size_t below(size_t n) { return n == 0 ? 0 : (size_t)(next_random() % n); }

static char *read_all(const char *path, size_t *size) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return NULL;
  fseek(file, 0, SEEK_END);
  long length = ftell(file);
  fseek(file, 0, SEEK_SET);
  char *data = malloc((size_t)length + 1);
  if (data != NULL && fread(data, 1, (size_t)length, file) != (size_t)length) {
    free(data);
    data = NULL;
  }
  fclose(file);
  if (data != NULL) data[length] = '\0';
  *size = (size_t)length;
  return data;
}

static int write_at(const char *path, long offset, const void *data, size_t size, int truncate) {
  FILE *file = fopen(path, truncate ? "wb" : "r+b");
  if (file == NULL) return 0;
  int ok = fseek(file, offset, SEEK_SET) == 0 && fwrite(data, 1, size, file) == size;
  return fclose(file) == 0 && ok;
}

/* ---- text mutations ---------------------------------------------------------------------------------- */

static char *mutate_text(const char *original, size_t size, size_t *out_size) {
  char *text = malloc(2 * size + 64);
  memcpy(text, original, size);
  size_t n = size;
  int edits = 1 + (int)below(4);
  for (int e = 0; e < edits && n > 0; e++) {
    size_t at = below(n);
    switch (below(6)) {
      case 0:
        text[at] ^= (char)(1u << below(8));
        break;
      case 1:
        text[at] = (char)below(256);
        break;
      case 2: { /* delete a range */
        size_t length = 1 + below(16);
        if (at + length > n) length = n - at;
        memmove(text + at, text + at + length, n - at - length);
        n -= length;
        break;
      }
      case 3: { /* insert structural characters */
        static const char pieces[] = "{}[]\",:0123456789-eE.\\ u";
        size_t length = 1 + below(4);
        memmove(text + at + length, text + at, n - at);
        for (size_t i = 0; i < length; i++) text[at + i] = pieces[below(sizeof pieces - 1)];
        n += length;
        break;
      }
      case 4:
        n = at; /* truncate */
        break;
      default: { /* duplicate a range */
        size_t length = 1 + below(32);
        if (at + length > n) length = n - at;
        if (n + length > 2 * size + 32) break;
        memmove(text + at + length, text + at, n - at);
        n += length;
        break;
      }
    }
  }
  *out_size = n;
  return text;
}

/* ---- structural mutations ------------------------------------------------------------------------------ */

struct node_ref {
  cJSON *parent, *item;
  int important; /* under model, sparsity, files, or a top-level scalar */
};

static void collect_nodes(cJSON *parent, int important, struct node_ref *nodes, size_t *n, size_t capacity) {
  cJSON *child;
  cJSON_ArrayForEach(child, parent) {
    int child_important = important || (parent->string == NULL && child->string != NULL &&
                                         strcmp(child->string, "tensors") != 0);
    if (*n < capacity) nodes[(*n)++] = (struct node_ref){parent, child, child_important};
    if (cJSON_IsObject(child) || cJSON_IsArray(child)) collect_nodes(child, child_important, nodes, n, capacity);
  }
}

static cJSON *random_value(void) {
  static const double numbers[] = {-1, 0, 1, 2, 3, 7, 16, 17, 31, 32, 64, 191, 192, 193, 768, 2047, 2048, 2049,
                                   1e9, -1e9, 4294967296.0, 9007199254740993.0, 1e300, 0.5, -0.0, 1e-300};
  static const char *strings[] = {"", "x", "F16", "BF16", "I32", "F32", "svd", "core", "none", "drelu", "silu",
                                  "fatrelu", "edge-sdk-bundle", "../weights.safetensors", "/etc/passwd"};
  switch (below(4)) {
    case 0:
      return cJSON_CreateNumber(numbers[below(sizeof numbers / sizeof *numbers)]);
    case 1:
      return cJSON_CreateString(strings[below(sizeof strings / sizeof *strings)]);
    case 2: {
      static const int kinds[] = {cJSON_NULL, cJSON_True, cJSON_False};
      int kind = kinds[below(3)];
      return kind == cJSON_NULL ? cJSON_CreateNull() : cJSON_CreateBool(kind == cJSON_True);
    }
    default:
      return below(2) ? cJSON_CreateArray() : cJSON_CreateObject();
  }
}

static char *mutate_structure(const char *original, size_t *out_size) {
  cJSON *root = cJSON_Parse(original);
  if (root == NULL) return NULL;
  static struct node_ref nodes[1 << 16];
  size_t n = 0;
  collect_nodes(root, 0, nodes, &n, sizeof nodes / sizeof *nodes);
  int edits = 1 + (int)below(2);
  for (int e = 0; e < edits; e++) {
    struct node_ref *ref = &nodes[below(n)];
    if (below(2)) { /* half of the time among the model / sparsity / files fields */
      size_t tries = 0;
      while (!ref->important && tries++ < 64) ref = &nodes[below(n)];
    }
    switch (below(4)) {
      case 0:
      case 1: {
        cJSON *value = random_value();
        if (ref->item->string != NULL) value->string = strdup(ref->item->string); /* keep the member's key */
        cJSON_ReplaceItemViaPointer(ref->parent, ref->item, value);
        break;
      }
      case 2:
        cJSON_Delete(cJSON_DetachItemViaPointer(ref->parent, ref->item));
        break;
      default:
        if (ref->item->string != NULL && !(ref->item->type & cJSON_StringIsConst)) {
          static const char *names[] = {"../manifest.json", "/etc/passwd", "missing.bin", "a/../../b", "x",
                                        "weights.safetensors", "tokenizer.json"};
          free(ref->item->string);
          ref->item->string = strdup(names[below(sizeof names / sizeof *names)]);
        }
        break;
    }
    n = 0; /* the tree changed: collect again */
    collect_nodes(root, 0, nodes, &n, sizeof nodes / sizeof *nodes);
    if (n == 0) break;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(root, "manifest_sha256");
  char *text = cJSON_PrintUnformatted(root);
  char digest[65];
  if (text != NULL && json_canonical_digest(text, strlen(text), "manifest_sha256", "fuzz", digest) == EDGE_OK) {
    cJSON_AddStringToObject(root, "manifest_sha256", digest);
    free(text);
    text = cJSON_Print(root);
  }
  cJSON_Delete(root);
  *out_size = text != NULL ? strlen(text) : 0;
  return text;
}

/* ---- header mutations ---------------------------------------------------------------------------------- */

static void mutate_header(unsigned char *header, size_t size) {
  int edits = 1 + (int)below(3);
  int digits_only = (int)below(2); /* half of the time the JSON stays valid and the values go wrong */
  for (int e = 0; e < edits; e++) {
    size_t at = 8 + below(size - 8);
    switch (digits_only ? 1 : below(3)) {
      case 0:
        header[at] ^= (unsigned char)(1u << below(8));
        break;
      case 1: { /* a digit changed, so offsets and shapes go wrong while the JSON stays valid */
        for (size_t i = 0; i < size - 8; i++) {
          size_t j = 8 + (at - 8 + i) % (size - 8);
          if (header[j] >= '0' && header[j] <= '9') {
            header[j] = (unsigned char)('0' + below(10));
            break;
          }
        }
        break;
      }
      default:
        header[at] = (unsigned char)"\"{}[],:0x"[below(9)];
        break;
    }
  }
}

/* ---- one open ------------------------------------------------------------------------------------------- */

struct counts {
  int ok, errors[16], bad;
};

static void try_open(const char *bundle, int verify, struct counts *counts, const char *kind, int iteration) {
  edge_options *options;
  edge_model *model = NULL;
  if (edge_options_create(&options) != EDGE_OK) exit(3);
  edge_options_set_verify_checksums(options, verify);
  edge_options_set_threads(options, 1);
  edge_status status = edge_model_open(bundle, options, &model);
  edge_options_destroy(options);
  if (status == EDGE_OK) {
    counts->ok++;
    edge_session *session;
    int32_t prompt[3] = {0, 5, 6};
    if (edge_session_create(model, &session) == EDGE_OK) {
      int32_t vocab = edge_model_vocab_size(model);
      for (int i = 0; i < 3; i++) prompt[i] %= vocab;
      edge_session_generate(session, prompt, 3, 4, NULL, NULL, NULL, NULL);
      edge_session_destroy(session);
    }
    edge_tokenizer *tokenizer;
    if (edge_tokenizer_create(model, &tokenizer) == EDGE_OK) {
      int32_t *ids;
      size_t n;
      if (edge_tokenizer_encode(tokenizer, "def f(x):\n    return x", 22, -1, &ids, &n) == EDGE_OK) edge_free(ids);
      edge_tokenizer_destroy(tokenizer);
    }
    edge_model_close(model);
    if (verbose) printf("%d %s: opened\n", iteration, kind);
    return;
  }
  if (model != NULL || (int)status < 0 || (int)status > 15 || edge_last_error()[0] == '\0') {
    counts->bad++;
    printf("BAD iteration %d (%s): status %d, model %p, message '%s'\n", iteration, kind, (int)status, (void *)model,
           edge_last_error());
    return;
  }
  counts->errors[status]++;
  if (verbose) printf("%d %s: %s: %s\n", iteration, kind, edge_status_name(status), edge_last_error());
}

int main(int argc, char **argv) {
  if (argc < 4 || argc > 5) {
    fprintf(stderr, "usage: edge_fuzz_bundle BUNDLE_COPY ITERATIONS SEED [-v]\n");
    return 2;
  }
  const char *bundle = argv[1];
  int iterations = atoi(argv[2]);
  rng_state = strtoull(argv[3], NULL, 10);
  verbose = argc == 5 && strcmp(argv[4], "-v") == 0;
  char manifest_path[4096], weights_path[4096];
  snprintf(manifest_path, sizeof manifest_path, "%s/manifest.json", bundle);
  snprintf(weights_path, sizeof weights_path, "%s/weights.safetensors", bundle);
  size_t manifest_size, weights_size;
  char *manifest = read_all(manifest_path, &manifest_size);
  char *weights = read_all(weights_path, &weights_size);
  if (manifest == NULL || weights == NULL || weights_size < 8) {
    fprintf(stderr, "edge_fuzz_bundle: cannot read %s\n", bundle);
    return 2;
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; i--) header_length = header_length << 8 | (unsigned char)weights[i];
  size_t header_size = 8 + (size_t)header_length;
  unsigned char *header = malloc(header_size);

  struct counts baseline = {0};
  try_open(bundle, 1, &baseline, "baseline", -1);
  if (baseline.ok != 1) {
    fprintf(stderr, "edge_fuzz_bundle: the unmutated bundle does not open: %s\n", edge_last_error());
    return 2;
  }
  struct counts counts = {0};
  static const char *kinds[] = {"text", "structure", "header", "length"};
  for (int i = 0; i < iterations; i++) {
    int kind = i % 4;
    if (kind == 0 || kind == 1) {
      size_t size = 0;
      char *text = kind == 0 ? mutate_text(manifest, manifest_size, &size) : mutate_structure(manifest, &size);
      if (text == NULL) continue;
      write_at(manifest_path, 0, text, size, 1);
      free(text);
      try_open(bundle, kind == 0 || below(4) == 0, &counts, kinds[kind], i);
      write_at(manifest_path, 0, manifest, manifest_size, 1);
    } else {
      memcpy(header, weights, header_size);
      if (kind == 2) {
        mutate_header(header, header_size);
      } else {
        static const uint64_t lengths[] = {0, 1, 2, 7, UINT64_MAX, 1ULL << 40, 1ULL << 62};
        uint64_t length = below(2) ? lengths[below(sizeof lengths / sizeof *lengths)]
                                   : header_length + (uint64_t)(int64_t)((int)below(33) - 16);
        if (below(4) == 0) length = weights_size - 8 - below(4);
        for (int b = 0; b < 8; b++) header[b] = (unsigned char)(length >> (8 * b));
      }
      write_at(weights_path, 0, header, header_size, 0);
      try_open(bundle, 0, &counts, kinds[kind], i);
      write_at(weights_path, 0, weights, header_size, 0);
    }
  }
  struct counts after = {0};
  try_open(bundle, 1, &after, "restored", iterations);
  printf("iterations %d: opened %d, bad %d, errors:", iterations, counts.ok, counts.bad);
  for (int s = 1; s < 16; s++) {
    if (counts.errors[s] > 0) printf(" %s=%d", edge_status_name((edge_status)s), counts.errors[s]);
  }
  printf("\nrestored bundle opens: %s\n", after.ok == 1 ? "yes" : "no");
  free(manifest);
  free(weights);
  free(header);
  return counts.bad == 0 && after.ok == 1 ? 0 : 1;
}
