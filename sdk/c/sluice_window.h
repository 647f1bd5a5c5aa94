/* Event-time windows for C transforms, on keyed state and timers:
 * tumbling, hopping and session windows per user key, each with a user
 * aggregate, emitted once when the partition's watermark passes their end
 * (and, optionally, early on every batch that changes them). A record
 * whose windows have all closed is a dead letter of kind `late`, never
 * dropped, or, with `retain_ms`, updates a window that closed less than
 * that ago (handed out again as an update).
 *
 * It keeps windows in state exactly as the Rust, Python and JavaScript
 * SDKs do (docs/event-time.md), so a windowed transform gives the same
 * rows, state and digest in any of them.
 *
 *   static sluice_take take(const sluice_record *r, sluice_event *event, const char **reason, void *ctx);
 *   static void emit(sluice_output *out, const sluice_window_value *w, void *ctx);
 *   sluice_windowed w = {.windows = {SLUICE_TUMBLING, .size_ms = 60000},
 *                        .aggregate = &my_aggregate};
 *   sluice_windowed_run(&w, batch, out, take, emit, ctx);
 *
 * It must not read the host's clock or keep anything between batches
 * outside state. */
#ifndef SLUICE_WINDOW_H
#define SLUICE_WINDOW_H

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sluice_window_kind {
  /* Back-to-back windows of `size_ms`, aligned to the Unix epoch. */
  SLUICE_TUMBLING,
  /* Windows of `size_ms` starting every `hop_ms`, aligned to the epoch. */
  SLUICE_HOPPING,
  /* Records of a key less than `gap_ms` apart, together: a session ends
   * `gap_ms` after its last record. */
  SLUICE_SESSION,
} sluice_window_kind;

typedef struct sluice_windows {
  sluice_window_kind kind;
  int64_t size_ms, hop_ms, gap_ms;
} sluice_windows;

/* What a window computes over its records. An accumulator is
 * `acc_size` bytes the SDK allocates; `encode` gives the bytes state keeps
 * (malloc'd, the SDK frees them), `decode` reads them back (false: not
 * an accumulator) and must give back what `encode` was given, as in the
 * other SDKs, which keep a window's value in memory within a batch.
 * `ctx` is the one `sluice_windowed_run` was given. */
typedef struct sluice_aggregate {
  size_t acc_size;
  void (*init)(void *acc, void *ctx);
  void (*add)(void *acc, const void *input, void *ctx);
  /* Two sessions' accumulators joined into `acc` (sessions only). */
  void (*merge)(void *acc, const void *other, void *ctx);
  uint8_t *(*encode)(const void *acc, size_t *len, void *ctx);
  bool (*decode)(void *acc, const uint8_t *data, size_t len, void *ctx);
} sluice_aggregate;

typedef struct sluice_windowed {
  sluice_windows windows;
  const sluice_aggregate *aggregate;
  /* Also hand out every open window a batch changed, as early. */
  bool early;
  /* Keep each closed window this much more event time: a record behind
   * the watermark whose window ended less than `retain_ms` before it
   * updates the window (handed out again as an update, once per batch)
   * instead of becoming a `late` dead letter; a closed session only if
   * the record's time is within its records (first to last), so its
   * bounds never move. 0: no updates. */
  int64_t retain_ms;
} sluice_windowed;

/* What `take` says of a record. */
typedef enum sluice_take {
  /* In the windows of `event->key` at its time, bringing `event->input`. */
  SLUICE_TAKE_EVENT,
  /* In no window. */
  SLUICE_TAKE_IGNORED,
  /* In no window: a `rejected` dead letter with `*reason`. */
  SLUICE_TAKE_REJECTED,
} sluice_take;

/* A record's event: its user key and the aggregate's input (both live
 * until the next `take`), its event time (`has_time` false: its Kafka
 * timestamp). */
typedef struct sluice_event {
  const uint8_t *key;
  size_t key_len;
  bool has_time;
  int64_t time_ms;
  const void *input;
} sluice_event;

/* Why a window's value is handed out. */
typedef enum sluice_emit_kind {
  /* The watermark passed the window's end: handed out once. */
  SLUICE_EMIT_FINAL,
  /* The batch changed the window, which is still open (with `early`). */
  SLUICE_EMIT_EARLY,
  /* Late records changed the closed window (with `retain_ms`), once per
   * batch that changed it. */
  SLUICE_EMIT_UPDATE,
} sluice_emit_kind;

/* A window's value, handed to `emit`. Pointers live until `emit`
 * returns. */
typedef struct sluice_window_value {
  const char *topic;
  size_t topic_len;
  int32_t partition;
  const uint8_t *key;
  size_t key_len;
  int64_t start_ms, end_ms;
  const void *acc;
  sluice_emit_kind emit;
  /* Names the window's partition in state calls. */
  uint32_t index;
} sluice_window_value;

typedef sluice_take (*sluice_take_fn)(const sluice_record *record, sluice_event *event,
                                      const char **reason, void *ctx);
typedef void (*sluice_emit_fn)(sluice_output *out, const sluice_window_value *window, void *ctx);

/* Runs the batch: `take` says once per record what it brings (a record in
 * no window does not move the watermark, so a malformed record's Kafka
 * timestamp cannot close windows); each event goes into its windows, or
 * updates retained ones, or becomes a `late` dead letter; then every
 * window the watermark passed is handed to `emit` once, as final, every
 * retained window late records changed as an update (and, with `early`,
 * every open window the batch changed as early). It reads the batch to
 * its end. */
void sluice_windowed_run(const sluice_windowed *windowed, sluice_batch *batch, sluice_output *out,
                         sluice_take_fn take, sluice_emit_fn emit, void *ctx);

#ifdef __cplusplus
}
#endif

#endif
