/*
 * check.c - gyre-cuda-check: holds the CUDA build of the engine to the CPU build through
 * the public ABI only (both libraries loaded side by side with dlopen), and times it.
 *
 *   gyre-cuda-check compare --cpu LIB --cuda LIB [--checkpoint DIR]... [--quick] [--json FILE]
 *       Same weights in both builds; compares prefill and decode logits, a fork and a prefix
 *       fork with copy-on-write, KV hand-off within the CUDA build (bit for bit) and across builds,
 *       tree-masked training (SFT and PPO: log-probs, statistics, gradients, accumulation,
 *       determinism), AdamW, optimizer state round trip, and the out-of-blocks and
 *       bad-hand-off errors. Built-in configurations cover head dims 6, 8, 16, 64 and 128, GQA,
 *       MQA and MHA, tied and untied heads, 20 query heads per kv head, Qwen2's q/k/v biases,
 *       Qwen3's per-head q/k norm with YaRN (biases and norms off their initial values); each --checkpoint
 *       adds a saved model (named after its directory).
 *   gyre-cuda-check bench --cuda LIB --checkpoint DIR [--probe FILE] [--quick] [--json FILE]
 *       (a checkpoint directory holds config.json and model.safetensors; without the latter
 *       the model gets random weights)
 *       Prefill, decode (16 sequences at contexts 512 and 4096) and training throughput;
 *       with the probe's measured bandwidth and SGEMM rate (gyre-cuda-probe), decode's
 *       fraction of memory bandwidth and training's fraction of the matmul rate.
 *   gyre-cuda-check long --cpu LIB --cuda LIB [--checkpoint DIR] [--long TOKENS] [--quick] [--json FILE]
 *       A long-context model (the checkpoint, tiny-long's; without one its shape with random
 *       weights): a path at positions from 120,000 trained by the CUDA build unchunked and in
 *       chunks against the CPU build (log-probs, loss, gradients, the K/V store's size); then
 *       attention pairs per second of training one path of 4096 tokens and one of TOKENS
 *       (default 131072), chunks of 4096 (--quick: 256 and TOKENS, chunks of 256):
 *       attention_pairs_per_s_4k, attention_pairs_per_s_long, long_over_4k, long_store_bytes.
 *
 * Prints one line per check or figure and, last, one JSON line. Exit status 1 when a check
 * fails, 2 on a usage or setup error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gyre.h"
#include "../../src/half.h"

/* ---- the ABI of one library ---- */

#define GYRE_FNS(X)                                                                                      \
  X(backend) X(device_count) X(device_name) X(last_error) X(status_name) X(param_count) X(model_create)  \
  X(model_load) X(model_save) X(model_get_weights) X(model_set_weights) X(model_free) X(cache_create)    \
  X(cache_free) X(cache_stats_get) X(seq_create) X(seq_fork) X(seq_free) X(seq_pin) X(seq_unpin)         \
  X(seq_fork_prefix) X(seq_export) X(seq_import) X(forward) X(trainer_create) X(trainer_free)            \
  X(train_batch) X(trainer_zero_grads) X(trainer_get_grads) X(trainer_set_grads) X(trainer_step)         \
  X(trainer_save_optimizer) X(trainer_load_optimizer) X(trainer_memory)

typedef struct api {
  const char *path;
  void *lib;
#define FIELD(n) __typeof__(&gyre_##n) n;
  GYRE_FNS(FIELD)
#undef FIELD
} api;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gyre-cuda-check: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static void api_open(api *a, const char *path) {
  a->path = path;
  a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (a->lib == NULL) die("cannot load %s: %s", path, dlerror());
#define LOAD(n)                                                         \
  a->n = (__typeof__(a->n))dlsym(a->lib, "gyre_" #n);                   \
  if (a->n == NULL) die("%s does not export gyre_%s", path, #n);
  GYRE_FNS(LOAD)
#undef LOAD
}

/* Calls an ABI function and stops with its message when it fails. */
#define TRY(a, call)                                                                          \
  do {                                                                                        \
    gyre_status st_ = (a)->call;                                                              \
    if (st_ != GYRE_OK) {                                                                     \
      char msg_[512];                                                                         \
      (a)->last_error(msg_, sizeof msg_);                                                     \
      die("%s (%s): %s -> %s: %s", (a)->backend(), (a)->path, #call, (a)->status_name(st_), msg_); \
    }                                                                                         \
  } while (0)

static void *xmalloc(size_t n) {
  void *p = calloc(n > 0 ? n : 1, 1);
  if (p == NULL) die("out of host memory (%zu bytes)", n);
  return p;
}

/* ---- results ---- */

static int failures;
static char json[1 << 16];
static size_t json_len;

static void json_add(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(json + json_len, sizeof json - json_len, fmt, ap);
  va_end(ap);
  if (n > 0 && json_len + (size_t)n < sizeof json) json_len += (size_t)n;
}

/* A check of `value` against `limit` (value <= limit passes). */
static void check(const char *model, const char *name, double value, double limit) {
  int ok = value <= limit; /* NaN fails */
  if (!ok) failures++;
  printf("%-4s %-14s %-34s %.3e  (limit %.1e)\n", ok ? "ok" : "FAIL", model, name, value, limit);
  json_add("%s\"%s/%s\":%.6e", json_len > 0 && json[json_len - 1] != '{' ? "," : "", model, name, value);
}

/* max |a - b| / max |b|: the error relative to the reference's scale */
static double rel_diff(const float *a, const float *b, size_t n) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (isnan(a[i]) != isnan(b[i])) d = INFINITY;
    if (!isnan(d) && d > err) err = d;
    if (!isnan(b[i]) && fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return scale > 0 ? err / scale : err;
}

static double bits_differ(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) != 0; }

/* ---- models ---- */

typedef struct model_spec {
  const char *name;
  gyre_config cfg;
  const char *dir; /* a checkpoint, or NULL: random weights */
} model_spec;

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) die("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = xmalloc((size_t)n);
  if (n < 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* A number (or true/false) of a flat JSON object; missing: fallback. */
static double json_number(const char *text, const char *key, double fallback) {
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char *at = strstr(text, quoted);
  if (at == NULL) return fallback;
  at = strchr(at + strlen(quoted), ':');
  if (at == NULL) return fallback;
  at++;
  while (*at == ' ' || *at == '\t' || *at == '\n' || *at == '\r') at++;
  if (strncmp(at, "true", 4) == 0) return 1;
  if (strncmp(at, "false", 5) == 0) return 0;
  char *end;
  double v = strtod(at, &end);
  return end == at ? fallback : v;
}

/* Whether a flat JSON object's string field `key` is `value`. */
static int json_string_is(const char *text, const char *key, const char *value) {
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char *at = strstr(text, quoted);
  if (at == NULL || (at = strchr(at + strlen(quoted), ':')) == NULL) return 0;
  at++;
  while (*at == ' ' || *at == '\t' || *at == '\n' || *at == '\r') at++;
  return *at == '"' && strncmp(at + 1, value, strlen(value)) == 0 && at[1 + strlen(value)] == '"';
}

static gyre_config read_config(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  size_t len;
  char *text = (char *)read_file(path, &len);
  text = realloc(text, len + 1);
  text[len] = '\0';
  gyre_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = (int32_t)json_number(text, "vocab_size", 0);
  c.hidden_size = (int32_t)json_number(text, "hidden_size", 0);
  c.intermediate_size = (int32_t)json_number(text, "intermediate_size", 0);
  c.num_hidden_layers = (int32_t)json_number(text, "num_hidden_layers", 0);
  c.num_attention_heads = (int32_t)json_number(text, "num_attention_heads", 0);
  c.num_key_value_heads = (int32_t)json_number(text, "num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = (int32_t)json_number(text, "max_position_embeddings", 0);
  c.tie_word_embeddings = (int32_t)json_number(text, "tie_word_embeddings", 0);
  c.rms_norm_eps = json_number(text, "rms_norm_eps", 1e-6);
  c.rope_theta = json_number(text, "rope_theta", 10000);
  c.head_dim = (int32_t)json_number(text, "head_dim", 0); /* null (no number) is 0: the default */
  c.qkv_bias = json_string_is(text, "model_type", "qwen2"); /* Qwen2ForCausalLM; RoPE scaling is not read */
  c.qk_norm = json_string_is(text, "model_type", "qwen3");
  free(text);
  return c;
}

/* The model's safetensors: the checkpoint's model.safetensors, or (none, or no such file)
 * random weights saved by `ref`. */
static uint8_t *model_bytes(const api *ref, const model_spec *s, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", s->dir != NULL ? s->dir : ".");
  FILE *f = s->dir != NULL ? fopen(path, "rb") : NULL;
  if (f != NULL) {
    fclose(f);
    return read_file(path, len);
  }
  gyre_model *m;
  TRY(ref, model_create(&s->cfg, 1234, 0.05f, &m));
  if (s->cfg.qkv_bias || s->cfg.qk_norm) { /* biases (0) and norms (1) moved off their initial values */
    int64_t n;
    TRY(ref, param_count(&s->cfg, &n));
    float *w = xmalloc(sizeof(float) * (size_t)n);
    TRY(ref, model_get_weights(m, w, n));
    uint64_t state = 99;
    for (int64_t i = 0; i < n; i++) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      w[i] += 0.1f * ((float)(state >> 40) / 16777216.0f - 0.5f);
    }
    TRY(ref, model_set_weights(m, w, n));
    free(w);
  }
  TRY(ref, model_save(m, NULL, 0, len));
  uint8_t *buf = xmalloc(*len);
  TRY(ref, model_save(m, buf, *len, len));
  ref->model_free(m);
  return buf;
}

static uint64_t lcg_state;
static uint32_t lcg(void) {
  lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(lcg_state >> 33);
}
static float lcg_unit(void) { return (float)(lcg() & 0xffffff) / 16777216.0f; }

/* ---- inference checks ---- */

/* Runs gyre_forward on one library, returning the logits (rows x vocab). */
static float *forward(const api *a, gyre_cache *c, int n, const int32_t *seqs, const int32_t *n_new, const int32_t *tokens,
                      int32_t mode, int vocab) {
  int rows = 0;
  for (int s = 0; s < n; s++) rows += mode == GYRE_LOGITS_ALL ? n_new[s] : 1;
  float *logits = xmalloc(sizeof(float) * (size_t)rows * vocab);
  TRY(a, forward(c, n, seqs, n_new, tokens, mode, logits, NULL, NULL, NULL));
  return logits;
}

/* rel_diff of two hand-off payloads of n elements of `elem` bytes (F32, or F16 widened). */
static double payload_diff(const uint8_t *a, const uint8_t *b, size_t n, int elem) {
  float *fa = xmalloc(sizeof(float) * (n ? n : 1)), *fb = xmalloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) {
    if (elem == 4) {
      memcpy(&fa[i], a + 4 * i, 4);
      memcpy(&fb[i], b + 4 * i, 4);
    } else {
      uint16_t ha, hb;
      memcpy(&ha, a + 2 * i, 2);
      memcpy(&hb, b + 2 * i, 2);
      fa[i] = half_to_float(ha);
      fb[i] = half_to_float(hb);
    }
  }
  double d = rel_diff(fa, fb, n);
  free(fa), free(fb);
  return d;
}

#define F16_TOL 2e-3

/* The checks of one KV storage type (kv_dtype); F16's checks are named <model>/f16 and compare
 * the libraries within F16_TOL (each rounds its own F32 K and V, which differ in the last
 * bits, so a few elements round to neighbouring halves). */
static void inference_checks(const api *cpu, const api *gpu, gyre_model *mc, gyre_model *mg, const model_spec *s,
                             int quick, int32_t kv_dtype) {
  const gyre_config *cfg = &s->cfg;
  char name[64];
  snprintf(name, sizeof name, "%s%s", s->name, kv_dtype == GYRE_KV_F16 ? "/f16" : "");
  const double tol = kv_dtype == GYRE_KV_F16 ? F16_TOL : 1e-4;
  const int elem = kv_dtype == GYRE_KV_F16 ? 2 : 4;
  const int V = cfg->vocab_size, B = 16;
  const int lens[3] = {1, quick ? 23 : 200, quick ? 270 : 700}; /* the last spans several 256-key chunks */
  int total = lens[0] + lens[1] + lens[2];
  if (lens[2] + 8 > cfg->max_position_embeddings) die("%s: max_position_embeddings too small for the checks", s->name);
  int32_t *tokens = xmalloc(sizeof(int32_t) * total);
  for (int i = 0; i < total; i++) tokens[i] = (int32_t)(lcg() % (uint32_t)V);
  const int blocks = 3 * ((lens[2] + 16) / B + 2) * 4;
  gyre_cache *cc, *cg;
  TRY(cpu, cache_create(mc, B, blocks, kv_dtype, &cc));
  TRY(gpu, cache_create(mg, B, blocks, kv_dtype, &cg));
  int32_t seq_c[3], seq_g[3];
  for (int k = 0; k < 3; k++) {
    TRY(cpu, seq_create(cc, &seq_c[k]));
    TRY(gpu, seq_create(cg, &seq_g[k]));
  }
  float *lc = forward(cpu, cc, 3, seq_c, lens, tokens, GYRE_LOGITS_ALL, V);
  float *lg = forward(gpu, cg, 3, seq_g, lens, tokens, GYRE_LOGITS_ALL, V);
  check(name, "prefill logits", rel_diff(lg, lc, (size_t)total * V), tol);
  free(lc);
  free(lg);

  /* decode: 4 steps of one token per sequence */
  const int32_t ones[3] = {1, 1, 1};
  double worst = 0.0;
  for (int step = 0; step < 4; step++) {
    int32_t next[3];
    for (int k = 0; k < 3; k++) next[k] = (int32_t)(lcg() % (uint32_t)V);
    lc = forward(cpu, cc, 3, seq_c, ones, next, GYRE_LOGITS_LAST, V);
    lg = forward(gpu, cg, 3, seq_g, ones, next, GYRE_LOGITS_LAST, V);
    double e = rel_diff(lg, lc, (size_t)3 * V);
    worst = e > worst ? e : worst;
    free(lc);
    free(lg);
  }
  check(name, "decode logits", worst, tol);

  /* fork in a partly filled block, then different appends (copy-on-write) */
  int32_t fork_c, fork_g, pair_c[2], pair_g[2], five[2] = {5, 5}, app[10];
  TRY(cpu, seq_fork(cc, seq_c[1], &fork_c));
  TRY(gpu, seq_fork(cg, seq_g[1], &fork_g));
  for (int i = 0; i < 10; i++) app[i] = (int32_t)(lcg() % (uint32_t)V);
  pair_c[0] = seq_c[1], pair_c[1] = fork_c, pair_g[0] = seq_g[1], pair_g[1] = fork_g;
  lc = forward(cpu, cc, 2, pair_c, five, app, GYRE_LOGITS_ALL, V);
  lg = forward(gpu, cg, 2, pair_g, five, app, GYRE_LOGITS_ALL, V);
  check(name, "fork copy-on-write logits", rel_diff(lg, lc, (size_t)10 * V), tol);
  free(lc);
  free(lg);

  /* prefix fork past the prefill (inside a block the parent filled further), then appends to
   * parent and child: the child's copy-on-write keeps the parent's tail */
  int32_t pre_c, pre_g;
  TRY(cpu, seq_fork_prefix(cc, seq_c[0], lens[0] + 1, &pre_c));
  TRY(gpu, seq_fork_prefix(cg, seq_g[0], lens[0] + 1, &pre_g));
  for (int i = 0; i < 10; i++) app[i] = (int32_t)(lcg() % (uint32_t)V);
  pair_c[0] = seq_c[0], pair_c[1] = pre_c, pair_g[0] = seq_g[0], pair_g[1] = pre_g;
  lc = forward(cpu, cc, 2, pair_c, five, app, GYRE_LOGITS_ALL, V);
  lg = forward(gpu, cg, 2, pair_g, five, app, GYRE_LOGITS_ALL, V);
  check(name, "prefix fork copy-on-write logits", rel_diff(lg, lc, (size_t)10 * V), tol);
  free(lc);
  free(lg);

  /* hand-off within the CUDA build: export, import into a cache of another block size,
   * decode the same token on both: bit for bit */
  size_t len;
  TRY(gpu, seq_pin(cg, seq_g[2]));
  TRY(gpu, seq_export(cg, seq_g[2], NULL, 0, &len));
  uint8_t *buf = xmalloc(len), *buf_c;
  TRY(gpu, seq_export(cg, seq_g[2], buf, len, &len));
  TRY(gpu, seq_unpin(cg, seq_g[2]));
  gyre_cache *cg2, *cc2;
  TRY(gpu, cache_create(mg, 8, (lens[2] + 16) / 8 + 8, kv_dtype, &cg2));
  int32_t imported, one = 1, tok = (int32_t)(lcg() % (uint32_t)V);
  TRY(gpu, seq_import(cg2, buf, len, &imported));
  float *a = forward(gpu, cg, 1, &seq_g[2], &one, &tok, GYRE_LOGITS_LAST, V);
  float *b = forward(gpu, cg2, 1, &imported, &one, &tok, GYRE_LOGITS_LAST, V);
  check(name, "hand-off cuda->cuda bits", bits_differ(a, b, sizeof(float) * V), 0);
  /* across builds: the CPU's own continuation against decoding CUDA's K/V on the CPU */
  size_t len_c;
  TRY(cpu, seq_export(cc, seq_c[2], NULL, 0, &len_c));
  buf_c = xmalloc(len_c);
  TRY(cpu, seq_export(cc, seq_c[2], buf_c, len_c, &len_c));
  check(name, "hand-off payload cuda vs cpu", len_c == len ? payload_diff(buf + 48, buf_c + 48, (len - 48) / elem, elem) : INFINITY,
        tol);
  TRY(cpu, cache_create(mc, 32, (lens[2] + 16) / 32 + 4, kv_dtype, &cc2));
  int32_t imported_c;
  TRY(cpu, seq_import(cc2, buf, len, &imported_c));
  float *c_own = forward(cpu, cc, 1, &seq_c[2], &one, &tok, GYRE_LOGITS_LAST, V);
  float *c_from_gpu = forward(cpu, cc2, 1, &imported_c, &one, &tok, GYRE_LOGITS_LAST, V);
  check(name, "hand-off cuda->cpu logits", rel_diff(c_from_gpu, c_own, V), tol);
  free(a), free(b), free(c_own), free(c_from_gpu), free(buf), free(buf_c);

  /* errors: a corrupt payload, and a pool too small (nothing changes) */
  gyre_cache *tiny_g;
  TRY(gpu, cache_create(mg, B, 2, kv_dtype, &tiny_g));
  int32_t s_new;
  TRY(gpu, seq_create(tiny_g, &s_new));
  int32_t n_big = 3 * B;
  float *big = xmalloc(sizeof(float) * V);
  gyre_status st = gpu->forward(tiny_g, 1, &s_new, &n_big, tokens, GYRE_LOGITS_LAST, big, NULL, NULL, NULL);
  gyre_cache_stats stats;
  TRY(gpu, cache_stats_get(tiny_g, &stats));
  check(name, "out of blocks -> error", !(st == GYRE_ERR_OUT_OF_BLOCKS && stats.used_blocks == 0), 0);
  TRY(gpu, seq_export(cg, seq_g[0], NULL, 0, &len));
  buf = xmalloc(len);
  TRY(gpu, seq_export(cg, seq_g[0], buf, len, &len));
  buf[len - 1] ^= 0x40;
  st = gpu->seq_import(cg2, buf, len, &imported);
  check(name, "corrupt hand-off -> error", st != GYRE_ERR_BAD_HANDOFF, 0);
  free(buf), free(big), free(tokens);
  gpu->cache_free(tiny_g);
  gpu->cache_free(cg2);
  cpu->cache_free(cc2);
  gpu->cache_free(cg);
  cpu->cache_free(cc);
}

/* ---- training checks ---- */

typedef struct packed {
  int n;
  int32_t *tokens, *parents, *positions, *versions;
  float *weights, *advantages, *behaviour, *proximal;
} packed;

/* A forest: branches given as (parent index or -1 for a new root, length). */
static packed make_forest(int vocab, int quick) {
  static const int spec_quick[][2] = {{-1, 70}, {49, 40}, {69, 20}, {-1, 20}, {30, 5}};
  static const int spec_full[][2] = {{-1, 300}, {199, 150}, {299, 100}, {-1, 120}, {50, 60}, {-1, 1}};
  const int (*spec)[2] = quick ? spec_quick : spec_full;
  const int branches = quick ? 5 : 6;
  packed p;
  memset(&p, 0, sizeof p);
  for (int k = 0; k < branches; k++) p.n += spec[k][1];
  p.tokens = xmalloc(sizeof(int32_t) * p.n);
  p.parents = xmalloc(sizeof(int32_t) * p.n);
  p.positions = xmalloc(sizeof(int32_t) * p.n);
  p.versions = xmalloc(sizeof(int32_t) * p.n);
  p.weights = xmalloc(sizeof(float) * p.n);
  p.advantages = xmalloc(sizeof(float) * p.n);
  p.behaviour = xmalloc(sizeof(float) * p.n);
  p.proximal = xmalloc(sizeof(float) * p.n);
  int at = 0;
  for (int k = 0; k < branches; k++) {
    int parent = spec[k][0]; /* an index among the tokens before the branch */
    for (int j = 0; j < spec[k][1]; j++, at++) {
      int par = j > 0 ? at - 1 : parent;
      p.parents[at] = par;
      p.positions[at] = par < 0 ? 0 : p.positions[par] + 1;
      p.tokens[at] = (int32_t)(lcg() % (uint32_t)vocab);
      p.weights[at] = par < 0 || (at % 7) == 3 ? 0.0f : 1.0f / (float)p.n;
      p.advantages[at] = (k % 2 ? -1.0f : 1.0f) * (0.5f + lcg_unit());
      p.versions[at] = (at % 11) == 5 ? 0 : 3;
    }
  }
  return p;
}

static void free_packed(packed *p) {
  free(p->tokens), free(p->parents), free(p->positions), free(p->versions);
  free(p->weights), free(p->advantages), free(p->behaviour), free(p->proximal);
}

static gyre_status train(const api *a, gyre_trainer *t, const packed *p, const gyre_loss_config *loss, float *logp,
                         gyre_train_stats *stats) {
  return a->train_batch(t, p->n, p->tokens, p->parents, p->positions, p->weights, p->advantages, p->behaviour,
                        p->proximal, p->versions, loss, 1, logp, stats);
}

/* The batch trained by a CUDA trainer whose chunks are about a third of it (the K/V of earlier
 * chunks kept on the device, their dK/dV carried back) against the CPU's unchunked SFT pass
 * (log-probs lpc, stats sc, gradients gc), and the store it reports. */
static void chunked_checks(const api *gpu, gyre_model *mg, const model_spec *s, const packed *p,
                           const float *lpc, const gyre_train_stats *sc, const float *gc, int64_t n_params) {
  gyre_trainer *t;
  TRY(gpu, trainer_create(mg, p->n / 3 + 1, &t));
  float *lp = xmalloc(sizeof(float) * p->n), *g = xmalloc(sizeof(float) * n_params);
  gyre_train_stats st;
  gyre_loss_config sft = {GYRE_LOSS_SFT, 0.2f, 0.2f, 0.0f, 3, -1, 0, 1.0f};
  TRY(gpu, train_batch(t, p->n, p->tokens, p->parents, p->positions, p->weights, NULL, NULL, NULL, NULL, &sft, 1, lp, &st));
  check(s->name, "chunked sft token log-probs", rel_diff(lp, lpc, p->n), 1e-4);
  check(s->name, "chunked sft loss", fabs(st.loss - sc->loss) / fabs(sc->loss), 1e-4);
  check(s->name, "chunked sft entropy", fabs(st.entropy - sc->entropy) / fabs(sc->entropy), 1e-4);
  TRY(gpu, trainer_get_grads(t, g, n_params));
  check(s->name, "chunked sft gradients", rel_diff(g, gc, n_params), 1e-4);
  gyre_trainer_memory_info mem;
  TRY(gpu, trainer_memory(t, &mem));
  check(s->name, "chunked store bytes (n x per token)",
        mem.kv_bytes_per_token <= 0 || mem.last_batch_bytes != (int64_t)p->n * mem.kv_bytes_per_token, 0);
  gpu->trainer_free(t);
  free(lp), free(g);
}

static void training_checks(const api *cpu, const api *gpu, gyre_model *mc, gyre_model *mg, const model_spec *s,
                            int quick) {
  int64_t n_params;
  TRY(cpu, param_count(&s->cfg, &n_params));
  packed p = make_forest(s->cfg.vocab_size, quick);
  gyre_trainer *tc, *tg;
  TRY(cpu, trainer_create(mc, p.n, &tc));
  TRY(gpu, trainer_create(mg, p.n, &tg));
  float *lpc = xmalloc(sizeof(float) * p.n), *lpg = xmalloc(sizeof(float) * p.n);
  float *gc = xmalloc(sizeof(float) * n_params), *gg = xmalloc(sizeof(float) * n_params);
  float *g2 = xmalloc(sizeof(float) * n_params);
  gyre_train_stats sc, sg;

  /* SFT */
  gyre_loss_config sft = {GYRE_LOSS_SFT, 0.2f, 0.2f, 0.0f, 3, -1, 0, 1.0f};
  TRY(cpu, train_batch(tc, p.n, p.tokens, p.parents, p.positions, p.weights, NULL, NULL, NULL, NULL, &sft, 1, lpc, &sc));
  TRY(gpu, train_batch(tg, p.n, p.tokens, p.parents, p.positions, p.weights, NULL, NULL, NULL, NULL, &sft, 1, lpg, &sg));
  check(s->name, "sft token log-probs", rel_diff(lpg, lpc, p.n), 1e-4);
  check(s->name, "sft loss", fabs(sg.loss - sc.loss) / fabs(sc.loss), 1e-4);
  check(s->name, "sft entropy", fabs(sg.entropy - sc.entropy) / fabs(sc.entropy), 1e-4);
  TRY(cpu, trainer_get_grads(tc, gc, n_params));
  TRY(gpu, trainer_get_grads(tg, gg, n_params));
  check(s->name, "sft gradients", rel_diff(gg, gc, n_params), 1e-4);

  chunked_checks(gpu, mg, s, &p, lpc, &sc, gc, n_params);

  /* PPO on top (accumulation), behaviour / proximal log-probs near the policy's */
  for (int i = 0; i < p.n; i++) {
    p.behaviour[i] = isnan(lpc[i]) ? 0.0f : lpc[i] + 0.3f * (lcg_unit() - 0.5f);
    p.proximal[i] = i % 3 == 0 ? NAN : p.behaviour[i] + 0.1f * (lcg_unit() - 0.5f);
  }
  gyre_loss_config ppo = {GYRE_LOSS_PPO, 0.2f, 0.28f, 1.5f, 3, 2, 0, 1.0f};
  if (train(cpu, tc, &p, &ppo, lpc, &sc) != GYRE_OK || train(gpu, tg, &p, &ppo, lpg, &sg) != GYRE_OK)
    die("%s: PPO train_batch failed", s->name);
  check(s->name, "ppo token log-probs", rel_diff(lpg, lpc, p.n), 1e-4);
  check(s->name, "ppo loss", fabs(sg.loss - sc.loss) / fmax(fabs(sc.loss), 1e-12), 1e-4);
  check(s->name, "ppo mean ratio", fabs(sg.mean_ratio - sc.mean_ratio), 1e-5);
  check(s->name, "ppo clip fraction", fabs(sg.clip_fraction - sc.clip_fraction), 0);
  check(s->name, "ppo truncated, stale counts",
        fabs(sg.truncated_fraction - sc.truncated_fraction) + abs(sg.stale_tokens - sc.stale_tokens) +
            abs(sg.trained_tokens - sc.trained_tokens),
        0);
  /* ... and with the trained weights as the proximal policy (r = 1, w = pi / mu) */
  gyre_loss_config current = ppo;
  current.proximal_current = 1;
  if (train(cpu, tc, &p, &current, lpc, &sc) != GYRE_OK || train(gpu, tg, &p, &current, lpg, &sg) != GYRE_OK)
    die("%s: PPO (current proximal) train_batch failed", s->name);
  check(s->name, "ppo current-proximal loss", fabs(sg.loss - sc.loss) / fmax(fabs(sc.loss), 1e-12), 1e-4);
  check(s->name, "ppo current-proximal ratio", fabs(sg.mean_ratio - 1.0) + fabs(sc.mean_ratio - 1.0), 0);
  check(s->name, "ppo current-proximal is weight", fabs(sg.mean_is_weight - sc.mean_is_weight), 1e-4);
  /* ... and at a sampling temperature (logits / 0.7 in the log-probs, the entropy and the gradients) */
  gyre_loss_config tempered = ppo;
  tempered.temperature = 0.7f;
  if (train(cpu, tc, &p, &tempered, lpc, &sc) != GYRE_OK || train(gpu, tg, &p, &tempered, lpg, &sg) != GYRE_OK)
    die("%s: PPO (temperature 0.7) train_batch failed", s->name);
  check(s->name, "ppo tempered token log-probs", rel_diff(lpg, lpc, p.n), 1e-4);
  check(s->name, "ppo tempered loss", fabs(sg.loss - sc.loss) / fmax(fabs(sc.loss), 1e-12), 1e-4);
  check(s->name, "ppo tempered entropy", fabs(sg.entropy - sc.entropy) / fabs(sc.entropy), 1e-4);
  TRY(cpu, trainer_get_grads(tc, gc, n_params));
  TRY(gpu, trainer_get_grads(tg, gg, n_params));
  check(s->name, "sft+ppo accumulated gradients", rel_diff(gg, gc, n_params), 1e-4);

  /* determinism: the same batch twice from zero gives the same bits */
  TRY(gpu, trainer_zero_grads(tg));
  if (train(gpu, tg, &p, &ppo, lpg, &sg) != GYRE_OK) die("%s: PPO train_batch failed", s->name);
  TRY(gpu, trainer_get_grads(tg, gg, n_params));
  TRY(gpu, trainer_zero_grads(tg));
  if (train(gpu, tg, &p, &ppo, lpg, &sg) != GYRE_OK) die("%s: PPO train_batch failed", s->name);
  TRY(gpu, trainer_get_grads(tg, g2, n_params));
  check(s->name, "cuda gradients deterministic", bits_differ(gg, g2, sizeof(float) * n_params), 0);

  /* AdamW from the same gradients, two steps */
  gyre_adamw opt = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.5f};
  TRY(gpu, trainer_set_grads(tg, gc, n_params));
  float norm_c, norm_g;
  for (int step = 0; step < 2; step++) {
    TRY(cpu, trainer_step(tc, &opt, &norm_c));
    TRY(gpu, trainer_step(tg, &opt, &norm_g));
  }
  check(s->name, "adamw grad norm", fabs(norm_g - norm_c) / norm_c, 1e-5);
  TRY(cpu, model_get_weights(mc, gc, n_params));
  TRY(gpu, model_get_weights(mg, gg, n_params));
  check(s->name, "adamw weights", rel_diff(gg, gc, n_params), 1e-5);

  /* optimizer state: CUDA -> CPU -> bytes equal */
  size_t len, len2;
  TRY(gpu, trainer_save_optimizer(tg, NULL, 0, &len));
  uint8_t *state = xmalloc(len), *state2;
  TRY(gpu, trainer_save_optimizer(tg, state, len, &len));
  gyre_trainer *t3;
  TRY(cpu, trainer_create(mc, 4, &t3));
  TRY(cpu, trainer_load_optimizer(t3, state, len));
  TRY(cpu, trainer_save_optimizer(t3, NULL, 0, &len2));
  state2 = xmalloc(len2);
  TRY(cpu, trainer_save_optimizer(t3, state2, len2, &len2));
  check(s->name, "optimizer state round trip", len != len2 || bits_differ(state, state2, len), 0);
  free(state), free(state2);
  cpu->trainer_free(t3);
  cpu->trainer_free(tc);
  gpu->trainer_free(tg);
  free(lpc), free(lpg), free(gc), free(gg), free(g2);
  free_packed(&p);
}

static void compare_model(const api *cpu, const api *gpu, const model_spec *s, int quick) {
  size_t len;
  uint8_t *bytes = model_bytes(cpu, s, &len);
  gyre_model *mc, *mg;
  TRY(cpu, model_load(&s->cfg, bytes, len, &mc));
  TRY(gpu, model_load(&s->cfg, bytes, len, &mg));
  int64_t n;
  TRY(cpu, param_count(&s->cfg, &n));
  float *wc = xmalloc(sizeof(float) * n), *wg = xmalloc(sizeof(float) * n);
  TRY(cpu, model_get_weights(mc, wc, n));
  TRY(gpu, model_get_weights(mg, wg, n));
  check(s->name, "loaded weights bits", bits_differ(wc, wg, sizeof(float) * n), 0);
  free(wc), free(wg), free(bytes);
  inference_checks(cpu, gpu, mc, mg, s, quick, GYRE_KV_F32);
  inference_checks(cpu, gpu, mc, mg, s, quick, GYRE_KV_F16);
  training_checks(cpu, gpu, mc, mg, s, quick);
  cpu->model_free(mc);
  gpu->model_free(mg);
}

#define MAX_DIRS 4

static gyre_config config_of(int V, int D, int F, int L, int H, int KV, int tied) {
  gyre_config c = {V, D, F, L, H, KV, 2048, tied, 1e-5, 10000.0};
  return c;
}

/* c with an explicit head_dim (H * hd != D allowed, as in LlamaConfig). */
static gyre_config with_head_dim(gyre_config c, int hd) {
  c.head_dim = hd;
  return c;
}

/* Qwen2 (q/k/v biases) or Qwen3 (per-head q/k RMSNorm, YaRN with its attention factor). */
static gyre_config qwen(gyre_config c, int qwen3) {
  c.qkv_bias = !qwen3;
  c.qk_norm = qwen3;
  if (qwen3) {
    c.rope_type = GYRE_ROPE_YARN;
    c.rope_factor = 4.0;
    c.rope_original_max_position_embeddings = 512;
    c.rope_truncate = 1;
  }
  return c;
}

#define CHECKS_FAILED 4 /* a child's exit status when some of its checks failed */

/* Runs one model's comparison in a child process, so a crash of either library (or a CUDA
 * fault, which poisons the process's context) fails that model and the others still run.
 * The parent never initialises CUDA (a CUDA context does not survive fork); the child's
 * JSON entries come back through a pipe. */
static void compare_isolated(const api *cpu, const api *gpu, const model_spec *s, int quick, int first) {
  int fds[2];
  if (pipe(fds) != 0) die("pipe failed");
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    close(fds[0]);
    json_len = 0;
    failures = 0;
    if (first) {
      char name[256];
      if (gpu->device_count() < 1) die("%s: no CUDA device visible", gpu->path);
      TRY(gpu, device_name(0, name, sizeof name));
      printf("cuda device 0: %s\n", name);
      json_add("\"device\":\"%s\"", name);
    }
    compare_model(cpu, gpu, s, quick);
    if (write(fds[1], json, json_len) != (ssize_t)json_len) _exit(3);
    fflush(stdout);
    _exit(failures > 0 ? CHECKS_FAILED : 0);
  }
  close(fds[1]);
  char part[sizeof json];
  size_t got = 0;
  ssize_t n;
  while ((n = read(fds[0], part + got, sizeof part - 1 - got)) > 0) got += (size_t)n;
  close(fds[0]);
  part[got] = '\0';
  int status = 0;
  waitpid(pid, &status, 0);
  if (got > 0) json_add("%s%s", json[json_len - 1] != '{' ? "," : "", part);
  if (WIFSIGNALED(status)) check(s->name, "crashed (signal number)", WTERMSIG(status), 0);
  else if (WEXITSTATUS(status) == CHECKS_FAILED) failures++; /* the FAIL lines are above */
  else if (WEXITSTATUS(status) == 2) check(s->name, "setup failed (see above)", 1, 0);
  else if (WEXITSTATUS(status) != 0) check(s->name, "died (exit status; a sanitizer report?)", WEXITSTATUS(status), 0);
}

static int run_compare(const char *cpu_path, const char *cuda_path, const char *const *dirs, int n_dirs, int quick) {
  api cpu, gpu;
  api_open(&cpu, cpu_path);
  api_open(&gpu, cuda_path);
  if (strcmp(gpu.backend(), "cuda") != 0 || strcmp(cpu.backend(), "cpu") != 0)
    die("expected a cpu and a cuda build, got %s and %s", cpu.backend(), gpu.backend());
  json_add("{");
  model_spec specs[8 + MAX_DIRS] = {
      {"gqa-hd16", config_of(300, 64, 160, 2, 4, 2, 0), NULL},
      {"mqa-hd64-tied", config_of(259, 128, 256, 2, 2, 1, 1), NULL},
      {"mha-hd128", config_of(128, 256, 320, 1, 2, 2, 0), NULL},
      {"g20-hd8", config_of(64, 160, 96, 1, 20, 1, 0), NULL}, /* 20 query heads per kv head: 2 slices */
      {"mha-hd6", config_of(40, 12, 20, 2, 2, 2, 0), NULL},   /* head_dim not a multiple of 4 */
      {"gqa-hd16-wide", with_head_dim(config_of(96, 48, 80, 2, 4, 2, 0), 16), NULL}, /* H * hd = 64 != D = 48 */
      {"qwen2-gqa-hd16-tied", qwen(config_of(200, 64, 96, 2, 4, 2, 1), 0), NULL},
      {"qwen3-gqa-hd32-yarn", qwen(with_head_dim(config_of(150, 48, 80, 2, 4, 2, 0), 32), 1), NULL},
  };
  int n_specs = 8;
  for (int k = 0; k < n_dirs; k++, n_specs++) {
    const char *slash = strrchr(dirs[k], '/');
    specs[n_specs].name = slash != NULL && slash[1] != '\0' ? slash + 1 : dirs[k];
    specs[n_specs].cfg = read_config(dirs[k]);
    specs[n_specs].dir = dirs[k];
  }
  for (int k = 0; k < n_specs; k++) {
    lcg_state = 42 + (uint64_t)k; /* each model's data independent of the others' */
    compare_isolated(&cpu, &gpu, &specs[k], quick, k == 0);
  }
  json_add("%s\"failures\":%d}", json[json_len - 1] != '{' ? "," : "", failures);
  return failures > 0;
}

/* ---- benchmark ---- */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* gyre.h's head_dim: 0 is hidden_size / num_attention_heads. */
static double head_dim_of(const gyre_config *c) {
  return c->head_dim != 0 ? c->head_dim : (double)c->hidden_size / c->num_attention_heads;
}

/* Bytes one decode step reads: every weight once, plus each sequence's cached K/V. */
static double decode_bytes(const gyre_config *c, int64_t n_params, int seqs, int context) {
  double kv_per_token = 2.0 * c->num_hidden_layers * head_dim_of(c) * c->num_key_value_heads * sizeof(float);
  return 4.0 * (double)n_params + (double)seqs * context * kv_per_token;
}

/* Matmul FLOPs of forward + backward over `tokens` tokens whose attention sees `pairs`
 * (query, key) pairs in all: 6 per weight (the embedding gather excluded) per token, and
 * 4 (forward) + 8 (backward) per pair, head dim and head. */
static double train_flops(const gyre_config *c, double tokens, double pairs) {
  const double D = c->hidden_size, F = c->intermediate_size, H = c->num_attention_heads,
               KV = c->num_key_value_heads, L = c->num_hidden_layers, V = c->vocab_size, hd = head_dim_of(c);
  const double per_layer = D * (H + 2 * KV) * hd + H * hd * D + 3 * D * F;
  return 6.0 * tokens * (L * per_layer + V * D) + 12.0 * pairs * hd * H * L;
}

static int run_bench(const char *cuda_path, const char *dir, const char *probe, int quick) {
  api gpu;
  api_open(&gpu, cuda_path);
  if (gpu.device_count() < 1) die("%s: no CUDA device visible", cuda_path);
  model_spec s = {"checkpoint", read_config(dir), dir};
  size_t len;
  uint8_t *bytes = model_bytes(&gpu, &s, &len);
  gyre_model *m;
  TRY(&gpu, model_load(&s.cfg, bytes, len, &m));
  free(bytes);
  int64_t n_params;
  TRY(&gpu, param_count(&s.cfg, &n_params));
  /* --quick (the emulator): the same steps at toy sizes, to check the tool itself */
  const int V = s.cfg.vocab_size, seqs = quick ? 2 : 16, B = 16, longest = quick ? 80 : 4096;
  double bandwidth = 0, sgemm = 0;
  if (probe != NULL) {
    size_t plen;
    char *text = (char *)read_file(probe, &plen);
    text = realloc(text, plen + 1);
    text[plen] = '\0';
    bandwidth = json_number(text, "bandwidth_gbs", 0);
    sgemm = json_number(text, "sgemm_gflops", 0);
    free(text);
  }
  char name[256];
  TRY(&gpu, device_name(0, name, sizeof name));
  json_add("{\"device\":\"%s\",\"params\":%lld", name, (long long)n_params);

  /* prefill 16 x 512, then decode at 512 and, after growing the context, at 4096 */
  const int contexts[2] = {quick ? 40 : 512, longest};
  gyre_cache *c;
  TRY(&gpu, cache_create(m, B, seqs * (longest + 64) / B + seqs, GYRE_KV_F32, &c));
  int32_t ids[16], n_new[16], ones[16];
  int32_t *tokens = xmalloc(sizeof(int32_t) * seqs * longest);
  for (int i = 0; i < seqs * longest; i++) tokens[i] = (int32_t)(lcg() % (uint32_t)V);
  float *logits = xmalloc(sizeof(float) * seqs * V);
  for (int k = 0; k < seqs; k++) {
    TRY(&gpu, seq_create(c, &ids[k]));
    n_new[k] = contexts[0];
    ones[k] = 1;
  }
  double t0 = now();
  TRY(&gpu, forward(c, seqs, ids, n_new, tokens, GYRE_LOGITS_LAST, logits, NULL, NULL, NULL));
  double prefill = seqs * contexts[0] / (now() - t0);
  printf("prefill  %d x %d tokens: %.0f tokens/s\n", seqs, contexts[0], prefill);
  json_add(",\"prefill_tokens_per_s\":%.1f", prefill);
  int context = contexts[0];
  for (int k = 0; k < 2; k++) {
    if (context < contexts[k]) { /* grow every sequence to the context */
      for (int j = 0; j < seqs; j++) n_new[j] = contexts[k] - context;
      TRY(&gpu, forward(c, seqs, ids, n_new, tokens, GYRE_LOGITS_NONE, NULL, NULL, NULL, NULL));
      context = contexts[k];
    }
    const int steps = quick ? 2 : 32;
    TRY(&gpu, forward(c, seqs, ids, ones, tokens, GYRE_LOGITS_LAST, logits, NULL, NULL, NULL)); /* warm */
    context++;
    t0 = now();
    for (int step = 0; step < steps; step++)
      TRY(&gpu, forward(c, seqs, ids, ones, tokens + step * seqs, GYRE_LOGITS_LAST, logits, NULL, NULL, NULL));
    double dt = (now() - t0) / steps, rate = seqs / dt;
    double gbs = decode_bytes(&s.cfg, n_params, seqs, context + steps / 2) / dt / 1e9;
    context += steps;
    printf("decode   %d seqs at context %d: %.0f tokens/s, %.1f GB/s", seqs, contexts[k], rate, gbs);
    json_add(",\"decode_%d_tokens_per_s\":%.1f,\"decode_%d_gbs\":%.2f", contexts[k], rate, contexts[k], gbs);
    if (bandwidth > 0) {
      printf(" = %.1f%% of the measured %.0f GB/s", 100 * gbs / bandwidth, bandwidth);
      json_add(",\"decode_%d_frac_of_bandwidth\":%.4f", contexts[k], gbs / bandwidth);
    }
    printf("\n");
  }
  gpu.cache_free(c);

  /* training: 16 chains of 512 tokens per micro-batch, SFT, forward + backward + AdamW */
  const int chain = quick ? 40 : 512, n = seqs * chain;
  int32_t *parents = xmalloc(sizeof(int32_t) * n), *positions = xmalloc(sizeof(int32_t) * n);
  for (int i = 0; i < n; i++) {
    parents[i] = i % chain == 0 ? -1 : i - 1;
    positions[i] = i % chain;
  }
  gyre_trainer *t;
  TRY(&gpu, trainer_create(m, n, &t));
  gyre_loss_config sft = {GYRE_LOSS_SFT, 0.2f, 0.2f, 0.0f, 0, -1, 0, 1.0f};
  gyre_adamw opt = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f};
  float norm;
  const int steps = quick ? 1 : 5;
  for (int step = -1; step < steps; step++) { /* step -1 warms up */
    if (step == 0) t0 = now();
    TRY(&gpu, train_batch(t, n, tokens, parents, positions, NULL, NULL, NULL, NULL, NULL, &sft, 1, NULL, NULL));
    TRY(&gpu, trainer_step(t, &opt, &norm));
    TRY(&gpu, trainer_zero_grads(t));
  }
  double dt = (now() - t0) / steps, rate = n / dt;
  double pairs = (double)seqs * chain * (chain + 1) / 2.0, gflops = train_flops(&s.cfg, n, pairs) / dt / 1e9;
  printf("train    %d tokens per step: %.0f tokens/s, %.0f GFLOP/s", n, rate, gflops);
  json_add(",\"train_tokens_per_s\":%.1f,\"train_gflops\":%.1f", rate, gflops);
  if (sgemm > 0) {
    printf(" = %.1f%% of the measured SGEMM %.0f GFLOP/s", 100 * gflops / sgemm, sgemm);
    json_add(",\"train_frac_of_sgemm\":%.4f", gflops / sgemm);
  }
  printf("\n");
  json_add("}");
  gpu.trainer_free(t);
  gpu.model_free(m);
  free(tokens), free(logits), free(parents), free(positions);
  return 0;
}

/* ---- long paths ---- */

/* One chain of n tokens at positions pos0 .. pos0 + n - 1, every token but the root trained
 * with weight 1 / n. */
static packed make_path(int vocab, int n, int pos0) {
  packed p;
  memset(&p, 0, sizeof p);
  p.n = n;
  p.tokens = xmalloc(sizeof(int32_t) * n);
  p.parents = xmalloc(sizeof(int32_t) * n);
  p.positions = xmalloc(sizeof(int32_t) * n);
  p.versions = xmalloc(sizeof(int32_t) * n);
  p.weights = xmalloc(sizeof(float) * n);
  p.advantages = xmalloc(sizeof(float) * n);
  p.behaviour = xmalloc(sizeof(float) * n);
  p.proximal = xmalloc(sizeof(float) * n);
  for (int i = 0; i < n; i++) {
    p.tokens[i] = (int32_t)(lcg() % (uint32_t)vocab);
    p.parents[i] = i - 1;
    p.positions[i] = pos0 + i;
    p.weights[i] = i == 0 ? 0.0f : 1.0f / (float)n;
  }
  return p;
}

/* SFT over p (forward + backward) on a fresh trainer of max_tokens `chunk`: log-probs, stats,
 * gradients; the trainer's memory report. */
static void sft_pass(const api *a, gyre_model *m, const packed *p, int chunk, int64_t n_params, float *logp,
                     gyre_train_stats *stats, float *grads, gyre_trainer_memory_info *mem) {
  gyre_trainer *t;
  gyre_loss_config sft = {GYRE_LOSS_SFT, 0.2f, 0.2f, 0.0f, 0, -1, 0, 1.0f};
  TRY(a, trainer_create(m, chunk, &t));
  TRY(a, train_batch(t, p->n, p->tokens, p->parents, p->positions, p->weights, NULL, NULL, NULL, NULL, &sft, 1, logp, stats));
  TRY(a, trainer_get_grads(t, grads, n_params));
  TRY(a, trainer_memory(t, mem));
  a->trainer_free(t);
}

/* A path at positions from 120,000 (past 100k and 2^16): the CUDA build unchunked and in
 * chunks of a quarter of it against the CPU build unchunked. */
static void long_position_checks(const api *cpu, const api *gpu, gyre_model *mc, gyre_model *mg, const model_spec *s,
                                 int quick) {
  int64_t n_params;
  TRY(cpu, param_count(&s->cfg, &n_params));
  packed p = make_path(s->cfg.vocab_size, quick ? 300 : 2048, 120000);
  float *lpc = xmalloc(sizeof(float) * p.n), *lpg = xmalloc(sizeof(float) * p.n);
  float *gc = xmalloc(sizeof(float) * n_params), *gg = xmalloc(sizeof(float) * n_params);
  gyre_train_stats sc, sg;
  gyre_trainer_memory_info mem;
  sft_pass(cpu, mc, &p, p.n, n_params, lpc, &sc, gc, &mem);
  for (int chunked = 0; chunked < 2; chunked++) {
    char name[64];
    const char *how = chunked ? "chunked" : "unchunked";
    sft_pass(gpu, mg, &p, chunked ? p.n / 4 : p.n, n_params, lpg, &sg, gg, &mem);
    snprintf(name, sizeof name, "pos 120k %s log-probs", how);
    check(s->name, name, rel_diff(lpg, lpc, p.n), 1e-4);
    snprintf(name, sizeof name, "pos 120k %s loss", how);
    check(s->name, name, fabs(sg.loss - sc.loss) / fabs(sc.loss), 1e-4);
    snprintf(name, sizeof name, "pos 120k %s gradients", how);
    check(s->name, name, rel_diff(gg, gc, n_params), 1e-4);
  }
  check(s->name, "pos 120k chunked store bytes", mem.last_batch_bytes != (int64_t)p.n * mem.kv_bytes_per_token, 0);
  free(lpc), free(lpg), free(gc), free(gg);
  free_packed(&p);
}

/* Attention pairs per second of training one path of n tokens (SFT, forward + backward) with
 * chunks of `chunk` tokens, as bench/attention.ts counts them: n (n + 1) / 2 pairs over the
 * pass's wall time (one warm-up pass on a 256-token path first). */
static double path_rate(const api *gpu, gyre_model *m, int vocab, int n, int chunk, int64_t *store_bytes) {
  gyre_trainer *t;
  gyre_loss_config sft = {GYRE_LOSS_SFT, 0.2f, 0.2f, 0.0f, 0, -1, 0, 1.0f};
  packed warm = make_path(vocab, 256, 0), p = make_path(vocab, n, 0);
  TRY(gpu, trainer_create(m, chunk, &t));
  TRY(gpu, train_batch(t, warm.n, warm.tokens, warm.parents, warm.positions, warm.weights, NULL, NULL, NULL, NULL, &sft, 1,
                       NULL, NULL));
  const double t0 = now();
  TRY(gpu, train_batch(t, p.n, p.tokens, p.parents, p.positions, p.weights, NULL, NULL, NULL, NULL, &sft, 1, NULL, NULL));
  const double seconds = now() - t0;
  gyre_trainer_memory_info mem;
  TRY(gpu, trainer_memory(t, &mem));
  *store_bytes = mem.last_batch_bytes;
  gpu->trainer_free(t);
  free_packed(&warm), free_packed(&p);
  return (double)n * (n + 1) / 2.0 / seconds;
}

static int run_long(const char *cpu_path, const char *cuda_path, const char *dir, int longest, int quick) {
  api cpu, gpu;
  api_open(&cpu, cpu_path);
  api_open(&gpu, cuda_path);
  if (gpu.device_count() < 1) die("%s: no CUDA device visible", cuda_path);
  /* without a checkpoint: tiny-long's shape (2 layers, 2 query heads on 1 kv head of 32) */
  gyre_config cfg = with_head_dim(config_of(300, 128, 320, 2, 2, 1, 1), 32);
  cfg.max_position_embeddings = 1 << 20;
  cfg.rope_theta = 500000.0;
  model_spec s = {"tiny-long", dir != NULL ? read_config(dir) : cfg, dir};
  char name[256];
  TRY(&gpu, device_name(0, name, sizeof name));
  json_add("{\"device\":\"%s\"", name);
  size_t len;
  uint8_t *bytes = model_bytes(&cpu, &s, &len);
  gyre_model *mc, *mg;
  TRY(&cpu, model_load(&s.cfg, bytes, len, &mc));
  TRY(&gpu, model_load(&s.cfg, bytes, len, &mg));
  free(bytes);
  long_position_checks(&cpu, &gpu, mc, mg, &s, quick);
  const int chunk = quick ? 256 : 4096, shortest = chunk;
  if (longest > s.cfg.max_position_embeddings) longest = s.cfg.max_position_embeddings;
  int64_t store_short, store_long;
  const double r_short = path_rate(&gpu, mg, s.cfg.vocab_size, shortest, chunk, &store_short);
  const double r_long = path_rate(&gpu, mg, s.cfg.vocab_size, longest, chunk, &store_long);
  printf("attention (training, one path, chunks of %d): %d tokens %.3e pairs/s, %d tokens %.3e pairs/s (%.2f of the "
         "former), K/V store %.1f MB\n",
         chunk, shortest, r_short, longest, r_long, r_long / r_short, store_long / 1e6);
  json_add(",\"short_tokens\":%d,\"attention_pairs_per_s_4k\":%.0f,\"attention_pairs_per_s_long\":%.0f,\"long_tokens\":%d,"
           "\"long_over_4k\":%.3f,\"chunk\":%d,\"long_store_bytes\":%lld,\"failures\":%d}",
           shortest, r_short, r_long, longest, r_long / r_short, chunk, (long long)store_long, failures);
  cpu.model_free(mc);
  gpu.model_free(mg);
  return failures > 0;
}

/* ---- main ---- */

static void usage(void) {
  die("usage: gyre-cuda-check compare --cpu LIB --cuda LIB [--checkpoint DIR]... [--quick] [--json FILE]\n"
      "       gyre-cuda-check bench --cuda LIB --checkpoint DIR [--probe FILE] [--quick] [--json FILE]\n"
      "       gyre-cuda-check long --cpu LIB --cuda LIB [--checkpoint DIR] [--long TOKENS] [--quick] [--json FILE]");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) usage();
  const char *cpu = NULL, *cuda = NULL, *dirs[MAX_DIRS], *out = NULL, *probe = NULL;
  int quick = 0, n_dirs = 0, longest = 131072;
  for (int i = 2; i < argc; i++) {
    const char *flag = argv[i];
    if (strcmp(flag, "--quick") == 0) {
      quick = 1;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char *value = argv[++i];
    if (strcmp(flag, "--cpu") == 0) cpu = value;
    else if (strcmp(flag, "--cuda") == 0) cuda = value;
    else if (strcmp(flag, "--checkpoint") == 0 && n_dirs < MAX_DIRS) dirs[n_dirs++] = value;
    else if (strcmp(flag, "--json") == 0) out = value;
    else if (strcmp(flag, "--probe") == 0) probe = value;
    else if (strcmp(flag, "--long") == 0 && atoi(value) > 0) longest = atoi(value);
    else usage();
  }
  int rc;
  if (strcmp(argv[1], "compare") == 0 && cpu != NULL && cuda != NULL) rc = run_compare(cpu, cuda, dirs, n_dirs, quick);
  else if (strcmp(argv[1], "bench") == 0 && cuda != NULL && n_dirs == 1) rc = run_bench(cuda, dirs[0], probe, quick);
  else if (strcmp(argv[1], "long") == 0 && cpu != NULL && cuda != NULL && n_dirs <= 1)
    rc = run_long(cpu, cuda, n_dirs == 1 ? dirs[0] : NULL, longest, quick);
  else usage();
  printf("%s\n", json);
  if (out != NULL) {
    FILE *f = fopen(out, "w");
    if (f == NULL) die("cannot write %s", out);
    fprintf(f, "%s\n", json);
    fclose(f);
  }
  return rc;
}
