/* W4A8 GEMM for x86 CPUs with AVX-512 (F/BW/VL) and VNNI: w4a8.c's kernel on 512-bit vectors and vpdpbusd; the same
 * entry point, weight layout and activation quantization (quantize.h), loaded by kernels/cpu/w4a8.py where the CPU
 * has them (kernels/cpu/build.py's cpu_isa).
 *
 * Why: one decode stream reads every weight once per token, so the GEMV should run at memory speed. w4a8.c needs
 * ~6 instructions per 32 weight bytes (two masks, two vpmaddubsw, two int16 adds) on 256-bit vectors; here one
 * 64-byte load feeds two vpdpbusd (u8 x s8 -> i32, four products a lane, exactly our operand types: unsigned nibbles,
 * signed int8 activations) with no int16 stage. llama.cpp uses the same instruction on these CPUs.
 *
 * Layout: as w4a8.c (wq (N, K/2): per 64-value block, byte j = value j (low nibble) | value j + 32 (high)). One
 * 64-byte load covers two blocks ("a chunk", 128 values): its low nibbles are values 0..31 of either block, its high
 * nibbles values 32..63. The quantized activations are permuted once per call to match (xp, per chunk: [lo 64 | hi
 * 64] bytes, the missing second block of an odd tail zero), so both operands are plain 512-bit loads.
 *
 *   y[m, n] = sum_chunks sum_lanes cvt(int dot of the lane's products) * s[n, g(lane)] * xd[m, g(lane)]
 *             - sum_g (z s)[n, g] * xs[m, g]
 *
 * The integer dot products are exact (as w4a8.c's); the fp32 sums group them by 16 lanes (w4a8.c by 8), so the two
 * kernels agree to fp32 rounding, not bit for bit. Every (m, n) result is computed by the same sequence of operations
 * whatever M and the tiling are, so a row's output does not depend on its batch-mates (the engine's batch
 * invariance). Group sizes 32, 64, 128, 256.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quantize.h" /* quantize_rows: x -> per-row, per-group int8 + scales + exact sums (w4a8.c's, unchanged) */

#define PREFETCH 2048 /* bytes ahead of the weight stream (w4a8.c's reason) */

/* Lane l of a chunk's products: l < 8 from the chunk's first block, l >= 8 from its second; lo vectors hold values
 * 0..31 of a block, hi 32..63. A chunk's scale vector for G (s = ws * xd of the chunk's groups, in an xmm):
 *   G 32: groups 4c..4c+3 = (block 0 lo, block 0 hi, block 1 lo, block 1 hi): lo lanes take s[0]/s[2], hi s[1]/s[3]
 *   G 64: groups 2c, 2c+1 = blocks 0, 1: both take s[0]/s[1];  G 128: group c;  G 256: group c/2 (broadcast) */
static inline __m512 spread(__m128 s, int a, int b) {
  const __m512i idx = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

/* The chunk's groups' scales: `per` consecutive floats from p (fewer in a tail chunk; the rest read as 0). */
static inline __m128 chunk_scales(const float *p, int64_t first, int64_t ng, int per) {
  const int64_t left = ng - first;
  const __mmask8 m = (__mmask8)((1u << (left < per ? left : per)) - 1);
  return _mm_maskz_loadu_ps(m, p + first);
}

/* NT weight rows x MT activation rows, group size G (compile-time: NT x 2 weight vectors and NT x MT accumulators stay
 * in the 32 zmm registers; NT 1, see TILES). kc: chunks; wq rows K/2 bytes apart, xp rows 128 kc bytes apart. */
#define TILE(NT, MT, G)                                                                                          \
  static void tile_##NT##x##MT##_##G(const uint8_t *wq, const float *ws, const int8_t *xp, const float *xd,     \
                                     int64_t K, int64_t kc, float *y, int64_t ldy) {                            \
    const int64_t ng = K / G, wrow = K / 2;                                                                      \
    const __m512i mask = _mm512_set1_epi8(15);                                                                   \
    __m512 acc[NT][MT];                                                                                          \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm512_setzero_ps();                                             \
    for (int64_t c = 0; c < kc; c++) {                                                                           \
      /* the tail chunk of an odd block count holds one block: its second half reads as zero (a plain load     \
       * elsewhere: masked loads cost more) */                                                                   \
      const int tail = (2 * c + 1) * 64 > K;                                                                     \
      __m512i lo[NT], hi[NT];                                                                                    \
      for (int i = 0; i < NT; i++) {                                                                             \
        const uint8_t *p = wq + i * wrow + c * 64;                                                               \
        _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);                                                 \
        const __m512i v = tail ? _mm512_maskz_loadu_epi8((__mmask64)0xffffffffu, p) : _mm512_loadu_si512(p);     \
        lo[i] = _mm512_and_si512(v, mask);                                                                       \
        hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);                                                 \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const __m512i xlo = _mm512_loadu_si512(xp + r * kc * 128 + c * 128);                                     \
        const __m512i xhi = _mm512_loadu_si512(xp + r * kc * 128 + c * 128 + 64);                                \
        for (int i = 0; i < NT; i++) {                                                                           \
          /* 1. the exact integer dot products, 2. scaled by both scales into the fp32 accumulator */           \
          if (G == 32) {                                                                                         \
            const __m128 s = _mm_mul_ps(chunk_scales(ws + i * ng, 4 * c, ng, 4), chunk_scales(xd + r * ng, 4 * c, ng, 4)); \
            const __m512i pl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xlo);                          \
            const __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[i], xhi);                          \
            acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pl), spread(s, 0, 2), acc[i][r]);                   \
            acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ph), spread(s, 1, 3), acc[i][r]);                   \
          } else {                                                                                               \
            __m512 sv;                                                                                           \
            if (G == 64)                                                                                         \
              sv = spread(_mm_mul_ps(chunk_scales(ws + i * ng, 2 * c, ng, 2), chunk_scales(xd + r * ng, 2 * c, ng, 2)), 0, 1); \
            else {                                                                                               \
              const int64_t g = G == 128 ? c : c / 2;                                                            \
              sv = _mm512_set1_ps(ws[i * ng + g] * xd[r * ng + g]);                                              \
            }                                                                                                    \
            const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xlo), hi[i], xhi); \
            acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[i][r]);                                  \
          }                                                                                                      \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = _mm512_reduce_add_ps(acc[i][r]);                            \
  }
/* One weight row at a time, against 4 rows of x or 1: the weight stream stays sequential. Reading 2 or 4 rows at once
 * (K / 2 bytes apart) ran slower on AMD Zen 4 at one row of x (30 layers of SmolLM2: 1 row 7.9 ms, 2 rows 10.4, 4 rows
 * 11.1, one thread), the hardware prefetcher following one stream better than several interleaved ones. */
#define TILES(G) TILE(1, 4, G) TILE(1, 1, G)
TILES(32)
TILES(64)
TILES(128)
TILES(256)

typedef void (*tile_fn)(const uint8_t *, const float *, const int8_t *, const float *, int64_t, int64_t, float *, int64_t);
typedef struct { tile_fn four, single; } tiles; /* 1x4, 1x1 */

static tiles tiles_for(int64_t G) {
  switch (G) {
    case 32: return (tiles){tile_1x4_32, tile_1x1_32};
    case 64: return (tiles){tile_1x4_64, tile_1x1_64};
    case 128: return (tiles){tile_1x4_128, tile_1x1_128};
    default: return (tiles){tile_1x4_256, tile_1x1_256}; /* 256 (the launcher checks) */
  }
}

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by those weight rows in one pass (32 x K bytes stay in L1) */

static void chunk(const uint8_t *wq, const float *ws, const float *wzt, const int8_t *xp, const float *xd,
                  const float *xs, int64_t M, int64_t N, int64_t K, int64_t G, int64_t n0, int64_t n1, float *y) {
  const int64_t ng = K / G, kc = (K + 127) / 128;
  const tiles t = tiles_for(G);
#define AT(n, m) wq + (n) * (K / 2), ws + (n) * ng, xp + (m) * kc * 128, xd + (m) * ng, K, kc, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
    const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
    for (m = mb; m + 4 <= me; m += 4)
      for (int64_t n = n0; n < n1; n++) t.four(AT(n, m));
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n++) t.single(AT(n, m));
  }
#undef AT
  /* 3. the zero points: y[m, n] -= sum_g xs[m, g] * (z s)[n, g], sixteen columns at a time (masked at the end) */
  for (m = 0; m < M; m++)
    for (int64_t n = n0; n < n1; n += 16) {
      const __mmask16 k = n1 - n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n1 - n)) - 1);
      __m512 z = _mm512_setzero_ps();
      for (int64_t g = 0; g < ng; g++) z = _mm512_fmadd_ps(_mm512_set1_ps(xs[m * ng + g]), _mm512_maskz_loadu_ps(k, wzt + g * N + n), z);
      _mm512_mask_storeu_ps(y + m * N + n, k, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, y + m * N + n), z));
    }
}

/* xq (M, K) in natural order -> xp (M, 128 kc): per chunk the values that meet the low nibbles, then the high. */
static void permute_rows(const int8_t *xq, int64_t M, int64_t K, int8_t *xp) {
  const int64_t kc = (K + 127) / 128;
  memset(xp, 0, (size_t)(M * kc * 128));
  for (int64_t m = 0; m < M; m++)
    for (int64_t b = 0; b < K / 64; b++) { /* block b: chunk b / 2, half b % 2 */
      int8_t *o = xp + m * kc * 128 + (b / 2) * 128 + (b % 2) * 32;
      memcpy(o, xq + m * K + b * 64, 32);
      memcpy(o + 64, xq + m * K + b * 64 + 32, 32);
    }
}

/* The entry point (w4a8.c's): quantize x (M, K) float (rows ldx floats apart), then y (M, N) float. Returns 0, or -1
 * when the scratch could not be allocated. */
int w4a8_linear(const float *x, int64_t ldx, const uint8_t *wq, const float *ws, const float *wzt, int64_t M, int64_t N,
                int64_t K, int64_t G, float *y, int nthreads) {
  const quantized a = quantized_alloc(M, K, G);
  int8_t *xp = malloc((size_t)(M * ((K + 127) / 128) * 128));
  if (!a.block || !xp) {
    free(a.block);
    free(xp);
    return -1;
  }
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, nthreads);
  permute_rows(a.xq, M, K, xp);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK)
    chunk(wq, ws, wzt, xp, a.xd, a.xs, M, N, K, G, n0, n0 + N_CHUNK < N ? n0 + N_CHUNK : N, y);
  free(a.block);
  free(xp);
  return 0;
}
