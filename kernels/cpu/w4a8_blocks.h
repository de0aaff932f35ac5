/* The W4A8 GEMMs' group-32 "blocks" layout (GGUF's Q4_0 / Q4_1 blocks as served), shared by w4a8.c (AVX2) and
 * w4a8_avx512.c: each defines BLOCK_DOT (the integer dot product of a block, its instruction set's) and BLOCKS_NT
 * (weight rows per tile at 4 x rows) and includes this before its `chunk`, which hands a weight without separate
 * scales (ws NULL) to chunk_blocks.
 *
 * Why: at G = 32 the split layout (nibbles in wq, fp32 scales in ws, fp32 zero terms in wzt, a separate pass) reads
 * 8 bytes of scales per 16 bytes of nibbles from three places, and spends two cvt + two fmadd + two scalar scale
 * products per 64 values and row, plus the zero pass. Here a row is one sequential stream of 40-byte blocks, the
 * scale and zero term fp16 (GGUF's own precision: lossless), and one vector op per 64 values does the work the split
 * layout did per group.
 *
 * Layout, per weight row, 64-value block b (groups 2b and 2b + 1), 40 bytes:
 *   bytes 0..31   nibbles: byte j = value at slot j (low nibble) | value at slot 32 + j (high)
 *   bytes 32..35  fp16 scales d[2b], d[2b + 1]
 *   bytes 36..39  fp16 zero terms z[2b], z[2b + 1]                       w = q d - z  (GGUF Q4_1: z = -m)
 * Slot t holds value v = (t / 4 % 2) * 32 + (t / 32) * 16 + (t % 32 / 8) * 4 + t % 4: each 4-byte lane of the unpacked
 * low (slots 0..31) and high (32..63) nibbles alternates between the two groups, so the block's integer dot product
 * leaves group 2b's partial sums in the even int32 lanes and group 2b + 1's in the odd ones. The activations are
 * quantized into the same slots (quantize_rows' `blocks`), so one dot product, one cvt and one fmadd with the scale
 * vector [d0 xd0, d1 xd1, ...] cover both groups of a row.
 *
 * The zero terms are summed apart, four rows of x at a time: per weight row and block one fmadd of [z0, z1, z0, z1, ...]
 * with the rows' exact activation sums [xs0 r0, xs1 r0, xs0 r1, xs1 r1, ...] (interleave_xs), so lanes 2r and 2r + 1
 * gather row r's even- and odd-group terms. Folded into each row's accumulator instead (one fnmadd per row and block,
 * six of eight lanes zero) they cost a fifth of the multiply ports' work: this way a 32-row step of the 30 layers ran
 * 1.19x and a 512-row prefill 1.17x faster on AMD Zen 4 (AVX-512, one thread), and one row 1.12x.
 *
 *   y[m, n] = hsum over lanes of ( sum_b cvt(dot_b) * (d xd)_b )  -  ( sum_b z_b xs_b  [lane 2r]  +  [lane 2r + 1] )
 *
 * The integer dot products are exact; the fp32 results agree with the split layout's to rounding. Every (m, n)
 * result is computed by the same sequence of operations whatever M and the tiling are (batch invariance).
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define BLOCK_BYTES 40 /* 32 bytes of nibbles + 2 fp16 scales + 2 fp16 zero terms */

/* two adjacent floats broadcast to every pair of lanes: [p0, p1, p0, p1, ...] */
static inline __m256 pair_broadcast(const float *p) {
  double t;
  memcpy(&t, p, sizeof t);
  return _mm256_castpd_ps(_mm256_set1_pd(t));
}

/* two adjacent fp16 values, widened and broadcast to every pair of lanes (exact) */
static inline __m256 half_pair_broadcast(const uint8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm256_cvtph_ps(_mm_set1_epi32(t));
}

/* NT weight rows x 4 rows of x (compile-time: unpacked nibbles, scale vectors and accumulators stay in registers); MT 1
 * for a single row. xs4: interleave_xs's zero-term scales of these rows. Row r of a 4-row tile and a single row run the
 * same operations in their lanes (2r, 2r + 1 and 0, 1), so a row's result does not depend on how it was tiled. */
#define BTILE_BODY(NT, MT)                                                                                        \
  static void btile_##NT##x##MT(const uint8_t *wq, const int8_t *xq, const float *xd, const float *xs4, int64_t K, \
                                float *y, int64_t ldy) {                                                          \
    const int64_t nb = K / 64, ng = K / 32, row = nb * BLOCK_BYTES;                                              \
    const __m256i mask = _mm256_set1_epi8(15);                                                                   \
    __m256 acc[NT][MT], zacc[NT];                                                                                \
    for (int i = 0; i < NT; i++) {                                                                               \
      zacc[i] = _mm256_setzero_ps();                                                                             \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm256_setzero_ps();                                             \
    }                                                                                                            \
    for (int64_t b = 0; b < nb; b++) {                                                                           \
      __m256i lo[NT], hi[NT];                                                                                    \
      __m256 d[NT];                                                                                              \
      const __m256 xsv = _mm256_loadu_ps(xs4 + 8 * b);                                                           \
      for (int i = 0; i < NT; i++) {                                                                             \
        const uint8_t *p = wq + i * row + b * BLOCK_BYTES;                                                       \
        _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);                                                 \
        const __m256i v = _mm256_loadu_si256((const __m256i *)p);                                                \
        lo[i] = _mm256_and_si256(v, mask);                                                                       \
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);                                                 \
        d[i] = half_pair_broadcast(p + 32);                                                                      \
        zacc[i] = _mm256_fmadd_ps(half_pair_broadcast(p + 36), xsv, zacc[i]);                                    \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + b * 64;                                                                   \
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)a), a1 = _mm256_loadu_si256((const __m256i *)(a + 32)); \
        const __m256 xdv = pair_broadcast(xd + r * ng + 2 * b);                                                  \
        for (int i = 0; i < NT; i++) {                                                                           \
          const __m256 f = _mm256_cvtepi32_ps(BLOCK_DOT(lo[i], hi[i], a0, a1));                                 \
          acc[i][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(d[i], xdv), acc[i][r]);                                   \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++) {                                                                               \
      float zl[8];                                                                                               \
      _mm256_storeu_ps(zl, zacc[i]);                                                                             \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = hsum(acc[i][r]) - (zl[2 * r] + zl[2 * r + 1]);              \
    }                                                                                                            \
  }
#define BTILE(NT, MT) BTILE_BODY(NT, MT) /* expands BLOCKS_NT before pasting */
BTILE(BLOCKS_NT, 4)
#if BLOCKS_NT > 1
BTILE(1, 4)
#endif
BTILE(1, 1)
#define BTILE_MAIN_(NT) btile_##NT##x4
#define BTILE_MAIN(NT) BTILE_MAIN_(NT)

/* xs4 (K / 64 blocks x 8 lanes): rows r < rows of xs (M, K / 32) in lanes 2r, 2r + 1 (block b's two groups), zeros
 * in the other lanes. */
static void interleave_xs(const float *xs, int64_t K, int64_t rows, float *xs4) {
  const int64_t ng = K / 32;
  for (int64_t b = 0; b < ng / 2; b++)
    for (int64_t l = 0; l < 8; l++) xs4[8 * b + l] = l / 2 < rows ? xs[(l / 2) * ng + 2 * b + l % 2] : 0.f;
}

/* Weight rows [n0, n1) of the blocks layout against all M rows of x (quantized into the blocks' slots). */
static void chunk_blocks(const uint8_t *wq, const int8_t *xq, const float *xd, const float *xs, int64_t M, int64_t N,
                         int64_t K, int64_t n0, int64_t n1, float *y) {
  const int64_t ng = K / 32, row = K / 64 * BLOCK_BYTES;
  float xs4[8 * (K / 64)];
#define BAT(n, m) wq + (n) * row, xq + (m) * K, xd + (m) * ng, xs4, K, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += 32) { /* 32 rows of x stay in L1 while the chunk's weights pass */
    const int64_t me = mb + 32 < M ? mb + 32 : M;
    for (m = mb; m + 4 <= me; m += 4) {
      interleave_xs(xs + m * ng, K, 4, xs4);
      int64_t n = n0;
      for (; n + BLOCKS_NT <= n1; n += BLOCKS_NT) BTILE_MAIN(BLOCKS_NT)(BAT(n, m));
      for (; n < n1; n++) btile_1x4(BAT(n, m));
    }
    for (; m < me; m++) {
      interleave_xs(xs + m * ng, K, 1, xs4);
      for (int64_t n = n0; n < n1; n++) btile_1x1(BAT(n, m));
    }
  }
#undef BAT
}
