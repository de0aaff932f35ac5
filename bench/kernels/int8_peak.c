/* The int8 dot-product rate of this CPU with the AVX2 GEMM tiles' own instruction sequence (kernels/cpu/
 * wg8a8_octets.h and w8a8_octets.h: |w| times sign(x, w) on vpmaddubsw, widened by vpmaddwd, added to int32 lanes),
 * from L1: a roof for those GEMMs, measured rather than taken from a data sheet. bench/int8_peak.py loads it.
 *
 * Each pass is the tiles' inner step: two 32-byte weight chunks, four rows of x broadcast four bytes at a time, eight
 * independent int32 accumulators (256 multiply-adds). The chunks cycle through 4 KB so that nothing is loop-invariant
 * and the loads stay in L1, as the tiles' do. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static inline __m256i bcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm256_set1_epi32(t);
}

/* Multiply-adds a second (all threads together) over `passes` passes a thread on `nthreads` threads; `sink` keeps
 * the sums alive. */
double int8_peak_avx2(int64_t passes, int nthreads, int32_t *sink) {
  static int8_t buf[4096 + 64];
  for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (int8_t)(i * 37 % 255 - 127);
  const double start = omp_get_wtime();
#pragma omp parallel num_threads(nthreads)
  {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][2];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t it = 0; it < passes; it++) {
      const int8_t *p = buf + (it & 63) * 64;
      const __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < 4; r++) {
        const __m256i x0 = bcast4(p + 4 * r), x1 = bcast4(p + 16 + 4 * r);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x0, w0)), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x1, w1)), ones));
      }
    }
    __m256i s = _mm256_setzero_si256();
    for (int r = 0; r < 4; r++) s = _mm256_add_epi32(s, _mm256_add_epi32(acc[r][0], acc[r][1]));
    sink[omp_get_thread_num()] = _mm256_extract_epi32(s, 0);
  }
  const double seconds = omp_get_wtime() - start;
  return (double)passes * nthreads * 256 / seconds;
}
