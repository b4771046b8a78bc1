/* random.c - splitmix64 streams, counter-based uniforms and the weight initialisation. */
#include <math.h>
#include <string.h>

#include "../internal.h"

uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float uniform_at(uint64_t seed, uint64_t counter) {
  uint64_t s = seed;
  uint64_t a = splitmix64(&s);
  uint64_t t = a ^ (counter * 0xd1b54a32d192ed03ULL);
  uint64_t b = splitmix64(&t);
  return (float)(b >> 40) * (1.0f / 16777216.0f);
}

/* Normal deviates by Box-Muller in double precision from one splitmix64 stream. */
static double normal(uint64_t *state) {
  double u1 = ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void init_weights(const param_layout *layout, uint64_t seed, float init_std, float *flat) {
  for (int32_t t = 0; t < layout->n_tensors; t++) {
    const param_tensor *p = &layout->tensors[t];
    int64_t numel = p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
    float *w = flat + p->offset;
    if (p->rank == 1) { /* RMSNorm weights 1, biases 0 */
      size_t len = strlen(p->name);
      float value = len > 5 && strcmp(p->name + len - 5, ".bias") == 0 ? 0.0f : 1.0f;
      for (int64_t i = 0; i < numel; i++) w[i] = value;
      continue;
    }
    uint64_t state = seed ^ (0x51ed270b27eb5cc5ULL * (uint64_t)(t + 1));
    for (int64_t i = 0; i < numel; i++) w[i] = (float)(normal(&state) * init_std);
  }
}
