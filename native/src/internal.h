/*
 * internal.h - device-independent pieces shared by every backend build.
 *
 * src/common/ implements the public ABI (gyre.h) once: argument checks, the parameter
 * layout, safetensors and hand-off formats, KV block bookkeeping, the forest (ancestor
 * ranges) of a packed batch, loss terms and sampling. It calls the backend (backend.h) only
 * for what touches device memory. Everything here runs on the host.
 *
 * Plain C11 that also compiles as C++ (the CUDA backend includes it from .cu files): no C-only
 * qualifiers, C linkage for every declaration.
 */
#ifndef GYRE_INTERNAL_H
#define GYRE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "gyre.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (common/errors.c) ---- */

/* Records the message (printf format) as the last error and returns status. */
gyre_status gyre_fail(gyre_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define GYRE_CHECK(call)                       \
  do {                                         \
    gyre_status gyre_check_status_ = (call);   \
    if (gyre_check_status_ != GYRE_OK) return gyre_check_status_; \
  } while (0)

/* ---- model dimensions and parameter layout (common/layout.c) ---- */

typedef struct dims {
  int32_t V, D, F, L, H, KV, hd; /* vocab, hidden, intermediate, layers, heads, kv heads, head dim */
  int32_t q_dim;                 /* H * hd */
  int32_t kv_dim;                /* KV * hd */
  int32_t qkv_dim;               /* (H + 2 KV) * hd: q | k | v of one token */
  int32_t max_pos;
  int32_t tied;
  float eps;
  double rope_theta;
  int32_t rope_type, rope_original_max_pos;
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int32_t rope_truncate;
  double rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim, rope_attention_factor;
  int32_t qkv_bias, qk_norm;     /* gyre_config's architecture options */
} dims;

/* Offsets (in floats) of one layer's tensors in the flat parameter vector. q, k, v are
 * consecutive, so wqkv is the stacked [qkv_dim, D] matrix; gate, up likewise form [2F, D];
 * the biases form bqkv [qkv_dim]. bqkv, qnorm and knorm are -1 when the config has none. */
typedef struct layer_offsets {
  int64_t ln_in, wqkv, bqkv, qnorm, knorm, wo, ln_post, wgu, wdown;
} layer_offsets;

typedef struct param_tensor {
  char name[96];
  int64_t offset;
  int32_t rank;
  int64_t shape[2];
} param_tensor;

typedef struct param_layout {
  dims d;
  int64_t n_params;
  int32_t n_tensors;
  param_tensor *tensors;
  layer_offsets *layers;
  int64_t embed, norm_f, lm_head; /* lm_head == embed when tied */
} param_layout;

gyre_status dims_from_config(const gyre_config *cfg, dims *d);
gyre_status layout_build(const gyre_config *cfg, param_layout *out);
void layout_free(param_layout *layout);
/* Checks a flat-vector argument of n floats for a handle of this layout. */
gyre_status flat_check(const param_layout *layout, const void *handle, const void *p, int64_t n,
                       const char *fn);

/* ---- safetensors (common/safetensors.c) ---- */

/* A safetensors file holds n_groups copies of the layout, group g's tensor names prefixed by
 * prefixes[g] ("" for the model, "exp_avg." for a moment); flats[g] is its flat vector. */
gyre_status st_encode(const param_layout *layout, int32_t n_groups, const char *const *prefixes,
                      const float *const *flats, const char *metadata_json, uint8_t *out,
                      size_t cap, size_t *len);
/* Parses and checks a safetensors buffer against the layout and fills flats; if meta_key is
 * not NULL, copies that metadata string value into meta_value (empty if absent). */
gyre_status st_decode(const param_layout *layout, int32_t n_groups, const char *const *prefixes,
                      float *const *flats, const uint8_t *buf, size_t len, const char *meta_key,
                      char *meta_value, size_t meta_cap);

/* ---- random numbers (common/random.c) ---- */

uint64_t splitmix64(uint64_t *state);
/* Uniform in [0, 1) with 24 random bits, a pure function of (seed, counter). */
float uniform_at(uint64_t seed, uint64_t counter);
/* Fills the flat vector with the Hugging Face Llama initialisation. */
void init_weights(const param_layout *layout, uint64_t seed, float init_std, float *flat);

/* ---- RoPE (common/rope.c) ---- */

/* cs[T, hd]: row t holds cos then sin [hd/2 each] of the angles positions[t] * inv_freq[j],
 * as Hugging Face computes them for any position (the product in F32, then cos and sin, here
 * in double rounded to F32), times scale (rope_attention_scaling); every backend rotates by
 * these values. */
void rope_rows(float *cs, const int32_t *positions, int T, const float *inv_freq, int hd, float scale);
/* inv_freq[hd/2] after the config's RoPE scaling (gyre.h), in F32 as transformers computes it. */
void rope_inv_freq(float *inv_freq, const dims *d);
/* The factor cos and sin carry (YaRN's attention factor; 1 otherwise). */
float rope_attention_scaling(const dims *d);

/* ---- forest of a packed batch (common/forest.c) ---- */

/* The ancestors of token i (itself included) as ascending, disjoint index ranges
 * [ranges[2k], ranges[2k+1]] (inclusive) for k in [range_off[i], range_off[i+1]), and the
 * children of token p (the tokens whose parent it is) children[child_off[p] ..
 * child_off[p+1]) in ascending order. depth[i] = number of ancestors including itself. */
typedef struct forest {
  int32_t n;
  int32_t *range_off;
  int32_t *ranges;
  int32_t *depth;
  int32_t *child_off;  /* [n + 1] */
  int32_t *children;   /* [child_off[n]] */
  int64_t n_pairs;     /* sum of depth: the (query, key) pairs attention visits */
  int32_t max_depth;
  int32_t max_ranges;  /* most ranges of one token */
} forest;

gyre_status forest_build(int32_t n, const int32_t *parents, forest *out);
void forest_free(forest *f);

/* ---- loss terms (common/loss.c) ---- */

typedef struct loss_term {
  double value;   /* weights[i] * loss_i */
  float dlogp;    /* d value / d logp_i */
  float ratio;    /* r_i (1 for SFT) */
  float is_weight;/* w_i (1 for SFT) */
  int8_t trained, stale, clipped, truncated;
} loss_term;

/* The loss term of token i given logp_i (see gyre_loss_config); arrays may be NULL as in
 * gyre_train_batch. */
loss_term loss_term_at(const gyre_loss_config *cfg, int32_t i, float logp, const float *weights,
                       const float *advantages, const float *behaviour, const float *proximal,
                       const int32_t *versions);
gyre_status loss_config_check(const gyre_loss_config *cfg, const float *weights,
                              const float *advantages, const float *behaviour);

/* ---- sampling (common/sampling.c) ---- */

/* Samples from logits[vocab] (see gyre_sample); scratch holds 2 * vocab floats + vocab ints. */
void sample_row(int32_t vocab, const float *logits, const gyre_sampling *params, uint64_t counter,
                void *scratch, int32_t *token, float *logprob);
size_t sample_scratch_bytes(int32_t vocab);

/* ---- the model handle, shared by the cache and the trainer (common/model.c) ---- */

struct be_model;
struct gyre_model {
  gyre_config cfg;
  param_layout layout;
  struct be_model *be;
  /* The caller's handle plus one per cache and trainer. A plain int32_t, read and written
   * only by model_retain / model_release through the __atomic builtins (GCC, Clang), so the
   * struct is the same in C and C++ and handles may be freed from different threads. */
  int32_t refs;
  /* Host threads of its compute (gyre_model_set_threads; 0: the process default), read
   * through the __atomic builtins like refs. */
  int32_t threads;
};
void model_retain(gyre_model *m);
void model_release(gyre_model *m);
/* Sets the calling thread's compute threads to the model's (be_use_threads). */
void model_use_threads(const gyre_model *m);

/* ---- small helpers ---- */

void *aligned_calloc(size_t bytes); /* 64-byte aligned, zeroed; free with free() */

#ifdef __cplusplus
}
#endif

#endif
