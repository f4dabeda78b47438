/* Typed reads of JSON object fields, with the messages of bundle/manifest.py Fields. */
#include "json_fields.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "json_strict.h"

#define SHOWN_VALUE_BYTES 64

static const cJSON *field_item(const cJSON *object, const char *field) {
  return cJSON_IsObject(object) ? cJSON_GetObjectItemCaseSensitive(object, field) : NULL;
}

int json_integer(const cJSON *item, int64_t min, int64_t max, int64_t *out) {
  if (!cJSON_IsNumber(item)) return 0;
  double value = item->valuedouble;
  if (!isfinite(value) || value != floor(value) || fabs(value) > JSON_MAX_SAFE_INTEGER) return 0;
  if (value < (double)min || value > (double)max) return 0;
  *out = (int64_t)value;
  return 1;
}

edge_status json_field_fail(const cJSON *object, const char *field, const char *where, const char *expected) {
  const cJSON *item = field_item(object, field);
  char shown[SHOWN_VALUE_BYTES + 4] = "nothing";
  char *printed = item != NULL ? cJSON_PrintUnformatted(item) : NULL;
  if (printed != NULL) json_shown(printed, shown, sizeof shown);
  cJSON_free(printed);
  return edge_fail(EDGE_ERROR_BUNDLE, "%s: field '%s' must be %s, found %s", where, field, expected, shown);
}

int json_has(const cJSON *object, const char *field) {
  const cJSON *item = field_item(object, field);
  return item != NULL && !cJSON_IsNull(item);
}

edge_status json_object_field(const cJSON *object, const char *field, const char *where, const cJSON **out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsObject(item)) return json_field_fail(object, field, where, "a JSON object");
  *out = item;
  return EDGE_OK;
}

edge_status json_int_field(const cJSON *object, const char *field, const char *where, int64_t min, int64_t max,
                           int64_t *out) {
  if (json_integer(field_item(object, field), min, max, out)) return EDGE_OK;
  char expected[96];
  snprintf(expected, sizeof expected, "an integer in [%lld, %lld]", (long long)min, (long long)max);
  return json_field_fail(object, field, where, expected);
}

edge_status json_number_field(const cJSON *object, const char *field, const char *where, double *out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) return json_field_fail(object, field, where, "a finite number");
  *out = item->valuedouble;
  return EDGE_OK;
}

edge_status json_bool_field(const cJSON *object, const char *field, const char *where, int *out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsBool(item)) return json_field_fail(object, field, where, "true or false");
  *out = cJSON_IsTrue(item);
  return EDGE_OK;
}

edge_status json_string_field(const cJSON *object, const char *field, const char *where, const char **out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsString(item) || item->valuestring == NULL) return json_field_fail(object, field, where, "a string");
  *out = item->valuestring;
  return EDGE_OK;
}

edge_status json_choice_field(const cJSON *object, const char *field, const char *where, const char *const *choices,
                              int n, int *index) {
  const cJSON *item = field_item(object, field);
  for (int i = 0; cJSON_IsString(item) && i < n; i++) {
    if (strcmp(item->valuestring, choices[i]) == 0) {
      *index = i;
      return EDGE_OK;
    }
  }
  char expected[256] = "one of ";
  for (int i = 0; i < n; i++) {
    size_t used = strlen(expected);
    snprintf(expected + used, sizeof expected - used, "%s%s", i ? ", " : "", choices[i]);
  }
  return json_field_fail(object, field, where, expected);
}

edge_status json_list_field(const cJSON *object, const char *field, const char *where, int max_length,
                            const cJSON **out) {
  const cJSON *item = field_item(object, field);
  if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) > max_length) {
    char expected[64];
    snprintf(expected, sizeof expected, "a list of at most %d entries", max_length);
    return json_field_fail(object, field, where, expected);
  }
  *out = item;
  return EDGE_OK;
}
