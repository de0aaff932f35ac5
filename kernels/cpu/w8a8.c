/* W8A8 GEMM for x86 CPUs with AVX2 + FMA: y = act(x @ (W * s)^T + b) with W int8 (one scale per output row), the INT4
 * models' lm_head and the embedder's int8 encoder (backend/embed/minilm.py); built by kernels/cpu/w8a8.py.
 *
 * Why: the lm_head (49152 x 576 for SmolLM2) is read in full by every decode step; torch's int8 weight-only
 * kernel re-reads it per row of x, so batched steps ran it from a dense fp32 copy (4 bytes a weight). Here the
 * activations are quantized per row and group of G (quantize.h) and the int8 x int8 products run on integer
 * SIMD: vpmaddubsw multiplies unsigned by signed bytes, so the weight's sign moves onto the activation
 * (|w| * sign(x, w), exact) and each pair sum (<= 2 * 127 * 127) fits int16; per 32 values it is widened to int32.
 *
 * Layout: w (N, K) int8, ws (N,) float: w_real[n, k] = w[n, k] * ws[n]. Every (m, n) result is computed by the
 * same sequence of operations whatever M is, so a row's output does not depend on its batch-mates.
 *
 * The epilogue (bias, then optionally GELU's erf form) runs on each thread's columns right after they are written,
 * while they are in L1: for the encoder's short queries the bias add and GELU as torch ops cost ~30 us each a call
 * (10 x 1536, AMD EPYC), mostly dispatch and OpenMP, against ~200 us for the GEMM itself.
 */
#include <immintrin.h>
#include <stdint.h>

#include "quantize.h"

#include "simd.h"

#include "w8a8_epilogue.h" /* bias + GELU on a thread's columns (shared with w8a8_avx512.c) */

/* One weight row against MT rows of x, NB 32-value blocks per group (compile-time: the group's weights and their
 * absolute values, 2 x NB ymm, and the MT accumulators stay in registers). */
#define TILE(MT, NB)                                                                                             \
  static void tile_##MT##_##NB(const int8_t *w, float ws, const int8_t *xq, const float *xd, int64_t K, float *y, \
                               int64_t ldy) {                                                                    \
    const int64_t ng = K / (32 * NB);                                                                            \
    const __m256i ones = _mm256_set1_epi16(1);                                                                   \
    __m256 acc[MT];                                                                                              \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i wv[NB], wa[NB];                                                                                    \
      for (int b = 0; b < NB; b++) {                                                                             \
        wv[b] = _mm256_loadu_si256((const __m256i *)(w + (g * NB + b) * 32));                                   \
        wa[b] = _mm256_abs_epi8(wv[b]);                                                                          \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * NB * 32;                                                              \
        __m256i p = _mm256_setzero_si256();                                                                      \
        for (int b = 0; b < NB; b++) { /* 1. |w| * (x with w's sign), pairs in int16, then int32 */            \
          const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(a + 32 * b)), wv[b]);       \
          p = _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[b], sx), ones));                   \
        }                                                                                                        \
        /* 2. the group's sum times x's scale for the group into fp32 */                                        \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(xd + r * ng + g), acc[r]);          \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = hsum(acc[r]) * ws; /* 3. the row's weight scale, once */          \
  }
TILE(4, 1) TILE(1, 1)
TILE(4, 2) TILE(1, 2)

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by them in one pass (32 x K bytes stay in L1) */

/* The entry point: quantize x (M, K) float (rows ldx floats apart), then y (M, N) float = gelu?(x @ w^T + bias);
 * bias (N,) may be NULL, gelu 0 or 1. G: 32 or 64. Returns 0, or -1 when the scratch could not be allocated. */
int w8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu, int64_t M,
                int64_t N, int64_t K, int64_t G, float *y, int nthreads) {
  const quantized a = quantized_alloc(M, K, G);
  if (!a.block) return -1;
  const int8_t *xq = a.xq;
  const float *xd = a.xd;
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, 0, nthreads);
  const int64_t ng = K / G;
  void (*four)(const int8_t *, float, const int8_t *, const float *, int64_t, float *, int64_t) = G == 64 ? tile_4_2 : tile_4_1;
  void (*one)(const int8_t *, float, const int8_t *, const float *, int64_t, float *, int64_t) = G == 64 ? tile_1_2 : tile_1_1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) {
    const int64_t n1 = n0 + N_CHUNK < N ? n0 + N_CHUNK : N;
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = n0; n < n1; n++) four(w + n * K, ws[n], xq + m * K, xd + m * ng, K, y + m * N + n, N);
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n++) one(w + n * K, ws[n], xq + m * K, xd + m * ng, K, y + m * N + n, N);
    }
    if (bias || gelu) epilogue(y, N, M, n0, n1, bias, gelu);
  }
  free(a.block);
  return 0;
}

/* The lm_head's octets layout (w8a8_octets.h): |w| times x with w's sign, pairs in int16, widened per chunk to int32
 * (as above). Four rows of x against one octet of weight rows fit the 16 ymm registers. */
#define W8_PREP(v) (v)
#define W8_DOT(acc, wv, xb) \
  _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv)), _mm256_set1_epi16(1)))
#define W8_START(sum) _mm256_setzero_si256()
#define W8_GROUP_SUMS 0
#define OCT8_MT 4
#define OCT8_NC 1
#include "w8a8_octets.h"
