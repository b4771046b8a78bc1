/* rope.c - the RoPE cos/sin tables every backend rotates by, computed once on the host. */
#include <math.h>

#include "../internal.h"

void rope_tables(float *cos_t, float *sin_t, const dims *d) {
  int half = d->hd / 2;
  for (int j = 0; j < half; j++) {
    float inv_freq = 1.0f / powf((float)d->rope_theta, (float)(2 * j) / (float)d->hd);
    for (int p = 0; p < d->max_pos; p++) {
      float angle = (float)p * inv_freq;
      cos_t[(size_t)p * half + j] = (float)cos((double)angle);
      sin_t[(size_t)p * half + j] = (float)sin((double)angle);
    }
  }
}
