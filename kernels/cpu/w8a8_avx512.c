/* W8A8 GEMM for x86 CPUs with AVX-512 (F/BW/VL) and VNNI: w8a8.c's kernel on 512-bit vectors and vpdpbusd; the same
 * entry point, layout, activation quantization (quantize.h) and epilogue (w8a8_epilogue.h), loaded by
 * kernels/cpu/w8a8.py where the CPU has them (kernels/cpu/build.py's cpu_isa).
 *
 * Why: the INT4 models' lm_head (49152 x 576 int8 for SmolLM2, ~28 MB) is a third of the bytes a one-stream decode step
 * reads, so it must run at memory speed. vpdpbusd multiplies unsigned by signed bytes (four products a lane into
 * int32); AVX-512 has no vpsignb to move w's sign onto x as w8a8.c does, so the weight is made unsigned instead:
 * u = w + 128 (an xor with 0x80, w in -127..127), and dot(w, x) = dot(u, x) - 128 sum(x), the second term computed
 * once per activation row (the accumulator starts at it), so each weight vector costs one xor and one vpdpbusd a row.
 *
 * Layout (w8a8.c's): w (N, K) int8, ws (N,) float: w_real[n, k] = w[n, k] * ws[n]. A 64-value chunk is one group of
 * G = 64, or two of G = 32 (lanes 0..7 the first, 8..15 the second). The integer sums are exact (as w8a8.c's); the
 * fp32 sums group them by 16 lanes (w8a8.c by 8), so the two kernels agree to fp32 rounding, not bit for bit. Every
 * (m, n) result is computed by the same sequence of operations whatever M and the tiling are, so a row's output does
 * not depend on its batch-mates.
 */
#include <immintrin.h>
#include <stdint.h>

#include "quantize.h"

#include "w8a8_epilogue.h"

/* Per activation row and chunk, what every weight row shares: the accumulator's start (-128 x the sum of the lane's
 * four x values) and the lane's group scale. */
typedef struct { __m512i start; __m512 scale; } chunk_x;

/* NT weight rows x MT activation rows (compile-time: NT weight vectors and NT x MT accumulators in registers). kc
 * chunks; x rows K bytes apart (the tail chunk of K % 64 == 32 read through a mask), cx rows kc entries apart. */
#define TILE(NT, MT)                                                                                             \
  static void tile_##NT##x##MT(const int8_t *w, const float *ws, const int8_t *xq, const chunk_x *cx, int64_t K,  \
                               int64_t kc, float *y, int64_t ldy) {                                              \
    const __m512i flip = _mm512_set1_epi8((char)0x80);                                                           \
    __m512 acc[NT][MT];                                                                                          \
    for (int i = 0; i < NT; i++)                                                                                 \
      for (int r = 0; r < MT; r++) acc[i][r] = _mm512_setzero_ps();                                             \
    for (int64_t c = 0; c < kc; c++) {                                                                           \
      const int tail = (c + 1) * 64 > K; /* K % 64 == 32: the last chunk's second half reads as zero */        \
      __m512i u[NT];                                                                                             \
      for (int i = 0; i < NT; i++) {                                                                             \
        const int8_t *p = w + i * K + c * 64;                                                                    \
        const __m512i v = tail ? _mm512_maskz_loadu_epi8((__mmask64)0xffffffffu, p) : _mm512_loadu_si512(p);     \
        u[i] = _mm512_xor_si512(v, flip); /* w + 128, unsigned */                                                \
      }                                                                                                          \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + c * 64;                                                                   \
        const __m512i xv = tail ? _mm512_maskz_loadu_epi8((__mmask64)0xffffffffu, a) : _mm512_loadu_si512(a);    \
        const chunk_x *p = cx + r * kc + c;                                                                      \
        for (int i = 0; i < NT; i++) /* 1. the exact integer dot product, 2. times x's group scale */           \
          acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(p->start, u[i], xv)), p->scale, acc[i][r]); \
      }                                                                                                          \
    }                                                                                                            \
    for (int i = 0; i < NT; i++) /* 3. the row's weight scale, once */                                          \
      for (int r = 0; r < MT; r++) y[r * ldy + i] = _mm512_reduce_add_ps(acc[i][r]) * ws[i];                   \
  }
/* One weight row at a time (w4a8_avx512.c's TILES says why): the lm_head at one row of x took 1.4 ms with 1 row, 3.2-3.5 ms
 * with 2, 4 or 8 rows interleaved (49152 x 576, one thread, AMD Zen 4). */
TILE(1, 4) TILE(1, 1)

/* cx (M, kc) for xq (M, K) and its group scales xd (M, K / G). */
static void prepare_rows(const int8_t *xq, const float *xd, int64_t M, int64_t K, int64_t G, chunk_x *cx) {
  const int64_t kc = (K + 63) / 64, ng = K / G;
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  for (int64_t m = 0; m < M; m++)
    for (int64_t c = 0; c < kc; c++) {
      const __mmask64 km = (c + 1) * 64 <= K ? ~(__mmask64)0 : (__mmask64)0xffffffffu;
      const __m512i xv = _mm512_maskz_loadu_epi8(km, xq + m * K + c * 64);
      chunk_x *o = cx + m * kc + c;
      o->start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xv));
      if (G == 64) {
        o->scale = _mm512_set1_ps(xd[m * ng + c]);
      } else { /* G 32: lanes 0..7 group 2c, 8..15 group 2c + 1 (0 past the end) */
        const float b = 2 * c + 1 < ng ? xd[m * ng + 2 * c + 1] : 0.f;
        o->scale = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(xd[m * ng + 2 * c]), _mm512_set1_ps(b));
      }
    }
}

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by them in one pass (32 x K bytes stay in L1) */

/* The entry point (w8a8.c's): quantize x (M, K) float (rows ldx floats apart), then y (M, N) float = gelu?(x @ w^T +
 * bias); bias (N,) may be NULL, gelu 0 or 1. G: 32 or 64. Returns 0, or -1 when the scratch could not be allocated. */
int w8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu, int64_t M,
                int64_t N, int64_t K, int64_t G, float *y, int nthreads) {
  const int64_t kc = (K + 63) / 64;
  const quantized a = quantized_alloc(M, K, G);
  chunk_x *cx = aligned_alloc(64, (size_t)(M * kc) * sizeof(chunk_x));
  if (!a.block || !cx) {
    free(a.block);
    free(cx);
    return -1;
  }
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, nthreads);
  prepare_rows(a.xq, a.xd, M, K, G, cx);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) {
    const int64_t n1 = n0 + N_CHUNK < N ? n0 + N_CHUNK : N;
#define AT(n, m) w + (n) * K, ws + (n), a.xq + (m) * K, cx + (m) * kc, K, kc, y + (m) * N + (n), N
    for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
      const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = n0; n < n1; n++) tile_1x4(AT(n, m));
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n++) tile_1x1(AT(n, m));
    }
#undef AT
    if (bias || gelu) epilogue(y, N, M, n0, n1, bias, gelu);
  }
  free(a.block);
  free(cx);
  return 0;
}
