/* The W4A8 GEMMs' group-32 blocks layout on x86 (GGUF's Q4_0 / Q4_1 blocks as served), shared by w4a8.c (AVX2) and
 * w4a8_avx512.c: each defines DOT8 (acc + the dot products of two chunks of unsigned nibbles with two broadcasts of
 * four signed int8 activations, eight products an int32 lane: vpdpbusd, or vpmaddubsw + vpmaddwd), OCT_MT and OCT_NC
 * (the tile: rows of x, octets of weight rows) and
 * includes this before its `chunk`, which hands a weight without separate scales (ws NULL) to chunk_octets.
 * (w4a8_neon.c serves the same weights in its own 64-value blocks.)
 *
 * Layout: weight rows (y's columns) in octets of eight; per octet and group g of 32 input values, 160 bytes:
 *   bytes   0..127  nibbles, four 32-byte chunks j: int32 lane l is weight row l, its byte p holds values 8j + p
 *                   (low nibble) and 8j + 4 + p (high)
 *   bytes 128..143  the eight rows' fp16 scales d
 *   bytes 144..159  the eight rows' fp16 zero terms z                w = q d - z   (GGUF Q4_1: z = -m)
 * and an octet's groups follow each other: one sequential stream per eight rows, 5 bits a weight.
 *
 * Why: one broadcast int32 of four activations times a chunk's unpacked nibbles gives eight outputs' partial dot
 * products at once, so each lane ends as one output's exact group sum: no horizontal sums, and per group and row of x
 * one cvt, one mul, one fmadd and one fnmadd cover eight outputs (the 64-value blocks before this needed a cvt, a mul
 * and an fmadd per output and 64 values, plus an hsum per output). On AMD Zen 4 (AVX-512, one thread) the 30 layers
 * ran 2.1x as fast as those blocks at 32 and 512 rows of x, 1.9x at one.
 *
 *   y[m, n] = sum over g, in order:  cvt(int dot(q[n, g], xq[m, g])) * (d[n, g] xd[m, g])  -  z[n, g] xs[m, g]
 *
 * The integer dot products are exact and the same on both instruction sets, and every (m, n) result is the same
 * sequence of fp32 operations whatever M, N and the tiling are: a row does not depend on its batch-mates (the engine's
 * batch invariance), and AVX2 and AVX-512 give the same bits.
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define OCTET_GROUP_BYTES 160 /* 128 bytes of nibbles + eight fp16 scales + eight fp16 zero terms */

/* four int8 activations broadcast to every int32 lane */
static inline __m256i broadcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm256_set1_epi32(t);
}

/* MT rows of x x NC octets of weight rows (compile-time: the integer group sums, the fp32 accumulators and the
 * unpacked chunk stay in registers). w: the first octet's stream; xq, xd, xs: the first row's. */
#define OTILE_BODY(MT, NC)                                                                                        \
  static void otile_##MT##x##NC(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, int64_t K,  \
                                float *y, int64_t ldy) {                                                          \
    const int64_t ng = K / 32, octet = ng * OCTET_GROUP_BYTES;                                                   \
    const __m256i mask = _mm256_set1_epi8(15);                                                                   \
    __m256 acc[MT][NC];                                                                                          \
    for (int r = 0; r < MT; r++)                                                                                 \
      for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();                                             \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i dot[MT][NC];                                                                                       \
      for (int r = 0; r < MT; r++)                                                                               \
        for (int c = 0; c < NC; c++) dot[r][c] = _mm256_setzero_si256();                                        \
      for (int j = 0; j < 4; j++) { /* 1. the group's exact integer dot products, eight values per chunk */      \
        __m256i lo[NC], hi[NC];                                                                                  \
        for (int c = 0; c < NC; c++) {                                                                           \
          const uint8_t *p = w + c * octet + g * OCTET_GROUP_BYTES + 32 * j;                                     \
          _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);                                               \
          const __m256i v = _mm256_loadu_si256((const __m256i *)p);                                              \
          lo[c] = _mm256_and_si256(v, mask);                                                                     \
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);                                               \
        }                                                                                                        \
        for (int r = 0; r < MT; r++) {                                                                           \
          const int8_t *a = xq + r * K + g * 32 + 8 * j;                                                         \
          const __m256i a0 = broadcast4(a), a1 = broadcast4(a + 4);                                              \
          for (int c = 0; c < NC; c++) dot[r][c] = DOT8(dot[r][c], lo[c], hi[c], a0, a1);                        \
        }                                                                                                        \
      }                                                                                                          \
      for (int c = 0; c < NC; c++) { /* 2. scaled into fp32, the zero terms subtracted */                        \
        const uint8_t *p = w + c * octet + g * OCTET_GROUP_BYTES + 128;                                          \
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));                                   \
        const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));                            \
        for (int r = 0; r < MT; r++) {                                                                           \
          const __m256 f = _mm256_cvtepi32_ps(dot[r][c]);                                                        \
          acc[r][c] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, _mm256_set1_ps(xd[r * ng + g])), acc[r][c]);           \
          acc[r][c] = _mm256_fnmadd_ps(z, _mm256_set1_ps(xs[r * ng + g]), acc[r][c]);                            \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++)                                                                                 \
      for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + r * ldy + 8 * c, acc[r][c]);                            \
  }
#define OTILE(MT, NC) OTILE_BODY(MT, NC) /* expands OCT_MT / OCT_NC before pasting */
#define OTILE_NAME_(MT, NC) otile_##MT##x##NC
#define OTILE_NAME(MT, NC) OTILE_NAME_(MT, NC)
OTILE(OCT_MT, OCT_NC)
#if OCT_NC > 1
OTILE(OCT_MT, 1)
#endif
#if OCT_MT > 1
OTILE(1, 1)
#endif

/* Weight rows [n0, n1) (whole octets) of the blocks layout against all M rows of x (quantized in plain order). */
static void chunk_octets(const uint8_t *wq, const int8_t *xq, const float *xd, const float *xs, int64_t M, int64_t N,
                         int64_t K, int64_t n0, int64_t n1, float *y) {
  const int64_t ng = K / 32, octet = ng * OCTET_GROUP_BYTES;
#define OAT(n, m) wq + (n) / 8 * octet, xq + (m) * K, xd + (m) * ng, xs + (m) * ng, K, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += 32) { /* 32 rows of x stay in L1 while the chunk's weights pass */
    const int64_t me = mb + 32 < M ? mb + 32 : M;
    for (m = mb; m + OCT_MT <= me; m += OCT_MT) {
      int64_t n = n0;
      for (; n + 8 * OCT_NC <= n1; n += 8 * OCT_NC) OTILE_NAME(OCT_MT, OCT_NC)(OAT(n, m));
      for (; n < n1; n += 8) OTILE_NAME(OCT_MT, 1)(OAT(n, m));
    }
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n += 8) otile_1x1(OAT(n, m));
  }
#undef OAT
}
