/* Activations for the integer GEMMs (w4a8.c, w8a8.c): each row of x (M, K) float quantized to int8 per
 * group of G values (symmetric, one scale per row and group, round to nearest): xq (M, K) int8, xd (M, K/G) the
 * scales, xs (M, K/G) the exact fp32 sum of each group (for zero points). x's rows are ldx floats apart.
 * blocks (G 32 only): xq in the slots of w4a8_blocks.h's layout, value v of a 64-value block at slot
 * (v % 32 / 16) * 32 + (v % 16 / 4) * 8 + (v / 32) * 4 + v % 4, so its 4-byte lanes alternate between the two groups.
 *
 * Two builds of the same arithmetic: AVX2 on x86 and NEON on aarch64 (the *_neon.c kernels). Both sum a group in
 * eight lanes (lane i: values i, i + 8, ...) and then the lanes 0..7 in order, and round x * (127 / max) to the
 * nearest integer (ties to even), so both give the same bytes, scales and sums for the same x, in either order. */
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Scratch for quantize_rows' outputs, one allocation (malloc costs less than the tensors a caller would make). */
typedef struct { int8_t *xq; float *xd, *xs; void *block; } quantized;

static quantized quantized_alloc(int64_t M, int64_t K, int64_t G) {
  const int64_t scales = M * (K / G), xq_bytes = (M * K + 63) / 64 * 64;
  quantized q;
  q.block = malloc(xq_bytes + 2 * scales * sizeof(float));
  q.xq = (int8_t *)q.block;
  q.xd = (float *)((char *)q.block + xq_bytes);
  q.xs = q.xd + scales;
  return q;
}

#if !defined(__aarch64__)
static void quantize_rows(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t G, int8_t *xq, float *xd, float *xs,
                          int blocks, int nthreads) {
  const int64_t ng = K / G;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
#pragma omp parallel for schedule(static) num_threads(nthreads) if (M >= 16)
  for (int64_t m = 0; m < M; m++) {
    for (int64_t g = 0; g < ng; g++) {
      const float *v = x + m * ldx + g * G;
      /* 1. max |x| and the exact sum of the group */
      __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
      for (int64_t i = 0; i < G; i += 8) {
        __m256 t = _mm256_loadu_ps(v + i);
        amax = _mm256_max_ps(amax, _mm256_and_ps(t, absmask));
        sum = _mm256_add_ps(sum, t);
      }
      float am[8], sm[8], a = 0.f, s = 0.f;
      _mm256_storeu_ps(am, amax);
      _mm256_storeu_ps(sm, sum);
      for (int i = 0; i < 8; i++) { a = am[i] > a ? am[i] : a; s += sm[i]; }
      xd[m * ng + g] = a / 127.f;
      xs[m * ng + g] = s;
      /* 2. round(x * 127 / max) to int8 (an all-zero group stays zero) */
      const __m256 inv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
      int8_t *o = xq + m * K + g * G;
      for (int64_t i = 0; i < G; i += 8) {
        __m256 t = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m128i q32lo = _mm256_castsi256_si128(_mm256_cvtps_epi32(t)), q32hi = _mm256_extracti128_si256(_mm256_cvtps_epi32(t), 1);
        __m128i q16 = _mm_packs_epi32(q32lo, q32hi), q8 = _mm_packs_epi16(q16, q16);
        if (blocks) { /* values i..i+3 and i+4..i+7 of group g: two lanes of its block, 8 slots apart */
          int8_t *s = xq + m * K + g / 2 * 64 + i / 16 * 32 + i % 16 / 4 * 8 + g % 2 * 4;
          const int32_t lo4 = _mm_cvtsi128_si32(q8), hi4 = _mm_extract_epi32(q8, 1);
          memcpy(s, &lo4, 4);
          memcpy(s + 8, &hi4, 4);
        } else {
          _mm_storel_epi64((__m128i *)(o + i), q8);
        }
      }
    }
  }
}
#else
static void quantize_rows(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t G, int8_t *xq, float *xd, float *xs,
                          int blocks, int nthreads) {
  const int64_t ng = K / G;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (M >= 16)
  for (int64_t m = 0; m < M; m++) {
    for (int64_t g = 0; g < ng; g++) {
      const float *v = x + m * ldx + g * G;
      /* 1. max |x| and the exact sum of the group, lanes 0..3 and 4..7 of the AVX2 version's eight */
      float32x4_t amax0 = vdupq_n_f32(0.f), amax1 = amax0, sum0 = amax0, sum1 = amax0;
      for (int64_t i = 0; i < G; i += 8) {
        const float32x4_t t0 = vld1q_f32(v + i), t1 = vld1q_f32(v + i + 4);
        amax0 = vmaxq_f32(amax0, vabsq_f32(t0));
        amax1 = vmaxq_f32(amax1, vabsq_f32(t1));
        sum0 = vaddq_f32(sum0, t0);
        sum1 = vaddq_f32(sum1, t1);
      }
      float am[8], sm[8], a = 0.f, s = 0.f;
      vst1q_f32(am, amax0);
      vst1q_f32(am + 4, amax1);
      vst1q_f32(sm, sum0);
      vst1q_f32(sm + 4, sum1);
      for (int i = 0; i < 8; i++) { a = am[i] > a ? am[i] : a; s += sm[i]; }
      xd[m * ng + g] = a / 127.f;
      xs[m * ng + g] = s;
      /* 2. round(x * 127 / max) to int8, ties to even (an all-zero group stays zero) */
      const float32x4_t inv = vdupq_n_f32(a > 0.f ? 127.f / a : 0.f);
      int8_t *o = xq + m * K + g * G;
      for (int64_t i = 0; i < G; i += 8) {
        const int32x4_t q0 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(v + i), inv));
        const int32x4_t q1 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(v + i + 4), inv));
        const int16x8_t q16 = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
        const int8x8_t q8 = vqmovn_s16(q16);
        if (blocks) { /* values i..i+3 and i+4..i+7 of group g: two lanes of its block, 8 slots apart (as above) */
          int8_t *s = xq + m * K + g / 2 * 64 + i / 16 * 32 + i % 16 / 4 * 8 + g % 2 * 4;
          const int32_t lo4 = vget_lane_s32(vreinterpret_s32_s8(q8), 0), hi4 = vget_lane_s32(vreinterpret_s32_s8(q8), 1);
          memcpy(s, &lo4, 4);
          memcpy(s + 8, &hi4, 4);
        } else {
          vst1_s8(o + i, q8);
        }
      }
    }
  }
}
#endif
