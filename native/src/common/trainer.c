/* trainer.c - the trainer handle: packed-batch loss and gradients, gradient buffer, AdamW,
 * optimizer state files. The loss terms are computed here, on the host, for every backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"

struct gyre_trainer {
  gyre_model *model;
  be_trainer *be;
  int32_t max_tokens;
  int64_t steps;
};

static const char *const moment_prefixes[2] = {"exp_avg.", "exp_avg_sq."};

gyre_status gyre_trainer_create(gyre_model *model, int32_t max_tokens, gyre_trainer **out) {
  if (model == NULL || out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_create: NULL argument");
  if (max_tokens <= 0)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_create: max_tokens must be > 0, got %d", max_tokens);
  gyre_trainer *t = calloc(1, sizeof *t);
  if (t == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_trainer_create: out of host memory");
  gyre_status st = be_trainer_create(model->be, max_tokens, &t->be);
  if (st != GYRE_OK) {
    free(t);
    return st;
  }
  t->model = model;
  t->max_tokens = max_tokens;
  model_retain(model);
  *out = t;
  return GYRE_OK;
}

void gyre_trainer_free(gyre_trainer *t) {
  if (t == NULL) return;
  be_trainer_free(t->be);
  model_release(t->model);
  free(t);
}

/* The batch's loss terms from its log-probs: dlogp[i] for the backward (with respect to the
 * unscaled logits), and the stats. */
static gyre_train_stats loss_terms(int32_t n, const int32_t *parents, const float *logp, const float *entropy,
                                   const float *weights, const float *advantages, const float *behaviour,
                                   const float *proximal, const int32_t *versions, const gyre_loss_config *loss,
                                   float inv_temperature, float *dlogp) {
  gyre_train_stats s = {0};
  double entropy_sum = 0, logp_sum = 0, ratio_sum = 0, w_sum = 0;
  int32_t clipped = 0, truncated = 0;
  for (int32_t i = 0; i < n; i++) {
    dlogp[i] = 0.0f;
    if (parents[i] < 0) continue;
    loss_term lt = loss_term_at(loss, i, logp[i], weights, advantages, behaviour, proximal, versions);
    s.stale_tokens += lt.stale;
    if (!lt.trained) continue;
    dlogp[i] = lt.dlogp * inv_temperature; /* d/d(logits) = (1 / temperature) d/d(logits / temperature) */
    s.trained_tokens++;
    s.loss += lt.value;
    s.weight_sum += weights != NULL ? weights[i] : 1.0f;
    entropy_sum += entropy[i];
    logp_sum += logp[i];
    ratio_sum += lt.ratio;
    w_sum += lt.is_weight;
    clipped += lt.clipped;
    truncated += lt.truncated;
  }
  double k = s.trained_tokens > 0 ? 1.0 / s.trained_tokens : 0.0;
  s.entropy = entropy_sum * k;
  s.mean_logprob = logp_sum * k;
  s.mean_ratio = s.trained_tokens > 0 ? ratio_sum * k : 1.0;
  s.mean_is_weight = s.trained_tokens > 0 ? w_sum * k : 1.0;
  s.clip_fraction = clipped * k;
  s.truncated_fraction = truncated * k;
  return s;
}

/* Forward of every chunk in order (log-probs), the loss, then the backward of every chunk in
 * reverse order (backend.h); chunks of max_tokens rows. */
static gyre_status train_chunks(gyre_trainer *t, const train_batch *b, const float *weights, const float *advantages,
                                const float *behaviour, const float *proximal, const int32_t *versions,
                                const gyre_loss_config *loss, int32_t backward, float *logp, gyre_train_stats *stats) {
  int32_t n = b->n, C = t->max_tokens, chunks = n / C + (n % C != 0);
  float *entropy = logp + n, *dlogp = entropy + n;
  for (int32_t i = 0; i < n; i++)
    if (b->parents[i] < 0) logp[i] = entropy[i] = NAN;
  for (int32_t c = 0; c < chunks; c++)
    GYRE_CHECK(be_train_forward(t->be, b, c * C, c == chunks - 1 ? n : (c + 1) * C, logp, entropy));
  *stats = loss_terms(n, b->parents, logp, entropy, weights, advantages, behaviour, proximal, versions, loss,
                      b->inv_temperature, dlogp);
  for (int32_t c = chunks - 1; backward && c >= 0; c--)
    GYRE_CHECK(be_train_backward(t->be, b, c * C, c == chunks - 1 ? n : (c + 1) * C, dlogp));
  return GYRE_OK;
}

gyre_status gyre_train_batch(gyre_trainer *t, int32_t n, const int32_t *tokens, const int32_t *parents,
                             const int32_t *positions, const float *weights, const float *advantages,
                             const float *behaviour, const float *proximal, const int32_t *versions,
                             const gyre_loss_config *loss, int32_t backward, float *token_logprobs,
                             gyre_train_stats *stats) {
  const char *fn = "gyre_train_batch";
  if (t == NULL || tokens == NULL || parents == NULL || positions == NULL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: need a trainer, tokens, parents and positions", fn);
  if (n <= 0) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: n = %d, must be >= 1", fn, n);
  GYRE_CHECK(loss_config_check(loss, weights, advantages, behaviour));
  const dims *d = &t->model->layout.d;
  for (int32_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= d->V)
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: tokens[%d] = %d is outside the vocabulary [0, %d)", fn, i, tokens[i], d->V);
    if (positions[i] < 0 || positions[i] >= d->max_pos)
      return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "%s: positions[%d] = %d is outside [0, %d)", fn, i, positions[i], d->max_pos);
  }
  forest f;
  GYRE_CHECK(forest_build(n, parents, &f));
  float *logp = malloc(sizeof(float) * 3 * (size_t)n);
  if (logp == NULL) {
    forest_free(&f);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  train_batch b = {n, tokens, parents, positions, &f, 1.0f / loss->temperature};
  gyre_train_stats s;
  model_use_threads(t->model);
  gyre_status st = be_train_begin(t->be, &b);
  if (st == GYRE_OK) st = train_chunks(t, &b, weights, advantages, behaviour, proximal, versions, loss, backward, logp, &s);
  be_train_end(t->be);
  if (st == GYRE_OK && stats != NULL) *stats = s;
  if (st == GYRE_OK && token_logprobs != NULL) memcpy(token_logprobs, logp, sizeof(float) * (size_t)n);
  free(logp);
  forest_free(&f);
  return st;
}

gyre_status gyre_trainer_memory(const gyre_trainer *t, gyre_trainer_memory_info *out) {
  if (t == NULL || out == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_memory: NULL argument");
  be_trainer_memory(t->be, &out->fixed_bytes, &out->kv_bytes_per_token, &out->last_batch_bytes);
  return GYRE_OK;
}

gyre_status gyre_trainer_zero_grads(gyre_trainer *t) {
  if (t == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_zero_grads: trainer is NULL");
  return be_grads_zero(t->be);
}

gyre_status gyre_trainer_get_grads(const gyre_trainer *t, float *out, int64_t n) {
  GYRE_CHECK(flat_check(t ? &t->model->layout : NULL, t, out, n, "gyre_trainer_get_grads"));
  return be_grads_get(t->be, out);
}

gyre_status gyre_trainer_set_grads(gyre_trainer *t, const float *in, int64_t n) {
  GYRE_CHECK(flat_check(t ? &t->model->layout : NULL, t, in, n, "gyre_trainer_set_grads"));
  return be_grads_set(t->be, in);
}

gyre_status gyre_trainer_add_grads(gyre_trainer *t, const float *in, int64_t n, float scale) {
  GYRE_CHECK(flat_check(t ? &t->model->layout : NULL, t, in, n, "gyre_trainer_add_grads"));
  model_use_threads(t->model);
  return be_grads_add(t->be, in, scale);
}

gyre_status gyre_trainer_step(gyre_trainer *t, const gyre_adamw *opt, float *grad_norm) {
  if (t == NULL || opt == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_step: NULL argument");
  if (!(opt->lr >= 0.0f) || !(opt->beta1 >= 0.0f && opt->beta1 < 1.0f) || !(opt->beta2 >= 0.0f && opt->beta2 < 1.0f) ||
      !(opt->eps > 0.0f) || !(opt->weight_decay >= 0.0f))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_trainer_step: need lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0");
  float norm = 0.0f;
  model_use_threads(t->model);
  GYRE_CHECK(be_adamw_step(t->be, opt, t->steps + 1, &norm));
  t->steps++;
  if (grad_norm != NULL) *grad_norm = norm;
  return GYRE_OK;
}

gyre_status gyre_trainer_step_count(const gyre_trainer *t, int64_t *steps) {
  if (t == NULL || steps == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_step_count: NULL argument");
  *steps = t->steps;
  return GYRE_OK;
}

gyre_status gyre_trainer_save_optimizer(const gyre_trainer *t, uint8_t *out, size_t cap, size_t *len) {
  if (t == NULL || len == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_save_optimizer: NULL argument");
  size_t n = (size_t)t->model->layout.n_params;
  float *m = malloc(sizeof(float) * 2 * n);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_trainer_save_optimizer: out of host memory");
  gyre_status st = out == NULL ? GYRE_OK : be_moments_get(t->be, m, m + n);
  char meta[96];
  snprintf(meta, sizeof meta, "{\"format\":\"gyre-adamw\",\"step\":\"%lld\"}", (long long)t->steps);
  const float *flats[2] = {m, m + n};
  if (st == GYRE_OK) st = st_encode(&t->model->layout, 2, moment_prefixes, flats, meta, out, cap, len);
  free(m);
  return st;
}

gyre_status gyre_trainer_load_optimizer(gyre_trainer *t, const uint8_t *buf, size_t len) {
  if (t == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_trainer_load_optimizer: trainer is NULL");
  size_t n = (size_t)t->model->layout.n_params;
  float *m = malloc(sizeof(float) * 2 * n);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_trainer_load_optimizer: out of host memory");
  float *flats[2] = {m, m + n};
  char step[32];
  gyre_status st = st_decode(&t->model->layout, 2, moment_prefixes, flats, buf, len, "step", step, sizeof step);
  char *end = NULL;
  long long steps = st == GYRE_OK ? strtoll(step, &end, 10) : 0;
  if (st == GYRE_OK && (step[0] == '\0' || *end != '\0' || steps < 0))
    st = gyre_fail(GYRE_ERR_BAD_CHECKPOINT, "optimizer state: metadata \"step\" is missing or not a count: '%s'", step);
  if (st == GYRE_OK) st = be_moments_set(t->be, m, m + n);
  if (st == GYRE_OK) t->steps = steps;
  free(m);
  return st;
}
