/* The grouped W8A8 GEMM (GGUF blocks in their own values) on 256-bit vectors, for wg8a8.c (AVX2): it defines W8_PREP
 * (a weight chunk made ready for its dot product), W8_DOT (acc + four products a lane), W8_START (a lane's group sum's
 * starting value from the group's sum of int8 activations, used where W8_GROUP_SUMS is 1), then includes this.
 * wg8a8_avx512.c is the same arithmetic on 512-bit vectors, over sixteen rows a chunk instead of eight.
 *
 * Every GGUF block type is an integer q per weight (|q| < 128) times a float scale per group of G = 16 or 32, plus for
 * some a float term per 32 (backend/quant/gguf_types.py):  w[n, k] = ws[n, k / G] q[n, k] + wz[n, k / 32].
 *
 * Layout (kernels/cpu/wg8a8.py packs it): octets of weight rows, as w8a8_octets.h's
 *   w  (N / 8, K / 4, 8, 4) int8: per octet, K / 4 chunks of 32 bytes whose int32 lane l is row l's values 4t .. 4t + 3
 *   ws (N / 8, K / G, 8) float, or fp16 (HALF: each the file's own fp16 d): the octet's eight scales of group g
 *   (the nibble layout of 4-bit values: wg8a8_entry.h)
 *   wz (N / 8, K / 32, 8) float, or NULL
 * One broadcast of four int8 activations times a chunk gives the octet's eight partial dot products, so each lane ends
 * as one output's exact group sum (no horizontal sums), and per group and row of x one cvt, one multiply and one fmadd
 * cover eight outputs (wg8a8_avx512.c: the same with sixteen rows, `hexadecets`, one 64-byte chunk):
 *
 *   y[m, n] = sum over 32-blocks b, in order:  [ sum over its groups g: cvt(dot(q[n, g], xq[m, g])) * (ws[n, g] * xd[m, b]) ]
 *                                              + wz[n, b] * xs[m, b]
 *
 * with x quantized per row and 32 values (quantize.h: int8, a scale xd, the exact fp32 sum xs). Every (m, n) result is
 * the same sequence of fp32 operations whatever M and the tiling are (a row does not depend on its batch-mates), and
 * AVX2 and AVX-512 give the same bits.
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quantize.h"

static inline __m256i wg_broadcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm256_set1_epi32(t);
}

/* acc + four products a lane of unsigned 4- or 5-bit weights (vpmaddubsw takes them as they are: a pair's sum is at
 * most 2 x 31 x 128, within int16) and int8 activations */
#define WG_DOT_U(acc, wv, xb) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xb), _mm256_set1_epi16(1)))

/* 32 bytes of the nibble layout: chunk c's values u in the low nibbles (u[0]), chunk c + 1's in the high ones (u[1]),
 * with `plane` (the 5-bit layout: the group's 32 bytes of fifth bits, bit c of byte i for byte i of chunk c) each
 * chunk's fifth bits added back as 16s: its bit moved to bit 4 of each byte by one 16-bit shift (bit 4 of either byte
 * of a lane comes from its own byte for shifts of at most 4), kept by an AND, added by an OR. A bit per value in each
 * chunk's own order would take five operations a chunk to spread (AVX2 has no byte masks); this order takes three. */
static inline __attribute__((always_inline)) void wg_nibbles(const int8_t *src, const uint8_t *plane, int c,
                                                             __m256i u[2]) {
  const __m256i v = _mm256_loadu_si256((const __m256i *)src), low = _mm256_set1_epi8(15);
  u[0] = _mm256_and_si256(v, low);
  u[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  if (plane) {
    const __m256i bits = _mm256_loadu_si256((const __m256i *)plane), sixteen = _mm256_set1_epi8(16);
    for (int i = 0; i < 2; i++) {
      const int at = c + i; /* chunk c + i's bit: bit `at` of each byte, to bit 4 */
      const __m256i moved = at <= 4 ? _mm256_slli_epi16(bits, 4 - at) : _mm256_srli_epi16(bits, at - 4);
      u[i] = _mm256_or_si256(u[i], _mm256_and_si256(moved, sixteen));
    }
  }
}

/* MT rows of x times one octet. NIB 0: w in the int8 layout; 1: the nibble layout (wg8a8_entry.h); 2: the nibble
 * layout with an offset, values u - offset (its sums start at -offset times the group's sum of x's int8 values); 3: the
 * 5-bit layout (Q5_0, Q5_1, Q5_K: the nibbles hold u's low four bits, hi (K / 32, 32) bytes a group's fifth bits, bit c
 * of byte i for byte i of the group's chunk c), values u - offset; 4: bytes u as the int8 layout holds its values
 * (wg_unpack's), values u - offset. A constant, so that each variant compiles to its own loop (a runtime offset test
 * cost the 1-row tile ~25%). */
#define WGTILE_BODY(MT, NIB, HALF)                                                                                \
  static void wgtile_##MT##_##NIB##_##HALF(const int8_t *w, const uint8_t *hi, const void *ws, const float *wz,    \
                                           const int8_t *xq, const int32_t *xsum, const float *xd, const float *xs, \
                                           int64_t K, int64_t G, int32_t offset, float *y, int64_t ldy) {          \
    const int64_t nb = K / 32, ng = K / G, per = 32 / G;                                                          \
    __m256 acc[MT];                                                                                               \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                   \
    for (int64_t b = 0; b < nb; b++) {                                                                            \
      for (int64_t h = 0; h < per; h++) {                                                                         \
        const int64_t g = b * per + h;                                                                            \
        __m256i even[MT], odd[MT];                                                                                \
        for (int r = 0; r < MT; r++)                                                                              \
          even[r] = NIB == 0   ? W8_START(xsum[r * ng + g])                                                       \
                    : NIB >= 2 ? _mm256_set1_epi32(-offset * xsum[r * ng + g])                                   \
                               : _mm256_setzero_si256(),                                                          \
          odd[r] = _mm256_setzero_si256();                                                                        \
        for (int64_t t = 0; t < G / 4; t += 2) { /* 1. the group's exact integer sums, two chunks at a time */      \
          __m256i u[2];                                                                                           \
          if (NIB >= 1 && NIB <= 3) {                                                                             \
            const int8_t *p = w + (g * G / 8 + t / 2) * 32;                                                       \
            _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);                                                  \
            wg_nibbles(p, NIB == 3 ? hi + g * 32 : 0, (int)t, u);                                                 \
          } else {                                                                                                \
            const int8_t *p = w + (g * G / 4 + t) * 32;                                                           \
            _mm_prefetch((const char *)(p + 2048), _MM_HINT_T0);                                                  \
            u[0] = _mm256_loadu_si256((const __m256i *)p), u[1] = _mm256_loadu_si256((const __m256i *)(p + 32));   \
            if (NIB == 0) u[0] = W8_PREP(u[0]), u[1] = W8_PREP(u[1]);                                             \
          }                                                                                                       \
          for (int r = 0; r < MT; r++) {                                                                          \
            const int8_t *a = xq + r * K + g * G + 4 * t;                                                         \
            even[r] = NIB ? WG_DOT_U(even[r], u[0], wg_broadcast4(a)) : W8_DOT(even[r], u[0], wg_broadcast4(a));  \
            odd[r] = NIB ? WG_DOT_U(odd[r], u[1], wg_broadcast4(a + 4)) : W8_DOT(odd[r], u[1], wg_broadcast4(a + 4)); \
          }                                                                                                       \
        }                                                                                                         \
        const __m256 s = HALF ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)ws + g * 8)))  \
                              : _mm256_loadu_ps((const float *)ws + g * 8); /* 2. times the rows' group scales */  \
        for (int r = 0; r < MT; r++)                                                                              \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(even[r], odd[r])),                        \
                                   _mm256_mul_ps(s, _mm256_set1_ps(xd[r * nb + b])), acc[r]);                     \
      }                                                                                                           \
      if (wz) { /* 3. the block's terms times x's exact block sum */                                            \
        const __m256 z = _mm256_loadu_ps(wz + b * 8);                                                             \
        for (int r = 0; r < MT; r++) acc[r] = _mm256_fmadd_ps(z, _mm256_set1_ps(xs[r * nb + b]), acc[r]);        \
      }                                                                                                           \
    }                                                                                                             \
    for (int r = 0; r < MT; r++) _mm256_storeu_ps(y + r * ldy, acc[r]);                                          \
  }
/* every kind (int8, nibbles, nibbles with an offset, 5 bits, 5 bits unpacked) at 4 rows of x and 1, for one width of
 * scales */
#define WGTILE_KINDS(HALF)                                                                                        \
  WGTILE_BODY(4, 0, HALF) WGTILE_BODY(1, 0, HALF) WGTILE_BODY(4, 1, HALF) WGTILE_BODY(1, 1, HALF)               \
  WGTILE_BODY(4, 2, HALF) WGTILE_BODY(1, 2, HALF) WGTILE_BODY(4, 3, HALF) WGTILE_BODY(1, 3, HALF)               \
  WGTILE_BODY(4, 4, HALF) WGTILE_BODY(1, 4, HALF)
WGTILE_KINDS(0)
WGTILE_KINDS(1)

#define WG_LANES 8
#define WG_ROWS 16
#include "wg8a8_entry.h"

/* Octet n of the 5-bit layout as bytes u in the int8 layout's order of chunks, into `out` (8 K bytes): what NIB 4
 * reads. From WG_UNPACKED_ROWS rows of x (two 4-row passes or more), every pass then reads bytes instead of expanding
 * the fifth bits again: the same bytes u, so the same sums and bits. */
static void wg_unpack(const wg_args *a, int64_t n, int8_t *out) {
  const int64_t K = a->K;
  const int8_t *src = a->w + n * (K / 2);
  const uint8_t *hi = a->hi + n * (K / 8);
  for (int64_t pair = 0; pair < K / 8; pair++) { /* 32 source bytes: chunks 2 pair and 2 pair + 1 */
    __m256i u[2];
    wg_nibbles(src + 32 * pair, hi + 32 * (pair / 4), (int)(pair % 4) * 2, u);
    _mm256_storeu_si256((__m256i *)(out + 64 * pair), u[0]);
    _mm256_storeu_si256((__m256i *)(out + 64 * pair + 32), u[1]);
  }
}
#define WG_UNPACKED_ROWS 8

static void wg_rows(const wg_args *a, int64_t n0, int64_t n1) {
  const int64_t K = a->K, G = a->G, N = a->N, nb = K / 32, ng = K / G;
  const int64_t row_bytes = a->nib ? K / 2 : K;
  typedef void (*tile)(const int8_t *, const uint8_t *, const void *, const float *, const int8_t *, const int32_t *,
                       const float *, const float *, int64_t, int64_t, int32_t, float *, int64_t);
  /* [half][kind]: kind 0 int8, 1 nibbles, 2 nibbles with an offset, 3 5 bits, 4 5 bits unpacked */
  const tile four[2][5] = {{wgtile_4_0_0, wgtile_4_1_0, wgtile_4_2_0, wgtile_4_3_0, wgtile_4_4_0},
                           {wgtile_4_0_1, wgtile_4_1_1, wgtile_4_2_1, wgtile_4_3_1, wgtile_4_4_1}};
  const tile one[2][5] = {{wgtile_1_0_0, wgtile_1_1_0, wgtile_1_2_0, wgtile_1_3_0, wgtile_1_4_0},
                          {wgtile_1_0_1, wgtile_1_1_1, wgtile_1_2_1, wgtile_1_3_1, wgtile_1_4_1}};
  const int kind = !a->nib ? 0 : a->hi ? 3 : a->offset ? 2 : 1, half = a->half != 0;
  const int64_t scale_bytes = half ? 2 : 4;
#define WGAT(w, hi, n, m) w, hi, (const char *)a->ws + (n) * ng * scale_bytes, a->wz ? a->wz + (n) * nb : 0,           \
                          a->xq + (m) * K, a->xsum + (m) * ng, a->xd + (m) * nb, a->xs + (m) * nb, K, G, a->offset,      \
                          a->y + (m) * N + (n), N
#define WGPACKED(n, m) WGAT(a->w + (n) * row_bytes, a->hi ? a->hi + (n) * (K / 8) : 0, n, m)
  for (int64_t mb = 0; mb < a->M; mb += 32) { /* 32 rows of x stay in L1 while the chunk's weights pass */
    const int64_t me = mb + 32 < a->M ? mb + 32 : a->M;
    int8_t *unpacked = a->hi && me - mb >= WG_UNPACKED_ROWS ? wg_unpack_buffer(8 * K) : 0;
    if (unpacked) { /* 5-bit values unpacked once for every pass */
      for (int64_t n = n0; n < n1; n += 8) {
        wg_unpack(a, n, unpacked);
        int64_t m = mb;
        for (; m + 4 <= me; m += 4) four[half][4](WGAT(unpacked, 0, n, m));
        for (; m < me; m++) one[half][4](WGAT(unpacked, 0, n, m));
      }
      continue;
    }
    int64_t m = mb;
    for (; m + 4 <= me; m += 4)
      for (int64_t n = n0; n < n1; n += 8) four[half][kind](WGPACKED(n, m));
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n += 8) one[half][kind](WGPACKED(n, m));
  }
#undef WGPACKED
#undef WGAT
}
