/* W4A8 GEMM for x86 CPUs with AVX2 + FMA: y = x @ dequant(W)^T, built by kernels/cpu/w4a8.py.
 *
 * Why: torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes its weight tile again for every
 * 4 rows of x, so batched decode ran on a dequantized fp32 copy of the weights (8x the bytes of int4). Here
 * the activations are quantized too, per row and per quantization group (int8, one scale per group: the
 * same granularity as the weights' scales, so an outlier channel costs precision only in its own group),
 * and the 4-bit x 8-bit products run on integer SIMD (vpmaddubsw: 32 multiply-adds an instruction).
 *
 * Layout (prepared once by the Python side):
 *   wq   (N, K/2) uint8: row n, 64-value block b: byte j holds q[n, 64b + j] (low nibble) and q[n, 64b + 32 + j]
 *        (high), so one 32-byte load and two masks give 64 values in order
 *        (G = 32, GGUF's blocks: the low nibbles of 64-value block b are group 2b, the high nibbles group 2b + 1)
 *   ws   (N, K/G) float: scale s[n, g]                      w[n, k] = (q[n, k] - z[n, g]) * s[n, g] = q s - z s
 *   wzt  (K/G, N) float: the zero term z[n, g] * s[n, g] (GGUF Q4_1: minus its block minimum), transposed so it is
 *        a vector loop over n
 *   xq   (M, K) int8, xd (M, K/G) float, xs (M, K/G) float: x ~ xq * xd per group; xs = exact sum of x per group
 * so  y[m, n] = sum_g s[n,g] * xd[m,g] * dot(q[n,g], xq[m,g])  -  sum_g (z s)[n,g] * xs[m,g].
 *
 * Every (m, n) result is computed by the same sequence of operations whatever M and the tiling are, so a row's
 * output does not depend on its batch-mates (the engine's batch invariance).
 */
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

#include "quantize.h" /* quantize_rows: x -> per-row, per-group int8 + scales + exact sums */

/* Bytes ahead of the weight stream to prefetch (~7 rows of a 576-wide layer): one thread reads a small batch's weights
 * at ~6 GB/s without, ~9 with (it has more loads in flight than the hardware prefetcher starts). */
#define PREFETCH 2048

/* NT weight rows x MT activation rows, NS 64-value blocks per group (compile-time, so the group's unpacked
 * weights, NT x 2NS ymm, and the NT x MT fp32 accumulators stay in the 16 ymm registers). Per group and row, the
 * int16 sum of 2NS vpmaddubsw results cannot overflow: |q * xq| <= 15 * 127, two per lane, 8 x 3810 < 32767. */
#define TILE(NT, MT, NS)                                                                                         \
  static void tile_##NT##x##MT##_##NS(const uint8_t *wq, const float *ws, const int8_t *xq, const float *xd,     \
                                      int64_t K, float *y, int64_t ldy) {                                        \
    const int64_t ng = K / (64 * NS);                                                                            \
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(15);                                     \
    __m256 acc[NT][MT];                                                                                          \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm256_setzero_ps();                                             \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i lo[NT][NS], hi[NT][NS];                                                                            \
      for (int i = 0; i < NT; i++)                                                                               \
        for (int b = 0; b < NS; b++) {                                                                           \
          _mm_prefetch((const char *)(wq + i * (K / 2) + (g * NS + b) * 32 + PREFETCH), _MM_HINT_T0);            \
          const __m256i v = _mm256_loadu_si256((const __m256i *)(wq + i * (K / 2) + (g * NS + b) * 32));        \
          lo[i][b] = _mm256_and_si256(v, mask);                                                                  \
          hi[i][b] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);                                            \
        }                                                                                                        \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * NS * 64;                                                              \
        const __m256 d = _mm256_broadcast_ss(xd + r * ng + g);                                                  \
        for (int i = 0; i < NT; i++) {                                                                           \
          /* 1. the group's integer dot product, 2. scaled by both scales into the fp32 accumulator */          \
          __m256i p = _mm256_setzero_si256();                                                                    \
          for (int b = 0; b < NS; b++) {                                                                         \
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo[i][b], _mm256_loadu_si256((const __m256i *)(a + 64 * b)))); \
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi[i][b], _mm256_loadu_si256((const __m256i *)(a + 64 * b + 32)))); \
          }                                                                                                      \
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));                                       \
          acc[i][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(_mm256_broadcast_ss(ws + i * ng + g), d), acc[i][r]);    \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = hsum(acc[i][r]);                                            \
  }
/* per group size: the main tile, its one-weight-row and one-x-row tails */
#define TILES(NS) TILE(1, 4, NS) TILE(1, 1, NS)
TILES(1) TILE(2, 4, 1) TILE(2, 1, 1)
TILES(2)
TILES(4)

/* Groups of 32 (GGUF's Q4_0 / Q4_1 blocks): a 64-value block's low nibbles are group 2b and its high nibbles group
 * 2b + 1, so each 32-byte load feeds two integer dot products, each scaled by its own group's two scales. Per
 * (m, n) the order is fixed: group 2b's fmadd, then group 2b + 1's, block after block. */
#define TILE32(NT, MT)                                                                                           \
  static void tile_##NT##x##MT##_g32(const uint8_t *wq, const float *ws, const int8_t *xq, const float *xd,     \
                                     int64_t K, float *y, int64_t ldy) {                                         \
    const int64_t nb = K / 64, ng = K / 32;                                                                      \
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(15);                                     \
    __m256 acc[NT][MT];                                                                                          \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm256_setzero_ps();                                             \
    for (int64_t b = 0; b < nb; b++) {                                                                           \
      __m256i lo[NT], hi[NT];                                                                                    \
      for (int i = 0; i < NT; i++) {                                                                             \
        _mm_prefetch((const char *)(wq + i * (K / 2) + b * 32 + PREFETCH), _MM_HINT_T0);                         \
        const __m256i v = _mm256_loadu_si256((const __m256i *)(wq + i * (K / 2) + b * 32));                     \
        lo[i] = _mm256_and_si256(v, mask);                                                                       \
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);                                                 \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + b * 64;                                                                   \
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)a), a1 = _mm256_loadu_si256((const __m256i *)(a + 32)); \
        const __m256 d0 = _mm256_broadcast_ss(xd + r * ng + 2 * b), d1 = _mm256_broadcast_ss(xd + r * ng + 2 * b + 1); \
        for (int i = 0; i < NT; i++) {                                                                           \
          const __m256 f0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(lo[i], a0), ones));       \
          const __m256 f1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(hi[i], a1), ones));       \
          acc[i][r] = _mm256_fmadd_ps(f0, _mm256_mul_ps(_mm256_broadcast_ss(ws + i * ng + 2 * b), d0), acc[i][r]); \
          acc[i][r] = _mm256_fmadd_ps(f1, _mm256_mul_ps(_mm256_broadcast_ss(ws + i * ng + 2 * b + 1), d1), acc[i][r]); \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = hsum(acc[i][r]);                                            \
  }
TILE32(2, 4) TILE32(1, 4) TILE32(2, 1) TILE32(1, 1)

typedef void (*tile_fn)(const uint8_t *, const float *, const int8_t *, const float *, int64_t, float *, int64_t);
typedef struct { int nt; tile_fn main, one_w, one_x, single; } tiles;

static tiles tiles_for(int64_t G) {
  switch (G) {
    case 32: return (tiles){2, tile_2x4_g32, tile_1x4_g32, tile_2x1_g32, tile_1x1_g32};
    case 64: return (tiles){2, tile_2x4_1, tile_1x4_1, tile_2x1_1, tile_1x1_1};
    case 128: return (tiles){1, tile_1x4_2, tile_1x4_2, tile_1x1_2, tile_1x1_2};
    default: return (tiles){1, tile_1x4_4, tile_1x4_4, tile_1x1_4, tile_1x1_4}; /* 256 (the launcher checks) */
  }
}

/* The blocks layout (G 32, scales inline; w4a8_blocks.h): vpmaddubsw pairs summed in int16 (|q xq| <= 15 x 127, four
 * per lane: 7620 < 32767), then vpmaddwd to int32: each lane one output's eight products. Four rows of x against one
 * octet of weight rows: their group sums, accumulators and chunk fit the 16 ymm registers. */
#define DOT8(acc, lo, hi, a0, a1)                                                                                \
  _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_maddubs_epi16(hi, a1)), \
                                          _mm256_set1_epi16(1)))
#define OCT_MT 4
#define OCT_NC 1
#include "w4a8_blocks.h"

#define N_CHUNK 16 /* weight rows a thread takes at a time: 16 x K/2 bytes stay in L1 */
#define M_BLOCK 32 /* rows of x multiplied by those weight rows in one pass: 32 x K bytes, also in L1 */

static void chunk(const uint8_t *wq, const float *ws, const float *wzt, const int8_t *xq, const float *xd,
                  const float *xs, int64_t M, int64_t N, int64_t K, int64_t G, int64_t n0, int64_t n1, float *y) {
  if (!ws) { /* the blocks layout: scales and zero terms inline */
    chunk_octets(wq, xq, xd, xs, M, N, K, n0, n1, y);
    return;
  }
  const int64_t ng = K / G;
  const tiles t = tiles_for(G);
#define AT(n, m) wq + (n) * (K / 2), ws + (n) * ng, xq + (m) * K, xd + (m) * ng, K, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += M_BLOCK) { /* a block of x rows stays in L1 while the chunk's weights pass */
    const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
    for (m = mb; m + 4 <= me; m += 4) {
      int64_t n = n0;
      for (; n + t.nt <= n1; n += t.nt) t.main(AT(n, m));
      for (; n < n1; n++) t.one_w(AT(n, m));
    }
    for (; m < me; m++) {
      int64_t n = n0;
      for (; n + t.nt <= n1; n += t.nt) t.one_x(AT(n, m));
      for (; n < n1; n++) t.single(AT(n, m));
    }
  }
#undef AT
  /* 3. the zero points: y[m, n] -= sum_g xs[m, g] * (z s)[n, g], eight columns at a time */
  for (m = 0; m < M; m++) {
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) {
      __m256 t = _mm256_setzero_ps();
      for (int64_t g = 0; g < ng; g++) t = _mm256_fmadd_ps(_mm256_broadcast_ss(xs + m * ng + g), _mm256_loadu_ps(wzt + g * N + n), t);
      _mm256_storeu_ps(y + m * N + n, _mm256_sub_ps(_mm256_loadu_ps(y + m * N + n), t));
    }
    for (; n < n1; n++) {
      float t = 0.f;
      for (int64_t g = 0; g < ng; g++) t += xs[m * ng + g] * wzt[g * N + n];
      y[m * N + n] -= t;
    }
  }
}

#include "w4a8_entry.h" /* w4a8_linear: quantize x, then chunk() over the weight rows */
