/* The W8A8 GEMMs' epilogue (w8a8.c, w8a8_avx512.c): bias, then optionally GELU's erf form, on a thread's columns
 * while they are in L1. One copy, so both instruction sets give the same values after the same GEMM result. */
#pragma once
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

/* One vector of results: the bias, added to the rounded product (as torch's separate add), then the activation. */
static inline __m256 finish(__m256 v, const float *bias, int gelu) {
  if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias));
  return gelu ? gelu256(v) : v;
}

/* y[m, n0:n1] = gelu?(y + bias[n0:n1]) for every row m (bias may be NULL); a tail of fewer than 8 columns goes
 * through a padded copy, so every value takes the same arithmetic. */
static void epilogue(float *y, int64_t ldy, int64_t M, int64_t n0, int64_t n1, const float *bias, int gelu) {
  for (int64_t m = 0; m < M; m++) {
    float *row = y + m * ldy;
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) _mm256_storeu_ps(row + n, finish(_mm256_loadu_ps(row + n), bias ? bias + n : NULL, gelu));
    if (n < n1) {
      float v[8] = {0}, b[8] = {0};
      for (int64_t i = 0; i < n1 - n; i++) {
        v[i] = row[n + i];
        b[i] = bias ? bias[n + i] : 0.f;
      }
      _mm256_storeu_ps(v, finish(_mm256_loadu_ps(v), bias ? b : NULL, gelu));
      for (int64_t i = 0; i < n1 - n; i++) row[n + i] = v[i];
    }
  }
}
