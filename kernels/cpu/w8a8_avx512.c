/* W8A8 GEMM for x86 CPUs with AVX-512 (F/BW/VL) and VNNI: w8a8.c's kernel with vpdpbusd; the same entry point, layout,
 * activation quantization (quantize.h) and epilogue (w8a8_epilogue.h), loaded by kernels/cpu/w8a8.py where the CPU has
 * them (kernels/cpu/build.py's cpu_isa).
 *
 * Why: the INT4 models' lm_head (49152 x 576 int8 for SmolLM2, ~28 MB) is a third of the bytes a one-stream decode step
 * reads. vpdpbusd multiplies unsigned by signed bytes, four products a lane into int32, replacing w8a8.c's vpsignb,
 * vpmaddubsw, vpmaddwd and add. AVX-512 has no vpsignb to move w's sign onto x, so the weight is made unsigned instead:
 * u = w + 128 (an xor with 0x80, w in -127..127), and dot(w, x) = dot(u, x) - 128 sum(x), the second term computed once
 * per activation row and group (each group's accumulator starts at it).
 *
 * 256-bit vectors (AVX-512 VL): the 512-bit version read the lm_head at one row of x 25% slower than w8a8.c on AMD Zen 4
 * (1.9 vs 1.5 ms, one thread), whose 512-bit operations take two 256-bit passes and whose 16-lane sums cost more per
 * output row. The group's integer sum, its conversion and scaling, and the final 8-lane sum are w8a8.c's
 * (8 lanes, per group: cvt, fma with x's group scale; at the end hsum times the row's scale), but the lanes hold other
 * partial sums (vpdpbusd adds four adjacent products, vpmaddubsw + vpmaddwd four at a stride), so the two kernels
 * agree to fp32 rounding, not bit for bit. Every (m, n) result is computed by the same sequence of operations
 * whatever M and the tiling are, so a row's output does not depend on its batch-mates.
 *
 * Layout (w8a8.c's): w (N, K) int8, ws (N,) float: w_real[n, k] = w[n, k] * ws[n]; G 64, or 32 where K % 64 != 0.
 */
#include <immintrin.h>
#include <stdint.h>

#include "quantize.h"

#include "simd.h"

#include "w8a8_epilogue.h"

/* One weight row against MT rows of x, H = G / 32 halves per group (compile-time: the group's H weight vectors and the
 * MT accumulators stay in registers). start (M, ng): each group's accumulator start, -128 x its lanes' x sums. */
#define TILE(MT, H)                                                                                              \
  static void tile_##MT##_##H(const int8_t *w, float ws, const int8_t *xq, const __m256i *start, const float *xd, \
                              int64_t K, float *y, int64_t ldy) {                                                \
    const int64_t ng = K / (32 * H);                                                                             \
    const __m256i flip = _mm256_set1_epi8((char)0x80);                                                           \
    __m256 acc[MT];                                                                                              \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      __m256i u[H];                                                                                              \
      for (int h = 0; h < H; h++) /* w + 128, unsigned */                                                        \
        u[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + (g * H + h) * 32)), flip);            \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * H * 32;                                                               \
        __m256i p = start[r * ng + g]; /* 1. the exact integer dot product of the group */                      \
        for (int h = 0; h < H; h++) p = _mm256_dpbusd_epi32(p, u[h], _mm256_loadu_si256((const __m256i *)(a + 32 * h))); \
        /* 2. times x's scale for the group into fp32 */                                                         \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(xd + r * ng + g), acc[r]);          \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = hsum(acc[r]) * ws; /* 3. the row's weight scale, once */          \
  }
TILE(4, 1) TILE(1, 1)
TILE(4, 2) TILE(1, 2)

/* start (M, K / G) for xq (M, K): -128 x the sum of each lane's x values over the group's halves. */
static void group_starts(const int8_t *xq, int64_t M, int64_t K, int64_t G, __m256i *start) {
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < K / G; g++) {
      __m256i s = _mm256_setzero_si256();
      for (int64_t h = 0; h < G / 32; h++)
        s = _mm256_dpbusd_epi32(s, bias, _mm256_loadu_si256((const __m256i *)(xq + m * K + g * G + h * 32)));
      start[m * (K / G) + g] = _mm256_sub_epi32(_mm256_setzero_si256(), s);
    }
}

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by them in one pass (32 x K bytes stay in L1) */

/* The entry point (w8a8.c's): quantize x (M, K) float (rows ldx floats apart), then y (M, N) float = gelu?(x @ w^T +
 * bias); bias (N,) may be NULL, gelu 0 or 1. G: 32 or 64. Returns 0, or -1 when the scratch could not be allocated. */
int w8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu, int64_t M,
                int64_t N, int64_t K, int64_t G, float *y, int nthreads) {
  const int64_t ng = K / G;
  const quantized a = quantized_alloc(M, K, G);
  __m256i *start = aligned_alloc(32, (size_t)(M * ng) * sizeof(__m256i));
  if (!a.block || !start) {
    free(a.block);
    free(start);
    return -1;
  }
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, 0, nthreads);
  group_starts(a.xq, M, K, G, start);
  void (*four)(const int8_t *, float, const int8_t *, const __m256i *, const float *, int64_t, float *, int64_t) =
      G == 64 ? tile_4_2 : tile_4_1;
  void (*one)(const int8_t *, float, const int8_t *, const __m256i *, const float *, int64_t, float *, int64_t) =
      G == 64 ? tile_1_2 : tile_1_1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) {
    const int64_t n1 = n0 + N_CHUNK < N ? n0 + N_CHUNK : N;
#define AT(n, m) w + (n) * K, ws[n], a.xq + (m) * K, start + (m) * ng, a.xd + (m) * ng, K, y + (m) * N + (n), N
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = n0; n < n1; n++) four(AT(n, m));
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n++) one(AT(n, m));
    }
#undef AT
    if (bias || gelu) epilogue(y, N, M, n0, n1, bias, gelu);
  }
  free(a.block);
  free(start);
  return 0;
}

/* The lm_head's octets layout (w8a8_octets.h): w + 128 unsigned (as above), so a lane's group sum starts at -128 times
 * the group's activation sum. Four rows of x against two octets of weight rows. */
#define W8_PREP(v) _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80))
#define W8_DOT(acc, u, xb) _mm256_dpbusd_epi32(acc, u, xb)
#define W8_START(sum) _mm256_set1_epi32(-128 * (sum))
#define W8_GROUP_SUMS 1
#define OCT8_MT 4
#define OCT8_NC 2
#include "w8a8_octets.h"
