/* Canonical JSON (sorted keys, no whitespace, tokens as written) for the manifest digest. */
#include "json_canonical.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "sha256.h"

#define MAX_DEPTH 64

struct text_buffer {
  char *data;
  size_t size, capacity;
};

struct parser {
  const char *text;
  size_t size, at;
  const char *where;
  edge_status status;
};

static int append(struct text_buffer *buffer, const char *data, size_t size) {
  if (buffer->size + size > buffer->capacity) {
    size_t capacity = buffer->capacity ? buffer->capacity : 64;
    while (capacity < buffer->size + size) capacity *= 2;
    char *grown = realloc(buffer->data, capacity);
    if (grown == NULL) return 0;
    buffer->data = grown;
    buffer->capacity = capacity;
  }
  memcpy(buffer->data + buffer->size, data, size);
  buffer->size += size;
  return 1;
}

static int fail(struct parser *p, edge_status status, const char *what) {
  if (p->status == EDGE_OK) {
    p->status = status == EDGE_ERROR_OUT_OF_MEMORY
                    ? edge_fail(status, "%s: out of memory while checking the manifest digest", p->where)
                    : edge_fail(status, "%s: not valid JSON at byte %zu (%s)", p->where, p->at, what);
  }
  return 0;
}

static void skip_space(struct parser *p) {
  while (p->at < p->size && (p->text[p->at] == ' ' || p->text[p->at] == '\t' || p->text[p->at] == '\n' ||
                             p->text[p->at] == '\r')) {
    p->at++;
  }
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int read_hex4(struct parser *p, size_t at, uint32_t *value) {
  if (at + 4 > p->size) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int digit = hex_value(p->text[at + i]);
    if (digit < 0) return 0;
    v = v << 4 | (uint32_t)digit;
  }
  *value = v;
  return 1;
}

static int append_utf8(struct text_buffer *out, uint32_t code) {
  char bytes[4];
  size_t n;
  if (code < 0x80) {
    bytes[0] = (char)code, n = 1;
  } else if (code < 0x800) {
    bytes[0] = (char)(0xc0 | code >> 6), bytes[1] = (char)(0x80 | (code & 0x3f)), n = 2;
  } else if (code < 0x10000) {
    bytes[0] = (char)(0xe0 | code >> 12), bytes[1] = (char)(0x80 | ((code >> 6) & 0x3f));
    bytes[2] = (char)(0x80 | (code & 0x3f)), n = 3;
  } else {
    bytes[0] = (char)(0xf0 | code >> 18), bytes[1] = (char)(0x80 | ((code >> 12) & 0x3f));
    bytes[2] = (char)(0x80 | ((code >> 6) & 0x3f)), bytes[3] = (char)(0x80 | (code & 0x3f)), n = 4;
  }
  return append(out, bytes, n);
}

/* A string token: copied as written to raw (quotes included); decoded (UTF-8) into `decoded` when given. */
static int parse_string(struct parser *p, struct text_buffer *raw, struct text_buffer *decoded) {
  size_t start = p->at;
  if (p->at >= p->size || p->text[p->at] != '"') return fail(p, EDGE_ERROR_BUNDLE, "expected a string");
  p->at++;
  for (;;) {
    if (p->at >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unterminated string");
    unsigned char c = (unsigned char)p->text[p->at];
    if (c == '"') break;
    if (c < 0x20) return fail(p, EDGE_ERROR_BUNDLE, "control character in a string");
    if (c != '\\') {
      if (decoded != NULL && !append(decoded, (const char *)&c, 1)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
      p->at++;
      continue;
    }
    if (p->at + 1 >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unterminated escape");
    char e = p->text[p->at + 1];
    uint32_t code;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e != '\0' && simple != NULL) {
      static const char values[] = "\"\\/\b\f\n\r\t";
      code = (uint32_t)(unsigned char)values[simple - "\"\\/bfnrt"];
      p->at += 2;
    } else if (e == 'u' && read_hex4(p, p->at + 2, &code)) {
      p->at += 6;
      uint32_t low;
      if (code >= 0xd800 && code < 0xdc00 && p->at + 1 < p->size && p->text[p->at] == '\\' &&
          p->text[p->at + 1] == 'u' && read_hex4(p, p->at + 2, &low) && low >= 0xdc00 && low < 0xe000) {
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        p->at += 6;
      }
    } else {
      return fail(p, EDGE_ERROR_BUNDLE, "invalid escape in a string");
    }
    if (decoded != NULL && !append_utf8(decoded, code)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  }
  p->at++;
  if (!append(raw, p->text + start, p->at - start)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  return 1;
}

static int is_digit(struct parser *p) { return p->at < p->size && p->text[p->at] >= '0' && p->text[p->at] <= '9'; }

/* A number token (JSON grammar), copied as written. */
static int parse_number(struct parser *p, struct text_buffer *out) {
  size_t start = p->at;
  if (p->at < p->size && p->text[p->at] == '-') p->at++;
  if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected a value");
  if (p->text[p->at] == '0') {
    p->at++;
  } else {
    while (is_digit(p)) p->at++;
  }
  if (p->at < p->size && p->text[p->at] == '.') {
    p->at++;
    if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected digits after '.'");
    while (is_digit(p)) p->at++;
  }
  if (p->at < p->size && (p->text[p->at] == 'e' || p->text[p->at] == 'E')) {
    p->at++;
    if (p->at < p->size && (p->text[p->at] == '+' || p->text[p->at] == '-')) p->at++;
    if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected exponent digits");
    while (is_digit(p)) p->at++;
  }
  if (!append(out, p->text + start, p->at - start)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  return 1;
}

static int parse_value(struct parser *p, struct text_buffer *out, int depth, const char *skip_key);

struct member {
  struct text_buffer key;   /* decoded, for sorting */
  struct text_buffer value; /* "raw key":canonical value */
  int skipped;              /* the digest field: checked for duplicates, not written */
};

static int compare_members(const void *a, const void *b) {
  const struct member *x = a, *y = b;
  size_t n = x->key.size < y->key.size ? x->key.size : y->key.size;
  int order = n ? memcmp(x->key.data, y->key.data, n) : 0;
  if (order != 0) return order;
  return (x->key.size > y->key.size) - (x->key.size < y->key.size);
}

static void free_members(struct member *members, size_t count) {
  for (size_t i = 0; i < count; i++) {
    free(members[i].key.data);
    free(members[i].value.data);
  }
  free(members);
}

static int parse_object(struct parser *p, struct text_buffer *out, int depth, const char *skip_key) {
  struct member *members = NULL;
  size_t count = 0, capacity = 0;
  int ok = 1;
  p->at++; /* '{' */
  skip_space(p);
  if (p->at < p->size && p->text[p->at] == '}') {
    p->at++;
  } else {
    for (;;) {
      if (count == capacity) {
        size_t grown_capacity = capacity ? 2 * capacity : 8;
        struct member *grown = realloc(members, grown_capacity * sizeof *members);
        if (grown == NULL) {
          ok = fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
          break;
        }
        members = grown, capacity = grown_capacity;
      }
      struct member *m = &members[count++];
      memset(m, 0, sizeof *m);
      skip_space(p);
      if (!parse_string(p, &m->value, &m->key)) {
        ok = 0;
        break;
      }
      skip_space(p);
      if (p->at >= p->size || p->text[p->at] != ':') {
        ok = fail(p, EDGE_ERROR_BUNDLE, "expected ':'");
        break;
      }
      p->at++;
      skip_space(p);
      if (!append(&m->value, ":", 1)) {
        ok = fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
        break;
      }
      if (!parse_value(p, &m->value, depth + 1, NULL)) {
        ok = 0;
        break;
      }
      m->skipped = skip_key != NULL && m->key.size == strlen(skip_key) && memcmp(m->key.data, skip_key, m->key.size) == 0;
      skip_space(p);
      if (p->at < p->size && p->text[p->at] == ',') {
        p->at++;
        continue;
      }
      if (p->at < p->size && p->text[p->at] == '}') {
        p->at++;
        break;
      }
      ok = fail(p, EDGE_ERROR_BUNDLE, "expected ',' or '}'");
      break;
    }
  }
  if (ok && count > 1) {
    qsort(members, count, sizeof *members, compare_members);
    for (size_t i = 1; i < count && ok; i++) {
      if (compare_members(&members[i - 1], &members[i]) == 0) ok = fail(p, EDGE_ERROR_BUNDLE, "duplicate key");
    }
  }
  ok = ok && append(out, "{", 1);
  for (size_t i = 0, written = 0; ok && i < count; i++) {
    if (members[i].skipped) continue;
    ok = (written++ == 0 || append(out, ",", 1)) && append(out, members[i].value.data, members[i].value.size);
  }
  ok = ok && append(out, "}", 1);
  if (!ok) fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  free_members(members, count);
  return ok;
}

static int parse_array(struct parser *p, struct text_buffer *out, int depth) {
  p->at++; /* '[' */
  if (!append(out, "[", 1)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  skip_space(p);
  if (p->at < p->size && p->text[p->at] == ']') {
    p->at++;
    return append(out, "]", 1) ? 1 : fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
  }
  for (int first = 1;; first = 0) {
    if (!first && !append(out, ",", 1)) return fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
    skip_space(p);
    if (!parse_value(p, out, depth + 1, NULL)) return 0;
    skip_space(p);
    if (p->at < p->size && p->text[p->at] == ',') {
      p->at++;
      continue;
    }
    if (p->at < p->size && p->text[p->at] == ']') {
      p->at++;
      return append(out, "]", 1) ? 1 : fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
    }
    return fail(p, EDGE_ERROR_BUNDLE, "expected ',' or ']'");
  }
}

static int parse_literal(struct parser *p, struct text_buffer *out, const char *literal) {
  size_t n = strlen(literal);
  if (p->size - p->at < n || memcmp(p->text + p->at, literal, n) != 0) return fail(p, EDGE_ERROR_BUNDLE, "expected a value");
  p->at += n;
  return append(out, literal, n) ? 1 : fail(p, EDGE_ERROR_OUT_OF_MEMORY, "");
}

static int parse_value(struct parser *p, struct text_buffer *out, int depth, const char *skip_key) {
  if (depth > MAX_DEPTH) return fail(p, EDGE_ERROR_BUNDLE, "nested deeper than 64 levels");
  if (p->at >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unexpected end");
  switch (p->text[p->at]) {
    case '{':
      return parse_object(p, out, depth, skip_key);
    case '[':
      return parse_array(p, out, depth);
    case '"':
      return parse_string(p, out, NULL);
    case 't':
      return parse_literal(p, out, "true");
    case 'f':
      return parse_literal(p, out, "false");
    case 'n':
      return parse_literal(p, out, "null");
    default:
      return parse_number(p, out);
  }
}

edge_status json_canonical_digest(const char *text, size_t size, const char *skip_key, const char *where,
                                  char hex[65]) {
  struct parser p = {text, size, 0, where, EDGE_OK};
  struct text_buffer canonical = {0};
  skip_space(&p);
  if (p.at >= p.size || text[p.at] != '{') {
    fail(&p, EDGE_ERROR_BUNDLE, "expected a JSON object");
  } else if (parse_value(&p, &canonical, 0, skip_key)) {
    skip_space(&p);
    if (p.at != p.size) fail(&p, EDGE_ERROR_BUNDLE, "trailing characters after the object");
  }
  if (p.status == EDGE_OK) {
    struct sha256 hash;
    uint8_t digest[32];
    sha256_init(&hash);
    sha256_update(&hash, canonical.data, canonical.size);
    sha256_final(&hash, digest);
    sha256_hex(digest, hex);
  }
  free(canonical.data);
  return p.status;
}
