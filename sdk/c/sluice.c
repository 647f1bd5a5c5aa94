/* The C SDK's implementation: the world's exports over `sluice_init` and
 * `sluice_process`, the batch cursor and the columnar row builder.
 *
 * It must not keep anything between batches: the host makes a fresh
 * instance per batch. Misuse of the row builder (a value of the wrong kind,
 * too many or too few values in a row) is a bug in the transform and
 * aborts, which the host treats as a trap.
 */
#include "sluice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transform.h"

struct sluice_batch {
  transform_batch_context_t *ctx;
  transform_record_batch_t *raw;
  size_t slice, next, key_at, value_at, header_at, name_at, header_value_at;
};

typedef struct column_buf {
  char *name;
  sluice_kind kind;
  uint8_t *nulls;
  bool any_null;
  void *values; /* int64_t, double or uint8_t (bool) per row */
  uint32_t *lengths; /* text and bytes */
  uint8_t *data;
  size_t data_len, data_cap, cap;
} column_buf;

typedef struct target_buf {
  char *name;
  column_buf *columns;
  size_t count;
  uint32_t rows;
} target_buf;

struct sluice_output {
  target_buf *targets;
  size_t count, cap;
  int current;
  size_t next_column;
  sluice_plugin_types_rejection_t *rejections;
  size_t rejection_count, rejection_cap;
};

static void *grow(void *ptr, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return ptr;
  size_t cap2 = *cap ? *cap * 2 : 16;
  while (cap2 < need) cap2 *= 2;
  void *p = realloc(ptr, cap2 * size);
  if (!p) abort();
  *cap = cap2;
  return p;
}

static char *copy_string(const char *s, size_t len) {
  char *c = malloc(len + 1);
  if (!c) abort();
  memcpy(c, s, len);
  c[len] = 0;
  return c;
}

/* ---- the batch ---- */

bool sluice_next(sluice_batch *b, sluice_record *r) {
  transform_record_batch_t *raw = b->raw;
  while (b->slice < raw->slices.len &&
         b->next >= raw->slices.ptr[b->slice].first + raw->slices.ptr[b->slice].count) {
    b->slice++;
  }
  if (b->slice >= raw->slices.len) return false;
  const sluice_plugin_types_partition_slice_t *s = &raw->slices.ptr[b->slice];
  if (b->next < s->first) b->next = s->first;
  size_t i = b->next++;
  memset(r, 0, sizeof *r);
  r->index = (uint32_t)i;
  r->topic = (const char *)s->topic.ptr;
  r->topic_len = s->topic.len;
  r->partition = s->partition;
  r->offset = raw->offsets.ptr[i];
  r->timestamp = raw->timestamps.ptr[i];
  int32_t kl = raw->key_lengths.ptr[i];
  if (kl >= 0) {
    r->key = raw->keys.ptr + b->key_at;
    r->key_len = (size_t)kl;
    b->key_at += (size_t)kl;
  }
  int32_t vl = raw->value_lengths.ptr[i];
  if (vl >= 0) {
    r->value = raw->values.ptr + b->value_at;
    r->value_len = (size_t)vl;
    b->value_at += (size_t)vl;
  }
  r->header_count = raw->header_counts.ptr[i];
  r->first_header = (uint32_t)b->header_at;
  r->header_names_at = b->name_at;
  r->header_values_at = b->header_value_at;
  for (uint32_t h = 0; h < r->header_count; h++) {
    b->name_at += raw->header_name_lengths.ptr[b->header_at];
    int32_t hl = raw->header_value_lengths.ptr[b->header_at];
    if (hl > 0) b->header_value_at += (size_t)hl;
    b->header_at++;
  }
  return true;
}

size_t sluice_batch_len(const sluice_batch *b) { return b->raw->offsets.len; }
int64_t sluice_batch_time_ms(const sluice_batch *b) { return b->ctx->batch_time_ms; }
uint64_t sluice_batch_seed(const sluice_batch *b) { return b->ctx->seed; }

bool sluice_header(const sluice_batch *b, const sluice_record *r, uint32_t i, const char **name,
                   size_t *name_len, const uint8_t **value, size_t *value_len) {
  if (i >= r->header_count) return false;
  transform_record_batch_t *raw = b->raw;
  size_t name_at = r->header_names_at, value_at = r->header_values_at;
  for (uint32_t h = r->first_header; h < r->first_header + i; h++) {
    name_at += raw->header_name_lengths.ptr[h];
    int32_t hl = raw->header_value_lengths.ptr[h];
    if (hl > 0) value_at += (size_t)hl;
  }
  uint32_t h = r->first_header + i;
  *name = (const char *)raw->header_names.ptr + name_at;
  *name_len = raw->header_name_lengths.ptr[h];
  int32_t hl = raw->header_value_lengths.ptr[h];
  *value = hl < 0 ? NULL : raw->header_values.ptr + value_at;
  *value_len = hl < 0 ? 0 : (size_t)hl;
  return true;
}

/* ---- the output ---- */

int sluice_target(sluice_output *out, const char *name, const char *const *columns,
                  const sluice_kind *kinds, size_t count) {
  for (size_t t = 0; t < out->count; t++) {
    if (strcmp(out->targets[t].name, name) == 0) return (int)t;
  }
  out->targets = grow(out->targets, &out->cap, out->count + 1, sizeof *out->targets);
  target_buf *t = &out->targets[out->count];
  t->name = copy_string(name, strlen(name));
  t->columns = calloc(count ? count : 1, sizeof *t->columns);
  if (!t->columns) abort();
  t->count = count;
  t->rows = 0;
  for (size_t c = 0; c < count; c++) {
    t->columns[c].name = copy_string(columns[c], strlen(columns[c]));
    t->columns[c].kind = kinds[c];
  }
  return (int)out->count++;
}

static void finish_row(sluice_output *out) {
  if (out->current >= 0 && out->next_column != out->targets[out->current].count) abort();
}

void sluice_row(sluice_output *out, int target) {
  finish_row(out);
  if (target < 0 || (size_t)target >= out->count) abort();
  out->current = target;
  out->next_column = 0;
  out->targets[target].rows++;
}

/* The next column of the current row, checked to be of `kind` (any kind
 * for a null); its per-row arrays have room for the row. */
static column_buf *next_column(sluice_output *out, int kind) {
  if (out->current < 0) abort();
  target_buf *t = &out->targets[out->current];
  if (out->next_column >= t->count) abort();
  column_buf *c = &t->columns[out->next_column++];
  if (kind >= 0 && (sluice_kind)kind != c->kind) abort();
  size_t row = t->rows - 1, cap = c->cap, need = row + 1;
  c->nulls = grow(c->nulls, &cap, need, 1);
  cap = c->cap;
  switch (c->kind) {
    case SLUICE_INT64: c->values = grow(c->values, &cap, need, sizeof(int64_t)); break;
    case SLUICE_FLOAT64: c->values = grow(c->values, &cap, need, sizeof(double)); break;
    case SLUICE_BOOL: c->values = grow(c->values, &cap, need, 1); break;
    default: c->lengths = grow(c->lengths, &cap, need, sizeof(uint32_t)); break;
  }
  c->cap = cap;
  c->nulls[row] = 0;
  return c;
}

static size_t current_row(sluice_output *out) { return out->targets[out->current].rows - 1; }

void sluice_int(sluice_output *out, int64_t v) {
  column_buf *c = next_column(out, SLUICE_INT64);
  ((int64_t *)c->values)[current_row(out)] = v;
}

void sluice_float(sluice_output *out, double v) {
  column_buf *c = next_column(out, SLUICE_FLOAT64);
  ((double *)c->values)[current_row(out)] = v;
}

void sluice_bool(sluice_output *out, bool v) {
  column_buf *c = next_column(out, SLUICE_BOOL);
  ((uint8_t *)c->values)[current_row(out)] = v ? 1 : 0;
}

static void append_var(sluice_output *out, column_buf *c, const void *p, size_t len) {
  c->data = grow(c->data, &c->data_cap, c->data_len + len, 1);
  if (len) memcpy(c->data + c->data_len, p, len);
  c->data_len += len;
  c->lengths[current_row(out)] = (uint32_t)len;
}

void sluice_text(sluice_output *out, const char *text, size_t len) {
  append_var(out, next_column(out, SLUICE_TEXT), text, len);
}

/* The length of the well-formed sequence starting `s` (at most `n` bytes
 * long), or 0; else, in `*bad`, the length of the maximal subpart of the
 * ill-formed one (a lead byte and the continuation bytes it may take, up to
 * the first that does not fit; Unicode 3.9). */
static size_t utf8_step(const uint8_t *s, size_t n, size_t *bad) {
  uint8_t c = s[0], lo = 0x80, hi = 0xBF;
  size_t need = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) lo = 0xA0, need = 2;
  else if (c == 0xED) hi = 0x9F, need = 2;
  else if (c >= 0xE1 && c <= 0xEF) need = 2;
  else if (c == 0xF0) lo = 0x90, need = 3;
  else if (c == 0xF4) hi = 0x8F, need = 3;
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  size_t k = 1;
  for (; k <= need && k < n && s[k] >= lo && s[k] <= hi; k++) lo = 0x80, hi = 0xBF;
  if (need > 0 && k == need + 1) return k;
  *bad = k;
  return 0;
}

char *sluice_lossy_text(const uint8_t *bytes, size_t len, size_t *out_len) {
  /* Each bad byte grows into at most three. */
  char *text = malloc(len * 3 + 1);
  if (!text) abort();
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    size_t bad = 0, good = utf8_step(bytes + i, len - i, &bad);
    if (good) {
      memcpy(text + n, bytes + i, good), n += good, i += good;
    } else {
      memcpy(text + n, "\xEF\xBF\xBD", 3), n += 3, i += bad;
    }
  }
  text[n] = 0;
  *out_len = n;
  return text;
}

void sluice_bytes(sluice_output *out, const uint8_t *bytes, size_t len) {
  append_var(out, next_column(out, SLUICE_BYTES), bytes, len);
}

void sluice_null(sluice_output *out) {
  column_buf *c = next_column(out, -1);
  size_t row = current_row(out);
  c->nulls[row] = 1;
  c->any_null = true;
  switch (c->kind) {
    case SLUICE_INT64: ((int64_t *)c->values)[row] = 0; break;
    case SLUICE_FLOAT64: ((double *)c->values)[row] = 0; break;
    case SLUICE_BOOL: ((uint8_t *)c->values)[row] = 0; break;
    default: c->lengths[row] = 0; break;
  }
}

void sluice_reject(sluice_output *out, const sluice_record *r, const char *reason) {
  out->rejections = grow(out->rejections, &out->rejection_cap, out->rejection_count + 1,
                         sizeof *out->rejections);
  sluice_plugin_types_rejection_t *rej = &out->rejections[out->rejection_count++];
  rej->index = r->index;
  transform_string_dup(&rej->reason, reason);
}

void sluice_log(sluice_level level, const char *message) {
  transform_string_t m;
  transform_string_set(&m, message);
  sluice_plugin_log_write((sluice_plugin_log_level_t)level, &m);
}

static transform_list_u8_t list_of(const uint8_t *bytes, size_t len) {
  transform_list_u8_t list = {(uint8_t *)bytes, len};
  return list;
}

/* An owned list's bytes for the caller to free: NULL when empty (the
 * bindings' cabi_realloc hands out no block for zero bytes, only a
 * non-null marker that must not reach free). */
static void take_bytes(transform_list_u8_t v, uint8_t **value, size_t *value_len) {
  *value = v.len ? v.ptr : NULL;
  *value_len = v.len;
}

bool sluice_state_get(const sluice_record *r, const uint8_t *key, size_t key_len,
                      uint8_t **value, size_t *value_len) {
  transform_list_u8_t k = list_of(key, key_len), v;
  if (!sluice_plugin_state_get(r->index, &k, &v)) return false;
  take_bytes(v, value, value_len);
  return true;
}

static void state_set(const sluice_record *r, const uint8_t *key, size_t key_len,
                      const uint8_t *value, size_t value_len, int64_t *expires_at_ms) {
  transform_list_u8_t k = list_of(key, key_len), v = list_of(value, value_len);
  sluice_plugin_state_set(r->index, &k, &v, expires_at_ms);
}

void sluice_state_set(const sluice_record *r, const uint8_t *key, size_t key_len,
                      const uint8_t *value, size_t value_len) {
  state_set(r, key, key_len, value, value_len, NULL);
}

void sluice_state_set_expiring(const sluice_record *r, const uint8_t *key, size_t key_len,
                               const uint8_t *value, size_t value_len, int64_t expires_at_ms) {
  state_set(r, key, key_len, value, value_len, &expires_at_ms);
}

void sluice_state_delete(const sluice_record *r, const uint8_t *key, size_t key_len) {
  transform_list_u8_t k = list_of(key, key_len);
  sluice_plugin_state_delete(r->index, &k);
}

bool sluice_parse_i64(const uint8_t *text, size_t len, int64_t *out) {
  bool negative = len > 0 && text[0] == '-';
  size_t i = negative ? 1 : 0;
  if (i == len) return false;
  /* Accumulate as a negative number: its range holds INT64_MIN. */
  int64_t n = 0;
  for (; i < len; i++) {
    if (text[i] < '0' || text[i] > '9') return false;
    int digit = text[i] - '0';
    if (n < (INT64_MIN + digit) / 10) return false;
    n = n * 10 - digit;
  }
  if (!negative && n == INT64_MIN) return false;
  *out = negative ? n : -n;
  return true;
}

bool sluice_state_get_i64(const sluice_record *r, const uint8_t *key, size_t key_len,
                          int64_t *value) {
  uint8_t *bytes;
  size_t len;
  if (!sluice_state_get(r, key, key_len, &bytes, &len)) return false;
  bool ok = sluice_parse_i64(bytes, len, value);
  free(bytes);
  return ok;
}

void sluice_state_set_i64(const sluice_record *r, const uint8_t *key, size_t key_len,
                          int64_t value) {
  char text[24];
  int len = snprintf(text, sizeof text, "%lld", (long long)value);
  sluice_state_set(r, key, key_len, (const uint8_t *)text, (size_t)len);
}

/* ---- event time ---- */

bool sluice_time_watermark(uint32_t index, int64_t *watermark) {
  return sluice_plugin_time_watermark(index, watermark);
}

void sluice_time_set_event_time(uint32_t index, int64_t time_ms) {
  sluice_plugin_time_set_record_time(index, &time_ms);
}

void sluice_time_clear_event_time(uint32_t index) {
  sluice_plugin_time_set_record_time(index, NULL);
}

void sluice_time_set_timer(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms) {
  transform_list_u8_t k = list_of(key, key_len);
  sluice_plugin_time_set_timer(index, &k, at_ms);
}

void sluice_time_set_timer_value(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms,
                                 const uint8_t *value, size_t value_len) {
  transform_list_u8_t k = list_of(key, key_len), v = list_of(value, value_len);
  sluice_plugin_time_set_timer_value(index, &k, at_ms, &v);
}

bool sluice_time_timer_value(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms,
                             uint8_t **value, size_t *value_len) {
  transform_list_u8_t k = list_of(key, key_len), v;
  if (!sluice_plugin_time_timer_value(index, &k, at_ms, &v)) return false;
  take_bytes(v, value, value_len);
  return true;
}

void sluice_time_delete_timer(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms) {
  transform_list_u8_t k = list_of(key, key_len);
  sluice_plugin_time_delete_timer(index, &k, at_ms);
}

void sluice_time_late(uint32_t index, const char *reason) {
  transform_string_t r;
  transform_string_set(&r, reason);
  sluice_plugin_time_late(index, &r);
}

sluice_fired_timers sluice_due_timers(void) {
  sluice_plugin_time_list_fired_timer_value_t due;
  sluice_plugin_time_due_timers_with_values(&due);
  sluice_fired_timers timers = {.count = due.len, .raw = NULL};
  timers.timers = due.len ? calloc(due.len, sizeof *timers.timers) : NULL;
  for (size_t i = 0; i < due.len; i++) {
    timers.timers[i].index = due.ptr[i].index;
    timers.timers[i].key = due.ptr[i].key.ptr;
    timers.timers[i].key_len = due.ptr[i].key.len;
    timers.timers[i].at_ms = due.ptr[i].at_ms;
    timers.timers[i].value = due.ptr[i].value.ptr;
    timers.timers[i].value_len = due.ptr[i].value.len;
  }
  sluice_plugin_time_list_fired_timer_value_t *raw = malloc(sizeof *raw);
  if (!raw) abort();
  *raw = due;
  timers.raw = raw;
  return timers;
}

void sluice_fired_timers_free(sluice_fired_timers *timers) {
  if (timers->raw) {
    sluice_plugin_time_list_fired_timer_value_free(timers->raw);
    free(timers->raw);
  }
  free(timers->timers);
  timers->timers = NULL;
  timers->count = 0;
  timers->raw = NULL;
}

sluice_record sluice_timer_record(const sluice_fired_timer *timer) {
  sluice_record r;
  memset(&r, 0, sizeof r);
  r.index = timer->index;
  return r;
}

bool sluice_partition_of(const sluice_batch *b, uint32_t index, const char **topic,
                         size_t *topic_len, int32_t *partition) {
  for (size_t i = 0; i < b->raw->slices.len; i++) {
    const sluice_plugin_types_partition_slice_t *s = &b->raw->slices.ptr[i];
    if (s->first <= index && index < s->first + s->count) {
      *topic = (const char *)s->topic.ptr;
      *topic_len = s->topic.len;
      *partition = s->partition;
      return true;
    }
  }
  return false;
}

/* The output in the world's types; the bindings free it after the host
 * copied it. */
static void to_wit(sluice_output *out, transform_output_t *ret) {
  finish_row(out);
  ret->targets.len = out->count;
  ret->targets.ptr = out->count ? calloc(out->count, sizeof *ret->targets.ptr) : NULL;
  for (size_t t = 0; t < out->count; t++) {
    target_buf *tb = &out->targets[t];
    sluice_plugin_types_target_rows_t *tr = &ret->targets.ptr[t];
    tr->target.ptr = (uint8_t *)tb->name;
    tr->target.len = strlen(tb->name);
    tr->rows = tb->rows;
    tr->columns.len = tb->count;
    tr->columns.ptr = tb->count ? calloc(tb->count, sizeof *tr->columns.ptr) : NULL;
    for (size_t c = 0; c < tb->count; c++) {
      column_buf *cb = &tb->columns[c];
      sluice_plugin_types_column_t *col = &tr->columns.ptr[c];
      col->name.ptr = (uint8_t *)cb->name;
      col->name.len = strlen(cb->name);
      if (cb->any_null) {
        col->nulls.ptr = cb->nulls;
        col->nulls.len = tb->rows;
      } else {
        free(cb->nulls);
      }
      switch (cb->kind) {
        case SLUICE_INT64:
          col->data.tag = SLUICE_PLUGIN_TYPES_COLUMN_DATA_INT64;
          col->data.val.int64.ptr = cb->values;
          col->data.val.int64.len = tb->rows;
          break;
        case SLUICE_FLOAT64:
          col->data.tag = SLUICE_PLUGIN_TYPES_COLUMN_DATA_FLOAT64;
          col->data.val.float64.ptr = cb->values;
          col->data.val.float64.len = tb->rows;
          break;
        case SLUICE_BOOL:
          col->data.tag = SLUICE_PLUGIN_TYPES_COLUMN_DATA_BOOLEAN;
          col->data.val.boolean.ptr = cb->values;
          col->data.val.boolean.len = tb->rows;
          break;
        default: {
          sluice_plugin_types_var_column_t v = {
              .lengths = {cb->lengths, tb->rows},
              .data = {cb->data, cb->data_len},
          };
          col->data.tag = cb->kind == SLUICE_TEXT ? SLUICE_PLUGIN_TYPES_COLUMN_DATA_TEXT
                                                  : SLUICE_PLUGIN_TYPES_COLUMN_DATA_BYTES;
          if (cb->kind == SLUICE_TEXT) col->data.val.text = v;
          else col->data.val.bytes = v;
        }
      }
    }
    free(tb->columns);
  }
  free(out->targets);
  ret->rejections.ptr = out->rejections;
  ret->rejections.len = out->rejection_count;
}

/* ---- the world's exports ---- */

bool exports_transform_init(transform_string_t *params, transform_string_t *err) {
  char *text = copy_string((const char *)params->ptr, params->len);
  char *error = NULL;
  bool ok = sluice_init(text, params->len, &error);
  if (!ok) transform_string_dup(err, error ? error : "params refused");
  free(error);
  free(text);
  transform_string_free(params);
  return ok;
}

bool exports_transform_process(transform_batch_context_t *ctx, transform_record_batch_t *raw,
                               transform_output_t *ret, transform_batch_error_t *err) {
  sluice_batch batch = {.ctx = ctx, .raw = raw};
  sluice_output out = {.current = -1};
  sluice_error error = {0};
  bool ok = sluice_process(&batch, &out, &error);
  if (ok) {
    to_wit(&out, ret);
  } else {
    transform_string_dup(&err->message, error.message ? error.message : "batch failed");
    err->retryable = error.retryable;
  }
  sluice_plugin_types_record_batch_free(raw);
  sluice_plugin_types_batch_context_free(ctx);
  return ok;
}
