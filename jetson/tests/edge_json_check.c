/* Test driver for tests/jetson: the strict JSON rule and the canonical form, to compare with
 * edge_sdk/formats/strict_json.py (parse, canonical).
 *   edge_json_check [--integers-only] FILE
 * FILE holds one JSON document per line, hex-encoded (so any bytes can be tested). For each document one line:
 * "ok CANONICAL" when json_strict_parse accepts it (CANONICAL: json_canonical_text of it, always ASCII), else
 * "refused: MESSAGE". Exit status 0 when every line was evaluated.
 *   edge_json_check --locale-race LOCALE
 * Parses JSON numbers on two threads at once, one in LOCALE (uselocale: e.g. de_DE.UTF-8, whose decimal point is
 * ','), one in the C locale, and prints "misread N" (numbers not read as written); exit status 3 when LOCALE
 * cannot be had. */
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_sdk.h"
#include "json_canonical.h"
#include "json_strict.h"

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes the hex line in place; the byte count, or -1 when it is not hex. */
static long decode_hex(char *line, size_t length) {
  if (length % 2 != 0) return -1;
  for (size_t i = 0; i < length; i += 2) {
    int high = hex_value((unsigned char)line[i]), low = hex_value((unsigned char)line[i + 1]);
    if (high < 0 || low < 0) return -1;
    line[i / 2] = (char)(high << 4 | low);
  }
  return (long)(length / 2);
}

static void print_one_line(const char *prefix, const char *text) {
  fputs(prefix, stdout);
  for (const char *c = text; *c != '\0'; c++) putchar(*c == '\n' || *c == '\r' ? ' ' : *c);
  putchar('\n');
}

static int check_document(const char *text, size_t size, enum json_numbers numbers) {
  cJSON *value;
  if (json_strict_parse(text, size, numbers, "doc", &value) != EDGE_OK) {
    print_one_line("refused: ", edge_last_error());
    return 1;
  }
  cJSON_Delete(value);
  char *canonical;
  size_t canonical_size;
  if (json_canonical_text(text, size, NULL, "doc", &canonical, &canonical_size) != EDGE_OK) {
    print_one_line("canonical failed: ", edge_last_error());
    return 0;
  }
  print_one_line("ok ", canonical);
  free(canonical);
  return 1;
}

#define RACE_ROUNDS 200000

struct race_thread {
  locale_t locale; /* (locale_t)0: the C locale */
  long misread;
};

static void *parse_numbers(void *argument) {
  struct race_thread *thread = argument;
  if (thread->locale != (locale_t)0) uselocale(thread->locale);
  static const char document[] = "{\"x\": 0.5, \"y\": 1.25e1}";
  for (int round = 0; round < RACE_ROUNDS; round++) {
    cJSON *value;
    if (json_strict_parse(document, sizeof document - 1, JSON_ANY_NUMBERS, "doc", &value) != EDGE_OK) {
      thread->misread++;
      continue;
    }
    if (cJSON_GetObjectItem(value, "x")->valuedouble != 0.5 || cJSON_GetObjectItem(value, "y")->valuedouble != 12.5) {
      thread->misread++;
    }
    cJSON_Delete(value);
  }
  return NULL;
}

static int locale_race(const char *name) {
  locale_t other = newlocale(LC_ALL_MASK, name, (locale_t)0);
  if (other == (locale_t)0) {
    fprintf(stderr, "edge_json_check: no locale %s here\n", name);
    return 3;
  }
  struct race_thread threads[2] = {{other, 0}, {(locale_t)0, 0}};
  pthread_t ids[2];
  for (int i = 0; i < 2; i++) pthread_create(&ids[i], NULL, parse_numbers, &threads[i]);
  for (int i = 0; i < 2; i++) pthread_join(ids[i], NULL);
  printf("misread %ld\n", threads[0].misread + threads[1].misread);
  freelocale(other);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--locale-race") == 0) return locale_race(argv[2]);
  int integers_only = argc == 3 && strcmp(argv[1], "--integers-only") == 0;
  if (argc != 2 + integers_only) {
    fprintf(stderr, "usage: edge_json_check [--integers-only] FILE\n");
    return 2;
  }
  FILE *file = fopen(argv[argc - 1], "rb");
  if (file == NULL) {
    fprintf(stderr, "edge_json_check: cannot open %s\n", argv[argc - 1]);
    return 2;
  }
  char *line = NULL;
  size_t capacity = 0;
  ssize_t length;
  int ok = 1;
  while (ok && (length = getline(&line, &capacity, file)) >= 0) {
    while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r')) length--;
    long size = decode_hex(line, (size_t)length);
    if (size < 0) {
      fprintf(stderr, "edge_json_check: a line is not hex\n");
      ok = 0;
      break;
    }
    ok = check_document(line, (size_t)size, integers_only ? JSON_INTEGERS_ONLY : JSON_ANY_NUMBERS);
  }
  free(line);
  fclose(file);
  return ok ? 0 : 1;
}
