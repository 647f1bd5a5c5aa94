/* The C SDK's event-time windows (sluice_window.h): the Rust SDK's
 * `sluice_plugin::window` in C, over the same state layout.
 *
 * What it costs a record: a host call for its event time; the host's
 * watermark only when one of its windows may have closed (`watermark`); a
 * tumbling or hopping window is read from its timer and written back once
 * a batch (`helds`), whatever the number of its records.
 *
 * It must not read the host's clock or keep anything between batches
 * outside state. Memory it allocates is freed before it returns. */
#include "sluice_window.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX_LEN 9
static const uint8_t WINDOW_PREFIX[PREFIX_LEN] = "sluice/w/";
static const uint8_t SESSION_PREFIX[PREFIX_LEN] = "sluice/s/";
static const uint8_t RETAINED_PREFIX[PREFIX_LEN] = "sluice/r/";
static const uint8_t RETAINED_SESSION_PREFIX[PREFIX_LEN] = "sluice/t/";
/* The tag before a window's aggregate in its closing timer's value. */
#define WINDOW_TAG 1

static void *alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}

/* Room for one more item in an array of `count` items of `size` bytes
 * (`*cap` of them allocated): doubled when full, `first` to start. */
static void *room_for_one(void *items, size_t count, size_t *cap, size_t size, size_t first) {
  if (count < *cap) return items;
  *cap = *cap ? *cap * 2 : first;
  items = realloc(items, *cap * size);
  if (!items) abort();
  return items;
}

static uint8_t *copy_bytes(const uint8_t *data, size_t len) {
  uint8_t *copy = alloc(len);
  if (len) memcpy(copy, data, len);
  return copy;
}

static void put_be(uint8_t *p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static uint64_t get_be(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
  return v;
}

/* `prefix` (`sluice/w/` or `sluice/r/`) + end (8 bytes that sort as the
 * numbers do) + key. */
static uint8_t *window_key(const uint8_t *prefix, int64_t end, const uint8_t *key, size_t key_len,
                           size_t *len) {
  *len = PREFIX_LEN + 8 + key_len;
  uint8_t *at = alloc(*len);
  memcpy(at, prefix, PREFIX_LEN);
  put_be(at + PREFIX_LEN, (uint64_t)end ^ (1ull << 63), 8);
  if (key_len) memcpy(at + PREFIX_LEN + 8, key, key_len);
  return at;
}

typedef struct session {
  int64_t start, end;
  const uint8_t *acc;
  size_t acc_len;
} session;

/* The sessions of a key, in start order; `data` holds their bytes. */
typedef struct sessions {
  session *items;
  size_t count;
  uint8_t *data;
  uint8_t *key; /* `prefix` (`sluice/s/` or `sluice/t/`) + the user key */
  size_t key_len;
} sessions;

static sessions read_sessions(const sluice_record *r, const uint8_t *prefix, const uint8_t *key,
                              size_t key_len) {
  sessions s = {0};
  s.key_len = PREFIX_LEN + key_len;
  s.key = alloc(s.key_len);
  memcpy(s.key, prefix, PREFIX_LEN);
  if (key_len) memcpy(s.key + PREFIX_LEN, key, key_len);
  size_t len = 0;
  if (!sluice_state_get(r, s.key, s.key_len, &s.data, &len)) s.data = NULL, len = 0;
  /* One spare slot: a session may be added. */
  size_t cap = 1;
  s.items = alloc(cap * sizeof *s.items);
  for (size_t at = 0; at + 20 <= len;) {
    size_t n = (size_t)get_be(s.data + at + 16, 4);
    if (s.count + 1 == cap) {
      cap *= 2;
      s.items = realloc(s.items, cap * sizeof *s.items);
      if (!s.items) abort();
    }
    size_t room = len - at - 20;
    s.items[s.count++] = (session){(int64_t)get_be(s.data + at, 8), (int64_t)get_be(s.data + at + 8, 8),
                                   s.data + at + 20, n < room ? n : room};
    at += 20 + n;
  }
  return s;
}

static void write_sessions(const sluice_record *r, const sessions *s, const session *items,
                           size_t count) {
  if (count == 0) {
    sluice_state_delete(r, s->key, s->key_len);
    return;
  }
  size_t len = 0;
  for (size_t i = 0; i < count; i++) len += 20 + items[i].acc_len;
  uint8_t *value = alloc(len), *at = value;
  for (size_t i = 0; i < count; i++) {
    put_be(at, (uint64_t)items[i].start, 8);
    put_be(at + 8, (uint64_t)items[i].end, 8);
    put_be(at + 16, items[i].acc_len, 4);
    if (items[i].acc_len) memcpy(at + 20, items[i].acc, items[i].acc_len);
    at += 20 + items[i].acc_len;
  }
  sluice_state_set(r, s->key, s->key_len, value, len);
  free(value);
}

static void free_sessions(sessions *s) {
  free(s->items), free(s->data), free(s->key);
}

/* Sessions in start order, the new one after those it ties with. */
static void sort_sessions(session *items, size_t count) {
  for (size_t i = 1; i < count; i++) {
    session s = items[i];
    size_t j = i;
    for (; j > 0 && items[j - 1].start > s.start; j--) items[j] = items[j - 1];
    items[j] = s;
  }
}

/* Removes item `i` of `s` and writes the rest. */
static void remove_session(const sluice_record *r, sessions *s, size_t i) {
  memmove(&s->items[i], &s->items[i + 1], (s->count - i - 1) * sizeof *s->items);
  s->count--;
  write_sessions(r, s, s->items, s->count);
}

/* A window a batch changed, for early or update rows. */
typedef struct touch {
  uint32_t index;
  const char *topic;
  size_t topic_len;
  int32_t partition;
  uint8_t *key;
  size_t key_len;
  int64_t end;
  size_t order;
} touch;

typedef struct touches {
  touch *items;
  size_t count, cap;
} touches;

/* A window as it was when it closed: its final value. */
typedef struct closed {
  uint32_t index;
  uint8_t *key;
  size_t key_len;
  int64_t start, end;
  uint8_t *data;
  size_t len;
} closed;

typedef struct closeds {
  closed *items;
  size_t count, cap;
} closeds;

/* What a batch knows of a partition's watermark without asking the host:
 * at least the watermark before its next record, once `known` (`has`: the
 * partition has one, at most `at`). */
typedef struct ceiling {
  const char *topic;
  size_t topic_len;
  int32_t partition;
  bool known, has;
  int64_t at;
} ceiling;

typedef struct ceilings {
  ceiling *items;
  size_t count, cap;
} ceilings;

/* A partition's watermark just before a record, asked of the host only
 * when a window's fate depends on it. Its ceiling is the higher of the
 * watermark the host told for one of the partition's records in the batch
 * and the event times of its records since: the watermark (highest event
 * time minus a lateness never negative, never falling) is at most that, so
 * a window whose last millisecond is past it is open for sure. */
typedef struct watermark {
  uint32_t index;
  ceiling *ceiling;
  bool told, has;
  int64_t at;
} watermark;

/* An open window a batch holds: read from its closing timer once, its
 * aggregate's bytes kept here as records change it, written back once. */
typedef struct held {
  touch at; /* its partition, key and end; a record of its partition, to
             * name it to the host (`order` unused) */
  uint64_t hash;
  bool found; /* it has an aggregate (else init) */
  bool taken; /* a late record closed it: not written back */
  uint8_t *data;
  size_t len;
} held;

/* The open tumbling and hopping windows a batch adds records to, in the
 * order first read (the order they are written back in), found by an
 * open-addressing table of positions + 1 (0: empty), hashed with the
 * batch's seed. The host keeps a timer's last value, so what the batch
 * commits is the same. Written back before the batch asks for its due
 * timers; a window a late record closes is let go (`take_held`). */
typedef struct helds {
  held *items;
  size_t count, cap;
  size_t *slots;
  size_t slot_count;
  uint64_t seed;
} helds;

/* One run's context: what every step needs. */
typedef struct run {
  const sluice_windowed *w;
  sluice_batch *batch;
  sluice_output *out;
  sluice_emit_fn emit;
  void *ctx;
  touches *early;  /* open windows changed; NULL unless early */
  touches updated; /* closed windows late records changed */
  closeds closed;  /* windows a late record reached before their timer */
  helds held;      /* open windows changed */
  ceilings ceilings;
  void *acc, *other; /* two accumulators, reused */
} run;

static void touch_window(touches *t, const sluice_record *r, const uint8_t *key, size_t key_len,
                         int64_t end) {
  if (!t) return;
  t->items = room_for_one(t->items, t->count, &t->cap, sizeof *t->items, 64);
  t->items[t->count] =
      (touch){r->index, r->topic, r->topic_len, r->partition, copy_bytes(key, key_len), key_len, end, t->count};
  t->count++;
}

static void push_closed(run *run, uint32_t index, const uint8_t *key, size_t key_len, int64_t start,
                        int64_t end, const uint8_t *data, size_t len) {
  closeds *c = &run->closed;
  c->items = room_for_one(c->items, c->count, &c->cap, sizeof *c->items, 16);
  c->items[c->count++] =
      (closed){index, copy_bytes(key, key_len), key_len, start, end, copy_bytes(data, len), len};
}

/* What `decode` is given for an empty value (which a state read returns
 * as NULL). */
static const uint8_t NO_BYTES[1] = {0};

static int64_t rem_euclid(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r < 0 ? r + b : r;
}

/* The watermark, if the partition has one (into *wm). */
static bool watermark_get(watermark *m, int64_t *wm) {
  if (!m->told) {
    m->has = sluice_time_watermark(m->index, &m->at);
    m->told = true;
  }
  *wm = m->at;
  return m->has;
}

/* Whether the watermark has reached `at_ms` (a window's last
 * millisecond): the window has closed. */
static bool watermark_reached(watermark *m, int64_t at_ms) {
  const ceiling *c = m->ceiling;
  if (c->known && (!c->has || at_ms > c->at)) return false;
  int64_t wm;
  return watermark_get(m, &wm) && at_ms <= wm;
}

/* Moves the ceiling past a record at `time` whose watermark was `m`. */
static void watermark_passed(watermark *m, int64_t time) {
  ceiling *c = m->ceiling;
  if (m->told) c->known = true, c->has = m->has, c->at = m->at;
  if (c->known && (!c->has || time > c->at)) c->has = true, c->at = time;
}

/* The ceiling of `r`'s partition. */
static ceiling *ceiling_of(ceilings *cs, const sluice_record *r) {
  for (size_t i = cs->count; i-- > 0;) {
    ceiling *c = &cs->items[i];
    if (c->partition == r->partition && c->topic_len == r->topic_len &&
        memcmp(c->topic, r->topic, r->topic_len) == 0)
      return c;
  }
  cs->items = room_for_one(cs->items, cs->count, &cs->cap, sizeof *cs->items, 4);
  cs->items[cs->count] = (ceiling){r->topic, r->topic_len, r->partition, false, false, 0};
  return &cs->items[cs->count++];
}

/* FNV-1a over the window's partition, key and end, from the seed. */
static uint64_t held_hash(uint64_t seed, const sluice_record *r, const uint8_t *key, size_t key_len,
                          int64_t end) {
  uint64_t h = 14695981039346656037ull ^ seed;
  for (size_t i = 0; i < r->topic_len; i++) h = (h ^ (uint8_t)r->topic[i]) * 1099511628211ull;
  for (size_t i = 0; i < key_len; i++) h = (h ^ key[i]) * 1099511628211ull;
  uint64_t tail[2] = {(uint64_t)r->partition, (uint64_t)end};
  for (int i = 0; i < 2; i++)
    for (int b = 0; b < 64; b += 8) h = (h ^ ((tail[i] >> b) & 0xff)) * 1099511628211ull;
  return h;
}

static int compare_window(const touch *x, const touch *y);

/* Where the window is in the table: its slot (holding it, or empty). */
static size_t held_slot(const helds *h, uint64_t hash, const sluice_record *r, const uint8_t *key,
                        size_t key_len, int64_t end) {
  /* Only read: the key is not copied. */
  touch probe = {r->index, r->topic, r->topic_len, r->partition, (uint8_t *)key, key_len, end, 0};
  size_t mask = h->slot_count - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    if (!h->slots[i]) return i;
    const held *x = &h->items[h->slots[i] - 1];
    if (x->hash == hash && compare_window(&x->at, &probe) == 0) return i;
  }
}

/* Doubles the table (kept at most half full). */
static void held_grow(helds *h) {
  size_t count = h->slot_count ? h->slot_count * 2 : 256;
  size_t *slots = calloc(count, sizeof *slots);
  if (!slots) abort();
  for (size_t j = 0; j < h->count; j++) {
    size_t i = h->items[j].hash & (count - 1);
    while (slots[i]) i = (i + 1) & (count - 1);
    slots[i] = j + 1;
  }
  free(h->slots);
  h->slots = slots, h->slot_count = count;
}

static bool open_window(const sluice_record *r, const uint8_t *key, size_t key_len, int64_t end,
                        bool take, uint8_t **data, size_t *len);

/* The held window of `key` ending at `end` in `r`'s partition, read from
 * its timer the first time. */
static held *get_held(helds *h, const sluice_record *r, const uint8_t *key, size_t key_len, int64_t end) {
  if ((h->count + 1) * 2 > h->slot_count) held_grow(h);
  uint64_t hash = held_hash(h->seed, r, key, key_len, end);
  size_t slot = held_slot(h, hash, r, key, key_len, end);
  if (h->slots[slot]) {
    held *x = &h->items[h->slots[slot] - 1];
    if (x->taken) {
      free(x->data);
      x->data = NULL, x->len = 0, x->taken = false;
      x->found = open_window(r, key, key_len, end, true, &x->data, &x->len);
    }
    return x;
  }
  h->items = room_for_one(h->items, h->count, &h->cap, sizeof *h->items, 256);
  held *x = &h->items[h->count];
  touch at = {r->index, r->topic, r->topic_len, r->partition, copy_bytes(key, key_len), key_len, end, 0};
  *x = (held){at, hash, false, false, NULL, 0};
  x->found = open_window(r, key, key_len, end, true, &x->data, &x->len);
  h->slots[slot] = ++h->count;
  return x;
}

/* Lets the held window go (a late record closed it): true and its
 * aggregate (into *data: free it) if it was held. */
static bool take_held(helds *h, const sluice_record *r, const uint8_t *key, size_t key_len, int64_t end,
                      bool *found, uint8_t **data, size_t *len) {
  if (!h->slot_count) return false;
  uint64_t hash = held_hash(h->seed, r, key, key_len, end);
  size_t slot = held_slot(h, hash, r, key, key_len, end);
  if (!h->slots[slot]) return false;
  held *x = &h->items[h->slots[slot] - 1];
  if (x->taken) return false;
  x->taken = true;
  *found = x->found, *data = x->data, *len = x->len;
  x->data = NULL, x->len = 0;
  return true;
}

/* Writes every held window back to its closing timer, and frees them. */
static void write_back(helds *h) {
  for (size_t j = 0; j < h->count; j++) {
    held *x = &h->items[j];
    if (!x->taken) {
      uint8_t *value = alloc(x->len + 1);
      value[0] = WINDOW_TAG;
      if (x->len) memcpy(value + 1, x->data, x->len);
      sluice_time_set_timer_value(x->at.index, x->at.key, x->at.key_len, x->at.end - 1, value, x->len + 1);
      free(value);
    }
    free(x->at.key), free(x->data);
  }
  free(h->items), free(h->slots);
  *h = (helds){.seed = h->seed};
}

/* Whether a window ending at `end`, closed by the watermark `wm`, still
 * takes late records. */
static bool retained(const run *run, int64_t end, int64_t wm) {
  return run->w->retain_ms > 0 && end - 1 + run->w->retain_ms > wm;
}

/* `data` (found or not) decoded into run->acc, or init; `input` added;
 * the result encoded (free it). */
static uint8_t *add_input(run *run, bool found, const uint8_t *data, size_t len, const void *input,
                          size_t *out_len) {
  const sluice_aggregate *agg = run->w->aggregate;
  if (!found || !agg->decode(run->acc, data ? data : NO_BYTES, len, run->ctx)) agg->init(run->acc, run->ctx);
  agg->add(run->acc, input, run->ctx);
  return agg->encode(run->acc, out_len, run->ctx);
}

/* add_input, stored in state under `at`. */
static void add_and_store(run *run, const sluice_record *r, const uint8_t *at, size_t at_len,
                          bool found, const uint8_t *data, size_t len, const void *input) {
  size_t out_len;
  uint8_t *encoded = add_input(run, found, data, len, input, &out_len);
  sluice_state_set(r, at, at_len, encoded, out_len);
  free(encoded);
}

/* add_input, kept in the held window `x` (written back at the batch's
 * end). */
static void add_and_hold(run *run, held *x, const void *input) {
  size_t out_len;
  uint8_t *encoded = add_input(run, x->found, x->data, x->len, input, &out_len);
  free(x->data);
  x->data = encoded, x->len = out_len, x->found = true;
}

/* The bytes under `prefix` + `end` + `key` (into *data: free it),
 * removed from state when `take`. */
static bool read_window(const sluice_record *r, const uint8_t *prefix, const uint8_t *key, size_t key_len,
                        int64_t end, bool take, uint8_t **data, size_t *len) {
  size_t at_len;
  uint8_t *at = window_key(prefix, end, key, key_len, &at_len);
  bool found = sluice_state_get(r, at, at_len, data, len);
  if (found && take) sluice_state_delete(r, at, at_len);
  free(at);
  return found;
}

/* The aggregate of `key`'s window ending at `end` kept by its closing
 * timer's `value` or, for a window opened before timer values, under its
 * old key (removed when `take`, as its timer is about to hold it): a
 * copy in *data. */
static bool window_in(const sluice_record *r, const uint8_t *value, size_t value_len, const uint8_t *key,
                      size_t key_len, int64_t end, bool take, uint8_t **data, size_t *len) {
  if (value_len > 0 && value[0] == WINDOW_TAG) {
    *len = value_len - 1;
    *data = copy_bytes(value + 1, *len);
    return true;
  }
  return read_window(r, WINDOW_PREFIX, key, key_len, end, take, data, len);
}

/* The aggregate of `key`'s open window ending at `end`: false if no timer
 * closes one there. */
static bool open_window(const sluice_record *r, const uint8_t *key, size_t key_len, int64_t end,
                        bool take, uint8_t **data, size_t *len) {
  uint8_t *value = NULL;
  size_t value_len = 0;
  if (!sluice_time_timer_value(r->index, key, key_len, end - 1, &value, &value_len)) return false;
  bool found = window_in(r, value, value_len, key, key_len, end, take, data, len);
  free(value);
  return found;
}

/* Sets a timer without a value (a retention's), unless the timer exists:
 * it may hold a window, and fires at the same time anyway. */
static void set_bare_timer(uint32_t index, const uint8_t *key, size_t key_len, int64_t at_ms) {
  uint8_t *value = NULL;
  size_t len = 0;
  if (sluice_time_timer_value(index, key, key_len, at_ms, &value, &len)) {
    free(value);
    return;
  }
  sluice_time_set_timer(index, key, key_len, at_ms);
}

/* Adds a late event to the closed window [start, end) if it is retained
 * (closing it first if its timer has not yet). */
static bool update_closed_window(run *run, const sluice_record *r, const sluice_event *e, int64_t start,
                                 int64_t end, int64_t wm) {
  if (!retained(run, end, wm)) return false;
  size_t at_len, len = 0;
  uint8_t *at = window_key(RETAINED_PREFIX, end, e->key, e->key_len, &at_len), *data = NULL;
  bool found = sluice_state_get(r, at, at_len, &data, &len);
  if (!found) {
    if (!take_held(&run->held, r, e->key, e->key_len, end, &found, &data, &len))
      found = open_window(r, e->key, e->key_len, end, true, &data, &len);
    if (found) {
      /* Its timer stays, without the window: it may also forget a
       * retained one. */
      sluice_time_set_timer(r->index, e->key, e->key_len, end - 1);
      push_closed(run, r->index, e->key, e->key_len, start, end, data, len);
    }
    set_bare_timer(r->index, e->key, e->key_len, end - 1 + run->w->retain_ms);
  }
  add_and_store(run, r, at, at_len, found, data, len, e->input);
  free(data), free(at);
  touch_window(&run->updated, r, e->key, e->key_len, end);
  return true;
}

static bool add_to_windows(run *run, const sluice_record *r, const sluice_event *e, int64_t time,
                           watermark *m) {
  int64_t size = run->w->windows.size_ms;
  int64_t hop = run->w->windows.kind == SLUICE_HOPPING ? run->w->windows.hop_ms : size;
  int64_t latest = time - rem_euclid(time, hop);
  size_t windows = 0;
  for (int64_t start = latest; start > time - size; start -= hop) windows++;
  bool added = false;
  for (size_t i = windows; i-- > 0;) {
    int64_t end = latest - (int64_t)i * hop + size;
    if (watermark_reached(m, end - 1)) {
      if (update_closed_window(run, r, e, end - size, end, m->at)) added = true;
      continue;
    }
    add_and_hold(run, get_held(&run->held, r, e->key, e->key_len, end), e->input);
    touch_window(run->early, r, e->key, e->key_len, end);
    added = true;
  }
  return added;
}

/* The first session of `s` holding `time` within its records (first to
 * last) that is still retained (and, if `closed_only`, closed by `wm`);
 * s->count if none. */
static size_t holding(const run *run, const sessions *s, int64_t time, int64_t wm, bool closed_only) {
  int64_t gap = run->w->windows.gap_ms;
  for (size_t i = 0; i < s->count; i++) {
    const session *x = &s->items[i];
    bool closed = x->end - 1 <= wm;
    if ((closed || !closed_only) && retained(run, x->end, wm) && x->start <= time && time <= x->end - gap) {
      return i;
    }
  }
  return s->count;
}

/* Adds a late event to the retained closed session of its key whose
 * records' span holds its time (closing it first if its timer has not
 * yet: `open` are the key's open sessions); false if none. */
static bool update_closed_session(run *run, const sluice_record *r, const sluice_event *e, int64_t time,
                                  int64_t wm, sessions *open) {
  if (run->w->retain_ms <= 0) return false;
  sessions kept = read_sessions(r, RETAINED_SESSION_PREFIX, e->key, e->key_len);
  size_t at = holding(run, &kept, time, wm, false);
  if (at == kept.count) {
    size_t i = holding(run, open, time, wm, true);
    if (i == open->count) {
      free_sessions(&kept);
      return false;
    }
    session s = open->items[i]; /* its bytes stay in open->data */
    remove_session(r, open, i);
    push_closed(run, r->index, e->key, e->key_len, s.start, s.end, s.acc, s.acc_len);
    sluice_time_set_timer(r->index, e->key, e->key_len, s.end - 1 + run->w->retain_ms);
    kept.items[kept.count++] = s;
    sort_sessions(kept.items, kept.count);
    at = holding(run, &kept, time, wm, false);
  }
  const sluice_aggregate *agg = run->w->aggregate;
  session *s = &kept.items[at];
  if (!agg->decode(run->acc, s->acc_len ? s->acc : NO_BYTES, s->acc_len, run->ctx)) agg->init(run->acc, run->ctx);
  agg->add(run->acc, e->input, run->ctx);
  uint8_t *encoded = agg->encode(run->acc, &s->acc_len, run->ctx);
  s->acc = encoded;
  int64_t end = s->end;
  write_sessions(r, &kept, kept.items, kept.count);
  free(encoded);
  free_sessions(&kept);
  touch_window(&run->updated, r, e->key, e->key_len, end);
  return true;
}

static bool add_to_session(run *run, const sluice_record *r, const sluice_event *e, int64_t time,
                           bool has_wm, int64_t wm) {
  const sluice_aggregate *agg = run->w->aggregate;
  int64_t gap = run->w->windows.gap_ms, start = time, end = time + gap;
  sessions s = read_sessions(r, SESSION_PREFIX, e->key, e->key_len);
  bool *meets = alloc(s.count);
  for (size_t i = 0; i < s.count; i++) {
    /* A session the watermark has passed is closed, though its timer fires
     * only at the batch's end: nothing joins it. */
    bool open = !has_wm || s.items[i].end - 1 > wm;
    meets[i] = open && s.items[i].start < time + gap && time < s.items[i].end;
    if (meets[i] && s.items[i].start < start) start = s.items[i].start;
    if (meets[i] && s.items[i].end > end) end = s.items[i].end;
  }
  bool added;
  if (has_wm && end - 1 <= wm) {
    added = update_closed_session(run, r, e, time, wm, &s);
  } else {
    agg->init(run->acc, run->ctx);
    agg->add(run->acc, e->input, run->ctx);
    session *kept = alloc((s.count + 1) * sizeof *kept);
    size_t count = 0;
    for (size_t i = 0; i < s.count; i++) {
      if (!meets[i]) {
        kept[count++] = s.items[i];
        continue;
      }
      /* With a retention, the timer may also forget a closed session. */
      if (s.items[i].end != end && run->w->retain_ms <= 0) {
        sluice_time_delete_timer(r->index, e->key, e->key_len, s.items[i].end - 1);
      }
      if (agg->decode(run->other, s.items[i].acc, s.items[i].acc_len, run->ctx)) {
        agg->merge(run->acc, run->other, run->ctx);
      }
    }
    sluice_time_set_timer(r->index, e->key, e->key_len, end - 1);
    size_t acc_len;
    uint8_t *encoded = agg->encode(run->acc, &acc_len, run->ctx);
    kept[count++] = (session){start, end, encoded, acc_len};
    sort_sessions(kept, count);
    write_sessions(r, &s, kept, count);
    free(encoded), free(kept);
    touch_window(run->early, r, e->key, e->key_len, end);
    added = true;
  }
  free(meets);
  free_sessions(&s);
  return added;
}

static void emit_window(run *run, uint32_t index, const uint8_t *key, size_t key_len, int64_t start,
                        int64_t end, const uint8_t *data, size_t len, sluice_emit_kind why) {
  if (!run->w->aggregate->decode(run->acc, data ? data : NO_BYTES, len, run->ctx)) return;
  const char *topic = "";
  size_t topic_len = 0;
  int32_t partition = 0;
  /* `index` names a record of the batch: its partition is found. */
  (void)sluice_partition_of(run->batch, index, &topic, &topic_len, &partition);
  sluice_window_value w = {topic, topic_len, partition, key, key_len, start, end, run->acc, why, index};
  run->emit(run->out, &w, run->ctx);
}

/* The window (or session) of `key` ending at `end`, open or `kept`
 * (retained): its start and a copy of its bytes, removed from state when
 * `take`. */
static bool find_window(run *run, const sluice_record *r, const uint8_t *key, size_t key_len,
                        int64_t end, bool kept, bool take, int64_t *start, uint8_t **data, size_t *len) {
  if (run->w->windows.kind != SLUICE_SESSION) {
    *start = end - run->w->windows.size_ms;
    if (!kept) return open_window(r, key, key_len, end, take, data, len);
    return read_window(r, RETAINED_PREFIX, key, key_len, end, take, data, len);
  }
  sessions s = read_sessions(r, kept ? RETAINED_SESSION_PREFIX : SESSION_PREFIX, key, key_len);
  size_t i = 0;
  while (i < s.count && s.items[i].end != end) i++;
  bool found = i < s.count;
  if (found) {
    *start = s.items[i].start;
    *len = s.items[i].acc_len;
    *data = copy_bytes(s.items[i].acc, *len);
    if (take) remove_session(r, &s, i);
  }
  free_sessions(&s);
  return found;
}

/* Keeps a closed window for late records. */
static void keep_closed(run *run, const sluice_record *r, const uint8_t *key, size_t key_len, int64_t start,
                        int64_t end, const uint8_t *data, size_t len) {
  if (run->w->windows.kind != SLUICE_SESSION) {
    size_t at_len;
    uint8_t *at = window_key(RETAINED_PREFIX, end, key, key_len, &at_len);
    sluice_state_set(r, at, at_len, data, len);
    free(at);
    return;
  }
  sessions kept = read_sessions(r, RETAINED_SESSION_PREFIX, key, key_len);
  kept.items[kept.count++] = (session){start, end, data, len};
  sort_sessions(kept.items, kept.count);
  write_sessions(r, &kept, kept.items, kept.count);
  free_sessions(&kept);
}

/* Hands out the window `t` closes, as final, keeping it if there is a
 * retention; forgets the retained window it ends. */
static void close_window(run *run, const sluice_fired_timer *t) {
  sluice_record r = sluice_timer_record(t);
  int64_t start, end = t->at_ms + 1, retain = run->w->retain_ms;
  uint8_t *data = NULL;
  size_t len = 0;
  if (retain > 0 && find_window(run, &r, t->key, t->key_len, end - retain, true, true, &start, &data, &len)) {
    free(data), data = NULL, len = 0;
  }
  bool session = run->w->windows.kind == SLUICE_SESSION;
  bool found = session ? find_window(run, &r, t->key, t->key_len, end, false, true, &start, &data, &len)
                       : window_in(&r, t->value, t->value_len, t->key, t->key_len, end, true, &data, &len);
  if (!found) return;
  if (!session) start = end - run->w->windows.size_ms;
  if (retain > 0) {
    keep_closed(run, &r, t->key, t->key_len, start, end, data, len);
    if (session) {
      sluice_time_set_timer(t->index, t->key, t->key_len, t->at_ms + retain);
    } else {
      set_bare_timer(t->index, t->key, t->key_len, t->at_ms + retain);
    }
  }
  emit_window(run, t->index, t->key, t->key_len, start, end, data, len, SLUICE_EMIT_FINAL);
  free(data);
}

/* By window: topic, partition, key, end. */
static int compare_window(const touch *x, const touch *y) {
  if (x->topic_len != y->topic_len) return x->topic_len < y->topic_len ? -1 : 1;
  int c = memcmp(x->topic, y->topic, x->topic_len);
  if (c) return c;
  if (x->partition != y->partition) return x->partition < y->partition ? -1 : 1;
  if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
  c = x->key_len ? memcmp(x->key, y->key, x->key_len) : 0;
  if (c) return c;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* By window, then by when first changed. */
static int compare_touch(const void *a, const void *b) {
  const touch *x = a, *y = b;
  int c = compare_window(x, y);
  if (c) return c;
  return x->order < y->order ? -1 : x->order > y->order ? 1 : 0;
}

static int compare_order(const void *a, const void *b) {
  const touch *x = a, *y = b;
  return x->order < y->order ? -1 : x->order > y->order ? 1 : 0;
}

/* Every window in `t` (early: still open; update: still retained), once
 * each, in the order first changed. */
static void emit_changed(run *run, touches *t, sluice_emit_kind why) {
  qsort(t->items, t->count, sizeof *t->items, compare_touch);
  size_t kept = 0;
  for (size_t i = 0; i < t->count; i++) {
    touch *x = &t->items[i];
    if (kept > 0 && compare_window(x, &t->items[kept - 1]) == 0) free(x->key);
    else t->items[kept++] = *x;
  }
  qsort(t->items, kept, sizeof *t->items, compare_order);
  for (size_t i = 0; i < kept; i++) {
    touch *x = &t->items[i];
    sluice_record r = {.index = x->index};
    int64_t start;
    uint8_t *data = NULL;
    size_t len = 0;
    bool kept_window = why == SLUICE_EMIT_UPDATE;
    if (find_window(run, &r, x->key, x->key_len, x->end, kept_window, false, &start, &data, &len)) {
      emit_window(run, x->index, x->key, x->key_len, start, x->end, data, len, why);
    }
    free(data), free(x->key);
  }
  free(t->items);
}

static void take_record(run *run, const sluice_record *r, sluice_take_fn take) {
  sluice_event e = {0};
  const char *reason = "rejected";
  sluice_take taken = take(r, &e, &reason, run->ctx);
  if (taken != SLUICE_TAKE_EVENT) {
    sluice_time_clear_event_time(r->index);
    if (taken == SLUICE_TAKE_REJECTED) sluice_reject(run->out, r, reason);
    return;
  }
  int64_t time = r->timestamp, wm = 0;
  if (e.has_time) {
    time = e.time_ms;
    sluice_time_set_event_time(r->index, time);
  }
  watermark m = {r->index, ceiling_of(&run->ceilings, r), false, false, 0};
  bool added;
  if (run->w->windows.kind == SLUICE_SESSION) {
    bool has_wm = watermark_get(&m, &wm);
    added = add_to_session(run, r, &e, time, has_wm, wm);
  } else {
    added = add_to_windows(run, r, &e, time, &m);
  }
  if (!added) {
    bool has_wm = watermark_get(&m, &wm);
    char shown[32], reason_text[128];
    if (has_wm) snprintf(shown, sizeof shown, "Some(%lld)", (long long)wm);
    else snprintf(shown, sizeof shown, "None");
    snprintf(reason_text, sizeof reason_text,
             "event time %lld is behind the watermark %s: its window has closed", (long long)time, shown);
    sluice_time_late(r->index, reason_text);
  }
  watermark_passed(&m, time);
}

void sluice_windowed_run(const sluice_windowed *windowed, sluice_batch *batch, sluice_output *out,
                         sluice_take_fn take, sluice_emit_fn emit, void *ctx) {
  touches early = {0};
  run run = {windowed, batch, out, emit, ctx, windowed->early ? &early : NULL, {0}, {0},
             {.seed = sluice_batch_seed(batch)}, {0},
             alloc(windowed->aggregate->acc_size), alloc(windowed->aggregate->acc_size)};
  sluice_record r;
  while (sluice_next(batch, &r)) take_record(&run, &r, take);
  write_back(&run.held);
  free(run.ceilings.items);
  sluice_fired_timers due = sluice_due_timers();
  for (size_t i = 0; i < run.closed.count; i++) {
    closed *c = &run.closed.items[i];
    emit_window(&run, c->index, c->key, c->key_len, c->start, c->end, c->data, c->len, SLUICE_EMIT_FINAL);
    free(c->key), free(c->data);
  }
  free(run.closed.items);
  /* Before the timers: one may forget a window this batch updated. */
  emit_changed(&run, &run.updated, SLUICE_EMIT_UPDATE);
  for (size_t i = 0; i < due.count; i++) close_window(&run, &due.timers[i]);
  sluice_fired_timers_free(&due);
  if (run.early) emit_changed(&run, run.early, SLUICE_EMIT_EARLY);
  free(run.acc), free(run.other);
}
