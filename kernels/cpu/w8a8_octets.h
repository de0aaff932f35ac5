/* The W8A8 GEMM in octets of weight rows, for the INT4 models' lm_head (LowBitHead), shared by w8a8.c (AVX2) and
 * w8a8_avx512.c: each defines W8_PREP (a weight chunk made ready for its dot product), W8_DOT (acc + four products a
 * lane) and W8_START (a lane's group sum's starting value from the group's sum of int8 activations, computed only
 * where W8_GROUP_SUMS is 1), OCT8_MT and
 * OCT8_NC (the tile: rows of x, octets of weight rows) and includes this after w8a8_epilogue.h.
 *
 * Layout: w (N / 8, K / 4, 8, 4) int8: per octet of weight rows, K / 4 chunks of 32 bytes whose int32 lane l is row l's
 * four values 4t .. 4t + 3; ws (N,) float (w8a8.c's scales). One broadcast of four activations times a chunk gives the
 * octet's eight partial dot products, so each lane ends as one output's exact group sum: no horizontal sums, and per
 * group and row of x one cvt and one fmadd cover eight outputs (w8a8.c's rows take a cvt and an fmadd per output and
 * group, and an hsum per output). On AMD Zen 4 (one thread, the weight warm in cache) SmolLM2's 49152 x 576 head took
 * 6.9 ms at 32 rows against 15.9 (AVX-512), 15.8 against 19.9 (AVX2); 0.91 against 0.75 ms at one row, where a decode
 * step reads the head from memory anyway.
 *
 *   y[m, n] = ws[n] * sum over groups g, in order:  cvt(int dot(w[n, g], xq[m, g])) * xd[m, g]
 *
 * The integer sums are exact (two accumulators a group, even and odd chunks, so one row's sums do not wait on each
 * other's latency), and every (m, n) result is the same sequence of fp32 operations whatever M and the tiling are: a
 * row does not depend on its batch-mates. AVX2 and AVX-512 give the same bits. No bias or GELU (the head has none).
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quantize.h"

/* four int8 activations broadcast to every int32 lane */
static inline __m256i w8_broadcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm256_set1_epi32(t);
}

#define W8TILE_BODY(MT, NC)                                                                                       \
  static void w8tile_##MT##x##NC(const int8_t *w, const float *ws, const int8_t *xq, const int32_t *xsum,         \
                                 const float *xd, int64_t K, int64_t G, float *y, int64_t ldy) {                  \
    const int64_t ng = K / G, octet = 8 * K;                                                                     \
    __m256 acc[MT][NC];                                                                                          \
    for (int r = 0; r < MT; r++)                                                                                 \
      for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();                                             \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i even[MT][NC], odd[MT][NC];                                                                         \
      for (int r = 0; r < MT; r++)                                                                               \
        for (int c = 0; c < NC; c++) even[r][c] = W8_START(xsum[r * ng + g]), odd[r][c] = _mm256_setzero_si256(); \
      for (int64_t t = 0; t < G / 4; t += 2) { /* 1. the group's exact integer sums, two chunks at a time */     \
        __m256i w0[NC], w1[NC];                                                                                  \
        for (int c = 0; c < NC; c++) {                                                                           \
          const int8_t *p = w + c * octet + (g * G / 4 + t) * 32;                                                \
          _mm_prefetch((const char *)(p + 2048), _MM_HINT_T0);                                                   \
          w0[c] = W8_PREP(_mm256_loadu_si256((const __m256i *)p));                                               \
          w1[c] = W8_PREP(_mm256_loadu_si256((const __m256i *)(p + 32)));                                        \
        }                                                                                                        \
        for (int r = 0; r < MT; r++) {                                                                           \
          const int8_t *a = xq + r * K + g * G + 4 * t;                                                          \
          const __m256i a0 = w8_broadcast4(a), a1 = w8_broadcast4(a + 4);                                        \
          for (int c = 0; c < NC; c++) {                                                                         \
            even[r][c] = W8_DOT(even[r][c], w0[c], a0);                                                          \
            odd[r][c] = W8_DOT(odd[r][c], w1[c], a1);                                                            \
          }                                                                                                      \
        }                                                                                                        \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) { /* 2. times x's scale for the group into fp32 */                            \
        const __m256 d = _mm256_set1_ps(xd[r * ng + g]);                                                         \
        for (int c = 0; c < NC; c++)                                                                             \
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(even[r][c], odd[r][c])), d, acc[r][c]); \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) /* 3. the rows' weight scales, once */                                          \
      for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + r * ldy + 8 * c, _mm256_mul_ps(acc[r][c], _mm256_loadu_ps(ws + 8 * c))); \
  }
#define W8TILE(MT, NC) W8TILE_BODY(MT, NC)
#define W8TILE_NAME_(MT, NC) w8tile_##MT##x##NC
#define W8TILE_NAME(MT, NC) W8TILE_NAME_(MT, NC)
W8TILE(OCT8_MT, OCT8_NC)
#if OCT8_NC > 1
W8TILE(OCT8_MT, 1)
#endif
#if OCT8_MT > 1
W8TILE(1, 1)
#endif

/* y (M, N) float = x (M, K) float (rows ldx floats apart) @ (w * ws)^T, w in octets; N a multiple of 8, G 32 or 64.
 * Returns 0, or -1 when the scratch could not be allocated. */
int w8a8_octets_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, int64_t M, int64_t N, int64_t K,
                       int64_t G, float *y, int nthreads) {
  const int64_t ng = K / G;
  const quantized a = quantized_alloc(M, K, G);
  int32_t *xsum = malloc(sizeof(int32_t) * (size_t)(M * ng));
  if (!a.block || !xsum) {
    free(a.block);
    free(xsum);
    return -1;
  }
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, 0, nthreads);
#if W8_GROUP_SUMS
  for (int64_t i = 0; i < M * ng; i++) { /* the exact int8 sum of each row's group (W8_START's correction) */
    int32_t s = 0;
    for (int64_t k = 0; k < G; k++) s += a.xq[i * G + k];
    xsum[i] = s;
  }
#endif
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t n1 = n0 + 16 < N ? n0 + 16 : N;
#define W8AT(n, m) w + (n) * K, ws + (n), a.xq + (m) * K, xsum + (m) * ng, a.xd + (m) * ng, K, G, y + (m) * N + (n), N
    for (int64_t mb = 0; mb < M; mb += 32) { /* 32 rows of x stay in L1 while the chunk's weights pass */
      const int64_t me = mb + 32 < M ? mb + 32 : M;
      int64_t m = mb;
      for (; m + OCT8_MT <= me; m += OCT8_MT) {
        int64_t n = n0;
        for (; n + 8 * OCT8_NC <= n1; n += 8 * OCT8_NC) W8TILE_NAME(OCT8_MT, OCT8_NC)(W8AT(n, m));
        for (; n < n1; n += 8) W8TILE_NAME(OCT8_MT, 1)(W8AT(n, m));
      }
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n += 8) w8tile_1x1(W8AT(n, m));
    }
#undef W8AT
  }
  free(a.block);
  free(xsum);
  return 0;
}
