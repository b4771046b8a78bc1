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

gyre_status st_decode(const param_layout *lay, int32_t n_groups, const char *const *prefixes,
                      float *const *flats, const uint8_t *buf, size_t len, const char *meta_key,
                      char *meta_value, size_t meta_cap) {
  if (meta_value != NULL && meta_cap > 0) meta_value[0] = '\0';
  if (buf == NULL) return BAD("buffer is NULL");
  if (len < 8) return BAD("truncated: %zu bytes, shorter than the 8-byte header size", len);
  uint64_t header_len = 0;
  for (int k = 7; k >= 0; k--) header_len = header_len << 8 | buf[k];
  if (header_len > len - 8)
    return BAD("truncated: header claims %llu bytes but only %zu follow",
               (unsigned long long)header_len, len - 8);
  const uint8_t *data = buf + 8 + header_len;
  int64_t data_len = (int64_t)(len - 8 - header_len);

  int32_t n_expected = n_groups * lay->n_tensors;
  int64_t *found_begin = malloc(sizeof(int64_t) * (size_t)n_expected);
  span *spans = NULL;
  int32_t n_spans = 0, spans_cap = 0;
  gyre_status st = GYRE_OK;
  if (found_begin == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  for (int32_t k = 0; k < n_expected; k++) found_begin[k] = -1;

  json j = {(const char *)buf + 8, (const char *)data};
  char key[256], dtype[32];
  if (!eat(&j, '{')) {
    st = BAD("header is not a JSON object");
    goto done;
  }
  if (!eat(&j, '}')) do {
      if (!string(&j, key, sizeof key) || !eat(&j, ':')) {
        st = BAD("malformed JSON header near byte %ld", (long)(j.p - (const char *)buf));
        goto done;
      }
      if (strcmp(key, "__metadata__") == 0) {
        if (!eat(&j, '{')) {
          st = BAD("__metadata__ is not an object");
          goto done;
        }
        if (!eat(&j, '}')) do {
            char mk[128], mv[256];
            if (!string(&j, mk, sizeof mk) || !eat(&j, ':') || !string(&j, mv, sizeof mv)) {
              st = BAD("__metadata__ must map strings to strings");
              goto done;
            }
            if (meta_key != NULL && meta_value != NULL && strcmp(mk, meta_key) == 0)
              snprintf(meta_value, meta_cap, "%s", mv);
          } while (eat(&j, ','));
        if (!eat(&j, '}')) {
          st = BAD("malformed __metadata__");
          goto done;
        }
        continue;
      }
      /* a tensor entry */
      int64_t shape[4] = {0}, offs[2] = {0};
      int rank = -1, n_offs = -1;
      dtype[0] = '\0';
      if (!eat(&j, '{')) {
        st = BAD("entry '%s' is not an object", key);
        goto done;
      }
      if (!eat(&j, '}')) do {
          char field[32];
          if (!string(&j, field, sizeof field) || !eat(&j, ':')) {
            st = BAD("malformed entry '%s'", key);
            goto done;
          }
          int ok;
          if (strcmp(field, "dtype") == 0) ok = string(&j, dtype, sizeof dtype);
          else if (strcmp(field, "shape") == 0) ok = int_array(&j, shape, 4, &rank);
          else if (strcmp(field, "data_offsets") == 0) ok = int_array(&j, offs, 2, &n_offs);
          else ok = skip(&j, 0);
          if (!ok) {
            st = BAD("malformed field '%s' of '%s'", field, key);
            goto done;
          }
        } while (eat(&j, ','));
      if (!eat(&j, '}')) {
        st = BAD("malformed entry '%s'", key);
        goto done;
      }
      if (n_offs != 2 || rank < 0 || rank > 4 || dtype[0] == '\0') {
        st = BAD("tensor '%s' lacks dtype, shape or data_offsets", key);
        goto done;
      }
      if (offs[1] < offs[0]) {
        st = BAD("tensor '%s' has data_offsets [%lld, %lld] with end before begin", key,
                 (long long)offs[0], (long long)offs[1]);
        goto done;
      }
      if (offs[1] > data_len) {
        st = BAD("truncated: tensor '%s' needs data bytes [%lld, %lld) but the data section has %lld bytes",
                 key, (long long)offs[0], (long long)offs[1], (long long)data_len);
        goto done;
      }
      if (n_spans == spans_cap) {
        spans_cap = spans_cap ? 2 * spans_cap : 64;
        span *grown = realloc(spans, sizeof(span) * (size_t)spans_cap);
        if (grown == NULL) {
          st = gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
          goto done;
        }
        spans = grown;
      }
      spans[n_spans++] = (span){offs[0], offs[1]};
      /* match it against the layout */
      int32_t match = -1;
      for (int32_t g = 0; g < n_groups && match < 0; g++) {
        size_t pl = strlen(prefixes[g]);
        if (strncmp(key, prefixes[g], pl) != 0) continue;
        for (int32_t t = 0; t < lay->n_tensors; t++)
          if (strcmp(key + pl, lay->tensors[t].name) == 0) {
            match = g * lay->n_tensors + t;
            break;
          }
      }
      if (match < 0) {
        if (ends_with(key, "rotary_emb.inv_freq") || (lay->d.tied && ends_with(key, "lm_head.weight")))
          continue; /* ignored, documented in gyre.h */
        st = BAD("unexpected tensor '%s' for this config", key);
        goto done;
      }
      const param_tensor *p = &lay->tensors[match % lay->n_tensors];
      if (strcmp(dtype, "F32") != 0) {
        st = BAD("tensor '%s' has dtype %s; only F32 is supported", key, dtype);
        goto done;
      }
      int shape_ok = rank == p->rank && shape[0] == p->shape[0] && (p->rank == 1 || shape[1] == p->shape[1]);
      if (!shape_ok) {
        st = p->rank == 1 ? BAD("tensor '%s' has the wrong shape; expected [%lld]", key, (long long)p->shape[0])
                          : BAD("tensor '%s' has the wrong shape; expected [%lld, %lld]", key,
                                (long long)p->shape[0], (long long)p->shape[1]);
        goto done;
      }
      int64_t numel = p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
      if (offs[1] - offs[0] != numel * 4) {
        st = BAD("tensor '%s' spans %lld bytes, expected %lld", key, (long long)(offs[1] - offs[0]),
                 (long long)(numel * 4));
        goto done;
      }
      if (found_begin[match] >= 0) {
        st = BAD("tensor '%s' appears twice", key);
        goto done;
      }
      found_begin[match] = offs[0];
    } while (eat(&j, ','));
  if (!eat(&j, '}')) {
    st = BAD("malformed JSON header (expected '}')");
    goto done;
  }
  for (int32_t k = 0; k < n_expected; k++)
    if (found_begin[k] < 0) {
      st = BAD("missing tensor '%s%s'", prefixes[k / lay->n_tensors], lay->tensors[k % lay->n_tensors].name);
      goto done;
    }
  qsort(spans, (size_t)n_spans, sizeof(span), span_cmp);
  for (int32_t k = 1; k < n_spans; k++)
    if (spans[k].begin < spans[k - 1].end) {
      st = BAD("tensors overlap at data byte %lld", (long long)spans[k].begin);
      goto done;
    }
  for (int32_t k = 0; k < n_expected; k++) {
    const param_tensor *p = &lay->tensors[k % lay->n_tensors];
    int64_t numel = p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
    memcpy(flats[k / lay->n_tensors] + p->offset, data + found_begin[k], (size_t)numel * 4);
  }
done:
  free(found_begin);
  free(spans);
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
