/* layout.c - config checks, model dimensions and the flat parameter layout of gyre.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

/* The head dimension a config means (gyre.h: head_dim 0 is hidden_size / num_attention_heads). */
static int32_t config_head_dim(const gyre_config *c) {
  return c->head_dim != 0 ? c->head_dim : c->hidden_size / c->num_attention_heads;
}

/* YaRN's own fields (gyre.h): all optional, none negative. */
static gyre_status yarn_check(const gyre_config *c) {
  if (c->rope_truncate != 0 && c->rope_truncate != 1)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: rope_truncate must be 0 or 1");
  if (c->rope_original_max_position_embeddings < 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: rope_original_max_position_embeddings must be >= 0 for yarn");
#define NOT_NEGATIVE(field)                                                                                   \
  if (!(c->field >= 0.0)) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: " #field " must be >= 0, got %g", c->field);
  NOT_NEGATIVE(rope_beta_fast)
  NOT_NEGATIVE(rope_beta_slow)
  NOT_NEGATIVE(rope_mscale)
  NOT_NEGATIVE(rope_mscale_all_dim)
  NOT_NEGATIVE(rope_attention_factor)
#undef NOT_NEGATIVE
  return GYRE_OK;
}

gyre_status gyre_config_check(const gyre_config *c) {
  if (c == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: NULL");
#define POSITIVE(field)                                                                     \
  if (c->field <= 0)                                                                        \
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: " #field " must be > 0, got %d", \
                     (int)c->field);
  POSITIVE(vocab_size)
  POSITIVE(hidden_size)
  POSITIVE(intermediate_size)
  POSITIVE(num_hidden_layers)
  POSITIVE(num_attention_heads)
  POSITIVE(num_key_value_heads)
  POSITIVE(max_position_embeddings)
#undef POSITIVE
  if (c->head_dim < 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: head_dim must be >= 0 (0: hidden_size / num_attention_heads), got %d",
                     (int)c->head_dim);
  if (c->head_dim == 0 && c->hidden_size % c->num_attention_heads != 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "config: hidden_size %d is not a multiple of num_attention_heads %d (and head_dim is 0)",
                     c->hidden_size, c->num_attention_heads);
  if (config_head_dim(c) % 2 != 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: head_dim %d must be even", config_head_dim(c));
  if ((int64_t)c->num_attention_heads * config_head_dim(c) > INT32_MAX / 4) /* qkv_dim <= 3 H hd is an int32 */
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: num_attention_heads %d x head_dim %d is too large",
                     c->num_attention_heads, config_head_dim(c));
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                     c->num_attention_heads, c->num_key_value_heads);
  if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: tie_word_embeddings must be 0 or 1");
  if (!(c->rms_norm_eps > 0.0) || !(c->rope_theta > 0.0))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: rms_norm_eps and rope_theta must be > 0");
  if (c->qkv_bias != 0 && c->qkv_bias != 1) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: qkv_bias must be 0 or 1");
  if (c->qk_norm != 0 && c->qk_norm != 1) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: qk_norm must be 0 or 1");
  if (c->rope_type < GYRE_ROPE_DEFAULT || c->rope_type > GYRE_ROPE_YARN)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: rope_type %d is not 0 (default), 1 (linear), 2 (llama3) or 3 (yarn)",
                     (int)c->rope_type);
  if (c->rope_type != GYRE_ROPE_DEFAULT && !(c->rope_factor > 0.0))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "config: rope_factor must be > 0, got %g", c->rope_factor);
  if (c->rope_type == GYRE_ROPE_LLAMA3 &&
      !(c->rope_low_freq_factor > 0.0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
        c->rope_original_max_position_embeddings > 0))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "config: llama3 RoPE needs 0 < rope_low_freq_factor < rope_high_freq_factor and "
                     "rope_original_max_position_embeddings > 0");
  if (c->rope_type == GYRE_ROPE_YARN) return yarn_check(c);
  return GYRE_OK;
}

gyre_status dims_from_config(const gyre_config *c, dims *d) {
  GYRE_CHECK(gyre_config_check(c));
  d->V = c->vocab_size;
  d->D = c->hidden_size;
  d->F = c->intermediate_size;
  d->L = c->num_hidden_layers;
  d->H = c->num_attention_heads;
  d->KV = c->num_key_value_heads;
  d->hd = config_head_dim(c);
  d->q_dim = d->H * d->hd;
  d->kv_dim = d->KV * d->hd;
  d->qkv_dim = d->q_dim + 2 * d->kv_dim;
  d->max_pos = c->max_position_embeddings;
  d->tied = c->tie_word_embeddings;
  d->eps = (float)c->rms_norm_eps;
  d->rope_theta = c->rope_theta;
  d->rope_type = c->rope_type;
  d->rope_original_max_pos = c->rope_original_max_position_embeddings;
  d->rope_factor = c->rope_factor;
  d->rope_low_freq_factor = c->rope_low_freq_factor;
  d->rope_high_freq_factor = c->rope_high_freq_factor;
  d->rope_truncate = c->rope_truncate;
  d->rope_beta_fast = c->rope_beta_fast;
  d->rope_beta_slow = c->rope_beta_slow;
  d->rope_mscale = c->rope_mscale;
  d->rope_mscale_all_dim = c->rope_mscale_all_dim;
  d->rope_attention_factor = c->rope_attention_factor;
  d->qkv_bias = c->qkv_bias;
  d->qk_norm = c->qk_norm;
  return GYRE_OK;
}

static int64_t add_tensor(param_layout *lay, int64_t offset, const char *name, int64_t rows,
                          int64_t cols) {
  param_tensor *p = &lay->tensors[lay->n_tensors++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->offset = offset;
  p->rank = cols == 0 ? 1 : 2;
  p->shape[0] = rows;
  p->shape[1] = cols;
  return offset + rows * (cols == 0 ? 1 : cols);
}

gyre_status layout_build(const gyre_config *cfg, param_layout *lay) {
  memset(lay, 0, sizeof *lay);
  GYRE_CHECK(dims_from_config(cfg, &lay->d));
  const dims *d = &lay->d;
  int32_t max_tensors = 3 + 14 * d->L;
  lay->tensors = calloc((size_t)max_tensors, sizeof *lay->tensors);
  lay->layers = calloc((size_t)d->L, sizeof *lay->layers);
  if (lay->tensors == NULL || lay->layers == NULL) {
    layout_free(lay);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "layout: out of host memory");
  }
  char name[96];
  int64_t off = 0;
  lay->embed = off;
  off = add_tensor(lay, off, "model.embed_tokens.weight", d->V, d->D);
  for (int32_t i = 0; i < d->L; i++) {
    layer_offsets *lo = &lay->layers[i];
#define TENSOR(field, suffix, rows, cols)                       \
  snprintf(name, sizeof name, "model.layers.%d." suffix, i);    \
  lo->field = off;                                              \
  off = add_tensor(lay, off, name, rows, cols);
    TENSOR(ln_in, "input_layernorm.weight", d->D, 0)
    TENSOR(wqkv, "self_attn.q_proj.weight", d->q_dim, d->D)
    snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", i);
    off = add_tensor(lay, off, name, d->kv_dim, d->D);
    snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.weight", i);
    off = add_tensor(lay, off, name, d->kv_dim, d->D);
    lo->bqkv = lo->qnorm = lo->knorm = -1;
    if (d->qkv_bias) {
      TENSOR(bqkv, "self_attn.q_proj.bias", d->q_dim, 0)
      snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.bias", i);
      off = add_tensor(lay, off, name, d->kv_dim, 0);
      snprintf(name, sizeof name, "model.layers.%d.self_attn.v_proj.bias", i);
      off = add_tensor(lay, off, name, d->kv_dim, 0);
    }
    if (d->qk_norm) {
      TENSOR(qnorm, "self_attn.q_norm.weight", d->hd, 0)
      TENSOR(knorm, "self_attn.k_norm.weight", d->hd, 0)
    }
    TENSOR(wo, "self_attn.o_proj.weight", d->D, d->q_dim)
    TENSOR(ln_post, "post_attention_layernorm.weight", d->D, 0)
    TENSOR(wgu, "mlp.gate_proj.weight", d->F, d->D)
    snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", i);
    off = add_tensor(lay, off, name, d->F, d->D);
    TENSOR(wdown, "mlp.down_proj.weight", d->D, d->F)
#undef TENSOR
  }
  lay->norm_f = off;
  off = add_tensor(lay, off, "model.norm.weight", d->D, 0);
  if (d->tied) {
    lay->lm_head = lay->embed;
  } else {
    lay->lm_head = off;
    off = add_tensor(lay, off, "lm_head.weight", d->V, d->D);
  }
  lay->n_params = off;
  return GYRE_OK;
}

void layout_free(param_layout *lay) {
  free(lay->tensors);
  free(lay->layers);
  lay->tensors = NULL;
  lay->layers = NULL;
}

gyre_status gyre_param_count(const gyre_config *cfg, int64_t *count) {
  if (count == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_param_count: count is NULL");
  param_layout lay;
  GYRE_CHECK(layout_build(cfg, &lay));
  *count = lay.n_params;
  layout_free(&lay);
  return GYRE_OK;
}

gyre_status gyre_param_tensor_count(const gyre_config *cfg, int32_t *count) {
  if (count == NULL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_param_tensor_count: count is NULL");
  param_layout lay;
  GYRE_CHECK(layout_build(cfg, &lay));
  *count = lay.n_tensors;
  layout_free(&lay);
  return GYRE_OK;
}

gyre_status gyre_param_tensor(const gyre_config *cfg, int32_t index, char *name, size_t name_cap,
                              int64_t *offset, int32_t *rank, int64_t shape[2]) {
  param_layout lay;
  GYRE_CHECK(layout_build(cfg, &lay));
  if (index < 0 || index >= lay.n_tensors) {
    int32_t n = lay.n_tensors;
    layout_free(&lay);
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_param_tensor: index %d not in [0, %d)",
                     index, n);
  }
  const param_tensor *p = &lay.tensors[index];
  if (name != NULL && name_cap > 0) snprintf(name, name_cap, "%s", p->name);
  if (offset != NULL) *offset = p->offset;
  if (rank != NULL) *rank = p->rank;
  if (shape != NULL) {
    shape[0] = p->shape[0];
    shape[1] = p->shape[1];
  }
  layout_free(&lay);
  return GYRE_OK;
}

gyre_status flat_check(const param_layout *layout, const void *handle, const void *p, int64_t n,
                       const char *fn) {
  if (handle == NULL || p == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (n != layout->n_params)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: n = %lld but the model has %lld parameters", fn,
                     (long long)n, (long long)layout->n_params);
  return GYRE_OK;
}

gyre_status gyre_rope_inv_freq(const gyre_config *cfg, float *out, int32_t n) {
  dims d;
  GYRE_CHECK(dims_from_config(cfg, &d));
  if (out == NULL || n != d.hd / 2)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_rope_inv_freq: n = %d, head_dim / 2 is %d", (int)n, (int)(d.hd / 2));
  rope_inv_freq(out, &d);
  return GYRE_OK;
}

gyre_status gyre_rope_attention_scaling(const gyre_config *cfg, float *out) {
  dims d;
  GYRE_CHECK(dims_from_config(cfg, &d));
  if (out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_rope_attention_scaling: out is NULL");
  *out = rope_attention_scaling(&d);
  return GYRE_OK;
}
