/* Small AVX2 helpers the C kernels share. */
#pragma once
#include <immintrin.h>

/* The sum of a vector's eight lanes. */
static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* exp(x), Cephes' range reduction and degree-5 polynomial (~1 ulp), x clamped to [-87.3, 88.3] (no inf, no
 * denormals: exp underflows to ~0 below, and callers divide by 1 + exp above). */
static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x); /* x - n ln2, in two parts for precision */
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

/* GELU, erf form: x * Phi(x) = 0.5 x erfc(-x / sqrt 2), to ~3e-7 relative over the whole range. erfc(|z|) is
 * t exp(P(t) - z^2), t = 1 / (1 + |z| / 2) (Numerical Recipes' erfcc: a Chebyshev fit, relative error < 1.2e-7 for
 * every z >= 0), and erfc(-|z|) = 2 - erfc(|z|) for x > 0. Why not erf(z) = 1 - t P(t) exp(-z^2) (Abramowitz-Stegun
 * 7.1.26, torch's own AVX2 erf): its 1.5e-7 absolute error is a large relative one where 1 + erf(z) is small
 * (x < -2: torch's F.gelu is 2e-4 off there). Phi is taken at x clamped to [-20, 20] (x^2 stays finite): 1 above,
 * and below -13 ~1e-38, the floor of exp256's clamp. */
static inline __m256 gelu256(__m256 x) {
  static const float c[10] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                              -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f};
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-20.f)), _mm256_set1_ps(20.f));
  const __m256 hx = _mm256_mul_ps(_mm256_set1_ps(0.5f), xc);
  /* 1. t from |z| = |x| / sqrt 2, and P(t) */
  const __m256 z = _mm256_andnot_ps(_mm256_set1_ps(-0.f), _mm256_mul_ps(xc, _mm256_set1_ps(0.70710678118654752f)));
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5f), z, one));
  __m256 p = _mm256_set1_ps(c[0]);
  for (int i = 1; i < 10; i++) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c[i]));
  /* 2. exp(P - x^2 / 2) without the exponent's rounding, which alone is 1e-6 relative at x = -6: x^2 / 2 = h + l
   * exactly (FMA), P - h = s + err exactly (two-sum), then exp(s) * (1 + err - l) */
  const __m256 h = _mm256_mul_ps(hx, xc), l = _mm256_fmsub_ps(hx, xc, h);
  const __m256 s = _mm256_sub_ps(p, h), bb = _mm256_sub_ps(s, p);
  /* err = (p - (s - bb)) + (-h - bb), written as a difference of the same roundings */
  const __m256 err = _mm256_sub_ps(_mm256_sub_ps(p, _mm256_sub_ps(s, bb)), _mm256_add_ps(h, bb));
  const __m256 ex = exp256(s);
  const __m256 e = _mm256_mul_ps(t, _mm256_fmadd_ps(ex, _mm256_sub_ps(err, l), ex)); /* erfc(|z|) */
  /* 3. 2 Phi(x): erfc(|z|) where x < 0, 2 - erfc(|z|) elsewhere */
  const __m256 phi2 = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.f), e), e, xc);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), phi2);
}
