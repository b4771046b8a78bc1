/* half.h - IEEE 754 binary16 (F16) storage: scalar conversions to and from F32.
 *
 * The KV cache may store K and V as F16 (gyre.h: GYRE_KV_F16); every sum over them is in F32.
 * float -> half rounds to nearest, ties to even, and saturates at +-65504 (a key past F16's
 * range becomes its largest finite value, never an infinity that would poison a softmax);
 * half -> float is exact. With F16C (-march=native on x86-64) both are one instruction;
 * otherwise bit arithmetic with the same results. Plain C that also compiles as C++. */
#ifndef GYRE_HALF_H
#define GYRE_HALF_H

#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#define HALF_MAX 65504.0f

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
  else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (man << 13);
  else if (man == 0) bits = sign;
  else { /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

static inline uint16_t half_from_float(float x) {
  x = x > HALF_MAX ? HALF_MAX : (x < -HALF_MAX ? -HALF_MAX : x); /* nan passes through */
#if defined(__F16C__)
  return (uint16_t)_cvtss_sh(x, 0); /* 0: round to nearest even */
#else
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  uint32_t sign = (bits >> 16) & 0x8000u, abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* nan */
  if (abs < 0x38800000u) { /* below F16's smallest normal: a subnormal or zero, rounded */
    float a;
    memcpy(&a, &abs, sizeof a);
    float scaled = a * 16777216.0f; /* units of 2^-24, F16's smallest subnormal */
    uint32_t q = (uint32_t)scaled;
    float rest = scaled - (float)q;
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u); /* to nearest even at bit 13 */
  return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
#endif
}

#endif
