/* W4A8 GEMM for x86 CPUs with AVX2 + FMA: y = x @ dequant(W)^T, built by kernels/cpu_w4a8.py.
 *
 * Why: torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes its weight tile again for every
 * 4 rows of x, so batched decode ran on a dequantized fp32 copy of the weights (8x the bytes of int4). Here
 * the activations are quantized too, per row and per quantization group (int8, one scale per group: the
 * same granularity as the weights' scales, so an outlier channel costs precision only in its own group),
 * and the 4-bit x 8-bit products run on integer SIMD (vpmaddubsw: 32 multiply-adds an instruction).
 *
 * Layout (prepared once by the Python side):
 *   wq   (N, K/2) uint8: row n, 32-value block b: byte j holds q[n, 32b + j] (low nibble) and q[n, 32b + 16 + j]
 *   ws   (N, K/G) float: scale s[n, g]                      w[n, k] = (q[n, k] - z[n, g]) * s[n, g]
 *   wzt  (K/G, N) float: z[n, g] * s[n, g], transposed so the zero term is a vector loop over n
 *   xq   (M, K) int8, xd (M, K/G) float, xs (M, K/G) float: x ~ xq * xd per group; xs = exact sum of x per group
 * so  y[m, n] = sum_g s[n,g] * xd[m,g] * dot(q[n,g], xq[m,g])  -  sum_g (z s)[n,g] * xs[m,g].
 *
 * Every (m, n) result is computed by the same sequence of operations whatever M and the tiling are, so a row's
 * output does not depend on its batch-mates (the engine's batch invariance).
 */
#include <immintrin.h>
#include <stdint.h>

/* ---- activations: per-row, per-group int8 ---------------------------------------------------------- */
static void w4a8_quantize(const float *x, int64_t M, int64_t K, int64_t G, int8_t *xq, float *xd, float *xs, int nthreads) {
  const int64_t ng = K / G;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
#pragma omp parallel for schedule(static) num_threads(nthreads) if (M >= 16)
  for (int64_t m = 0; m < M; m++) {
    for (int64_t g = 0; g < ng; g++) {
      const float *v = x + m * K + g * G;
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
        __m128i q16 = _mm_packs_epi32(q32lo, q32hi);
        _mm_storel_epi64((__m128i *)(o + i), _mm_packs_epi16(q16, q16));
      }
    }
  }
}

/* ---- the GEMM ------------------------------------------------------------------------------------- */
static inline __m256i unpack32(const uint8_t *p) { /* 16 bytes -> 32 values: low nibbles, then high nibbles */
  const __m128i b = _mm_loadu_si128((const __m128i *)p), mask = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}

static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* NT weight rows x MT activation rows, NB 32-value blocks per group (compile-time, so the group's unpacked
 * weights, NT x NB ymm, and the NT x MT fp32 accumulators stay in the 16 ymm registers). Per group and row, the
 * int16 sum of NB vpmaddubsw results cannot overflow: |q * xq| <= 15 * 127, two per lane, 8 x 3810 < 32767. */
#define TILE(NT, MT, NB)                                                                                         \
  static void tile_##NT##x##MT##_##NB(const uint8_t *wq, const float *ws, const int8_t *xq, const float *xd,     \
                                      int64_t K, float *y, int64_t ldy) {                                        \
    const int64_t ng = K / (32 * NB);                                                                            \
    const __m256i ones = _mm256_set1_epi16(1);                                                                   \
    __m256 acc[NT][MT];                                                                                          \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm256_setzero_ps();                                             \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i w[NT][NB];                                                                                         \
      for (int i = 0; i < NT; i++)                                                                               \
        for (int b = 0; b < NB; b++) w[i][b] = unpack32(wq + i * (K / 2) + (g * NB + b) * 16);                  \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * NB * 32;                                                              \
        const __m256 d = _mm256_broadcast_ss(xd + r * ng + g);                                                  \
        for (int i = 0; i < NT; i++) {                                                                           \
          /* 1. the group's integer dot product, 2. scaled by both scales into the fp32 accumulator */          \
          __m256i p = _mm256_maddubs_epi16(w[i][0], _mm256_loadu_si256((const __m256i *)a));                   \
          for (int b = 1; b < NB; b++)                                                                           \
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[i][b], _mm256_loadu_si256((const __m256i *)(a + 32 * b)))); \
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));                                       \
          acc[i][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(_mm256_broadcast_ss(ws + i * ng + g), d), acc[i][r]);    \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = hsum(acc[i][r]);                                            \
  }
/* per group size: the main tile, its one-weight-row and one-x-row tails */
#define TILES(NB) TILE(1, 4, NB) TILE(1, 1, NB)
TILES(1) TILE(2, 4, 1) TILE(2, 1, 1)
TILES(2) TILE(2, 4, 2) TILE(2, 1, 2)
TILES(4)
TILES(8)

typedef void (*tile_fn)(const uint8_t *, const float *, const int8_t *, const float *, int64_t, float *, int64_t);
typedef struct { int nt; tile_fn main, one_w, one_x, single; } tiles;

static tiles tiles_for(int64_t G) {
  switch (G) {
    case 32: return (tiles){2, tile_2x4_1, tile_1x4_1, tile_2x1_1, tile_1x1_1};
    case 64: return (tiles){2, tile_2x4_2, tile_1x4_2, tile_2x1_2, tile_1x1_2};
    case 128: return (tiles){1, tile_1x4_4, tile_1x4_4, tile_1x1_4, tile_1x1_4};
    default: return (tiles){1, tile_1x4_8, tile_1x4_8, tile_1x1_8, tile_1x1_8}; /* 256 (the launcher checks) */
  }
}

#define N_CHUNK 16 /* weight rows a thread takes at a time: 16 x K/2 bytes stay in L1 */
#define M_BLOCK 32 /* rows of x multiplied by those weight rows in one pass: 32 x K bytes, also in L1 */

static void chunk(const uint8_t *wq, const float *ws, const float *wzt, const int8_t *xq, const float *xd,
                  const float *xs, int64_t M, int64_t N, int64_t K, int64_t G, int64_t n0, int64_t n1, float *y) {
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

/* The entry point: quantize x (M, K) float into the caller's scratch (xq, xd, xs), then y (M, N) float. */
void w4a8_linear(const float *x, const uint8_t *wq, const float *ws, const float *wzt, int8_t *xq, float *xd, float *xs,
                 int64_t M, int64_t N, int64_t K, int64_t G, float *y, int nthreads) {
  w4a8_quantize(x, M, K, G, xq, xd, xs, nthreads);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) chunk(wq, ws, wzt, xq, xd, xs, M, N, K, G, n0, n0 + N_CHUNK < N ? n0 + N_CHUNK : N, y);
}
