/* rope.c - the RoPE inverse frequencies (with the config's scaling) and the cos/sin of any
 * position, computed per batch row: no table grows with max_position_embeddings. */
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

void rope_rows(float *cs, const int32_t *positions, int T, const float *inv_freq, int hd) {
  int half = hd / 2;
  for (int t = 0; t < T; t++) {
    float *c = cs + (size_t)t * hd, *s = c + half, p = (float)positions[t];
    for (int j = 0; j < half; j++) {
      float angle = p * inv_freq[j];
      c[j] = (float)cos((double)angle);
      s[j] = (float)sin((double)angle);
    }
  }
}
