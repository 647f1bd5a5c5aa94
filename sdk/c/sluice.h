/* The C SDK for sluice transforms.
 *
 * Owns the guest side of the `sluice:plugin` world for C: it hides the
 * columnar batch behind `sluice_next` (one record at a time) and the
 * columnar output behind a row builder. A transform defines two functions:
 *
 *   bool sluice_init(const char *params, size_t len, char **error);
 *   bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error);
 *
 *   bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error) {
 *     static const char *names[] = {"offset", "value"};
 *     static const sluice_kind kinds[] = {SLUICE_INT64, SLUICE_TEXT};
 *     int t = sluice_target(out, "out", names, kinds, 2);
 *     sluice_record r;
 *     while (sluice_next(batch, &r)) {
 *       if (!r.value) { sluice_reject(out, &r, "no value"); continue; }
 *       sluice_row(out, t);
 *       sluice_int(out, r.offset);
 *       sluice_text(out, (const char *)r.value, r.value_len);
 *     }
 *     return true;
 *   }
 *
 * Built with `sluice build` (clang for wasm32-wasi with wasi-libc, the
 * bindings from `wit-bindgen c`, the WASI preview-1 adapter). The host gives
 * the module a fixed clock (the batch time), seeded random, no files and no
 * network. Everything the SDK allocates for a batch is freed by the
 * bindings after the host has copied the output.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One input record. `key` and `value` are NULL when null; they point into
 * the batch and live as long as it. */
typedef struct sluice_record {
  uint32_t index;
  const char *topic;
  size_t topic_len;
  int32_t partition;
  int64_t offset;
  int64_t timestamp;
  const uint8_t *key;
  size_t key_len;
  const uint8_t *value;
  size_t value_len;
  /* Headers: `header_count` of them, read with `sluice_header`. */
  uint32_t header_count;
  /* Where its headers start (for `sluice_header`; not for the transform). */
  uint32_t first_header;
  size_t header_names_at, header_values_at;
} sluice_record;

typedef struct sluice_batch sluice_batch;
typedef struct sluice_output sluice_output;

/* A failure of the whole batch (not a trap): set `message` (it is copied)
 * and `retryable`, and return false from `sluice_process`. */
typedef struct sluice_error {
  const char *message;
  bool retryable;
} sluice_error;

typedef enum sluice_kind {
  SLUICE_INT64,
  SLUICE_FLOAT64,
  SLUICE_TEXT,
  SLUICE_BYTES,
  SLUICE_BOOL,
} sluice_kind;

typedef enum sluice_level {
  SLUICE_DEBUG,
  SLUICE_INFO,
  SLUICE_WARN,
  SLUICE_ERROR,
} sluice_level;

/* What the transform implements. `params` is the pipeline's JSON; on a
 * refusal, set `*error` to a malloc'd message and return false. */
bool sluice_init(const char *params, size_t len, char **error);
bool sluice_process(sluice_batch *batch, sluice_output *out, sluice_error *error);

/* The batch: its records in order, its size, its plan. */
bool sluice_next(sluice_batch *batch, sluice_record *record);
size_t sluice_batch_len(const sluice_batch *batch);
int64_t sluice_batch_time_ms(const sluice_batch *batch);
uint64_t sluice_batch_seed(const sluice_batch *batch);
/* Header `i` (0-based) of `record`: its name and value (NULL when null). */
bool sluice_header(const sluice_batch *batch, const sluice_record *record, uint32_t i,
                   const char **name, size_t *name_len, const uint8_t **value, size_t *value_len);

/* Declares a target with its columns (in order); returns its handle.
 * Declaring the same name again returns the same handle. */
int sluice_target(sluice_output *out, const char *name, const char *const *columns,
                  const sluice_kind *kinds, size_t count);
/* Starts a row of `target`; then one call per column, in declared order. */
void sluice_row(sluice_output *out, int target);
void sluice_int(sluice_output *out, int64_t value);
void sluice_float(sluice_output *out, double value);
void sluice_text(sluice_output *out, const char *text, size_t len);
/* `bytes` as UTF-8 text, each maximal invalid subsequence replaced by
 * U+FFFD (as Rust's from_utf8_lossy, Python's "replace" and JavaScript's
 * TextDecoder do): a malloc'd, NUL-terminated copy the caller frees, its
 * length in `*out_len`. */
char *sluice_lossy_text(const uint8_t *bytes, size_t len, size_t *out_len);
void sluice_bytes(sluice_output *out, const uint8_t *bytes, size_t len);
void sluice_bool(sluice_output *out, bool value);
void sluice_null(sluice_output *out);
/* Makes `record` a dead letter with `reason`. */
void sluice_reject(sluice_output *out, const sluice_record *record, const char *reason);

/* Deterministic logging, buffered by the host per batch. */
void sluice_log(sluice_level level, const char *message);

/* Keyed state of the partition `record` came from, as the record sees it:
 * the state as the batch started plus the batch's own earlier writes. The
 * host commits what the batch writes with its rows and offsets, exactly
 * once, and replays it in `sluice verify`. Keys are at most 255 bytes;
 * values at most `limits.max_state_value_kib` (past either, the call traps
 * and the record becomes a dead letter).
 *
 * The value under `key`: true with a malloc'd copy in `*value` (the caller
 * frees it; NULL when empty) and its length, false if absent or expired. */
bool sluice_state_get(const sluice_record *record, const uint8_t *key, size_t key_len,
                      uint8_t **value, size_t *value_len);
/* Stores `value` under `key`. */
void sluice_state_set(const sluice_record *record, const uint8_t *key, size_t key_len,
                      const uint8_t *value, size_t value_len);
/* Stores `value` under `key` until `expires_at_ms` (ms since the epoch):
 * batches whose batch time is at or past it read it as absent. Expiry
 * follows batch time (`sluice_batch_time_ms`) or a time the module
 * computes, never the host's clock. */
void sluice_state_set_expiring(const sluice_record *record, const uint8_t *key, size_t key_len,
                               const uint8_t *value, size_t value_len, int64_t expires_at_ms);
/* Removes `key`. */
void sluice_state_delete(const sluice_record *record, const uint8_t *key, size_t key_len);
/* The integer under `key` (decimal text: an optional `-` then digits, in
 * int64's range): true with it in `*value`; false if absent or anything
 * else. The same bytes as every SDK's integer helpers. */
bool sluice_state_get_i64(const sluice_record *record, const uint8_t *key, size_t key_len,
                          int64_t *value);
/* Stores `value` under `key` as decimal text. */
void sluice_state_set_i64(const sluice_record *record, const uint8_t *key, size_t key_len,
                          int64_t value);
/* Decimal text to int64 (an optional `-` then digits, nothing else, in
 * range): true with it in `*out`. */
bool sluice_parse_i64(const uint8_t *text, size_t len, int64_t *out);

/* Event time of the partition record `index` (a record's `index`, or a
 * fired timer's) came from. A partition's watermark is the highest event
 * time of its records so far minus `event_time.allowed_lateness_ms`, kept
 * in its state by the host; a timer comes due once the watermark reaches
 * its time, in the batch that moved it there (`sluice_due_timers`). Times
 * are ms since the Unix epoch.
 *
 * The partition's watermark just before record `index`: as the batch
 * started, moved by the partition's records before it; false before its
 * first record. */
bool sluice_time_watermark(uint32_t index, int64_t *watermark);
/* Sets the record's event time (default: its Kafka timestamp). Call it (or
 * `sluice_time_clear_event_time`) in record order, before the watermark of
 * later records and before `sluice_due_timers`. */
void sluice_time_set_event_time(uint32_t index, int64_t time_ms);
/* Leaves the record out of the watermark: it has no event time (a record
 * no window takes: no key, not parseable). */
void sluice_time_clear_event_time(uint32_t index);
/* Sets the timer (`key`, `at_ms`) on the partition (`key` at most 245
 * bytes); setting it again is one timer (and empties its value). */
void sluice_time_set_timer(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms);
/* Sets the timer (`key`, `at_ms`) keeping `value` with it (bounded like a
 * state value), handed back in the fired timer's `value`: state that lives
 * as long as the timer, one stored entry where a state key and a timer
 * would take two. Setting it again replaces the value. */
void sluice_time_set_timer_value(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms,
                                 const uint8_t *value, size_t value_len);
/* The value kept with the timer (`key`, `at_ms`): false if there is no
 * such timer (never set, deleted, fired); empty if set by
 * `sluice_time_set_timer`. On true, free `*value`. */
bool sluice_time_timer_value(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms,
                             uint8_t **value, size_t *value_len);
/* Removes the timer (`key`, `at_ms`) of the partition. */
void sluice_time_delete_timer(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms);
/* Makes the record a dead letter of kind `late` with `reason`. */
void sluice_time_late(uint32_t index, const char *reason);

/* A timer that came due: `index` names its partition. */
typedef struct sluice_fired_timer {
  uint32_t index;
  const uint8_t *key;
  size_t key_len;
  int64_t at_ms;
  /* What `sluice_time_set_timer_value` kept with it (empty for
   * `sluice_time_set_timer`). */
  const uint8_t *value;
  size_t value_len;
} sluice_fired_timer;

/* The timers `sluice_due_timers` returned; free with
 * `sluice_fired_timers_free`. */
typedef struct sluice_fired_timers {
  sluice_fired_timer *timers;
  size_t count;
  void *raw; /* the bindings' list the keys and values point into */
} sluice_fired_timers;

/* Moves each partition's watermark past the batch's records and returns
 * the timers that came due by it, oldest first, each once (they are
 * removed as they are returned). What the module writes and emits for
 * them commits with this batch. */
sluice_fired_timers sluice_due_timers(void);
void sluice_fired_timers_free(sluice_fired_timers *timers);
/* A record that names the timer's partition, for the state calls (only
 * its `index` is set). */
sluice_record sluice_timer_record(const sluice_fired_timer *timer);
/* The topic and partition of record `index` (or a timer's index). */
bool sluice_partition_of(const sluice_batch *batch, uint32_t index, const char **topic,
                         size_t *topic_len, int32_t *partition);

#ifdef __cplusplus
}
#endif

#endif
