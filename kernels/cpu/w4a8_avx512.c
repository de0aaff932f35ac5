/* W4A8 GEMM for x86 CPUs with AVX-512 (F/BW/VL) and VNNI: w4a8.c's kernel with vpdpbusd; the same entry point, weight
 * layout and activation quantization (quantize.h), loaded by kernels/cpu/w4a8.py where the CPU has them
 * (kernels/cpu/build.py's cpu_isa).
 *
 * Why: vpdpbusd multiplies unsigned by signed bytes, four products a lane into int32: exactly our operands (unsigned
 * nibbles, signed int8 activations), one instruction where w4a8.c needs vpmaddubsw, an int16 add and, per group,
 * vpmaddwd. No int16 stage, so no bound on the products summed before widening. llama.cpp uses the same instruction.
 *
 * 256-bit vectors (AVX-512 VL): on AMD Zen 4, which runs a 512-bit operation as two 256-bit ones, a 512-bit version
 * (two blocks a load, activations permuted to match) read 30 layers of SmolLM2 at one row no faster than w4a8.c, and
 * its W8A8 sibling was 25% slower (w8a8_avx512.c).
 *
 * Layout: w4a8.c's (wq (N, K/2): per 64-value block, byte j = value j (low nibble) | value j + 32 (high); ws (N, K/G);
 * wzt (K/G, N) = zero * scale, transposed), so one 32-byte load gives a block's low nibbles (values 0..31, the x bytes
 * at the block's start) and high nibbles (values 32..63, the next 32 x bytes). For G = 32 these are two groups.
 *
 *   y[m, n] = sum_g cvt(int dot(q[n, g], xq[m, g])) * (s[n, g] * xd[m, g])  -  sum_g (z s)[n, g] * xs[m, g]
 *
 * The integer dot products are exact (as w4a8.c's); the int32 lanes hold other partial sums than w4a8.c's (four
 * adjacent products, not pairs of pairs at a stride), so the fp32 results agree to rounding, not bit for bit. Every
 * (m, n) result is computed by the same sequence of operations whatever M and the tiling are, so a row's output does
 * not depend on its batch-mates (the engine's batch invariance). Group sizes 32, 64, 128, 256.
 */
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

#include "quantize.h" /* quantize_rows: x -> per-row, per-group int8 + scales + exact sums (w4a8.c's, unchanged) */

#define PREFETCH 2048 /* bytes ahead of the weight stream (w4a8.c's reason) */

/* One weight row against MT rows of x, group size G (compile-time: the group's unpacked weights and the MT fp32
 * accumulators stay in registers). One weight row at a time keeps the weight stream sequential: 2 or 4 rows
 * interleaved (K / 2 bytes apart) read 30 layers 30-40% slower at one row of x (AMD Zen 4), the hardware prefetcher
 * following one stream better than several. */
#define TILE(MT, G)                                                                                              \
  static void tile_##MT##_##G(const uint8_t *wq, const float *ws, const int8_t *xq, const float *xd, int64_t K,  \
                              float *y, int64_t ldy) {                                                           \
    const int64_t ng = K / G, nb = G >= 64 ? G / 64 : 1; /* blocks per group (G 32: two groups per block) */    \
    const __m256i mask = _mm256_set1_epi8(15);                                                                   \
    __m256 acc[MT];                                                                                              \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t g = 0; g < (G >= 64 ? ng : ng / 2); g++) { /* G 32: one block, groups 2g and 2g + 1 */          \
      __m256i lo[G >= 64 ? G / 64 : 1], hi[G >= 64 ? G / 64 : 1];                                                \
      for (int64_t b = 0; b < nb; b++) {                                                                         \
        const uint8_t *p = wq + (g * nb + b) * 32;                                                               \
        _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);                                                 \
        const __m256i v = _mm256_loadu_si256((const __m256i *)p);                                                \
        lo[b] = _mm256_and_si256(v, mask);                                                                       \
        hi[b] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);                                                 \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * nb * 64;                                                              \
        /* 1. the group's exact integer dot product, 2. scaled by both scales into the fp32 accumulator */      \
        if (G == 32) {                                                                                           \
          const __m256i pl = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo[0], _mm256_loadu_si256((const __m256i *)a)); \
          const __m256i ph = _mm256_dpbusd_epi32(_mm256_setzero_si256(), hi[0], _mm256_loadu_si256((const __m256i *)(a + 32))); \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl), _mm256_set1_ps(ws[2 * g] * xd[r * ng + 2 * g]), acc[r]); \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph), _mm256_set1_ps(ws[2 * g + 1] * xd[r * ng + 2 * g + 1]), acc[r]); \
        } else {                                                                                                 \
          __m256i p = _mm256_setzero_si256();                                                                    \
          for (int64_t b = 0; b < nb; b++) {                                                                     \
            p = _mm256_dpbusd_epi32(p, lo[b], _mm256_loadu_si256((const __m256i *)(a + 64 * b)));               \
            p = _mm256_dpbusd_epi32(p, hi[b], _mm256_loadu_si256((const __m256i *)(a + 64 * b + 32)));          \
          }                                                                                                      \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ws[g] * xd[r * ng + g]), acc[r]);      \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = hsum(acc[r]);                                                     \
  }
#define TILES(G) TILE(4, G) TILE(1, G)
TILES(32)
TILES(64)
TILES(128)
TILES(256)

typedef void (*tile_fn)(const uint8_t *, const float *, const int8_t *, const float *, int64_t, float *, int64_t);
typedef struct { tile_fn four, single; } tiles;

static tiles tiles_for(int64_t G) {
  switch (G) {
    case 32: return (tiles){tile_4_32, tile_1_32};
    case 64: return (tiles){tile_4_64, tile_1_64};
    case 128: return (tiles){tile_4_128, tile_1_128};
    default: return (tiles){tile_4_256, tile_1_256}; /* 256 (the launcher checks) */
  }
}

/* The blocks layout (G 32, scales inline; w4a8_blocks.h): two vpdpbusd, each lane one output's eight products. Four
 * rows of x against two octets of weight rows (16 group sums, 16 accumulators, two chunks: 1.2x one octet at 32 rows
 * of x, 1.15x two rows of x at two octets). */
#define DOT8(acc, lo, hi, a0, a1) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, lo, a0), hi, a1)
#define OCT_MT 4
#define OCT_NC 2
#include "w4a8_blocks.h"

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by those weight rows in one pass (32 x K bytes stay in L1) */

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
  for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
    const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
    for (m = mb; m + 4 <= me; m += 4)
      for (int64_t n = n0; n < n1; n++) t.four(AT(n, m));
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n++) t.single(AT(n, m));
  }
#undef AT
  /* 3. the zero points: y[m, n] -= sum_g xs[m, g] * (z s)[n, g], eight columns at a time (masked at the end, so every
   * column takes the same fused multiply-adds) */
  for (m = 0; m < M; m++)
    for (int64_t n = n0; n < n1; n += 8) {
      const __mmask8 k = n1 - n >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (n1 - n)) - 1);
      __m256 z = _mm256_setzero_ps();
      for (int64_t g = 0; g < ng; g++) z = _mm256_fmadd_ps(_mm256_set1_ps(xs[m * ng + g]), _mm256_maskz_loadu_ps(k, wzt + g * N + n), z);
      _mm256_mask_storeu_ps(y + m * N + n, k, _mm256_sub_ps(_mm256_maskz_loadu_ps(k, y + m * N + n), z));
    }
}

#include "w4a8_entry.h" /* w4a8_linear: quantize x, then chunk() over the weight rows */
