/* sampling.c - temperature / top-p sampling of one token from a row of logits. */
#include <math.h>
#include <stdlib.h>

#include "../internal.h"

typedef struct ranked {
  float p;
  int32_t id;
} ranked;

static int by_probability(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->p != y->p) return x->p > y->p ? -1 : 1;
  return x->id < y->id ? -1 : 1; /* ties: lower id first, so the order is total */
}

size_t sample_scratch_bytes(int32_t vocab) { return (size_t)vocab * sizeof(ranked); }

void sample_row(int32_t vocab, const float *logits, const gyre_sampling *params, uint64_t counter,
                void *scratch, int32_t *token, float *logprob) {
  float max = logits[0];
  int32_t arg = 0;
  for (int32_t i = 1; i < vocab; i++)
    if (logits[i] > max) {
      max = logits[i];
      arg = i;
    }
  if (!(params->temperature > 0.0f)) { /* greedy */
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - max);
    *token = arg;
    *logprob = (float)(-log(sum));
    return;
  }
  ranked *r = scratch;
  double inv_t = 1.0 / params->temperature, total = 0.0;
  for (int32_t i = 0; i < vocab; i++) {
    r[i].p = (float)exp(((double)logits[i] - max) * inv_t);
    r[i].id = i;
    total += r[i].p;
  }
  int32_t kept = vocab;
  double kept_mass = total;
  if (params->top_p < 1.0f) {
    qsort(r, (size_t)vocab, sizeof(ranked), by_probability);
    double cum = 0.0, target = params->top_p * total;
    for (kept = 0; kept < vocab;) {
      cum += r[kept++].p;
      if (cum >= target) break;
    }
    kept_mass = cum;
  }
  double u = uniform_at(params->seed, counter) * kept_mass, cum = 0.0;
  int32_t pick = kept - 1;
  for (int32_t k = 0; k < kept; k++) {
    cum += r[k].p;
    if (u < cum) {
      pick = k;
      break;
    }
  }
  *token = r[pick].id;
  *logprob = (float)(log((double)r[pick].p) - log(kept_mass));
}

gyre_status gyre_sample(int32_t vocab, const float *logits, const gyre_sampling *params,
                        uint64_t counter, int32_t *token, float *logprob) {
  if (vocab <= 0 || logits == NULL || params == NULL || token == NULL || logprob == NULL)
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT, "gyre_sample: vocab must be > 0 and pointers non-NULL");
  if (!(params->top_p > 0.0f && params->top_p <= 1.0f) || !(params->temperature >= 0.0f))
    return gyre_fail(GYRE_ERR_INVALID_ARGUMENT,
                     "gyre_sample: need temperature >= 0 and top_p in (0, 1], got %g and %g",
                     params->temperature, params->top_p);
  void *scratch = malloc(sample_scratch_bytes(vocab));
  if (scratch == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "gyre_sample: out of memory");
  sample_row(vocab, logits, params, counter, scratch, token, logprob);
  free(scratch);
  return GYRE_OK;
}
