/* exp and GELU (erf form) one value at a time in portable C, for the NEON kernels' epilogue (w8a8_neon.c): simd.h's
 * exp256 and gelu256 written lane by lane, the same constants and the same roundings in the same order (fmaf where
 * they fuse, rintf for their round-to-nearest-even), so for the same input they give the same bits as the AVX2 ones.
 * Why scalar: the epilogue is a small part of a GEMM's time, and one copy of the arithmetic is easier to keep equal.
 * Needs -ffp-contract=off (build.py's flags): a multiply and an add written apart must stay apart. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x), Cephes' range reduction and degree-5 polynomial (simd.h's exp256) */
static inline float exp_scalar(float x) {
  x = fminf(fmaxf(x, -87.3f), 88.3f);
  const float fx = rintf(x * 1.44269504088896341f);
  x = fmaf(-fx, 0.693359375f, x); /* x - n ln2, in two parts for precision */
  x = fmaf(-fx, -2.12194440e-4f, x);
  float y = 1.9875691500e-4f;
  y = fmaf(y, x, 1.3981999507e-3f);
  y = fmaf(y, x, 8.3334519073e-3f);
  y = fmaf(y, x, 4.1665795894e-2f);
  y = fmaf(y, x, 1.6666665459e-1f);
  y = fmaf(y, x, 5.0000001201e-1f);
  y = fmaf(y, x * x, x + 1.f);
  const int32_t bits = ((int32_t)fx + 127) << 23;
  float pow2n;
  memcpy(&pow2n, &bits, sizeof pow2n);
  return y * pow2n;
}

/* GELU, erf form: x * Phi(x) = 0.5 x erfc(-x / sqrt 2), to ~3e-7 relative (simd.h's gelu256 says how) */
static inline float gelu_scalar(float x) {
  static const float c[10] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                              -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f};
  const float xc = fminf(fmaxf(x, -20.f), 20.f);
  const float hx = 0.5f * xc;
  const float z = fabsf(xc * 0.70710678118654752f);
  const float t = 1.f / fmaf(0.5f, z, 1.f);
  float p = c[0];
  for (int i = 1; i < 10; i++) p = fmaf(p, t, c[i]);
  const float h = hx * xc, l = fmaf(hx, xc, -h);
  const float s = p - h, bb = s - p;
  const float err = (p - (s - bb)) - (h + bb);
  const float ex = exp_scalar(s);
  const float e = t * fmaf(ex, err - l, ex); /* erfc(|z|) */
  const float phi2 = signbit(xc) ? e : 2.f - e;
  return (0.5f * x) * phi2;
}
