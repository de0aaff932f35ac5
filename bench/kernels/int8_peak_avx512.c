/* The int8 dot-product rate of this CPU with the AVX-512 VNNI GEMM tile's instruction (kernels/cpu/wg8a8_avx512.c:
 * vpdpbusd on 512-bit vectors, unsigned weight bytes times a broadcast of four int8 activations), from L1: that
 * tile's roof. Each pass is its inner step at six rows of x and two hexadecets: two 64-byte weight chunks, twelve
 * independent accumulators (768 multiply-adds). Built and loaded only on CPUs with AVX-512 VNNI (bench/int8_peak.py). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static inline __m512i bcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm512_set1_epi32(t);
}

double int8_peak_vnni512(int64_t passes, int nthreads, int32_t *sink) {
  static int8_t buf[8192 + 128];
  for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (int8_t)(i * 37 % 255 - 127);
  const double start = omp_get_wtime();
#pragma omp parallel num_threads(nthreads)
  {
    __m512i acc[6][2];
    for (int r = 0; r < 6; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int64_t it = 0; it < passes; it++) {
      const int8_t *p = buf + (it & 63) * 128;
      const __m512i w0 = _mm512_loadu_si512((const void *)p), w1 = _mm512_loadu_si512((const void *)(p + 64));
      for (int r = 0; r < 6; r++) {
        const __m512i x = bcast4(p + 4 * r);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, x);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, x);
      }
    }
    __m512i s = _mm512_setzero_si512();
    for (int r = 0; r < 6; r++) s = _mm512_add_epi32(s, _mm512_add_epi32(acc[r][0], acc[r][1]));
    sink[omp_get_thread_num()] = _mm512_reduce_add_epi32(s);
  }
  const double seconds = omp_get_wtime() - start;
  return (double)passes * nthreads * 768 / seconds;
}
