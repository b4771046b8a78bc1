/* safetensors.c - reading and writing safetensors files for the flat parameter layout.
 *
 * File format (https://huggingface.co/docs/safetensors): u64 little-endian header size N,
 * N bytes of JSON {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}},
 * then the data section; data_offsets are [begin, end) relative to the data section.
 * Reading checks everything a loader can get wrong and names it in the error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

/* ---- a minimal JSON reader: exactly what a safetensors header needs ---- */

typedef struct json {
  const char *p, *end;
} json;

static void ws(json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int eat(json *j, char c) {
  ws(j);
  if (j->p < j->end && *j->p == c) {
    j->p++;
    return 1;
  }
  return 0;
}

/* A string into out (truncated to cap - 1; \u escapes outside ASCII become '?'). */
static int string(json *j, char *out, size_t cap) {
  size_t n = 0;
  if (!eat(j, '"')) return 0;
  while (j->p < j->end && *j->p != '"') {
    char c = *j->p++;
    if (c == '\\') {
      if (j->p >= j->end) return 0;
      char e = *j->p++;
      switch (e) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u': {
          if (j->end - j->p < 4) return 0;
          unsigned v = 0;
          for (int k = 0; k < 4; k++) {
            char h = *j->p++;
            v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
            if (v > 0xffff) return 0;
          }
          c = v < 128 ? (char)v : '?';
          break;
        }
        default: c = e;
      }
    }
    if (out != NULL && n + 1 < cap) out[n++] = c;
  }
  if (out != NULL && cap > 0) out[n] = '\0';
  return eat(j, '"');
}

static int integer(json *j, int64_t *v) {
  ws(j);
  int64_t x = 0;
  int digits = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    if (x > (INT64_MAX - 9) / 10) return 0;
    x = x * 10 + (*j->p++ - '0');
    digits++;
  }
  *v = x;
  return digits > 0;
}

/* Skips any value. */
static int skip(json *j, int depth) {
  ws(j);
  if (j->p >= j->end || depth > 64) return 0;
  char c = *j->p;
  if (c == '"') return string(j, NULL, 0);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    if (eat(j, close)) return 1;
    do {
      if (c == '{' && !(string(j, NULL, 0) && eat(j, ':'))) return 0;
      if (!skip(j, depth + 1)) return 0;
    } while (eat(j, ','));
    return eat(j, close);
  }
  while (j->p < j->end && (strchr("-+.eE0123456789truefalsn", *j->p) != NULL)) j->p++;
  return 1;
}

static int int_array(json *j, int64_t *v, int max, int *count) {
  *count = 0;
  if (!eat(j, '[')) return 0;
  if (eat(j, ']')) return 1;
  do {
    int64_t x;
    if (!integer(j, &x)) return 0;
    if (*count < max) v[*count] = x;
    (*count)++;
  } while (eat(j, ','));
  return eat(j, ']');
}

/* ---- reading ---- */

typedef struct span {
  int64_t begin, end;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

#define BAD(...) gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "safetensors: " __VA_ARGS__)

/* One tensor entry of the header: {"dtype", "shape", "data_offsets"}. */
typedef struct entry {
  char dtype[32];
  int64_t shape[4], offs[2];
  int rank, n_offs;
} entry;

/* What decoding one file tracks: the layout's groups, where each expected tensor was found
 * (found_begin[g * n_tensors + t], -1 until found), and every tensor's data span (overlaps). */
typedef struct decoding {
  const param_layout *lay;
  int32_t n_groups;
  const char *const *prefixes;
  int64_t data_len;
  int64_t *found_begin; /* [n_groups * lay->n_tensors] */
  span *spans;          /* [n_spans], grown by doubling */
  int32_t n_spans, spans_cap;
  const char *meta_key;
  char *meta_value;
  size_t meta_cap;
} decoding;

/* The header's length from the first 8 bytes (u64 little-endian), checked against len. */
static gyre_status header_length(const uint8_t *buf, size_t len, uint64_t *header_len) {
  if (buf == NULL) return BAD("buffer is NULL");
  if (len < 8) return BAD("truncated: %zu bytes, shorter than the 8-byte header size", len);
  uint64_t n = 0;
  for (int k = 7; k >= 0; k--) n = n << 8 | buf[k];
  if (n > len - 8)
    return BAD("truncated: header claims %llu bytes but only %zu follow", (unsigned long long)n, len - 8);
  *header_len = n;
  return GYRE_OK;
}

/* "__metadata__": {str: str}; the value of meta_key, when asked for, into meta_value. */
static gyre_status read_metadata(json *j, decoding *d) {
  if (!eat(j, '{')) return BAD("__metadata__ is not an object");
  if (!eat(j, '}')) do {
      char mk[128], mv[256];
      if (!string(j, mk, sizeof mk) || !eat(j, ':') || !string(j, mv, sizeof mv))
        return BAD("__metadata__ must map strings to strings");
      if (d->meta_key != NULL && d->meta_value != NULL && strcmp(mk, d->meta_key) == 0)
        snprintf(d->meta_value, d->meta_cap, "%s", mv);
    } while (eat(j, ','));
  if (!eat(j, '}')) return BAD("malformed __metadata__");
  return GYRE_OK;
}

/* A tensor entry's fields (others skipped), complete and within the data section. */
static gyre_status read_entry(json *j, const decoding *d, const char *key, entry *e) {
  *e = (entry){.rank = -1, .n_offs = -1};
  if (!eat(j, '{')) return BAD("entry '%s' is not an object", key);
  if (!eat(j, '}')) do {
      char field[32];
      if (!string(j, field, sizeof field) || !eat(j, ':')) return BAD("malformed entry '%s'", key);
      int ok;
      if (strcmp(field, "dtype") == 0) ok = string(j, e->dtype, sizeof e->dtype);
      else if (strcmp(field, "shape") == 0) ok = int_array(j, e->shape, 4, &e->rank);
      else if (strcmp(field, "data_offsets") == 0) ok = int_array(j, e->offs, 2, &e->n_offs);
      else ok = skip(j, 0);
      if (!ok) return BAD("malformed field '%s' of '%s'", field, key);
    } while (eat(j, ','));
  if (!eat(j, '}')) return BAD("malformed entry '%s'", key);
  if (e->n_offs != 2 || e->rank < 0 || e->rank > 4 || e->dtype[0] == '\0')
    return BAD("tensor '%s' lacks dtype, shape or data_offsets", key);
  if (e->offs[1] < e->offs[0])
    return BAD("tensor '%s' has data_offsets [%lld, %lld] with end before begin", key, (long long)e->offs[0],
               (long long)e->offs[1]);
  if (e->offs[1] > d->data_len)
    return BAD("truncated: tensor '%s' needs data bytes [%lld, %lld) but the data section has %lld bytes", key,
               (long long)e->offs[0], (long long)e->offs[1], (long long)d->data_len);
  return GYRE_OK;
}

static gyre_status add_span(decoding *d, int64_t begin, int64_t end) {
  if (d->n_spans == d->spans_cap) {
    d->spans_cap = d->spans_cap ? 2 * d->spans_cap : 64;
    span *grown = realloc(d->spans, sizeof(span) * (size_t)d->spans_cap);
    if (grown == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    d->spans = grown;
  }
  d->spans[d->n_spans++] = (span){begin, end};
  return GYRE_OK;
}

/* The index of `key` among the expected tensors (group prefix + layout name), -1 if none. */
static int32_t match_tensor(const decoding *d, const char *key) {
  for (int32_t g = 0; g < d->n_groups; g++) {
    size_t pl = strlen(d->prefixes[g]);
    if (strncmp(key, d->prefixes[g], pl) != 0) continue;
    for (int32_t t = 0; t < d->lay->n_tensors; t++)
      if (strcmp(key + pl, d->lay->tensors[t].name) == 0) return g * d->lay->n_tensors + t;
  }
  return -1;
}

static int64_t numel_of(const param_tensor *p) { return p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1]; }

/* A tensor entry placed: ignored when the layout documents it so, else dtype, shape and size
 * checked against the layout and its data offset kept (once). */
static gyre_status place_tensor(decoding *d, const char *key, const entry *e) {
  gyre_status st = add_span(d, e->offs[0], e->offs[1]);
  if (st != GYRE_OK) return st;
  int32_t match = match_tensor(d, key);
  if (match < 0) {
    if (ends_with(key, "rotary_emb.inv_freq") || (d->lay->d.tied && ends_with(key, "lm_head.weight")))
      return GYRE_OK; /* ignored, documented in gyre.h */
    return BAD("unexpected tensor '%s' for this config", key);
  }
  const param_tensor *p = &d->lay->tensors[match % d->lay->n_tensors];
  if (strcmp(e->dtype, "F32") != 0) return BAD("tensor '%s' has dtype %s; only F32 is supported", key, e->dtype);
  int shape_ok = e->rank == p->rank && e->shape[0] == p->shape[0] && (p->rank == 1 || e->shape[1] == p->shape[1]);
  if (!shape_ok)
    return p->rank == 1 ? BAD("tensor '%s' has the wrong shape; expected [%lld]", key, (long long)p->shape[0])
                        : BAD("tensor '%s' has the wrong shape; expected [%lld, %lld]", key, (long long)p->shape[0],
                              (long long)p->shape[1]);
  int64_t numel = numel_of(p);
  if (e->offs[1] - e->offs[0] != numel * 4)
    return BAD("tensor '%s' spans %lld bytes, expected %lld", key, (long long)(e->offs[1] - e->offs[0]),
               (long long)(numel * 4));
  if (d->found_begin[match] >= 0) return BAD("tensor '%s' appears twice", key);
  d->found_begin[match] = e->offs[0];
  return GYRE_OK;
}

/* The JSON header: the metadata and every tensor entry, placed. */
static gyre_status read_header(json *j, decoding *d, const uint8_t *buf) {
  char key[256];
  if (!eat(j, '{')) return BAD("header is not a JSON object");
  if (!eat(j, '}')) do {
      if (!string(j, key, sizeof key) || !eat(j, ':'))
        return BAD("malformed JSON header near byte %ld", (long)(j->p - (const char *)buf));
      entry e;
      gyre_status st = strcmp(key, "__metadata__") == 0 ? read_metadata(j, d) : read_entry(j, d, key, &e);
      if (st == GYRE_OK && strcmp(key, "__metadata__") != 0) st = place_tensor(d, key, &e);
      if (st != GYRE_OK) return st;
    } while (eat(j, ','));
  if (!eat(j, '}')) return BAD("malformed JSON header (expected '}')");
  return GYRE_OK;
}

/* Every expected tensor found and no two overlapping: their data copied into the flats. */
static gyre_status copy_tensors(decoding *d, float *const *flats, const uint8_t *data) {
  const param_layout *lay = d->lay;
  int32_t n_expected = d->n_groups * lay->n_tensors;
  for (int32_t k = 0; k < n_expected; k++)
    if (d->found_begin[k] < 0)
      return BAD("missing tensor '%s%s'", d->prefixes[k / lay->n_tensors], lay->tensors[k % lay->n_tensors].name);
  qsort(d->spans, (size_t)d->n_spans, sizeof(span), span_cmp);
  for (int32_t k = 1; k < d->n_spans; k++)
    if (d->spans[k].begin < d->spans[k - 1].end)
      return BAD("tensors overlap at data byte %lld", (long long)d->spans[k].begin);
  for (int32_t k = 0; k < n_expected; k++) {
    const param_tensor *p = &lay->tensors[k % lay->n_tensors];
    memcpy(flats[k / lay->n_tensors] + p->offset, data + d->found_begin[k], (size_t)numel_of(p) * 4);
  }
  return GYRE_OK;
}

gyre_status st_decode(const param_layout *lay, int32_t n_groups, const char *const *prefixes,
                      float *const *flats, const uint8_t *buf, size_t len, const char *meta_key,
                      char *meta_value, size_t meta_cap) {
  if (meta_value != NULL && meta_cap > 0) meta_value[0] = '\0';
  uint64_t header_len = 0;
  gyre_status st = header_length(buf, len, &header_len);
  if (st != GYRE_OK) return st;
  const uint8_t *data = buf + 8 + header_len;
  int32_t n_expected = n_groups * lay->n_tensors;
  decoding d = {.lay = lay, .n_groups = n_groups, .prefixes = prefixes, .data_len = (int64_t)(len - 8 - header_len),
                .meta_key = meta_key, .meta_value = meta_value, .meta_cap = meta_cap};
  d.found_begin = malloc(sizeof(int64_t) * (size_t)n_expected);
  if (d.found_begin == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  for (int32_t k = 0; k < n_expected; k++) d.found_begin[k] = -1;
  json j = {(const char *)buf + 8, (const char *)data};
  st = read_header(&j, &d, buf);
  if (st == GYRE_OK) st = copy_tensors(&d, flats, data);
  free(d.found_begin);
  free(d.spans);
  return st;
}

/* ---- writing ---- */

typedef struct text {
  char *s;
  size_t n, cap;
} text;

static int append(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int append(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (t->n + (size_t)k + 1 > t->cap) {
    size_t cap = (t->n + (size_t)k + 1) * 2;
    char *grown = realloc(t->s, cap);
    if (grown == NULL) return 0;
    t->s = grown;
    t->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(t->s + t->n, (size_t)k + 1, fmt, ap);
  va_end(ap);
  t->n += (size_t)k;
  return 1;
}

gyre_status st_encode(const param_layout *lay, int32_t n_groups, const char *const *prefixes,
                      const float *const *flats, const char *metadata_json, uint8_t *out,
                      size_t cap, size_t *len) {
  text h = {0};
  int ok = append(&h, "{\"__metadata__\":%s", metadata_json);
  int64_t off = 0;
  for (int32_t g = 0; g < n_groups; g++)
    for (int32_t t = 0; t < lay->n_tensors; t++) {
      const param_tensor *p = &lay->tensors[t];
      int64_t numel = p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
      ok = ok && append(&h, ",\"%s%s\":{\"dtype\":\"F32\",\"shape\":", prefixes[g], p->name);
      ok = ok && (p->rank == 1 ? append(&h, "[%lld]", (long long)p->shape[0])
                               : append(&h, "[%lld,%lld]", (long long)p->shape[0], (long long)p->shape[1]));
      ok = ok && append(&h, ",\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + numel * 4));
      off += numel * 4;
    }
  ok = ok && append(&h, "}");
  while (ok && h.n % 8 != 0) ok = append(&h, " "); /* aligns the data section */
  if (!ok) {
    free(h.s);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  }
  size_t total = 8 + h.n + (size_t)off;
  *len = total;
  if (out == NULL) {
    free(h.s);
    return GYRE_OK;
  }
  if (cap < total) {
    free(h.s);
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "safetensors: buffer of %zu bytes, need %zu", cap, total);
  }
  for (int k = 0; k < 8; k++) out[k] = (uint8_t)((uint64_t)h.n >> (8 * k));
  memcpy(out + 8, h.s, h.n);
  uint8_t *data = out + 8 + h.n;
  for (int32_t g = 0; g < n_groups; g++)
    for (int32_t t = 0; t < lay->n_tensors; t++) {
      const param_tensor *p = &lay->tensors[t];
      size_t bytes = (size_t)(p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1]) * 4;
      memcpy(data, flats[g] + p->offset, bytes);
      data += bytes;
    }
  free(h.s);
  return GYRE_OK;
}
