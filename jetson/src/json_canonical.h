/* The manifest digest: sha256 of the manifest's canonical JSON without its manifest_sha256 field, the bytes
 * Python's json.dumps(content, sort_keys=True, separators=(",", ":")) writes (bundle/manifest.py manifest_digest,
 * formats/strict_json.py canonical):
 * - object keys sorted by code point, no whitespace;
 * - strings re-escaped as Python's ensure_ascii does: \" \\ \n \r \t \b \f, every other character outside
 *   ' '..'~' as lowercase \uXXXX (characters above U+FFFF as a surrogate pair);
 * - integer literals as decimal integers ("-0" is 0), other numbers as Python's float repr (the shortest digits
 *   that read back as the same float64; exponent form below 1e-4 and from 1e16 on: 1e-05, 1e+16, 100000.0).
 * So a manifest re-indented or re-written by any JSON tool (1.0e-5, "\u00e9" as raw UTF-8) keeps its digest.
 * The text must have passed the strict JSON rule (json_strict.h): its numbers are finite and its integers exact. */
#ifndef EDGE_JSON_CANONICAL_H
#define EDGE_JSON_CANONICAL_H

#include <stddef.h>

#include "edge_sdk.h"

/* The canonical form of the JSON value in text[0:size] (*out NUL-terminated, free it), leaving out the top-level
 * key `skip_key` of an object (NULL: none). EDGE_ERROR_BUNDLE (message names `where`) on malformed JSON. */
edge_status json_canonical_text(const char *text, size_t size, const char *skip_key, const char *where, char **out,
                                size_t *out_size);

/* hex = sha256 of json_canonical_text. */
edge_status json_canonical_digest(const char *text, size_t size, const char *skip_key, const char *where,
                                  char hex[65]);

#endif
