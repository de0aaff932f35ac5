/* fp32 GEMM for a few rows of x (1..16) on x86 CPUs with AVX2 + FMA: y = x @ W^T (+ b); built by kernels/cpu/small_gemm.py.
 *
 * Why: a full-precision decode step multiplies 1 to 16 rows (one sequence, a few streams, or a speculative verify
 * of 1 + k tokens per sequence) by every weight of the model once; it is bound by reading the weights. oneDNN's packed GEMM
 * costs 1.4x more at 5 rows than at 1 on the same weights (one thread, AMD EPYC: gate_up 1.18 -> 1.63 ms, lm_head
 * 16.6 -> 22.1 ms), so a verify of 1 + 4 tokens cost ~1.4 plain steps. Here each weight row is read once and
 * multiplied into all M rows of x while it is in registers (x stays in L1), so M = 5 costs about what M = 1 does.
 *
 * Every y[m, n] is computed by the same operations whatever M is (one 8-lane fp32 accumulator over k, summed in a
 * fixed order, then the bias), so a row's result does not depend on its batch-mates: a verify's logits equal the
 * plain step's to the bit.
 *
 * Layout: x (M, K) rows ldx floats apart; W (N, K) contiguous; bias (N,) or NULL; y (M, N) contiguous. K % 8 == 0.
 */
#include <immintrin.h>
#include <stdint.h>

#include "simd.h" /* hsum */

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define PREFETCH 2048 /* floats ahead (8 KB: ~3 rows of a 576-wide weight): more loads in flight than the core finds */

/* One weight row against MT rows of x (compile-time: MT accumulators in registers). */
#define ROW(MT)                                                                                                  \
  static void row_##MT(const float *x, int64_t ldx, const float *w, int64_t K, float *y, int64_t ldy) {        \
    __m256 acc[MT];                                                                                              \
    for (int r = 0; r < MT; r++) acc[r] = _mm256_setzero_ps();                                                  \
    for (int64_t k = 0; k < K; k += 8) {                                                                         \
      _mm_prefetch((const char *)(w + PREFETCH + k), _MM_HINT_T0); /* the weights a few rows on, from memory */     \
      const __m256 wv = _mm256_loadu_ps(w + k); /* 1. eight weights, loaded once for every row of x */           \
      for (int r = 0; r < MT; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + k), acc[r]);        \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = hsum(acc[r]); /* 2. the eight lanes, in hsum's fixed order */      \
  }
ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8)

typedef void (*row_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t);
static const row_fn ROWS[9] = {0, row_1, row_2, row_3, row_4, row_5, row_6, row_7, row_8};

/* Returns 0, or -1 when M is out of 1..16. Rows 9..16 run as a second pass over the weight row, still in L1. */
int small_gemm(const float *x, int64_t ldx, const float *w, const float *bias, int64_t M, int64_t N, int64_t K, float *y,
               int nthreads) {
  if (M < 1 || M > 16) return -1;
  const int64_t m1 = M < 8 ? M : 8;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK) {
    const int64_t n1 = n0 + N_CHUNK < N ? n0 + N_CHUNK : N;
    for (int64_t n = n0; n < n1; n++) {
      ROWS[m1](x, ldx, w + n * K, K, y + n, N);
      if (M > 8) ROWS[M - 8](x + 8 * ldx, ldx, w + n * K, K, y + 8 * N + n, N);
      if (bias)
        for (int64_t m = 0; m < M; m++) y[m * N + n] += bias[n]; /* 3. the bias, after the sum (as F.linear's order) */
    }
  }
  return 0;
}
