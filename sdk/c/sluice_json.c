/* The C SDK's JSON reader (sluice_json.h): a strict RFC 8259 parser that
 * hands a transform the top-level fields of one object.
 *
 * It must not keep anything between calls, nor accept what serde_json
 * refuses (the SDKs must agree on which records are JSON). */
#include "sluice_json.h"

#include <stdlib.h>
#include <string.h>

#include "sluice.h"

typedef struct reader {
  const uint8_t *p, *end;
  void (*field)(const sluice_json_field *f, void *ctx);
  void *ctx;
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
  if (!buf) abort();
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

static bool digits(reader *r) {
  if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
  while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  return true;
}

static bool parse_number(reader *r) {
  if (r->p < r->end && *r->p == '-') r->p++;
  if (r->p >= r->end) return false;
  if (*r->p == '0') r->p++;
  else if (!digits(r)) return false;
  if (r->p < r->end && *r->p == '.') {
    r->p++;
    if (!digits(r)) return false;
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (!digits(r)) return false;
  }
  return true;
}

static bool literal(reader *r, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return false;
  r->p += n;
  return true;
}

static bool parse_value(reader *r, int depth, sluice_json_field *f);

/* The members of an array or object (after its opening bracket); the
 * top-level object's fields go to the callback. */
static bool parse_container(reader *r, int depth, bool object) {
  if (depth >= SLUICE_JSON_MAX_DEPTH) return false;
  skip_ws(r);
  uint8_t close = object ? '}' : ']';
  if (r->p < r->end && *r->p == close) { r->p++; return true; }
  bool top = depth == 0 && object;
  for (;;) {
    char *name = NULL;
    sluice_json_field f = {0};
    if (object) {
      skip_ws(r);
      if (r->p >= r->end || *r->p++ != '"' || !parse_string(r, &name, &f.name_len)) return false;
      skip_ws(r);
      if (r->p >= r->end || *r->p++ != ':') { free(name); return false; }
    }
    f.name = name;
    skip_ws(r);
    bool ok = parse_value(r, depth + 1, top ? &f : NULL);
    if (ok && top) r->field(&f, r->ctx);
    free(name);
    free((char *)f.string);
    if (!ok) return false;
    skip_ws(r);
    if (r->p >= r->end) return false;
    uint8_t c = *r->p++;
    if (c == close) return true;
    if (c != ',') return false;
  }
}

/* Any value; `f` (a top-level field) gets its kind and contents. */
static bool parse_value(reader *r, int depth, sluice_json_field *f) {
  sluice_json_field ignored;
  if (!f) f = &ignored;
  if (r->p >= r->end) return false;
  const uint8_t *start = r->p;
  switch (*r->p) {
    case '{': r->p++; f->kind = SLUICE_JSON_OBJECT; return parse_container(r, depth, true);
    case '[': r->p++; f->kind = SLUICE_JSON_ARRAY; return parse_container(r, depth, false);
    case '"': {
      r->p++;
      f->kind = SLUICE_JSON_STRING;
      char *s = NULL;
      bool ok = parse_string(r, f == &ignored ? NULL : &s, &f->string_len);
      f->string = s;
      return ok;
    }
    case 't': f->kind = SLUICE_JSON_TRUE; return literal(r, "true");
    case 'f': f->kind = SLUICE_JSON_FALSE; return literal(r, "false");
    case 'n': f->kind = SLUICE_JSON_NULL; return literal(r, "null");
    default:
      f->kind = SLUICE_JSON_NUMBER;
      if (!parse_number(r)) return false;
      f->number = (const char *)start;
      f->number_len = (size_t)(r->p - start);
      return true;
  }
}

bool sluice_json_object(const uint8_t *value, size_t len,
                        void (*field)(const sluice_json_field *f, void *ctx), void *ctx) {
  if (!value || !utf8_valid(value, len)) return false;
  reader r = {.p = value, .end = value + len, .field = field, .ctx = ctx};
  skip_ws(&r);
  if (r.p >= r.end || *r.p != '{') return false;
  r.p++;
  if (!parse_container(&r, 0, true)) return false;
  skip_ws(&r);
  return r.p == r.end;
}

bool sluice_json_is(const sluice_json_field *f, const char *name) {
  return f->name && f->name_len == strlen(name) && memcmp(f->name, name, f->name_len) == 0;
}

bool sluice_json_i64(const sluice_json_field *f, int64_t *out) {
  return f->kind == SLUICE_JSON_NUMBER &&
         sluice_parse_i64((const uint8_t *)f->number, f->number_len, out);
}

double sluice_json_f64(const sluice_json_field *f) {
  if (f->kind != SLUICE_JSON_NUMBER) return 0;
  char tmp[512];
  char *text = f->number_len < sizeof tmp ? tmp : malloc(f->number_len + 1);
  if (!text) abort();
  memcpy(text, f->number, f->number_len);
  text[f->number_len] = 0;
  double value = strtod(text, NULL);
  if (text != tmp) free(text);
  return value;
}
