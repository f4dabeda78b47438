/* Canonical JSON (Python's json.dumps with sorted keys and no whitespace) for the manifest digest. */
#include "json_canonical.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_strict.h"
#include "sha256.h"

#define MAX_INTEGER_DIGITS 17 /* 2^53 has 16 digits: a longer integer literal is beyond it */
#define MAX_SIGNIFICANT_DIGITS 17 /* every float64 reads back from 17 significant digits */

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

static int append(struct text_buffer *buffer, const void *data, size_t size) {
  if (buffer->size + size + 1 > buffer->capacity) {
    size_t capacity = buffer->capacity ? buffer->capacity : 64;
    while (capacity < buffer->size + size + 1) capacity *= 2;
    char *grown = realloc(buffer->data, capacity);
    if (grown == NULL) return 0;
    buffer->data = grown;
    buffer->capacity = capacity;
  }
  memcpy(buffer->data + buffer->size, data, size);
  buffer->size += size;
  buffer->data[buffer->size] = '\0';
  return 1;
}

static int append_text(struct text_buffer *buffer, const char *text) { return append(buffer, text, strlen(text)); }

static int fail(struct parser *p, edge_status status, const char *what) {
  if (p->status == EDGE_OK) {
    p->status = status == EDGE_ERROR_OUT_OF_MEMORY
                    ? edge_fail(status, "%s: out of memory while checking the manifest digest", p->where)
                    : edge_fail(status, "%s: not valid JSON at byte %zu (%s)", p->where, p->at, what);
  }
  return 0;
}

static int out_of_memory(struct parser *p) { return fail(p, EDGE_ERROR_OUT_OF_MEMORY, ""); }

static void skip_space(struct parser *p) {
  while (p->at < p->size && (p->text[p->at] == ' ' || p->text[p->at] == '\t' || p->text[p->at] == '\n' ||
                             p->text[p->at] == '\r')) {
    p->at++;
  }
}

/* ---- Strings ---------------------------------------------------------------------------------------------- */

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

/* One escape of a string token at p->at, decoded into `decoded`. */
static int parse_escape(struct parser *p, struct text_buffer *decoded) {
  if (p->at + 1 >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unterminated escape");
  char e = p->text[p->at + 1];
  static const char names[] = "\"\\/bfnrt", values[] = "\"\\/\b\f\n\r\t";
  const char *simple = e != '\0' ? strchr(names, e) : NULL;
  uint32_t code, low;
  if (simple != NULL) {
    code = (uint32_t)(unsigned char)values[simple - names];
    p->at += 2;
  } else if (e == 'u' && read_hex4(p, p->at + 2, &code)) {
    p->at += 6;
    if (code >= 0xd800 && code < 0xdc00 && p->at + 1 < p->size && p->text[p->at] == '\\' &&
        p->text[p->at + 1] == 'u' && read_hex4(p, p->at + 2, &low) && low >= 0xdc00 && low < 0xe000) {
      code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
      p->at += 6;
    } else if (code >= 0xd800 && code < 0xe000) {
      return fail(p, EDGE_ERROR_BUNDLE, "lone UTF-16 surrogate");
    }
  } else {
    return fail(p, EDGE_ERROR_BUNDLE, "invalid escape in a string");
  }
  return append_utf8(decoded, code) ? 1 : out_of_memory(p);
}

/* A string token at p->at, decoded (UTF-8, U+0000 as a NUL byte) into `decoded`. */
static int parse_string(struct parser *p, struct text_buffer *decoded) {
  if (p->at >= p->size || p->text[p->at] != '"') return fail(p, EDGE_ERROR_BUNDLE, "expected a string");
  p->at++;
  decoded->size = 0;
  if (!append(decoded, "", 0)) return out_of_memory(p);
  for (;;) {
    if (p->at >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unterminated string");
    unsigned char c = (unsigned char)p->text[p->at];
    if (c == '"') break;
    if (c < 0x20) return fail(p, EDGE_ERROR_BUNDLE, "control character in a string");
    if (c == '\\') {
      if (!parse_escape(p, decoded)) return 0;
      continue;
    }
    if (!append(decoded, &c, 1)) return out_of_memory(p);
    p->at++;
  }
  p->at++;
  return 1;
}

/* Python's ensure_ascii spelling of a decoded string. */
static int append_python_string(struct parser *p, struct text_buffer *out, const struct text_buffer *decoded) {
  static const char hex[] = "0123456789abcdef";
  int ok = append(out, "\"", 1);
  const unsigned char *s = (const unsigned char *)decoded->data;
  for (size_t at = 0; ok && at < decoded->size;) {
    uint32_t code;
    size_t length = utf8_sequence(s + at, decoded->size - at, &code);
    if (length == 0) return fail(p, EDGE_ERROR_BUNDLE, "a string is not UTF-8 text");
    at += length;
    const char *named = code == '"' ? "\\\"" : code == '\\' ? "\\\\" : code == '\n' ? "\\n" : code == '\r' ? "\\r"
                        : code == '\t' ? "\\t" : code == '\b' ? "\\b" : code == '\f' ? "\\f" : NULL;
    if (named != NULL) {
      ok = append_text(out, named);
    } else if (code >= ' ' && code <= '~') {
      char c = (char)code;
      ok = append(out, &c, 1);
    } else {
      uint32_t units[2] = {code, 0};
      int n_units = 1;
      if (code >= 0x10000) units[0] = 0xd800 + ((code - 0x10000) >> 10), units[1] = 0xdc00 + (code & 0x3ff), n_units = 2;
      for (int u = 0; ok && u < n_units; u++) {
        char escape[6] = {'\\', 'u', hex[units[u] >> 12], hex[(units[u] >> 8) & 15], hex[(units[u] >> 4) & 15],
                          hex[units[u] & 15]};
        ok = append(out, escape, sizeof escape);
      }
    }
  }
  ok = ok && append(out, "\"", 1);
  return ok ? 1 : out_of_memory(p);
}

/* ---- Numbers ---------------------------------------------------------------------------------------------- */

/* A decimal candidate: value = 0.digits x 10^point (digits without a leading zero). */
struct decimal {
  char digits[MAX_SIGNIFICANT_DIGITS + 2];
  int n_digits, point;
};

static int reads_back(const struct decimal *d, double x) {
  char text[MAX_SIGNIFICANT_DIGITS + 16];
  int n = snprintf(text, sizeof text, "0.%.*se%d", d->n_digits, d->digits, d->point);
  double value;
  return json_number_value(text, (size_t)n, &value) && value == x;
}

/* The n significant digits of x correctly rounded (printf is exact). */
static void rounded(double x, int n, struct decimal *d) {
  char text[64];
  snprintf(text, sizeof text, "%.*e", n - 1, x);
  d->n_digits = 0;
  const char *c = text;
  for (; *c != 'e'; c++) {
    if (*c >= '0' && *c <= '9') d->digits[d->n_digits++] = *c; /* skips the locale's decimal point */
  }
  d->digits[d->n_digits] = '\0';
  d->point = atoi(c + 1) + 1;
}

/* The next n-digit decimal above (step 1) or below (step -1) d. */
static void neighbour(const struct decimal *d, int step, struct decimal *out) {
  *out = *d;
  int i = out->n_digits - 1;
  char edge = step > 0 ? '9' : '0', wrap = step > 0 ? '0' : '9';
  while (i >= 0 && out->digits[i] == edge) out->digits[i--] = wrap;
  if (i >= 0) {
    out->digits[i] = (char)(out->digits[i] + step);
    if (!(i == 0 && out->digits[0] == '0')) return;
    out->digits[0] = '9'; /* 1.00 - 0.01 = 0.99: the grid below a power of ten */
    out->point--;
    return;
  }
  out->digits[0] = '1'; /* 9.99 + 0.01 = 10.0 */
  out->point++;
}

/* Python's repr digits of finite x > 0: the shortest that read back as x, the nearest to x among those. Of the
 * n-digit decimals only the two around x can read back, and the correctly rounded one is the nearer; the other
 * wins only where x is a power of two, whose lower rounding interval is half as wide. */
static void shortest(double x, struct decimal *d) {
  for (int n = 1; n <= MAX_SIGNIFICANT_DIGITS; n++) {
    rounded(x, n, d);
    if (reads_back(d, x)) break;
    struct decimal other;
    double value;
    char text[MAX_SIGNIFICANT_DIGITS + 16];
    int length = snprintf(text, sizeof text, "0.%se%d", d->digits, d->point);
    json_number_value(text, (size_t)length, &value);
    neighbour(d, value < x ? 1 : -1, &other);
    if (reads_back(&other, x)) {
      *d = other;
      break;
    }
  }
  while (d->n_digits > 1 && d->digits[d->n_digits - 1] == '0') d->digits[--d->n_digits] = '\0';
}

static int append_zeros(struct text_buffer *out, int count) {
  for (int i = 0; i < count; i++) {
    if (!append(out, "0", 1)) return 0;
  }
  return 1;
}

/* Python's float repr (format_float_short, mode 'r'): exponent form when the exponent is < -4 or >= 16. */
static int append_float_repr(struct text_buffer *out, double x) {
  if (signbit(x) && !append(out, "-", 1)) return 0;
  if (x == 0) return append_text(out, "0.0");
  struct decimal d;
  shortest(fabs(x), &d);
  if (d.point <= -4 || d.point > 16) {
    char exponent[16];
    snprintf(exponent, sizeof exponent, "e%+03d", d.point - 1);
    return append(out, d.digits, 1) && (d.n_digits == 1 || (append(out, ".", 1) && append_text(out, d.digits + 1))) &&
           append_text(out, exponent);
  }
  if (d.point <= 0) return append_text(out, "0.") && append_zeros(out, -d.point) && append_text(out, d.digits);
  if (d.point >= d.n_digits) return append_text(out, d.digits) && append_zeros(out, d.point - d.n_digits) && append_text(out, ".0");
  return append(out, d.digits, (size_t)d.point) && append(out, ".", 1) && append_text(out, d.digits + d.point);
}

static int is_digit(struct parser *p) { return p->at < p->size && p->text[p->at] >= '0' && p->text[p->at] <= '9'; }

static int append_float(struct parser *p, struct text_buffer *out, const char *token, size_t length);

/* An integer literal as the strict reader reads it: within +-2^53 Python's int, its decimal value; beyond, the
 * nearest float64, written as Python writes that float. */
static int append_integer(struct parser *p, struct text_buffer *out, const char *token, size_t length) {
  int negative = token[0] == '-';
  if (length - (size_t)negative > MAX_INTEGER_DIGITS) return append_float(p, out, token, length);
  int64_t value = 0;
  for (size_t i = (size_t)negative; i < length; i++) value = value * 10 + (token[i] - '0');
  if (value > (INT64_C(1) << 53)) return append_float(p, out, token, length);
  char text[32];
  snprintf(text, sizeof text, "%lld", (long long)(negative ? -value : value));
  return append_text(out, text) ? 1 : out_of_memory(p);
}

static int append_float(struct parser *p, struct text_buffer *out, const char *token, size_t length) {
  double value;
  if (!json_number_value(token, length, &value)) return out_of_memory(p);
  if (!isfinite(value)) return fail(p, EDGE_ERROR_BUNDLE, "a number beyond float64");
  return append_float_repr(out, value) ? 1 : out_of_memory(p);
}

/* A number token (JSON grammar), written as Python writes the int or float it reads. */
static int parse_number(struct parser *p, struct text_buffer *out) {
  size_t start = p->at;
  int integer = 1;
  if (p->at < p->size && p->text[p->at] == '-') p->at++;
  if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected a value");
  if (p->text[p->at] == '0') {
    p->at++;
  } else {
    while (is_digit(p)) p->at++;
  }
  if (p->at < p->size && p->text[p->at] == '.') {
    p->at++, integer = 0;
    if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected digits after '.'");
    while (is_digit(p)) p->at++;
  }
  if (p->at < p->size && (p->text[p->at] == 'e' || p->text[p->at] == 'E')) {
    p->at++, integer = 0;
    if (p->at < p->size && (p->text[p->at] == '+' || p->text[p->at] == '-')) p->at++;
    if (!is_digit(p)) return fail(p, EDGE_ERROR_BUNDLE, "expected exponent digits");
    while (is_digit(p)) p->at++;
  }
  const char *token = p->text + start;
  return integer ? append_integer(p, out, token, p->at - start) : append_float(p, out, token, p->at - start);
}

/* ---- Values ----------------------------------------------------------------------------------------------- */

static int parse_value(struct parser *p, struct text_buffer *out, int depth, const char *skip_key);

struct member {
  struct text_buffer key;   /* decoded, for sorting by code point (= UTF-8 byte order) */
  struct text_buffer value; /* "key":value, canonical */
  int skipped;              /* the digest field: not written */
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

/* One "key": value member at p->at into m. */
static int parse_member(struct parser *p, struct member *m, int depth, const char *skip_key) {
  skip_space(p);
  if (!parse_string(p, &m->key) || !append_python_string(p, &m->value, &m->key)) return 0;
  skip_space(p);
  if (p->at >= p->size || p->text[p->at] != ':') return fail(p, EDGE_ERROR_BUNDLE, "expected ':'");
  p->at++;
  skip_space(p);
  if (!append(&m->value, ":", 1)) return out_of_memory(p);
  if (!parse_value(p, &m->value, depth + 1, NULL)) return 0;
  m->skipped = skip_key != NULL && m->key.size == strlen(skip_key) && memcmp(m->key.data, skip_key, m->key.size) == 0;
  return 1;
}

static int write_members(struct parser *p, struct text_buffer *out, struct member *members, size_t count) {
  if (count > 1) qsort(members, count, sizeof *members, compare_members);
  for (size_t i = 1; i < count; i++) {
    if (compare_members(&members[i - 1], &members[i]) == 0) return fail(p, EDGE_ERROR_BUNDLE, "duplicate key");
  }
  int ok = append(out, "{", 1);
  for (size_t i = 0, written = 0; ok && i < count; i++) {
    if (members[i].skipped) continue;
    ok = (written++ == 0 || append(out, ",", 1)) && append(out, members[i].value.data, members[i].value.size);
  }
  return ok && append(out, "}", 1) ? 1 : out_of_memory(p);
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
          ok = out_of_memory(p);
          break;
        }
        members = grown, capacity = grown_capacity;
      }
      struct member *m = &members[count++];
      memset(m, 0, sizeof *m);
      if (!(ok = parse_member(p, m, depth, skip_key))) break;
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
  ok = ok && write_members(p, out, members, count);
  free_members(members, count);
  return ok;
}

static int parse_array(struct parser *p, struct text_buffer *out, int depth) {
  p->at++; /* '[' */
  if (!append(out, "[", 1)) return out_of_memory(p);
  skip_space(p);
  if (p->at < p->size && p->text[p->at] == ']') {
    p->at++;
    return append(out, "]", 1) ? 1 : out_of_memory(p);
  }
  for (int first = 1;; first = 0) {
    if (!first && !append(out, ",", 1)) return out_of_memory(p);
    skip_space(p);
    if (!parse_value(p, out, depth + 1, NULL)) return 0;
    skip_space(p);
    if (p->at < p->size && p->text[p->at] == ',') {
      p->at++;
      continue;
    }
    if (p->at < p->size && p->text[p->at] == ']') {
      p->at++;
      return append(out, "]", 1) ? 1 : out_of_memory(p);
    }
    return fail(p, EDGE_ERROR_BUNDLE, "expected ',' or ']'");
  }
}

static int parse_literal(struct parser *p, struct text_buffer *out, const char *literal) {
  size_t n = strlen(literal);
  if (p->size - p->at < n || memcmp(p->text + p->at, literal, n) != 0) return fail(p, EDGE_ERROR_BUNDLE, "expected a value");
  p->at += n;
  return append(out, literal, n) ? 1 : out_of_memory(p);
}

static int parse_string_value(struct parser *p, struct text_buffer *out) {
  struct text_buffer decoded = {0};
  int ok = parse_string(p, &decoded) && append_python_string(p, out, &decoded);
  free(decoded.data);
  return ok;
}

static int parse_value(struct parser *p, struct text_buffer *out, int depth, const char *skip_key) {
  if (depth > JSON_MAX_DEPTH) return fail(p, EDGE_ERROR_BUNDLE, "nested deeper than 64 levels");
  if (p->at >= p->size) return fail(p, EDGE_ERROR_BUNDLE, "unexpected end");
  switch (p->text[p->at]) {
    case '{':
      return parse_object(p, out, depth, skip_key);
    case '[':
      return parse_array(p, out, depth);
    case '"':
      return parse_string_value(p, out);
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

edge_status json_canonical_text(const char *text, size_t size, const char *skip_key, const char *where, char **out,
                                size_t *out_size) {
  struct parser p = {text, size, 0, where, EDGE_OK};
  struct text_buffer canonical = {0};
  skip_space(&p);
  if (parse_value(&p, &canonical, 0, skip_key)) {
    skip_space(&p);
    if (p.at != p.size) fail(&p, EDGE_ERROR_BUNDLE, "trailing characters after the value");
  }
  if (p.status != EDGE_OK) {
    free(canonical.data);
    return p.status;
  }
  *out = canonical.data;
  *out_size = canonical.size;
  return EDGE_OK;
}

edge_status json_canonical_digest(const char *text, size_t size, const char *skip_key, const char *where,
                                  char hex[65]) {
  char *canonical;
  size_t canonical_size;
  edge_status status = json_canonical_text(text, size, skip_key, where, &canonical, &canonical_size);
  if (status != EDGE_OK) return status;
  struct sha256 hash;
  uint8_t digest[32];
  sha256_init(&hash);
  sha256_update(&hash, canonical, canonical_size);
  sha256_final(&hash, digest);
  sha256_hex(digest, hex);
  free(canonical);
  return EDGE_OK;
}
