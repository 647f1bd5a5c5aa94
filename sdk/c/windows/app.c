/* The windowed conformance transform in C: the same as the Rust test
 * plugin `tests/plugins/windows` (per record key, the sum and count of the
 * records' `amount` in windows of event time, one `windows` row per
 * window), so they must give the same rows, state and digest on the same
 * input (tests/tests/languages.rs).
 *
 * Records: a key, and a JSON value `{"amount": N}` (optionally the event
 * time under `time_field`; else the Kafka timestamp). Anything else is
 * rejected. Params: `windows` ("tumbling" with `size_ms`, "hopping" with
 * `size_ms` and `hop_ms`, "session" with `gap_ms`), `early`, `retain_ms`,
 * `time_field`. */
#include "sluice.h"
#include "sluice_json.h"
#include "sluice_window.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* (total, records), 16 bytes: two big-endian int64. */
typedef struct sum_count {
  int64_t total, records;
} sum_count;

static void init(void *acc, void *ctx) {
  (void)ctx;
  *(sum_count *)acc = (sum_count){0, 0};
}

static void add(void *acc, const void *input, void *ctx) {
  (void)ctx;
  sum_count *a = acc;
  a->total += *(const int64_t *)input;
  a->records += 1;
}

static void merge(void *acc, const void *other, void *ctx) {
  (void)ctx;
  sum_count *a = acc;
  const sum_count *b = other;
  a->total += b->total;
  a->records += b->records;
}

static void put_i64(uint8_t *p, int64_t v) {
  for (int i = 7; i >= 0; i--, v = (int64_t)((uint64_t)v >> 8)) p[i] = (uint8_t)v;
}

static int64_t get_i64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return (int64_t)v;
}

static uint8_t *encode(const void *acc, size_t *len, void *ctx) {
  (void)ctx;
  const sum_count *a = acc;
  uint8_t *bytes = malloc(16);
  if (!bytes) abort();
  put_i64(bytes, a->total);
  put_i64(bytes + 8, a->records);
  *len = 16;
  return bytes;
}

static bool decode(void *acc, const uint8_t *data, size_t len, void *ctx) {
  (void)ctx;
  if (len < 16) return false;
  *(sum_count *)acc = (sum_count){get_i64(data), get_i64(data + 8)};
  return true;
}

static const sluice_aggregate SUM_COUNT = {sizeof(sum_count), init, add, merge, encode, decode};

/* The params, read once. */
static struct {
  sluice_windowed windowed;
  char *time_field;
  const char *kind;
  bool bad_ms;
} params;

static void param(const sluice_json_field *f, void *ctx) {
  (void)ctx;
  int64_t ms = 0;
  bool positive = sluice_json_i64(f, &ms) && ms > 0;
  if (sluice_json_is(f, "windows") && f->kind == SLUICE_JSON_STRING) {
    #define KIND(name) (f->string_len == strlen(name) && memcmp(f->string, name, f->string_len) == 0)
    params.kind = KIND("tumbling") ? "tumbling" : KIND("hopping") ? "hopping" : KIND("session") ? "session" : NULL;
    #undef KIND
  } else if (sluice_json_is(f, "windows")) {
    params.kind = NULL;
  } else if (sluice_json_is(f, "size_ms")) {
    params.windowed.windows.size_ms = positive ? ms : 0;
  } else if (sluice_json_is(f, "hop_ms")) {
    params.windowed.windows.hop_ms = positive ? ms : 0;
  } else if (sluice_json_is(f, "gap_ms")) {
    params.windowed.windows.gap_ms = positive ? ms : 0;
  } else if (sluice_json_is(f, "early")) {
    params.windowed.early = f->kind == SLUICE_JSON_TRUE;
  } else if (sluice_json_is(f, "retain_ms")) {
    params.windowed.retain_ms = positive ? ms : 0;
  } else if (sluice_json_is(f, "time_field")) {
    free(params.time_field);
    params.time_field = NULL;
    if (f->kind == SLUICE_JSON_STRING) {
      params.time_field = malloc(f->string_len + 1);
      if (!params.time_field) abort();
      memcpy(params.time_field, f->string, f->string_len);
      params.time_field[f->string_len] = 0;
    }
  }
}

static bool refuse(char **error, const char *message) {
  *error = strdup(message);
  return false;
}

static bool positive_ms(int64_t ms, const char *name, char **error) {
  if (ms > 0) return true;
  char message[96];
  snprintf(message, sizeof message, "windows params: `%s` must be a positive integer", name);
  return refuse(error, message);
}

bool sluice_init(const char *text, size_t len, char **error) {
  memset(&params, 0, sizeof params);
  params.windowed.aggregate = &SUM_COUNT;
  if (!sluice_json_object((const uint8_t *)text, len, param, NULL)) {
    return refuse(error, "windows params: not a JSON object");
  }
  sluice_windows *w = &params.windowed.windows;
  if (!params.kind) return refuse(error, "windows params: `windows` is tumbling, hopping or session");
  if (strcmp(params.kind, "tumbling") == 0) {
    w->kind = SLUICE_TUMBLING;
    return positive_ms(w->size_ms, "size_ms", error);
  }
  if (strcmp(params.kind, "hopping") == 0) {
    w->kind = SLUICE_HOPPING;
    return positive_ms(w->size_ms, "size_ms", error) && positive_ms(w->hop_ms, "hop_ms", error);
  }
  w->kind = SLUICE_SESSION;
  return positive_ms(w->gap_ms, "gap_ms", error);
}

/* What a record's value says: its amount and, maybe, its time. */
typedef struct value {
  bool has_amount, has_time;
  int64_t amount, time_ms;
} value;

static void value_field(const sluice_json_field *f, void *ctx) {
  value *v = ctx;
  if (sluice_json_is(f, "amount")) v->has_amount = sluice_json_i64(f, &v->amount);
  if (params.time_field && sluice_json_is(f, params.time_field)) v->has_time = sluice_json_i64(f, &v->time_ms);
}

static sluice_take take(const sluice_record *r, sluice_event *event, const char **reason, void *ctx) {
  value *v = ctx;
  memset(v, 0, sizeof *v);
  if (!sluice_json_object(r->value, r->value_len, value_field, v) || !v->has_amount) {
    *reason = "the value is not JSON with an integer `amount`";
    return SLUICE_TAKE_REJECTED;
  }
  event->key = r->key ? r->key : (const uint8_t *)"";
  event->key_len = r->key ? r->key_len : 0;
  event->has_time = v->has_time;
  event->time_ms = v->time_ms;
  event->input = &v->amount;
  return SLUICE_TAKE_EVENT;
}

static int windows_target;

static void emit(sluice_output *out, const sluice_window_value *w, void *ctx) {
  (void)ctx;
  const sum_count *acc = w->acc;
  size_t key_len;
  char *key = sluice_lossy_text(w->key, w->key_len, &key_len);
  sluice_row(out, windows_target);
  sluice_int(out, w->partition);
  sluice_text(out, key, key_len);
  sluice_int(out, w->start_ms);
  sluice_int(out, w->end_ms);
  sluice_int(out, acc->total);
  sluice_int(out, acc->records);
  static const char *const emits[] = {[SLUICE_EMIT_FINAL] = "final", [SLUICE_EMIT_EARLY] = "early",
                                      [SLUICE_EMIT_UPDATE] = "update"};
  sluice_text(out, emits[w->emit], strlen(emits[w->emit]));
  free(key);
}

bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error) {
  (void)error;
  static const char *names[] = {"partition", "key", "start_ms", "end_ms", "total", "records", "emit"};
  static const sluice_kind kinds[] = {SLUICE_INT64, SLUICE_TEXT,  SLUICE_INT64, SLUICE_INT64,
                                      SLUICE_INT64, SLUICE_INT64, SLUICE_TEXT};
  windows_target = sluice_target(out, "windows", names, kinds, 7);
  value v;
  sluice_windowed_run(&params.windowed, batch, out, take, emit, &v);
  return true;
}
