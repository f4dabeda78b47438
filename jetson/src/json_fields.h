/* Typed reads of one JSON object's fields (bundle/manifest.py Fields): every failure is EDGE_ERROR_BUNDLE
 * "<where>: field '<key>' must be <expected>, found <value>" (found nothing when the field is missing), with
 * `where` naming the file and the object, e.g. "BUNDLE/manifest.json: model". An integer is a JSON number with an
 * integral value in its range (1 and 1.0 alike). */
#ifndef EDGE_JSON_FIELDS_H
#define EDGE_JSON_FIELDS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "edge_sdk.h"

/* The message above for object[field]; returns EDGE_ERROR_BUNDLE. */
edge_status json_field_fail(const cJSON *object, const char *field, const char *where, const char *expected);

/* Nonzero when object[field] is present and not null. */
int json_has(const cJSON *object, const char *field);

edge_status json_object_field(const cJSON *object, const char *field, const char *where, const cJSON **out);
edge_status json_int_field(const cJSON *object, const char *field, const char *where, int64_t min, int64_t max,
                           int64_t *out);
/* A finite number (not a boolean). */
edge_status json_number_field(const cJSON *object, const char *field, const char *where, double *out);
edge_status json_bool_field(const cJSON *object, const char *field, const char *where, int *out);
edge_status json_string_field(const cJSON *object, const char *field, const char *where, const char **out);
/* One of choices[n] ("one of a, b, c"); *index is its position. */
edge_status json_choice_field(const cJSON *object, const char *field, const char *where, const char *const *choices,
                              int n, int *index);
/* A list of at most max_length entries. */
edge_status json_list_field(const cJSON *object, const char *field, const char *where, int max_length,
                            const cJSON **out);
/* An integer-valued JSON number in [min, max] (exact: |value| <= 2^53). */
int json_integer(const cJSON *item, int64_t min, int64_t max, int64_t *out);

#endif
