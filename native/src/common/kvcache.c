/* kvcache.c - the paged KV cache's bookkeeping, batched forward with sampling, hand-off.
 *
 * Blocks are reference counted: a sequence's table holds one reference per block, a fork
 * (of the whole sequence or of a prefix) copies the table or its head and adds references,
 * and an append into a shared, partly filled last block first copies that block
 * (copy-on-write). Every forward reserves all its blocks before any compute, so running out
 * is an error that changes nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../half.h"

typedef struct sequence {
  int32_t len;
  int32_t n_blocks, cap_blocks;
  int32_t *table;
  int32_t pins;
  int8_t exists; /* created and not yet released */
  int8_t freed;  /* gyre_seq_free called while pinned: release on the last unpin */
} sequence;

struct gyre_cache {
  gyre_model *model;
  be_cache *be;
  int32_t block_tokens, num_blocks;
  int32_t kv_dtype, elem; /* GYRE_KV_F32 | GYRE_KV_F16; bytes per stored element */
  int32_t *refs;      /* per block */
  int32_t *free_list; /* stack of free block ids */
  int32_t n_free;
  sequence *seqs;     /* indexed by id; ids are never reused */
  int32_t n_ids, cap_ids;
};

#define HANDOFF_HEADER 48

/* ---- blocks and sequences ---- */

static int32_t block_take(gyre_cache *c) {
  int32_t b = c->free_list[--c->n_free];
  c->refs[b] = 1;
  return b;
}

static void block_drop(gyre_cache *c, int32_t b) {
  if (--c->refs[b] == 0) c->free_list[c->n_free++] = b;
}

static gyre_status table_reserve(sequence *s, int32_t n) {
  if (n <= s->cap_blocks) return GYRE_OK;
  int32_t cap = s->cap_blocks ? s->cap_blocks : 4;
  while (cap < n) cap *= 2;
  int32_t *grown = realloc(s->table, sizeof(int32_t) * (size_t)cap);
  if (grown == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "kv cache: out of host memory");
  s->table = grown;
  s->cap_blocks = cap;
  return GYRE_OK;
}

static gyre_status seq_new(gyre_cache *c, int32_t *id) {
  if (c->n_ids == c->cap_ids) {
    int32_t cap = c->cap_ids ? 2 * c->cap_ids : 64;
    sequence *grown = realloc(c->seqs, sizeof(sequence) * (size_t)cap);
    if (grown == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "kv cache: out of host memory");
    memset(grown + c->cap_ids, 0, sizeof(sequence) * (size_t)(cap - c->cap_ids));
    c->seqs = grown;
    c->cap_ids = cap;
  }
  *id = c->n_ids++;
  c->seqs[*id].exists = 1;
  return GYRE_OK;
}

static void seq_release(gyre_cache *c, sequence *s) {
  /* last block first: the stack then hands a later sequence ascending ids (memory order) */
  for (int32_t k = s->n_blocks - 1; k >= 0; k--) block_drop(c, s->table[k]);
  free(s->table);
  memset(s, 0, sizeof *s);
}

/* The live, not freed sequence `id`, or NULL after recording an error. */
static sequence *seq_at(const gyre_cache *c, int32_t id, const char *fn, int allow_freed_pinned) {
  if (c == NULL) {
    gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: cache is NULL", fn);
    return NULL;
  }
  if (id < 0 || id >= c->n_ids || !c->seqs[id].exists ||
      (c->seqs[id].freed && !(allow_freed_pinned && c->seqs[id].pins > 0))) {
    gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: no sequence %d in this cache", fn, id);
    return NULL;
  }
  return &c->seqs[id];
}

#define SEQ_OR_FAIL(var, cache, id, fn, allow)                              \
  sequence *var = seq_at(cache, id, fn, allow);                             \
  if (var == NULL) return GYRE_ERR_INVALID_ARGUMENT;

/* ---- cache ---- */

/* Bytes per stored K/V element of a GYRE_KV_* type. */
static int32_t kv_elem_bytes(int32_t kv_dtype) { return kv_dtype == GYRE_KV_F16 ? (int32_t)sizeof(uint16_t) : (int32_t)sizeof(float); }

gyre_status gyre_cache_create(gyre_model *model, int32_t block_tokens, int32_t num_blocks, int32_t kv_dtype, gyre_cache **out) {
  if (model == NULL || out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_cache_create: NULL argument");
  if (block_tokens <= 0 || num_blocks <= 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_cache_create: block_tokens and num_blocks must be > 0, got %d and %d",
                     block_tokens, num_blocks);
  if (kv_dtype != GYRE_KV_F32 && kv_dtype != GYRE_KV_F16)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_cache_create: kv_dtype must be GYRE_KV_F32 (0) or GYRE_KV_F16 (1), got %d", kv_dtype);
  gyre_cache *c = calloc(1, sizeof *c);
  if (c == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_cache_create: out of host memory");
  c->refs = calloc((size_t)num_blocks, sizeof(int32_t));
  c->free_list = malloc(sizeof(int32_t) * (size_t)num_blocks);
  gyre_status st = c->refs == NULL || c->free_list == NULL
                       ? gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_cache_create: out of host memory")
                       : be_cache_create(model->be, block_tokens, num_blocks, kv_elem_bytes(kv_dtype), &c->be);
  if (st != GYRE_OK) {
    free(c->refs);
    free(c->free_list);
    free(c);
    return st;
  }
  for (int32_t b = 0; b < num_blocks; b++) c->free_list[b] = num_blocks - 1 - b; /* pops 0, 1, ... */
  c->n_free = num_blocks;
  c->block_tokens = block_tokens;
  c->num_blocks = num_blocks;
  c->kv_dtype = kv_dtype;
  c->elem = kv_elem_bytes(kv_dtype);
  c->model = model;
  model_retain(model);
  *out = c;
  return GYRE_OK;
}

void gyre_cache_free(gyre_cache *c) {
  if (c == NULL) return;
  for (int32_t i = 0; i < c->n_ids; i++) free(c->seqs[i].table);
  free(c->seqs);
  be_cache_free(c->be);
  free(c->refs);
  free(c->free_list);
  model_release(c->model);
  free(c);
}

gyre_status gyre_cache_stats_get(const gyre_cache *c, gyre_cache_stats *out) {
  if (c == NULL || out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_cache_stats_get: NULL argument");
  const dims *d = &c->model->layout.d;
  memset(out, 0, sizeof *out);
  out->block_tokens = c->block_tokens;
  out->num_blocks = c->num_blocks;
  out->free_blocks = c->n_free;
  out->used_blocks = c->num_blocks - c->n_free;
  out->kv_dtype = c->kv_dtype;
  out->bytes_per_token = 2LL * d->L * d->KV * d->hd * (int64_t)c->elem;
  out->bytes_total = out->bytes_per_token * c->block_tokens * c->num_blocks;
  uint8_t *marked = calloc((size_t)c->num_blocks, 1);
  if (marked == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_cache_stats_get: out of host memory");
  for (int32_t i = 0; i < c->n_ids; i++) {
    const sequence *s = &c->seqs[i];
    if (!s->exists) continue;
    out->num_sequences++;
    if (s->pins == 0) continue;
    for (int32_t k = 0; k < s->n_blocks; k++)
      if (!marked[s->table[k]]) {
        marked[s->table[k]] = 1;
        out->pinned_blocks++;
      }
  }
  free(marked);
  return GYRE_OK;
}

/* ---- sequences ---- */

gyre_status gyre_seq_create(gyre_cache *c, int32_t *seq) {
  if (c == NULL || seq == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_create: NULL argument");
  return seq_new(c, seq);
}

/* A new sequence `*child` holding parent's first n_blocks blocks (a reference each) and len
 * tokens. */
static gyre_status seq_share(gyre_cache *c, int32_t parent, int32_t n_blocks, int32_t len, int32_t *child) {
  int32_t id = -1;
  GYRE_CHECK(seq_new(c, &id));
  const sequence *p = &c->seqs[parent]; /* seq_new may have moved the array */
  sequence *s = &c->seqs[id];
  gyre_status st = table_reserve(s, n_blocks);
  if (st != GYRE_OK) {
    s->exists = 0;
    return st;
  }
  memcpy(s->table, p->table, sizeof(int32_t) * (size_t)n_blocks);
  s->n_blocks = n_blocks;
  s->len = len;
  for (int32_t k = 0; k < s->n_blocks; k++) c->refs[s->table[k]]++;
  *child = id;
  return GYRE_OK;
}

gyre_status gyre_seq_fork(gyre_cache *c, int32_t parent, int32_t *child) {
  if (child == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_fork: child is NULL");
  SEQ_OR_FAIL(p, c, parent, "gyre_seq_fork", 0)
  return seq_share(c, parent, p->n_blocks, p->len, child);
}

gyre_status gyre_seq_fork_prefix(gyre_cache *c, int32_t parent, int32_t length, int32_t *child) {
  if (child == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_fork_prefix: child is NULL");
  SEQ_OR_FAIL(p, c, parent, "gyre_seq_fork_prefix", 0)
  if (length <= 0 || length > p->len)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_seq_fork_prefix: length must be in [1, %d] (sequence %d's length), got %d",
                     p->len, parent, length);
  return seq_share(c, parent, (length + c->block_tokens - 1) / c->block_tokens, length, child);
}

gyre_status gyre_seq_free(gyre_cache *c, int32_t seq) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_free", 0)
  if (s->pins > 0) s->freed = 1;
  else seq_release(c, s);
  return GYRE_OK;
}

gyre_status gyre_seq_length(const gyre_cache *c, int32_t seq, int32_t *len) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_length", 1)
  if (len == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_length: len is NULL");
  *len = s->len;
  return GYRE_OK;
}

gyre_status gyre_seq_blocks(const gyre_cache *c, int32_t seq, int32_t *blocks) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_blocks", 1)
  if (blocks == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_blocks: blocks is NULL");
  *blocks = s->n_blocks;
  return GYRE_OK;
}

gyre_status gyre_seq_pin(gyre_cache *c, int32_t seq) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_pin", 0)
  s->pins++;
  return GYRE_OK;
}

gyre_status gyre_seq_unpin(gyre_cache *c, int32_t seq) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_unpin", 1)
  if (s->pins == 0) return gyre_fail(GYRE_ERR_STATE, "gyre_seq_unpin: sequence %d is not pinned", seq);
  if (--s->pins == 0 && s->freed) seq_release(c, s);
  return GYRE_OK;
}

/* ---- forward ---- */

static int32_t blocks_for(int32_t tokens, int32_t block_tokens) {
  return (tokens + block_tokens - 1) / block_tokens;
}

/* Blocks sequence s needs to hold `extra` more tokens: new blocks, plus one when its partly
 * filled last block is shared (copy-on-write). */
static int32_t blocks_needed(const gyre_cache *c, const sequence *s, int32_t extra) {
  int32_t more = blocks_for(s->len + extra, c->block_tokens) - s->n_blocks;
  int32_t cow = s->len % c->block_tokens != 0 && c->refs[s->table[s->len / c->block_tokens]] > 1;
  return (more > 0 ? more : 0) + cow;
}

/* Gives s room for `extra` more tokens; blocks_needed(s, extra) blocks must be free. */
static gyre_status seq_grow(gyre_cache *c, sequence *s, int32_t extra) {
  int32_t want = blocks_for(s->len + extra, c->block_tokens);
  GYRE_CHECK(table_reserve(s, want));
  if (s->len % c->block_tokens != 0) {
    int32_t k = s->len / c->block_tokens, shared = s->table[k];
    if (c->refs[shared] > 1) {
      int32_t copy = block_take(c);
      gyre_status st = be_cache_copy_block(c->be, copy, shared);
      if (st != GYRE_OK) {
        block_drop(c, copy);
        return st;
      }
      block_drop(c, shared);
      s->table[k] = copy;
    }
  }
  while (s->n_blocks < want) s->table[s->n_blocks++] = block_take(c);
  return GYRE_OK;
}

gyre_status gyre_forward(gyre_cache *c, int32_t n_seqs, const int32_t *seq_ids, const int32_t *n_new,
                         const int32_t *tokens, int32_t logits_mode, float *logits,
                         const gyre_sampling *sampling, int32_t *sampled, float *sampled_logprobs) {
  const char *fn = "gyre_forward";
  if (c == NULL || seq_ids == NULL || n_new == NULL || tokens == NULL || n_seqs <= 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: need a cache, n_seqs > 0 and the arrays", fn);
  if (logits_mode < GYRE_LOGITS_NONE || logits_mode > GYRE_LOGITS_ALL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: bad logits_mode %d", fn, logits_mode);
  if (logits_mode != GYRE_LOGITS_NONE && logits == NULL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
  if (sampling != NULL && (sampled == NULL || sampled_logprobs == NULL))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: sampling needs sampled and sampled_logprobs", fn);
  const dims *d = &c->model->layout.d;
  int32_t n_rows = 0, need = 0;
  for (int32_t s = 0; s < n_seqs; s++) {
    SEQ_OR_FAIL(q, c, seq_ids[s], fn, 0)
    if (q->pins > 0) return gyre_fail(GYRE_ERR_STATE, "%s: sequence %d is pinned for hand-off", fn, seq_ids[s]);
    if (n_new[s] <= 0) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: n_new[%d] = %d, must be > 0", fn, s, n_new[s]);
    if ((int64_t)q->len + n_new[s] > d->max_pos)
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: sequence %d would reach %lld tokens, max_position_embeddings is %d",
                       fn, seq_ids[s], (long long)q->len + n_new[s], d->max_pos);
    for (int32_t t = 0; t < s; t++)
      if (seq_ids[t] == seq_ids[s]) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: sequence %d given twice", fn, seq_ids[s]);
    if (sampling != NULL && (!(sampling[s].temperature >= 0.0f) || !(sampling[s].top_p > 0.0f && sampling[s].top_p <= 1.0f)))
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: sampling[%d] needs temperature >= 0 and top_p in (0, 1]", fn, s);
    n_rows += n_new[s];
    need += blocks_needed(c, q, n_new[s]);
  }
  for (int32_t r = 0; r < n_rows; r++)
    if (tokens[r] < 0 || tokens[r] >= d->V)
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: token %d at row %d is outside the vocabulary [0, %d)", fn, tokens[r], r, d->V);
  if (need > c->n_free)
    return gyre_fail(GYRE_ERR_OUT_OF_BLOCKS, "%s: needs %d free KV blocks but %d of %d are free (block_tokens %d)", fn,
                     need, c->n_free, c->num_blocks, c->block_tokens);
  for (int32_t s = 0; s < n_seqs; s++) GYRE_CHECK(seq_grow(c, &c->seqs[seq_ids[s]], n_new[s]));

  /* the ragged batch for the backend */
  int32_t total_blocks = 0;
  for (int32_t s = 0; s < n_seqs; s++) total_blocks += c->seqs[seq_ids[s]].n_blocks;
  int32_t n_out = logits_mode == GYRE_LOGITS_ALL ? n_rows
                  : logits_mode == GYRE_LOGITS_LAST || sampling != NULL ? n_seqs : 0;
  size_t ints = (size_t)3 * n_rows + 3 * (size_t)n_seqs + 1 + (size_t)total_blocks + (size_t)n_out;
  int32_t *mem = malloc(sizeof(int32_t) * ints);
  float *out_logits = logits_mode == GYRE_LOGITS_NONE && n_out > 0 ? malloc(sizeof(float) * (size_t)n_out * d->V) : logits;
  void *scratch = sampling != NULL ? malloc(sample_scratch_bytes(d->V)) : NULL;
  if (mem == NULL || (n_out > 0 && out_logits == NULL) || (sampling != NULL && scratch == NULL)) {
    free(mem);
    if (out_logits != logits) free(out_logits);
    free(scratch);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  int32_t *positions = mem, *row_seq = positions + n_rows, *row_tokens = row_seq + n_rows;
  int32_t *seq_len = row_tokens + n_rows, *last_row = seq_len + n_seqs, *block_off = last_row + n_seqs;
  int32_t *blocks = block_off + n_seqs + 1, *out_rows = blocks + total_blocks;
  memcpy(row_tokens, tokens, sizeof(int32_t) * (size_t)n_rows);
  int32_t r = 0;
  block_off[0] = 0;
  for (int32_t s = 0; s < n_seqs; s++) {
    const sequence *q = &c->seqs[seq_ids[s]];
    for (int32_t j = 0; j < n_new[s]; j++, r++) {
      positions[r] = q->len + j;
      row_seq[r] = s;
    }
    last_row[s] = r - 1;
    seq_len[s] = q->len + n_new[s];
    memcpy(blocks + block_off[s], q->table, sizeof(int32_t) * (size_t)q->n_blocks);
    block_off[s + 1] = block_off[s] + q->n_blocks;
  }
  for (int32_t k = 0; k < n_out; k++) out_rows[k] = n_out == n_rows ? k : last_row[k];
  fwd_batch b = {n_rows, row_tokens, positions, row_seq, n_seqs, seq_len, block_off, blocks, n_out, out_rows};
  model_use_threads(c->model);
  gyre_status st = be_forward(c->model->be, c->be, &b, out_logits);
  if (st == GYRE_OK) {
    for (int32_t s = 0; s < n_seqs; s++) c->seqs[seq_ids[s]].len = seq_len[s];
    for (int32_t s = 0; s < n_seqs && sampling != NULL; s++) {
      int32_t row = n_out == n_rows ? last_row[s] : s;
      sample_row(d->V, out_logits + (size_t)row * d->V, &sampling[s], (uint64_t)seq_len[s], scratch,
                 &sampled[s], &sampled_logprobs[s]);
    }
  }
  free(mem);
  if (out_logits != logits) free(out_logits);
  free(scratch);
  return st;
}

/* ---- hand-off ---- */

uint64_t gyre_checksum(const uint8_t *data, size_t len) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= data[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int k = 3; k >= 0; k--) v = v << 8 | p[k];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

static uint64_t payload_bytes(const dims *d, int64_t length, uint32_t elem) {
  return (uint64_t)d->L * 2 * (uint64_t)length * (uint64_t)d->KV * (uint64_t)d->hd * elem;
}

/* dst[n] (elements of dst_elem bytes) = src[n] (src_elem bytes): F16 -> F32 exact, F32 -> F16 rounded. */
static void convert_elements(void *dst, uint32_t dst_elem, const uint8_t *src, uint32_t src_elem, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    float x;
    uint16_t h;
    if (src_elem == sizeof(float)) memcpy(&x, src + i * sizeof x, sizeof x);
    else {
      memcpy(&h, src + i * sizeof h, sizeof h);
      x = half_to_float(h);
    }
    if (dst_elem == sizeof(float)) ((float *)dst)[i] = x;
    else ((uint16_t *)dst)[i] = half_from_float(x);
  }
}

gyre_status gyre_seq_export(const gyre_cache *c, int32_t seq, uint8_t *out, size_t cap, size_t *len) {
  SEQ_OR_FAIL(s, c, seq, "gyre_seq_export", 1)
  if (len == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_export: len is NULL");
  const dims *d = &c->model->layout.d;
  uint64_t payload = payload_bytes(d, s->len, (uint32_t)c->elem);
  *len = HANDOFF_HEADER + (size_t)payload;
  if (out == NULL) return GYRE_OK;
  if (cap < *len)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_seq_export: buffer of %zu bytes, need %zu", cap, *len);
  uint8_t *host = malloc(payload > 0 ? (size_t)payload : 1);
  if (host == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_seq_export: out of host memory");
  gyre_status st = s->len > 0 ? be_cache_read(c->be, s->table, s->len, host) : GYRE_OK;
  if (st == GYRE_OK) {
    memcpy(out, "GYKV", 4);
    put_u32(out + 4, 1);
    put_u32(out + 8, (uint32_t)d->L);
    put_u32(out + 12, (uint32_t)d->KV);
    put_u32(out + 16, (uint32_t)d->hd);
    put_u32(out + 20, (uint32_t)c->elem);
    put_u32(out + 24, (uint32_t)s->len);
    put_u32(out + 28, 0);
    put_u64(out + 32, payload);
    memcpy(out + HANDOFF_HEADER, host, (size_t)payload);
    put_u64(out + 40, gyre_checksum(out + HANDOFF_HEADER, (size_t)payload));
  }
  free(host);
  return st;
}

gyre_status gyre_seq_import(gyre_cache *c, const uint8_t *buf, size_t len, int32_t *seq) {
  const char *fn = "gyre_seq_import";
  if (c == NULL || buf == NULL || seq == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (len < HANDOFF_HEADER) return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: truncated: %zu bytes, the header alone is %d", fn, len, HANDOFF_HEADER);
  if (memcmp(buf, "GYKV", 4) != 0 || get_u32(buf + 4) != 1)
    return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: not a GYKV version 1 buffer", fn);
  const dims *d = &c->model->layout.d;
  uint32_t layers = get_u32(buf + 8), kv = get_u32(buf + 12), hd = get_u32(buf + 16), elem = get_u32(buf + 20);
  if (layers != (uint32_t)d->L || kv != (uint32_t)d->KV || hd != (uint32_t)d->hd || (elem != sizeof(float) && elem != sizeof(uint16_t)))
    return gyre_fail(GYRE_ERR_BAD_HANDOFF,
                     "%s: layout layers=%u kv_heads=%u head_dim=%u elem=%u does not match this cache's %d/%d/%d/(4 or 2)",
                     fn, layers, kv, hd, elem, d->L, d->KV, d->hd);
  int32_t length = (int32_t)get_u32(buf + 24);
  uint64_t payload = get_u64(buf + 32);
  if (length < 0 || payload != payload_bytes(d, length, elem))
    return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: payload size %llu does not match %d tokens", fn, (unsigned long long)payload, length);
  if (len != HANDOFF_HEADER + payload)
    return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: %s: buffer has %zu bytes, the header says %llu", fn,
                     len < HANDOFF_HEADER + payload ? "truncated" : "trailing bytes", len,
                     (unsigned long long)(HANDOFF_HEADER + payload));
  if (gyre_checksum(buf + HANDOFF_HEADER, (size_t)payload) != get_u64(buf + 40))
    return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: checksum mismatch: the payload is corrupt", fn);
  if (length > d->max_pos)
    return gyre_fail(GYRE_ERR_BAD_HANDOFF, "%s: %d tokens exceed max_position_embeddings %d", fn, length, d->max_pos);
  int32_t need = blocks_for(length, c->block_tokens);
  if (need > c->n_free)
    return gyre_fail(GYRE_ERR_OUT_OF_BLOCKS, "%s: needs %d free KV blocks but %d of %d are free", fn, need, c->n_free, c->num_blocks);
  uint64_t stored = payload_bytes(d, length, (uint32_t)c->elem); /* the payload in this pool's element type */
  uint8_t *host = malloc(stored > 0 ? (size_t)stored : 1);
  if (host == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  if (elem == (uint32_t)c->elem) memcpy(host, buf + HANDOFF_HEADER, (size_t)payload);
  else convert_elements(host, (uint32_t)c->elem, buf + HANDOFF_HEADER, elem, payload / elem);
  int32_t id = -1;
  gyre_status st = seq_new(c, &id);
  if (st == GYRE_OK) {
    sequence *s = &c->seqs[id];
    st = table_reserve(s, need);
    while (st == GYRE_OK && s->n_blocks < need) s->table[s->n_blocks++] = block_take(c);
    if (st == GYRE_OK && length > 0) st = be_cache_write(c->be, s->table, length, host);
    if (st == GYRE_OK) {
      s->len = length;
      *seq = id;
    } else {
      seq_release(c, s);
    }
  }
  free(host);
  return st;
}
