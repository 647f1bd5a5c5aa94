/* The conformance transform in C (docs/languages.md states it; every
 * language's copy must give byte-identical output on the same input).
 * It carries a small strict JSON parser (RFC 8259, UTF-8 checked) of its
 * own, to stay free of dependencies. */
#include "sluice.h"

#include <stdlib.h>
#include <string.h>

bool sluice_init(const char *params, size_t len, char **error) {
  (void)params, (void)len, (void)error;
  return true;
}

/* ---- a minimal JSON reader: what this transform needs of an object ---- */

typedef struct {
  const uint8_t *p, *end;
  /* The fields this transform reads, from the top-level object (last one wins). */
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

static void skip_ws(reader *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static bool utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) { i++; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

static void put_utf8(char *out, size_t *n, uint32_t cp) {
  if (cp < 0x80) out[(*n)++] = (char)cp;
  else if (cp < 0x800) {
    out[(*n)++] = (char)(0xC0 | (cp >> 6));
    out[(*n)++] = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out[(*n)++] = (char)(0xE0 | (cp >> 12));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[(*n)++] = (char)(0x80 | (cp & 0x3F));
  } else {
    out[(*n)++] = (char)(0xF0 | (cp >> 18));
    out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[(*n)++] = (char)(0x80 | (cp & 0x3F));
  }
}

static bool hex4(reader *r, uint32_t *v) {
  if (r->end - r->p < 4) return false;
  *v = 0;
  for (int i = 0; i < 4; i++) {
    uint8_t c = *r->p++;
    *v <<= 4;
    if (c >= '0' && c <= '9') *v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') *v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') *v |= (uint32_t)(c - 'A' + 10);
    else return false;
  }
  return true;
}

/* A string at r->p (after its opening quote); decoded into a malloc'd
 * buffer when `out` is given. */
static bool parse_string(reader *r, char **out, size_t *out_len) {
  char *buf = malloc((size_t)(r->end - r->p) + 1);
  size_t n = 0;
  while (r->p < r->end) {
    uint8_t c = *r->p++;
    if (c == '"') {
      if (out) { *out = buf; *out_len = n; } else free(buf);
      return true;
    }
    if (c < 0x20) break;
    if (c != '\\') { buf[n++] = (char)c; continue; }
    if (r->p >= r->end) break;
    uint8_t e = *r->p++;
    uint32_t cp;
    switch (e) {
      case '"': buf[n++] = '"'; break;
      case '\\': buf[n++] = '\\'; break;
      case '/': buf[n++] = '/'; break;
      case 'b': buf[n++] = '\b'; break;
      case 'f': buf[n++] = '\f'; break;
      case 'n': buf[n++] = '\n'; break;
      case 'r': buf[n++] = '\r'; break;
      case 't': buf[n++] = '\t'; break;
      case 'u':
        if (!hex4(r, &cp)) goto fail;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u') goto fail;
          r->p += 2;
          if (!hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto fail;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          goto fail;
        }
        put_utf8(buf, &n, cp);
        break;
      default: goto fail;
    }
  }
fail:
  free(buf);
  return false;
}

static bool parse_number(reader *r, double *out) {
  const uint8_t *start = r->p;
  if (r->p < r->end && *r->p == '-') r->p++;
  if (r->p >= r->end) return false;
  if (*r->p == '0') r->p++;
  else if (*r->p >= '1' && *r->p <= '9') while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  else return false;
  if (r->p < r->end && *r->p == '.') {
    r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  char tmp[512];
  size_t n = (size_t)(r->p - start);
  char *text = n < sizeof tmp ? tmp : malloc(n + 1);
  memcpy(text, start, n);
  text[n] = 0;
  *out = strtod(text, NULL);
  if (text != tmp) free(text);
  return true;
}

static bool literal(reader *r, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return false;
  r->p += n;
  return true;
}

enum kind { K_OTHER, K_STRING, K_NUMBER, K_TRUE, K_FALSE };

/* Any value; `depth` bounds nesting (deeper is refused, not a crash). The
 * kind, and for top-level fields the decoded string or number. */
static bool parse_value(reader *r, int depth, enum kind *kind, char **s, size_t *s_len, double *num);

/* Arrays and objects nest at most this deep, as in every SDK's JSON helper
 * (serde_json's limit, docs/languages.md); the top-level object is depth 0. */
#define MAX_DEPTH 127

static bool parse_container(reader *r, int depth, bool object, bool top) {
  if (depth >= MAX_DEPTH) return false;
  skip_ws(r);
  uint8_t close = object ? '}' : ']';
  if (r->p < r->end && *r->p == close) { r->p++; return true; }
  for (;;) {
    char *key = NULL;
    size_t key_len = 0;
    if (object) {
      skip_ws(r);
      if (r->p >= r->end || *r->p++ != '"' || !parse_string(r, &key, &key_len)) return false;
      skip_ws(r);
      if (r->p >= r->end || *r->p++ != ':') { free(key); return false; }
    }
    enum kind kind;
    char *s = NULL;
    size_t s_len = 0;
    double num = 0;
    skip_ws(r);
    if (!parse_value(r, depth + 1, &kind, top ? &s : NULL, &s_len, &num)) { free(key); return false; }
    if (top && key) {
      #define IS(name) (key_len == strlen(name) && memcmp(key, name, key_len) == 0)
      if (IS("user")) { free(r->user); r->user = kind == K_STRING ? s : NULL; r->user_len = s_len; r->has_user = kind == K_STRING; s = NULL; }
      else if (IS("text")) { free(r->text); r->text = kind == K_STRING ? s : NULL; r->text_len = s_len; r->has_text = kind == K_STRING; s = NULL; }
      else if (IS("score")) { r->has_score = kind == K_NUMBER; r->score = num; }
      else if (IS("keep")) { r->keep = kind == K_TRUE ? 1 : kind == K_FALSE ? 0 : -1; }
      else if (IS("vip")) { r->vip = kind == K_TRUE ? 1 : kind == K_FALSE ? 0 : -1; }
      else if (IS("forget")) { r->forget = kind == K_TRUE ? 1 : kind == K_FALSE ? 0 : -1; }
      else if (IS("expire")) { r->expire = kind == K_TRUE ? 1 : kind == K_FALSE ? 0 : -1; }
      #undef IS
    }
    free(s);
    free(key);
    skip_ws(r);
    if (r->p >= r->end) return false;
    uint8_t c = *r->p++;
    if (c == close) return true;
    if (c != ',') return false;
  }
}

static bool parse_value(reader *r, int depth, enum kind *kind, char **s, size_t *s_len, double *num) {
  *kind = K_OTHER;
  if (r->p >= r->end) return false;
  switch (*r->p) {
    case '{': r->p++; return parse_container(r, depth, true, false);
    case '[': r->p++; return parse_container(r, depth, false, false);
    case '"': r->p++; *kind = K_STRING; return parse_string(r, s, s_len);
    case 't': *kind = K_TRUE; return literal(r, "true");
    case 'f': *kind = K_FALSE; return literal(r, "false");
    case 'n': return literal(r, "null");
    default: *kind = K_NUMBER; return parse_number(r, num);
  }
}

/* Parses `value` as one JSON object; false when it is not one. */
static bool parse_object(reader *r, const uint8_t *value, size_t len) {
  memset(r, 0, sizeof *r);
  r->keep = r->vip = r->forget = r->expire = -1;
  if (!utf8_valid(value, len)) return false;
  r->p = value;
  r->end = value + len;
  skip_ws(r);
  if (r->p >= r->end || *r->p != '{') return false;
  r->p++;
  if (!parse_container(r, 0, true, true)) return false;
  skip_ws(r);
  return r->p == r->end;
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
