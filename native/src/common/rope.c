/* rope.c - the RoPE inverse frequencies (with the config's scaling) and the cos/sin tables
 * every backend rotates by, computed once on the host. */
#include <math.h>

#include "../internal.h"

/* As transformers' _compute_default_rope_parameters, then _compute_linear_scaling_rope_parameters
 * or _compute_llama3_parameters: F32 tensor arithmetic, so F32 here. */
void rope_inv_freq(float *inv_freq, const dims *d) {
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

void rope_tables(float *cos_t, float *sin_t, const dims *d) {
  int half = d->hd / 2;
  float inv_freq[half > 0 ? half : 1];
  rope_inv_freq(inv_freq, d);
  for (int j = 0; j < half; j++) {
    for (int p = 0; p < d->max_pos; p++) {
      float angle = (float)p * inv_freq[j];
      cos_t[(size_t)p * half + j] = (float)cos((double)angle);
      sin_t[(size_t)p * half + j] = (float)sin((double)angle);
    }
  }
}
