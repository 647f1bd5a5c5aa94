/* {{name}}: a sluice transform in C.
 *
 * Each record's value is read as UTF-8 text (bad bytes replaced by U+FFFD);
 * a record with no value is rejected (it becomes a dead letter); every other
 * one gives a row of target `out` with its offset and its value, ASCII
 * letters in upper case, after the `prefix` param. Every language's
 * template does exactly this.
 *
 * Try it:   sluice build && sluice test dist/{{name}}.wasm --input sample.jsonl
 */
#include "sluice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char prefix[64];

/* The pipeline's `[module.params]` as JSON; this reads `"prefix": "..."`
 * by hand to stay free of dependencies (use a JSON library for more). */
bool sluice_init(const char *params, size_t len, char **error) {
  (void)len;
  const char *p = strstr(params, "\"prefix\"");
  if (p && (p = strchr(p + 8, '"'))) {
    const char *end = strchr(p + 1, '"');
    size_t n = end ? (size_t)(end - p - 1) : 0;
    if (n >= sizeof prefix) {
      *error = strdup("prefix is too long");
      return false;
    }
    memcpy(prefix, p + 1, n);
    prefix[n] = 0;
  }
  return true;
}

bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error) {
  (void)error;
  static const char *names[] = {"offset", "value"};
  static const sluice_kind kinds[] = {SLUICE_INT64, SLUICE_TEXT};
  int t = sluice_target(out, "out", names, kinds, 2);
  size_t n = strlen(prefix);
  sluice_record r;
  while (sluice_next(batch, &r)) {
    if (!r.value) {
      sluice_reject(out, &r, "no value");
      continue;
    }
    size_t len;
    char *value = sluice_lossy_text(r.value, r.value_len, &len);
    char *text = malloc(n + len + 1);
    memcpy(text, prefix, n);
    for (size_t i = 0; i < len; i++) {
      char c = value[i];
      text[n + i] = c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
    }
    sluice_row(out, t);
    sluice_int(out, r.offset);
    sluice_text(out, text, n + len);
    free(text), free(value);
  }
  char line[64];
  snprintf(line, sizeof line, "%zu records", sluice_batch_len(batch));
  sluice_log(SLUICE_INFO, line);
  return true;
}
