/* Test driver for tests/jetson: the C tokenizer on a file, to compare with the `tokenizers` library.
 *   edge_tokenize BUNDLE encode TEXT_FILE            ids of the file's text (no bos), space-separated
 *   edge_tokenize BUNDLE prompt TEXT_FILE            the same, bos prepended as the tokenizer says (add_bos -1)
 *   edge_tokenize BUNDLE decode IDS_FILE [--skip]    text of whitespace-separated ids (--skip: no special tokens)
 *   edge_tokenize BUNDLE pieces IDS_FILE             the bytes of each token, concatenated (streaming output) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_sdk.h"

static char *read_file(const char *path, size_t *size) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return NULL;
  size_t capacity = 1 << 16, used = 0;
  char *data = malloc(capacity + 1);
  size_t n;
  while (data != NULL && (n = fread(data + used, 1, capacity - used, file)) > 0) {
    used += n;
    if (used == capacity) {
      char *grown = realloc(data, 2 * capacity + 1);
      if (grown == NULL) free(data);
      data = grown;
      capacity *= 2;
    }
  }
  fclose(file);
  if (data != NULL) data[used] = '\0';
  *size = used;
  return data;
}

static int32_t *parse_ids(char *text, size_t *count) {
  size_t capacity = 16;
  int32_t *ids = malloc(capacity * sizeof *ids);
  *count = 0;
  for (char *token = strtok(text, " \t\r\n"); ids != NULL && token != NULL; token = strtok(NULL, " \t\r\n")) {
    if (*count == capacity) {
      int32_t *grown = realloc(ids, 2 * capacity * sizeof *ids);
      if (grown == NULL) free(ids);
      ids = grown;
      capacity *= 2;
    }
    if (ids != NULL) ids[(*count)++] = (int32_t)strtol(token, NULL, 10);
  }
  return ids;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: edge_tokenize BUNDLE encode|prompt|decode|pieces FILE [--skip]\n");
    return 2;
  }
  edge_options *options = NULL;
  edge_model *model = NULL;
  edge_tokenizer *tokenizer = NULL;
  int code = 1;
  size_t size;
  char *text = read_file(argv[3], &size);
  if (text == NULL) {
    fprintf(stderr, "edge_tokenize: cannot read %s\n", argv[3]);
    return 1;
  }
  edge_status status = edge_options_create(&options);
  if (status == EDGE_OK) status = edge_options_set_verify_checksums(options, 0);
  if (status == EDGE_OK) status = edge_model_open(argv[1], options, &model);
  if (status == EDGE_OK) status = edge_tokenizer_create(model, &tokenizer);
  if (status != EDGE_OK) {
    fprintf(stderr, "edge_tokenize: %s: %s\n", edge_status_name(status), edge_last_error());
  } else if (strcmp(argv[2], "encode") == 0 || strcmp(argv[2], "prompt") == 0) {
    int32_t *ids;
    size_t n;
    status = edge_tokenizer_encode(tokenizer, text, size, strcmp(argv[2], "prompt") == 0 ? -1 : 0, &ids, &n);
    if (status == EDGE_OK) {
      for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
      printf("\n");
      edge_free(ids);
      code = 0;
    } else {
      fprintf(stderr, "edge_tokenize: %s: %s\n", edge_status_name(status), edge_tokenizer_last_error(tokenizer));
    }
  } else {
    size_t n;
    int32_t *ids = parse_ids(text, &n);
    if (strcmp(argv[2], "decode") == 0) {
      char *decoded;
      size_t length;
      int skip = argc > 4 && strcmp(argv[4], "--skip") == 0;
      status = edge_tokenizer_decode(tokenizer, ids, n, skip, &decoded, &length);
      if (status == EDGE_OK) {
        fwrite(decoded, 1, length, stdout);
        edge_free(decoded);
        code = 0;
      }
    } else {
      code = 0;
      for (size_t i = 0; i < n && status == EDGE_OK; i++) {
        const char *bytes;
        size_t length;
        status = edge_tokenizer_token_bytes(tokenizer, ids[i], &bytes, &length);
        if (status == EDGE_OK) fwrite(bytes, 1, length, stdout);
      }
    }
    if (status != EDGE_OK) {
      fprintf(stderr, "edge_tokenize: %s: %s\n", edge_status_name(status), edge_tokenizer_last_error(tokenizer));
      code = 1;
    }
    free(ids);
  }
  free(text);
  edge_tokenizer_destroy(tokenizer);
  edge_model_close(model);
  edge_options_destroy(options);
  return code;
}
