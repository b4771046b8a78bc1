/* fastmath.h - exp and sigmoid written so GCC vectorizes loops that call them.
 *
 * fast_exp: Cephes' expf (range reduction by ln 2, degree-6 polynomial), within 2 ulp of
 * expf over [-87, 88]; below -87 it returns 0 (what softmax wants for masked scores).
 * Only arithmetic and integer bit moves, no libm calls, so a loop over an array compiles to
 * vector code (libm's expf would be called once per element). */
#ifndef GYRE_CPU_FASTMATH_H
#define GYRE_CPU_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float fast_exp(float x) {
  float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
  float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

static inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

#endif
