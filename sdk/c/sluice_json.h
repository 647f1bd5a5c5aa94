/* The C SDK's JSON reader: one JSON object's top-level fields, read
 * strictly (RFC 8259, UTF-8 checked, nesting at most SLUICE_JSON_MAX_DEPTH
 * deep, no lone surrogate escape: what every SDK's JSON helper refuses,
 * docs/languages.md), so a C transform accepts and refuses the values a
 * Rust, Python, JavaScript or Go one does.
 *
 * It must not keep anything: each call reads one value. */
#ifndef SLUICE_JSON_H
#define SLUICE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Arrays and objects nest at most this deep (serde_json's limit); the
 * top-level object is depth 0. */
#define SLUICE_JSON_MAX_DEPTH 127

typedef enum sluice_json_kind {
  SLUICE_JSON_NULL,
  SLUICE_JSON_TRUE,
  SLUICE_JSON_FALSE,
  SLUICE_JSON_NUMBER,
  SLUICE_JSON_STRING,
  SLUICE_JSON_ARRAY,
  SLUICE_JSON_OBJECT,
} sluice_json_kind;

/* A top-level field: its name and a string's value decoded (UTF-8), a
 * number as its text. They live until the callback returns. */
typedef struct sluice_json_field {
  const char *name;
  size_t name_len;
  sluice_json_kind kind;
  const char *string; /* SLUICE_JSON_STRING */
  size_t string_len;
  const char *number; /* SLUICE_JSON_NUMBER: the number's text */
  size_t number_len;
} sluice_json_field;

/* Reads `value` as one JSON object, calling `field` for each top-level
 * field in order (a repeated name: each time, so the last one wins); false
 * when it is not one (`field` may have been called for the fields before
 * the fault: take them only on true). */
bool sluice_json_object(const uint8_t *value, size_t len,
                        void (*field)(const sluice_json_field *f, void *ctx), void *ctx);

/* Whether the field is `name`. */
bool sluice_json_is(const sluice_json_field *f, const char *name);
/* A number field as an int64: true when it is an integer (no fraction, no
 * exponent) in int64's range, as serde_json's `as_i64` takes it. */
bool sluice_json_i64(const sluice_json_field *f, int64_t *out);
/* A number field as a double (strtod of its text). */
double sluice_json_f64(const sluice_json_field *f);

#ifdef __cplusplus
}
#endif

#endif
