/* Strict JSON (edge_sdk/formats/strict_json.py): the one rule every reader applies to JSON it did not write itself
 * (manifest.json, the safetensors header, tokenizer.json, tokenizer_config.json), so that the Python readers and
 * this library give every such file the same verdict:
 * - UTF-8 text without a byte order mark, holding one RFC 8259 value with only JSON whitespace around it;
 * - no NaN or Infinity, every number finite as a float64; an integer literal beyond +-2^53 read as the nearest
 *   double (files of integers only refuse it);
 * - no lone UTF-16 surrogate in a \u escape, no raw control character in a string;
 * - at most JSON_MAX_DEPTH levels of arrays and objects, no key twice in one object;
 * - where the caller says so (safetensors headers), integer literals only.
 *
 * The rule is applied while the cJSON tree is built, by this parser rather than cJSON's: cJSON accepts what Python
 * refuses (duplicate keys, 1e400 read as infinity) and truncates what Python keeps (U+0000 inside a string). A
 * string holding U+0000 keeps it as the two bytes C0 80 (which valid UTF-8 never contains), so C strings of the
 * tree compare, look up and sort like the decoded JSON strings; json_string_bytes gives the real bytes. */
#ifndef EDGE_JSON_STRICT_H
#define EDGE_JSON_STRICT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "edge_sdk.h"

#define JSON_MAX_DEPTH 64
#define JSON_MAX_SAFE_INTEGER 9007199254740992.0 /* 2^53 */

enum json_numbers { JSON_ANY_NUMBERS, JSON_INTEGERS_ONLY };

/* The value of text[0:size] (cJSON_Delete it). EDGE_ERROR_BUNDLE "<where>: not valid JSON: <reason>" when the
 * text breaks the rule above. */
edge_status json_strict_parse(const char *text, size_t size, enum json_numbers numbers, const char *where,
                              cJSON **out);

/* json_strict_parse, and the value must be an object: "<where>: expected a JSON object, found <type>". */
edge_status json_strict_parse_object(const char *text, size_t size, enum json_numbers numbers, const char *where,
                                     cJSON **out);

/* The JSON name of a value's type, for messages: "null", "a boolean", "a number", "a string", "a list",
 * "an object" ("nothing" for NULL). */
const char *json_type_name(const cJSON *item);

/* The float64 value of a JSON number token, read the same way whatever locale any thread has; 0 when out of memory
 * (or the C locale cannot be had). */
int json_number_value(const char *token, size_t length, double *value);

/* Length of the strict UTF-8 sequence at s[0:n] (no overlong form, no surrogate, at most U+10FFFF) and its code
 * point, or 0 when the bytes there are not one. */
size_t utf8_sequence(const unsigned char *s, size_t n, uint32_t *code);

/* The bytes a string of json_strict_parse stands for, written over it (C0 80 becomes a NUL byte); the length. */
size_t json_string_bytes(char *text);

/* text (a string of json_strict_parse, or any bytes) shown on one line for a message: control characters, U+0000
 * and bytes that are not UTF-8 as \xNN escapes, cut at a character boundary to fit out[size] (with "..." when
 * cut). Returns out. */
const char *json_shown(const char *text, char *out, size_t size);

/* The json_strict_parse spelling of bytes[0:length] (a NUL byte as C0 80), NUL-terminated (free it); NULL when
 * out of memory. */
char *json_string_from_bytes(const char *bytes, size_t length);

#endif
