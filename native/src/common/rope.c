/* rope.c - the RoPE inverse frequencies (with the config's scaling: linear, llama3, YaRN), YaRN's
 * attention factor, and the cos/sin of any position, computed per batch row: no table grows
 * with max_position_embeddings. */
#include <math.h>

#include "../internal.h"

/* YaRN's correction dimension of `rotations` (transformers' find_correction_dim, in double). */
static double yarn_correction_dim(double rotations, const dims *d) {
  const double pi = 3.14159265358979323846;
  const double len = d->rope_original_max_pos > 0 ? d->rope_original_max_pos : d->max_pos;
  return d->hd * log(len / (rotations * 2.0 * pi)) / (2.0 * log(d->rope_theta));
}

/* YaRN (_compute_yarn_parameters): the extrapolated frequency f and the interpolated f / factor
 * blended by a linear ramp over the dimensions between the correction range's ends. */
static void yarn_inv_freq(float *inv_freq, const dims *d) {
  double low = yarn_correction_dim(d->rope_beta_fast > 0.0 ? d->rope_beta_fast : 32.0, d);
  double high = yarn_correction_dim(d->rope_beta_slow > 0.0 ? d->rope_beta_slow : 1.0, d);
  if (d->rope_truncate) low = floor(low), high = ceil(high);
  low = low > 0.0 ? low : 0.0;
  high = high < d->hd - 1 ? high : d->hd - 1;
  if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
  const float factor = (float)d->rope_factor, from = (float)low, width = (float)(high - low);
  for (int j = 0; j < d->hd / 2; j++) {
    float pos_freq = powf((float)d->rope_theta, (float)(2 * j) / (float)d->hd);
    float ramp = ((float)j - from) / width;
    ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
    float extrapolation = 1.0f - ramp; /* share of the unscaled frequency */
    inv_freq[j] = 1.0f / (factor * pos_freq) * (1.0f - extrapolation) + 1.0f / pos_freq * extrapolation;
  }
}

static double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

float rope_attention_scaling(const dims *d) {
  if (d->rope_type != GYRE_ROPE_YARN) return 1.0f;
  if (d->rope_attention_factor > 0.0) return (float)d->rope_attention_factor;
  if (d->rope_mscale > 0.0 && d->rope_mscale_all_dim > 0.0)
    return (float)(yarn_mscale(d->rope_factor, d->rope_mscale) / yarn_mscale(d->rope_factor, d->rope_mscale_all_dim));
  return (float)yarn_mscale(d->rope_factor, 1.0);
}

/* As transformers' _compute_default_rope_parameters, then _compute_linear_scaling_rope_parameters,
 * _compute_llama3_parameters or _compute_yarn_parameters: F32 tensor arithmetic, so F32 here. */
void rope_inv_freq(float *inv_freq, const dims *d) {
  if (d->rope_type == GYRE_ROPE_YARN) {
    yarn_inv_freq(inv_freq, d);
    return;
  }
  const float pi = 3.14159265358979323846f;
  const float factor = (float)d->rope_factor, low = (float)d->rope_low_freq_factor;
  const float high = (float)d->rope_high_freq_factor, old_len = (float)d->rope_original_max_pos;
  for (int j = 0; j < d->hd / 2; j++) {
    float f = 1.0f / powf((float)d->rope_theta, (float)(2 * j) / (float)d->hd);
    if (d->rope_type == GYRE_ROPE_LINEAR) f = f / factor;
    if (d->rope_type == GYRE_ROPE_LLAMA3) {
      float wavelen = 2.0f * pi / f;
      if (wavelen > old_len / low) {
        f = f / factor; /* low frequencies: interpolated */
      } else if (!(wavelen < old_len / high)) {
        float smooth = (old_len / wavelen - low) / (high - low); /* medium: blended */
        f = (1.0f - smooth) * f / factor + smooth * f;
      } /* high frequencies: kept */
    }
    inv_freq[j] = f;
  }
}

void rope_rows(float *cs, const int32_t *positions, int T, const float *inv_freq, int hd, float scale) {
  int half = hd / 2;
  for (int t = 0; t < T; t++) {
    float *c = cs + (size_t)t * hd, *s = c + half, p = (float)positions[t];
    for (int j = 0; j < half; j++) {
      float angle = p * inv_freq[j];
      c[j] = (float)cos((double)angle) * scale;
      s[j] = (float)sin((double)angle) * scale;
    }
  }
}
