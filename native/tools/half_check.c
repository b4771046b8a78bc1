/* half_check.c - the F16 conversions of src/half.h against an exact reference.
 *
 * Built twice by `make cpu-half-check`: with the engine's flags (F16C instructions where the
 * machine has them) and with -mno-f16c (the portable bit arithmetic), so both paths are held
 * to the same reference: every one of the 65,536 halves widened exactly; every finite half,
 * every midpoint between neighbours (ties to even), values past +-65504 (saturated) and
 * 2,000,000 seeded random floats over F16's whole range (subnormals included) rounded to the
 * nearest half. Prints one line; exit status 1 on the first mismatch. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "../src/half.h"

/* The exact value of a half (binary16 fits a double exactly). */
static double ref_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

/* The nearest finite half to x (ties to even), saturating at +-65504. */
static uint16_t ref_round(double x) {
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  if (a >= 65504.0) return sign | 0x7bff;
  uint16_t lo = 0, hi = 0x7bff; /* the largest positive half <= a, by bisection (values grow with the bits) */
  while (lo < hi) {
    uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if (ref_value(mid) <= a) lo = mid;
    else hi = mid - 1;
  }
  double below = ref_value(lo), above = ref_value((uint16_t)(lo + 1));
  uint16_t pick = a - below < above - a ? lo : a - below > above - a ? (uint16_t)(lo + 1) : (lo & 1) ? (uint16_t)(lo + 1) : lo;
  return pick == 0 ? sign : (uint16_t)(sign | pick);
}

static int failures = 0;

static void expect_round(float x) {
  uint16_t got = half_from_float(x), want = ref_round(x);
  if (got != want && failures++ < 5) fprintf(stderr, "half_from_float(%.9g) = 0x%04x, want 0x%04x\n", x, got, want);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 32);
}

int main(void) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    double want = ref_value((uint16_t)h);
    float got = half_to_float((uint16_t)h);
    if (!(isnan(want) ? isnan(got) : (double)got == want) && failures++ < 5)
      fprintf(stderr, "half_to_float(0x%04x) = %.9g, want %.9g\n", h, got, want);
  }
  for (uint16_t h = 0; h < 0x7bff; h++) {
    float v = (float)ref_value(h), mid = (float)((ref_value(h) + ref_value((uint16_t)(h + 1))) / 2);
    expect_round(v);
    expect_round(-v);
    expect_round(mid); /* exact in F32: a half's neighbours differ in at most 11 significant bits */
    expect_round(-mid);
  }
  const float past[] = {65504.0f, 65519.0f, 65520.0f, 1e6f, 3.0e38f, INFINITY};
  for (unsigned i = 0; i < sizeof past / sizeof *past; i++) {
    expect_round(past[i]);
    expect_round(-past[i]);
  }
  if (!isnan(half_to_float(half_from_float(NAN))) && failures++ < 5) fprintf(stderr, "NaN did not stay NaN\n");
  for (int i = 0; i < 2000000; i++) { /* random magnitudes 2^-30 .. 2^17, random signs and mantissas */
    float x = ldexpf(1.0f + (float)(next_u32() & 0x7fffff) / 8388608.0f, (int)(next_u32() % 48) - 30);
    expect_round(next_u32() & 1 ? -x : x);
  }
#if defined(__F16C__)
  const char *path = "F16C";
#else
  const char *path = "portable";
#endif
  printf("half-check (%s): %s, %d mismatches\n", path, failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
