/* loss.c - one loss term of SFT cross-entropy or decoupled PPO-clip (see gyre_loss_config). */
#include <math.h>

#include "../internal.h"

gyre_status loss_config_check(const gyre_loss_config *cfg, const float *weights,
                              const float *advantages, const float *behaviour) {
  if (cfg == NULL) return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_train_batch: loss config is NULL");
  if (!(cfg->temperature > 0.0f) || isinf(cfg->temperature))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_train_batch: the loss's temperature must be finite and > 0, got %g",
                     cfg->temperature);
  if (cfg->kind == GYRE_LOSS_SFT) return GYRE_OK;
  if (cfg->kind != GYRE_LOSS_PPO)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_train_batch: unknown loss kind %d", cfg->kind);
  if (weights == NULL || advantages == NULL || behaviour == NULL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_train_batch: PPO needs weights, advantages and behaviour_logprobs");
  if (!(cfg->clip_eps_low >= 0.0f && cfg->clip_eps_low < 1.0f && cfg->clip_eps_high >= 0.0f))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_train_batch: need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got %g, %g",
                     cfg->clip_eps_low, cfg->clip_eps_high);
  return GYRE_OK;
}

loss_term loss_term_at(const gyre_loss_config *cfg, int32_t i, float logp, const float *weights,
                       const float *advantages, const float *behaviour, const float *proximal,
                       const int32_t *versions) {
  loss_term t = {0};
  t.ratio = 1.0f;
  t.is_weight = 1.0f;
  float weight = weights != NULL ? weights[i] : 1.0f;
  if (weight == 0.0f) return t;
  if (cfg->max_staleness >= 0 && versions != NULL && versions[i] >= 0 &&
      cfg->current_version - versions[i] > cfg->max_staleness) {
    t.stale = 1;
    return t;
  }
  t.trained = 1;
  if (cfg->kind == GYRE_LOSS_SFT) {
    t.value = -(double)weight * logp;
    t.dlogp = -weight;
    return t;
  }
  float mu = behaviour[i];
  float prox = cfg->proximal_current ? logp : proximal != NULL && !isnan(proximal[i]) ? proximal[i] : mu;
  float w = expf(prox - mu);
  if (cfg->is_cap > 0.0f && w > cfg->is_cap) {
    w = cfg->is_cap;
    t.truncated = 1;
  }
  float r = expf(logp - prox), a = advantages[i];
  float rc = fminf(fmaxf(r, 1.0f - cfg->clip_eps_low), 1.0f + cfg->clip_eps_high);
  float unclipped = r * a, clipped = rc * a;
  float objective, dobjective;
  if (clipped < unclipped) { /* the clipped branch is active: constant in logp */
    objective = clipped;
    dobjective = 0.0f;
    t.clipped = 1;
  } else {
    objective = unclipped;
    dobjective = unclipped; /* d(r a)/dlogp = r a */
  }
  t.value = -(double)weight * w * objective;
  t.dlogp = -weight * w * dobjective;
  t.ratio = r;
  t.is_weight = w;
  return t;
}
