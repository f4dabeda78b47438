/* Test driver for tests/jetson: the C library's verdict on bundles, to compare with the Python readers'.
 *   edge_check_bundle DIR...
 * For each DIR one line: "ok" when edge_model_open (default options: checksums verified, backend cpu) and
 * edge_tokenizer_create both succeed, else "refused: MESSAGE" (the library's message, newlines as spaces).
 * Exit status 0 when every DIR was evaluated. */
#include <stdio.h>

#include "edge_sdk.h"

static void print_refusal(const char *message) {
  fputs("refused: ", stdout);
  for (const char *c = message; *c != '\0'; c++) putchar(*c == '\n' || *c == '\r' ? ' ' : *c);
  putchar('\n');
}

static void check_bundle(const char *directory) {
  edge_model *model = NULL;
  if (edge_model_open(directory, NULL, &model) != EDGE_OK) {
    print_refusal(edge_last_error());
    return;
  }
  edge_tokenizer *tokenizer = NULL;
  if (edge_tokenizer_create(model, &tokenizer) != EDGE_OK) {
    print_refusal(edge_last_error());
  } else {
    puts("ok");
  }
  edge_tokenizer_destroy(tokenizer);
  edge_model_close(model);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: edge_check_bundle DIR...\n");
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    check_bundle(argv[i]);
    fflush(stdout);
  }
  return 0;
}
