/* Grouped W8A8 GEMM for x86 CPUs with AVX2 + FMA: y = x @ W^T with W a GGUF file's quantized blocks as they are,
 * built by kernels/cpu/wg8a8.py.
 *
 * Why: every GGUF block type (Q4_0 ... Q8_0, and the K-quants' sub-blocks) is an integer q per weight times a float
 * scale per group of 16 or 32 weights, plus, for some types, a float term per group of 32:
 *
 *     w[n, k] = ws[n, k / G] * q[n, k] + wz[n, k / 32]          (G = 16 or 32; wz absent for the symmetric types)
 *
 * with |q| < 128 for every type up to Q8_0. Held as int8 + fp32 scales these are the file's own values (the same
 * float32 arithmetic as gguf-py's dequantization: backend/quant/gguf_types.py), at 1.1-1.25 bytes a weight, instead of
 * a float32 copy at 4. The activations are quantized per row and group of 32 (quantize.h: int8, a scale, the exact
 * sum) and the products run on integer SIMD as in w8a8.c (|q| times x with q's sign: vpmaddubsw, pairs <= 2 x 128 x
 * 127 fit int16), then widened to int32 lanes of 4 products each, so lanes 0-3 of a 32-value block are its first 16
 * weights and lanes 4-7 the next 16: a group of 16 is a per-lane scale, not a second pass.
 *
 *     y[m, n] = sum_b  cvt(dot_b) . (ws[n, b] * xd[m, b])   (per lane)   +   sum_b wz[n, b] * xs[m, b]
 *
 * Layout: w (N, K) int8, ws (N, K/G) float, wz (N, K/32) float or NULL; K a multiple of 32. Every (m, n) result is
 * computed by the same sequence of operations whatever M and the tiling are (batch invariance).
 */
#include <immintrin.h>
#include <stdint.h>

#include "quantize.h"

#include "simd.h"

#define PREFETCH 1024 /* bytes ahead of the weight row being read */
#define N_CHUNK 16    /* weight rows a thread takes at a time */
#define M_BLOCK 32    /* rows of x multiplied by them in one pass */

/* The scale of each int32 lane of block b: one scale (G 32), or the two 16-value groups' (G 16), times x's. */
static inline __m256 lane_scales(const float *ws, int64_t b, int g16, float xd) {
  if (!g16) return _mm256_set1_ps(ws[b] * xd);
  return _mm256_set_m128(_mm_set1_ps(ws[2 * b + 1] * xd), _mm_set1_ps(ws[2 * b] * xd));
}

/* One weight row against MT rows of x. */
#define TILE(MT)                                                                                                 \
  static void tile_##MT(const int8_t *w, const float *ws, const float *wz, int g16, const int8_t *xq,             \
                        const float *xd, const float *xs, int64_t K, float *y, int64_t ldy) {                    \
    const int64_t nb = K / 32;                                                                                   \
    const __m256i ones = _mm256_set1_epi16(1);                                                                   \
    __m256 acc[MT];                                                                                              \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t b = 0; b < nb; b++) {                                                                           \
      _mm_prefetch((const char *)(w + b * 32 + PREFETCH), _MM_HINT_T0);                                          \
      const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + b * 32));                                     \
      const __m256i wa = _mm256_abs_epi8(wv);                                                                    \
      for (int r = 0; r < MT; r++) {                                                                             \
        const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + r * K + b * 32)), wv);    \
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), ones);                                \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), lane_scales(ws, b, g16, xd[r * nb + b]), acc[r]);      \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) {                                                                               \
      float v = hsum(acc[r]);                                                                                    \
      if (wz)                                                                                                    \
        for (int64_t b = 0; b < nb; b++) v += wz[b] * xs[r * nb + b];                                            \
      y[r * ldy] = v;                                                                                            \
    }                                                                                                            \
  }
TILE(4) TILE(1)

/* The entry point: quantize x (M, K) float (rows ldx floats apart), then y (M, N) float = x @ w^T. G: 16 or 32.
 * Returns 0, -1 when the scratch could not be allocated, -2 on a shape the kernel does not take. */
int wg8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *wz, int64_t M, int64_t N,
                 int64_t K, int64_t G, float *y, int nthreads) {
  if (K % 32 || (G != 16 && G != 32)) return -2;
  const quantized a = quantized_alloc(M, K, 32);
  if (!a.block) return -1;
  quantize_rows(x, ldx, M, K, 32, a.xq, a.xd, a.xs, 0, nthreads);
  const int64_t nb = K / 32, ng = K / G;
  const int g16 = G == 16;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) {
    const int64_t n1 = n0 + N_CHUNK < N ? n0 + N_CHUNK : N;
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = n0; n < n1; n++)
          tile_4(w + n * K, ws + n * ng, wz ? wz + n * nb : 0, g16, a.xq + m * K, a.xd + m * nb, a.xs + m * nb, K,
                 y + m * N + n, N);
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n++)
          tile_1(w + n * K, ws + n * ng, wz ? wz + n * nb : 0, g16, a.xq + m * K, a.xd + m * nb, a.xs + m * nb, K,
                 y + m * N + n, N);
    }
  }
  free(a.block);
  return 0;
}
