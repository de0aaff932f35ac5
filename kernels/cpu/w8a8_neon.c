/* W8A8 GEMM for aarch64 CPUs with the dot-product extension (Armv8.2-A +dotprod): w8a8.c's kernel with SDOT
 * (vdotq_s32); the same entry point, layout and activation quantization (quantize.h's NEON build), loaded by
 * kernels/cpu/w8a8.py where kernels/cpu/build.py's cpu_isa() says "neon-dotprod".
 *
 * Why: SDOT multiplies signed by signed bytes, four products a lane into int32: the int8 weights and activations as
 * they are (no sign trick as w8a8.c's vpmaddubsw needs, no +128 offset as w8a8_avx512.c's vpdpbusd). The group's
 * integer dot product is exact; the lanes hold other partial sums than the x86 kernels' and the fp32 accumulator has
 * four lanes, so the results agree with theirs to fp32 rounding. Every (m, n) result is computed by the same sequence
 * of operations whatever M is, so a row's output does not depend on its batch-mates. Built and tested under emulation
 * (qemu-aarch64, tests/test_kernels_cpu_neon.py); no ARM hardware has timed it.
 *
 * Layout (w8a8.c's): w (N, K) int8, ws (N,) float: w_real[n, k] = w[n, k] * ws[n]; G 64, or 32 where K % 64 != 0.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <stdlib.h>

#include "quantize.h"

#include "scalar_math.h" /* gelu_scalar: simd.h's GELU, the same bits */

/* One weight row against MT rows of x, H = G / 32 halves per group (compile-time: the group's 2H weight vectors and
 * the MT accumulators stay in registers). */
#define TILE(MT, H)                                                                                              \
  static void tile_##MT##_##H(const int8_t *w, float ws, const int8_t *xq, const float *xd, int64_t K, float *y, \
                              int64_t ldy) {                                                                     \
    const int64_t ng = K / (32 * H);                                                                             \
    float32x4_t acc[MT];                                                                                         \
    for (int r = 0; r < MT; r++) acc[r] = vdupq_n_f32(0.f);                                                     \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      int8x16_t wv[2 * H];                                                                                       \
      for (int b = 0; b < 2 * H; b++) wv[b] = vld1q_s8(w + g * H * 32 + 16 * b);                                 \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * H * 32;                                                               \
        int32x4_t p = vdupq_n_s32(0); /* 1. the exact integer dot product of the group */                        \
        for (int b = 0; b < 2 * H; b++) p = vdotq_s32(p, wv[b], vld1q_s8(a + 16 * b));                           \
        /* 2. times x's scale for the group into fp32 */                                                         \
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(xd[r * ng + g]));                              \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = vaddvq_f32(acc[r]) * ws; /* 3. the row's weight scale, once */    \
  }
TILE(4, 1) TILE(1, 1)
TILE(4, 2) TILE(1, 2)

/* y[m, n0:n1] = gelu?(y + bias[n0:n1]) for every row m (bias may be NULL): w8a8_epilogue.h's arithmetic, one value
 * at a time (the bias added to the rounded product, as torch's separate add, then the activation). */
static void epilogue(float *y, int64_t ldy, int64_t M, int64_t n0, int64_t n1, const float *bias, int gelu) {
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = n0; n < n1; n++) {
      float v = y[m * ldy + n];
      if (bias) v = v + bias[n];
      y[m * ldy + n] = gelu ? gelu_scalar(v) : v;
    }
}

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by them in one pass (32 x K bytes stay in L1) */

/* The entry point (w8a8.c's): quantize x (M, K) float (rows ldx floats apart), then y (M, N) float = gelu?(x @ w^T +
 * bias); bias (N,) may be NULL, gelu 0 or 1. G: 32 or 64. Returns 0, or -1 when the scratch could not be allocated. */
int w8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu, int64_t M,
                int64_t N, int64_t K, int64_t G, float *y, int nthreads) {
  const quantized a = quantized_alloc(M, K, G);
  if (!a.block) return -1;
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
        for (int64_t n = n0; n < n1; n++) four(w + n * K, ws[n], a.xq + m * K, a.xd + m * ng, K, y + m * N + n, N);
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n++) one(w + n * K, ws[n], a.xq + m * K, a.xd + m * ng, K, y + m * N + n, N);
    }
    if (bias || gelu) epilogue(y, N, M, n0, n1, bias, gelu);
  }
  free(a.block);
  return 0;
}
