/* The manifest digest: sha256 of the manifest's canonical JSON without its manifest_sha256 field, the same
 * bytes Python's json.dumps(content, sort_keys=True, separators=(",", ":")) writes (bundle.py manifest_digest).
 *
 * The canonical text is rebuilt from the manifest text itself: object keys sorted, whitespace dropped, and
 * every string and number token copied as written. That equals Python's output for any manifest Python's json
 * wrote (indent or not), because Python spells a number and escapes a string the same way in both. A manifest
 * rewritten by a tool that spells numbers or escapes strings differently (1.0e-5, "\u00e9" as raw UTF-8) fails
 * the check here although Python would accept it: re-export it, or rewrite it with Python's json. */
#ifndef EDGE_JSON_CANONICAL_H
#define EDGE_JSON_CANONICAL_H

#include <stddef.h>

#include "edge_sdk.h"

/* hex = manifest digest of the JSON object in text[0:size], skipping the top-level key `skip_key`.
 * EDGE_ERROR_BUNDLE (message names `where`) on malformed JSON, duplicate keys or nesting deeper than 64. */
edge_status json_canonical_digest(const char *text, size_t size, const char *skip_key, const char *where,
                                  char hex[65]);

#endif
