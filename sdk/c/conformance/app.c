/* The conformance transform in C (docs/languages.md states it; every
 * language's copy must give byte-identical output on the same input).
 * Its JSON is read with the SDK's strict reader (sluice_json.h). */
#include "sluice.h"
#include "sluice_json.h"

#include <stdlib.h>
#include <string.h>

bool sluice_init(const char *params, size_t len, char **error) {
  (void)params, (void)len, (void)error;
  return true;
}

/* The fields this transform reads from the top-level object (the last
 * of a repeated name wins). */
typedef struct {
  char *user;
  size_t user_len;
  bool has_user;
  double score;
  bool has_score;
  char *text;
  size_t text_len;
  bool has_text;
  int keep; /* -1 absent or not a boolean, 0 false, 1 true */
  int vip;
  int forget;
  int expire;
} reader;

static char *copy(const char *s, size_t len) {
  char *c = malloc(len + 1);
  if (!c) abort();
  memcpy(c, s, len);
  c[len] = 0;
  return c;
}

static int boolean(const sluice_json_field *f) {
  return f->kind == SLUICE_JSON_TRUE ? 1 : f->kind == SLUICE_JSON_FALSE ? 0 : -1;
}

/* One string field into `*to`: kept (copied) if it is a string. */
static void string_field(const sluice_json_field *f, char **to, size_t *len, bool *has) {
  free(*to);
  *has = f->kind == SLUICE_JSON_STRING;
  *to = *has ? copy(f->string, f->string_len) : NULL;
  *len = *has ? f->string_len : 0;
}

static void field(const sluice_json_field *f, void *ctx) {
  reader *r = ctx;
  if (sluice_json_is(f, "user")) string_field(f, &r->user, &r->user_len, &r->has_user);
  else if (sluice_json_is(f, "text")) string_field(f, &r->text, &r->text_len, &r->has_text);
  else if (sluice_json_is(f, "score")) {
    r->has_score = f->kind == SLUICE_JSON_NUMBER;
    r->score = sluice_json_f64(f);
  }
  else if (sluice_json_is(f, "keep")) r->keep = boolean(f);
  else if (sluice_json_is(f, "vip")) r->vip = boolean(f);
  else if (sluice_json_is(f, "forget")) r->forget = boolean(f);
  else if (sluice_json_is(f, "expire")) r->expire = boolean(f);
}

/* Parses `value` as one JSON object; false when it is not one. */
static bool parse_object(reader *r, const uint8_t *value, size_t len) {
  memset(r, 0, sizeof *r);
  r->keep = r->vip = r->forget = r->expire = -1;
  return sluice_json_object(value, len, field, r);
}

static bool ascii_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error) {
  (void)error;
  static const char *event_names[] = {"offset", "user", "score", "scaled", "key", "words", "vip"};
  static const sluice_kind event_kinds[] = {SLUICE_INT64, SLUICE_TEXT,  SLUICE_FLOAT64, SLUICE_FLOAT64,
                                            SLUICE_BYTES, SLUICE_INT64, SLUICE_BOOL};
  static const char *word_names[] = {"offset", "word"};
  static const sluice_kind word_kinds[] = {SLUICE_INT64, SLUICE_TEXT};
  int events = sluice_target(out, "events", event_names, event_kinds, 7);
  int words = sluice_target(out, "words", word_names, word_kinds, 2);
  static const char *seen_names[] = {"offset", "user", "n", "last"};
  static const sluice_kind seen_kinds[] = {SLUICE_INT64, SLUICE_TEXT, SLUICE_INT64, SLUICE_TEXT};
  int64_t now = sluice_batch_time_ms(batch);
  sluice_record rec;
  while (sluice_next(batch, &rec)) {
    reader r = {0};
    bool ok = rec.value && parse_object(&r, rec.value, rec.value_len);
    if (!ok || r.keep == 0) {
      free(r.user), free(r.text);
      if (!ok) sluice_reject(out, &rec, "not a JSON object");
      continue;
    }
    /* Keyed state (step 5), before the words lowercase the text in place;
     * its row comes after the others. */
    int64_t n = 0;
    uint8_t *last = NULL;
    size_t last_len = 0;
    bool has_last = false;
    if (r.has_user) {
      size_t key_len = r.user_len + 5;
      uint8_t *count_key = malloc(key_len), *last_key = malloc(key_len);
      memcpy(count_key, "n:", 2), memcpy(count_key + 2, r.user, r.user_len);
      memcpy(last_key, "last:", 5), memcpy(last_key + 5, r.user, r.user_len);
      if (!sluice_state_get_i64(&rec, count_key, r.user_len + 2, &n)) n = 0;
      n += 1;
      has_last = sluice_state_get(&rec, last_key, key_len, &last, &last_len);
      if (r.forget == 1) sluice_state_delete(&rec, count_key, r.user_len + 2);
      else sluice_state_set_i64(&rec, count_key, r.user_len + 2, n);
      int64_t expires = r.expire == 1 ? now : now + 60000;
      sluice_state_set_expiring(&rec, last_key, key_len, (const uint8_t *)(r.has_text ? r.text : ""),
                                r.has_text ? r.text_len : 0, expires);
      free(count_key), free(last_key);
    }
    /* Words: maximal runs of ASCII letters and digits, lowercased. */
    size_t count = 0;
    for (size_t i = 0; r.has_text && i < r.text_len;) {
      while (i < r.text_len && !ascii_alnum(r.text[i])) i++;
      size_t start = i;
      while (i < r.text_len && ascii_alnum(r.text[i])) {
        if (r.text[i] >= 'A' && r.text[i] <= 'Z') r.text[i] = (char)(r.text[i] - 'A' + 'a');
        i++;
      }
      if (i > start) count++;
    }
    sluice_row(out, events);
    sluice_int(out, rec.offset);
    if (r.has_user) sluice_text(out, r.user, r.user_len); else sluice_null(out);
    if (r.has_score) { sluice_float(out, r.score); sluice_float(out, r.score * 0.1); }
    else { sluice_null(out); sluice_null(out); }
    if (rec.key) sluice_bytes(out, rec.key, rec.key_len); else sluice_null(out);
    sluice_int(out, (int64_t)count);
    sluice_bool(out, r.vip == 1);
    for (size_t i = 0; r.has_text && i < r.text_len;) {
      while (i < r.text_len && !ascii_alnum(r.text[i])) i++;
      size_t start = i;
      while (i < r.text_len && ascii_alnum(r.text[i])) i++;
      if (i > start) {
        sluice_row(out, words);
        sluice_int(out, rec.offset);
        sluice_text(out, r.text + start, i - start);
      }
    }
    if (r.has_user) {
      /* Declared where its first row is made: mid-batch, after rows of the
       * other targets (later calls find it by name). */
      int seen = sluice_target(out, "seen", seen_names, seen_kinds, 4);
      sluice_row(out, seen);
      sluice_int(out, rec.offset);
      sluice_text(out, r.user, r.user_len);
      sluice_int(out, n);
      if (has_last) sluice_text(out, (const char *)last, last_len); else sluice_null(out);
      free(last);
    }
    free(r.user), free(r.text);
  }
  return true;
}
