/* Strict JSON: the rule of formats/strict_json.py, checked while the cJSON tree is built (json_strict.h). */
#include "json_strict.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* 2^53 has 16 digits: an integer literal with more than this many cannot be within range */
#define MAX_INTEGER_DIGITS 17
#define SHOWN_NUMBER_BYTES 24

struct string_buffer {
  char *data;
  size_t size, capacity;
};

struct reader {
  const unsigned char *text;
  size_t size, at;
  enum json_numbers numbers;
  const char *where;
  int depth;
  edge_status status;
  struct string_buffer string; /* the string being decoded */
};

/* ---- UTF-8 -------------------------------------------------------------------------------------------- */

size_t utf8_sequence(const unsigned char *s, size_t n, uint32_t *code) {
  unsigned char b = s[0];
  if (b < 0x80) {
    *code = b;
    return 1;
  }
  size_t length;
  uint32_t value;
  unsigned char low = 0x80, high = 0xbf; /* allowed range of the second byte */
  if (b >= 0xc2 && b <= 0xdf) {
    length = 2, value = b & 0x1f;
  } else if (b >= 0xe0 && b <= 0xef) {
    length = 3, value = b & 0x0f;
    if (b == 0xe0) low = 0xa0;  /* overlong */
    if (b == 0xed) high = 0x9f; /* surrogates */
  } else if (b >= 0xf0 && b <= 0xf4) {
    length = 4, value = b & 0x07;
    if (b == 0xf0) low = 0x90;  /* overlong */
    if (b == 0xf4) high = 0x8f; /* above U+10FFFF */
  } else {
    return 0;
  }
  if (length > n) return 0;
  for (size_t i = 1; i < length; i++) {
    unsigned char c = s[i];
    if (c < (i == 1 ? low : 0x80) || c > (i == 1 ? high : 0xbf)) return 0;
    value = value << 6 | (c & 0x3f);
  }
  *code = value;
  return length;
}

size_t json_string_bytes(char *text) {
  size_t out = 0;
  for (size_t in = 0; text[in] != '\0'; in++) {
    if ((unsigned char)text[in] == 0xc0 && (unsigned char)text[in + 1] == 0x80) {
      text[out++] = '\0';
      in++;
    } else {
      text[out++] = text[in];
    }
  }
  text[out] = '\0';
  return out;
}

char *json_string_from_bytes(const char *bytes, size_t length) {
  size_t nuls = 0;
  for (size_t i = 0; i < length; i++) nuls += bytes[i] == '\0';
  char *text = malloc(length + nuls + 1);
  if (text == NULL) return NULL;
  size_t out = 0;
  for (size_t i = 0; i < length; i++) {
    if (bytes[i] == '\0') {
      text[out++] = (char)0xc0;
      text[out++] = (char)0x80;
    } else {
      text[out++] = bytes[i];
    }
  }
  text[out] = '\0';
  return text;
}

const char *json_shown(const char *text, char *out, size_t size) { /* size >= 4 */
  const unsigned char *s = (const unsigned char *)text;
  size_t used = 0, at = 0, n = strlen(text);
  while (at < n) {
    char piece[8];
    size_t length;
    uint32_t code;
    size_t sequence = utf8_sequence(s + at, n - at, &code);
    if (s[at] == 0xc0 && at + 1 < n && s[at + 1] == 0x80) {
      length = (size_t)snprintf(piece, sizeof piece, "\\x00"), sequence = 2;
    } else if (sequence == 0 || code < 0x20 || code == 0x7f) {
      length = (size_t)snprintf(piece, sizeof piece, "\\x%02x", s[at]), sequence = 1;
    } else {
      memcpy(piece, s + at, sequence), length = sequence;
    }
    if (used + length + 4 > size) { /* room for "..." stays: used + 4 <= size holds from the start */
      memcpy(out + used, "...", 4);
      return out;
    }
    memcpy(out + used, piece, length);
    used += length, at += sequence;
  }
  out[used] = '\0';
  return out;
}

/* ---- Numbers ------------------------------------------------------------------------------------------ */

static locale_t c_numbers;
static pthread_once_t c_numbers_once = PTHREAD_ONCE_INIT;

static void make_c_numbers(void) { c_numbers = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

int json_number_value(const char *token, size_t length, double *value) {
  /* strtod reads the calling thread's locale, whose decimal point may be ',': it runs in the C locale, set for this
   * thread alone (uselocale), so a thread with another locale -- or one changing it -- reads JSON's '.' all the same
   * (localeconv(), read before, returns one struct that every thread's call rewrites) */
  pthread_once(&c_numbers_once, make_c_numbers);
  if (c_numbers == (locale_t)0) return 0;
  char local[64];
  char *copy = length < sizeof local ? local : malloc(length + 1);
  if (copy == NULL) return 0;
  memcpy(copy, token, length);
  copy[length] = '\0';
  locale_t previous = uselocale(c_numbers);
  *value = strtod(copy, NULL);
  uselocale(previous);
  if (copy != local) free(copy);
  return 1;
}

const char *json_type_name(const cJSON *item) {
  if (item == NULL) return "nothing";
  if (cJSON_IsNull(item)) return "null";
  if (cJSON_IsBool(item)) return "a boolean";
  if (cJSON_IsNumber(item)) return "a number";
  if (cJSON_IsString(item)) return "a string";
  if (cJSON_IsArray(item)) return "a list";
  return "an object";
}

/* ---- Failures ----------------------------------------------------------------------------------------- */

static void refuse(struct reader *r, const char *format, ...) EDGE_PRINTF(2, 3);

static void refuse(struct reader *r, const char *format, ...) {
  if (r->status != EDGE_OK) return;
  char reason[512];
  va_list args;
  va_start(args, format);
  vsnprintf(reason, sizeof reason, format, args);
  va_end(args);
  r->status = edge_fail(EDGE_ERROR_BUNDLE, "%s: not valid JSON: %s", r->where, reason);
}

/* A grammar error at byte `at`, placed as Python's json module places it (line, and column in characters). */
static void refuse_at(struct reader *r, size_t at, const char *what) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < at && i < r->size; i++) {
    if (r->text[i] == '\n') {
      line++, column = 1;
    } else if ((r->text[i] & 0xc0) != 0x80) {
      column++;
    }
  }
  refuse(r, "%s (line %zu, column %zu)", what, line, column);
}

static void out_of_memory(struct reader *r) {
  if (r->status == EDGE_OK) r->status = edge_fail(EDGE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading JSON", r->where);
}

/* ---- Strings ------------------------------------------------------------------------------------------ */

static int append(struct reader *r, const void *data, size_t size) {
  struct string_buffer *b = &r->string;
  if (b->size + size + 1 > b->capacity) {
    size_t capacity = b->capacity ? b->capacity : 64;
    while (capacity < b->size + size + 1) capacity *= 2;
    char *grown = realloc(b->data, capacity);
    if (grown == NULL) {
      out_of_memory(r);
      return 0;
    }
    b->data = grown, b->capacity = capacity;
  }
  memcpy(b->data + b->size, data, size);
  b->size += size;
  b->data[b->size] = '\0';
  return 1;
}

static int append_code_point(struct reader *r, uint32_t code) {
  unsigned char bytes[4];
  size_t n;
  if (code == 0) {
    bytes[0] = 0xc0, bytes[1] = 0x80, n = 2; /* see json_strict.h */
  } else if (code < 0x80) {
    bytes[0] = (unsigned char)code, n = 1;
  } else if (code < 0x800) {
    bytes[0] = (unsigned char)(0xc0 | code >> 6), bytes[1] = (unsigned char)(0x80 | (code & 0x3f)), n = 2;
  } else if (code < 0x10000) {
    bytes[0] = (unsigned char)(0xe0 | code >> 12), bytes[1] = (unsigned char)(0x80 | ((code >> 6) & 0x3f));
    bytes[2] = (unsigned char)(0x80 | (code & 0x3f)), n = 3;
  } else {
    bytes[0] = (unsigned char)(0xf0 | code >> 18), bytes[1] = (unsigned char)(0x80 | ((code >> 12) & 0x3f));
    bytes[2] = (unsigned char)(0x80 | ((code >> 6) & 0x3f)), bytes[3] = (unsigned char)(0x80 | (code & 0x3f)), n = 4;
  }
  return append(r, bytes, n);
}

static int hex_digit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int hex4(const struct reader *r, size_t at, uint32_t *value) {
  if (at + 4 > r->size) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int digit = hex_digit(r->text[at + i]);
    if (digit < 0) return 0;
    v = v << 4 | (uint32_t)digit;
  }
  *value = v;
  return 1;
}

/* A \u escape at r->at (a surrogate pair is two of them). */
static int read_unicode_escape(struct reader *r) {
  uint32_t code, low;
  if (!hex4(r, r->at + 2, &code)) {
    refuse_at(r, r->at, "Invalid \\uXXXX escape");
    return 0;
  }
  r->at += 6;
  if (code >= 0xdc00 && code < 0xe000) {
    refuse(r, "a \\u escape is a lone UTF-16 surrogate");
    return 0;
  }
  if (code >= 0xd800 && code < 0xdc00) {
    if (r->at + 1 >= r->size || r->text[r->at] != '\\' || r->text[r->at + 1] != 'u' || !hex4(r, r->at + 2, &low) ||
        low < 0xdc00 || low >= 0xe000) {
      refuse(r, "a \\u escape is a lone UTF-16 surrogate");
      return 0;
    }
    code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
    r->at += 6;
  }
  return append_code_point(r, code);
}

static int read_escape(struct reader *r, size_t start) {
  if (r->at + 1 >= r->size) {
    refuse_at(r, start, "Unterminated string starting at");
    return 0;
  }
  static const char names[] = "\"\\/bfnrt", values[] = "\"\\/\b\f\n\r\t";
  char e = (char)r->text[r->at + 1];
  const char *simple = e != '\0' ? strchr(names, e) : NULL;
  if (simple != NULL) {
    r->at += 2;
    return append(r, &values[simple - names], 1);
  }
  if (e == 'u') return read_unicode_escape(r);
  refuse_at(r, r->at, "Invalid \\escape");
  return 0;
}

/* The string token at r->at, decoded into r->string (NUL-terminated). */
static int read_string(struct reader *r) {
  size_t start = r->at++;
  r->string.size = 0;
  if (!append(r, "", 0)) return 0;
  for (;;) {
    size_t run = r->at;
    while (run < r->size && r->text[run] != '"' && r->text[run] != '\\' && r->text[run] >= 0x20) run++;
    if (run > r->at && !append(r, r->text + r->at, run - r->at)) return 0; /* the text is valid UTF-8 */
    r->at = run;
    if (r->at >= r->size) {
      refuse_at(r, start, "Unterminated string starting at");
      return 0;
    }
    unsigned char c = r->text[r->at];
    if (c == '"') {
      r->at++;
      return 1;
    }
    if (c < 0x20) {
      refuse_at(r, r->at, "Invalid control character at");
      return 0;
    }
    if (!read_escape(r, start)) return 0;
  }
}

/* ---- Values ------------------------------------------------------------------------------------------- */

static void skip_space(struct reader *r) {
  while (r->at < r->size) {
    unsigned char c = r->text[r->at];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    r->at++;
  }
}

static int is_digit_at(const struct reader *r, size_t at) { return at < r->size && r->text[at] >= '0' && r->text[at] <= '9'; }

static cJSON *read_value(struct reader *r);

static cJSON *float_value(struct reader *r, const char *token, size_t length);

/* An integer literal within +-2^53 is exact in a double; beyond, it is read as the nearest double, as if written
 * with an exponent, except in files of integers only, which refuse it. */
static cJSON *integer_value(struct reader *r, const char *token, size_t length) {
  int negative = token[0] == '-';
  size_t digits = length - (size_t)negative;
  int64_t value = 0;
  for (size_t i = (size_t)negative; digits <= MAX_INTEGER_DIGITS && i < length; i++) value = value * 10 + (token[i] - '0');
  if (digits > MAX_INTEGER_DIGITS || value > (INT64_C(1) << 53)) {
    if (r->numbers != JSON_INTEGERS_ONLY) return float_value(r, token, length);
    refuse(r, "integer %.*s%s is outside +-2^53", (int)(length < SHOWN_NUMBER_BYTES ? length : SHOWN_NUMBER_BYTES),
           token, length > SHOWN_NUMBER_BYTES ? "..." : "");
    return NULL;
  }
  cJSON *item = cJSON_CreateNumber(negative ? -(double)value + 0.0 : (double)value); /* -0 is the integer 0 */
  if (item == NULL) out_of_memory(r);
  return item;
}

static cJSON *float_value(struct reader *r, const char *token, size_t length) {
  int shown = (int)(length < SHOWN_NUMBER_BYTES ? length : SHOWN_NUMBER_BYTES);
  if (r->numbers == JSON_INTEGERS_ONLY) {
    refuse(r, "number %.*s is not an integer (this file holds integers only)", shown, token);
    return NULL;
  }
  double value;
  if (!json_number_value(token, length, &value)) {
    out_of_memory(r);
    return NULL;
  }
  if (!isfinite(value)) {
    refuse(r, "number %.*s is not finite as a float64", shown, token);
    return NULL;
  }
  cJSON *item = cJSON_CreateNumber(value);
  if (item == NULL) out_of_memory(r);
  return item;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? */
static cJSON *read_number(struct reader *r) {
  size_t start = r->at;
  if (r->text[r->at] == '-') r->at++;
  if (!is_digit_at(r, r->at)) {
    refuse_at(r, start, "Expecting value");
    return NULL;
  }
  if (r->text[r->at++] != '0') {
    while (is_digit_at(r, r->at)) r->at++;
  }
  int integer = 1;
  if (r->at < r->size && r->text[r->at] == '.' && is_digit_at(r, r->at + 1)) {
    integer = 0;
    r->at++;
    while (is_digit_at(r, r->at)) r->at++;
  }
  if (r->at < r->size && (r->text[r->at] == 'e' || r->text[r->at] == 'E')) {
    size_t digits = r->at + 1;
    if (digits < r->size && (r->text[digits] == '+' || r->text[digits] == '-')) digits++;
    if (is_digit_at(r, digits)) {
      integer = 0;
      r->at = digits;
      while (is_digit_at(r, r->at)) r->at++;
    }
  }
  const char *token = (const char *)r->text + start;
  return integer ? integer_value(r, token, r->at - start) : float_value(r, token, r->at - start);
}

static cJSON *read_literal(struct reader *r) {
  static const struct {
    const char *text;
    int refused; /* Python reads these and strict_json refuses them */
  } literals[] = {{"true", 0}, {"false", 0}, {"null", 0}, {"NaN", 1}, {"Infinity", 1}, {"-Infinity", 1}};
  for (size_t i = 0; i < sizeof literals / sizeof *literals; i++) {
    size_t n = strlen(literals[i].text);
    if (r->size - r->at < n || memcmp(r->text + r->at, literals[i].text, n) != 0) continue;
    if (literals[i].refused) {
      refuse(r, "%s is not a JSON number", literals[i].text);
      return NULL;
    }
    r->at += n;
    cJSON *item = i == 2 ? cJSON_CreateNull() : cJSON_CreateBool(i == 0);
    if (item == NULL) out_of_memory(r);
    return item;
  }
  if (r->text[r->at] == '-' || is_digit_at(r, r->at)) return read_number(r);
  refuse_at(r, r->at, "Expecting value");
  return NULL;
}

static int enter(struct reader *r) {
  if (++r->depth <= JSON_MAX_DEPTH) return 1;
  refuse(r, "nested deeper than %d levels", JSON_MAX_DEPTH);
  return 0;
}

static int compare_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* No key twice in one object (compared decoded, as Python's dict does). */
static int keys_unique(struct reader *r, const cJSON *object) {
  size_t count = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, object) count++;
  if (count < 2) return 1;
  const char **keys = malloc(count * sizeof *keys);
  if (keys == NULL) {
    out_of_memory(r);
    return 0;
  }
  size_t n = 0;
  cJSON_ArrayForEach(item, object) keys[n++] = item->string;
  qsort(keys, count, sizeof *keys, compare_keys);
  int unique = 1;
  for (size_t i = 1; i < count && unique; i++) {
    if (strcmp(keys[i - 1], keys[i]) == 0) {
      char shown[80];
      refuse(r, "key '%s' appears twice in one object", json_shown(keys[i], shown, sizeof shown));
      unique = 0;
    }
  }
  free(keys);
  return unique;
}

/* One "key": value member into object; the key is r->string when called. */
static int read_member(struct reader *r, cJSON *object) {
  char *key = cJSON_malloc(r->string.size + 1);
  if (key == NULL) {
    out_of_memory(r);
    return 0;
  }
  memcpy(key, r->string.data, r->string.size + 1);
  skip_space(r);
  if (r->at >= r->size || r->text[r->at] != ':') {
    cJSON_free(key);
    refuse_at(r, r->at, "Expecting ':' delimiter");
    return 0;
  }
  r->at++;
  skip_space(r);
  cJSON *value = read_value(r);
  if (value == NULL) {
    cJSON_free(key);
    return 0;
  }
  value->string = key; /* owned by the item from here: cJSON_Delete frees it */
  if (!cJSON_AddItemToArray(object, value)) {
    cJSON_Delete(value);
    out_of_memory(r);
    return 0;
  }
  return 1;
}

static cJSON *read_object(struct reader *r) {
  cJSON *object = enter(r) ? cJSON_CreateObject() : NULL;
  if (object == NULL) {
    out_of_memory(r);
    return NULL;
  }
  r->at++; /* '{' */
  skip_space(r);
  int done = r->at < r->size && r->text[r->at] == '}';
  if (done) r->at++;
  while (!done) {
    if (r->at >= r->size || r->text[r->at] != '"') {
      refuse_at(r, r->at, "Expecting property name enclosed in double quotes");
      break;
    }
    if (!read_string(r) || !read_member(r, object)) break;
    skip_space(r);
    if (r->at < r->size && r->text[r->at] == ',') {
      r->at++;
      skip_space(r);
    } else if (r->at < r->size && r->text[r->at] == '}') {
      r->at++;
      done = 1;
    } else {
      refuse_at(r, r->at, "Expecting ',' delimiter");
      break;
    }
  }
  r->depth--;
  if (!done || !keys_unique(r, object)) {
    cJSON_Delete(object);
    return NULL;
  }
  return object;
}

static cJSON *read_array(struct reader *r) {
  cJSON *array = enter(r) ? cJSON_CreateArray() : NULL;
  if (array == NULL) {
    out_of_memory(r);
    return NULL;
  }
  r->at++; /* '[' */
  skip_space(r);
  int done = r->at < r->size && r->text[r->at] == ']';
  if (done) r->at++;
  while (!done) {
    cJSON *item = read_value(r);
    if (item == NULL) break;
    if (!cJSON_AddItemToArray(array, item)) {
      cJSON_Delete(item);
      out_of_memory(r);
      break;
    }
    skip_space(r);
    if (r->at < r->size && r->text[r->at] == ',') {
      r->at++;
      skip_space(r);
    } else if (r->at < r->size && r->text[r->at] == ']') {
      r->at++;
      done = 1;
    } else {
      refuse_at(r, r->at, "Expecting ',' delimiter");
      break;
    }
  }
  r->depth--;
  if (!done) {
    cJSON_Delete(array);
    return NULL;
  }
  return array;
}

static cJSON *read_value(struct reader *r) {
  if (r->at >= r->size) {
    refuse_at(r, r->at, "Expecting value");
    return NULL;
  }
  switch (r->text[r->at]) {
    case '{':
      return read_object(r);
    case '[':
      return read_array(r);
    case '"': {
      if (!read_string(r)) return NULL;
      cJSON *item = cJSON_CreateString(r->string.data);
      if (item == NULL) out_of_memory(r);
      return item;
    }
    default:
      return read_literal(r);
  }
}

/* ---- Documents ---------------------------------------------------------------------------------------- */

/* Python decodes the whole file before parsing it: an invalid byte anywhere refuses it. */
static int check_utf8(struct reader *r) {
  for (size_t at = 0; at < r->size;) {
    if (r->text[at] < 0x80) {
      at++;
      continue;
    }
    uint32_t code;
    size_t length = utf8_sequence(r->text + at, r->size - at, &code);
    if (length == 0) {
      refuse(r, "not UTF-8 text (byte 0x%02x at offset %zu)", r->text[at], at);
      return 0;
    }
    at += length;
  }
  if (r->size >= 3 && memcmp(r->text, "\xef\xbb\xbf", 3) == 0) {
    refuse(r, "starts with a byte order mark");
    return 0;
  }
  return 1;
}

edge_status json_strict_parse(const char *text, size_t size, enum json_numbers numbers, const char *where,
                              cJSON **out) {
  struct reader r = {(const unsigned char *)text, size, 0, numbers, where, 0, EDGE_OK, {0}};
  cJSON *value = NULL;
  if (check_utf8(&r)) {
    skip_space(&r);
    value = read_value(&r);
    skip_space(&r);
    if (value != NULL && r.at != r.size) refuse_at(&r, r.at, "Extra data");
  }
  free(r.string.data);
  if (r.status != EDGE_OK) {
    cJSON_Delete(value);
    return r.status;
  }
  *out = value;
  return EDGE_OK;
}

edge_status json_strict_parse_object(const char *text, size_t size, enum json_numbers numbers, const char *where,
                                     cJSON **out) {
  cJSON *value;
  edge_status status = json_strict_parse(text, size, numbers, where, &value);
  if (status != EDGE_OK) return status;
  if (!cJSON_IsObject(value)) {
    status = edge_fail(EDGE_ERROR_BUNDLE, "%s: expected a JSON object, found %s", where, json_type_name(value));
    cJSON_Delete(value);
    return status;
  }
  *out = value;
  return EDGE_OK;
}
