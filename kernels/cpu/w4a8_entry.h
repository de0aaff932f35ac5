/* The W4A8 GEMMs' entry point, shared by w4a8.c (AVX2) and w4a8_avx512.c: each defines `chunk` (its tiles over
 * weight rows [n0, n1)) and includes this after it. */
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include "quantize.h"

/* The entry point: quantize x (M, K) float (rows ldx floats apart), then y (M, N) float. ws and wzt NULL: wq is in
 * w4a8_blocks.h's layout (G 32, scales inline; N a multiple of 8). Returns 0, or -1 when the scratch could not be allocated. */
int w4a8_linear(const float *x, int64_t ldx, const uint8_t *wq, const float *ws, const float *wzt, int64_t M, int64_t N,
                int64_t K, int64_t G, float *y, int nthreads) {
  const quantized a = quantized_alloc(M, K, G);
  if (!a.block) return -1;
#if defined(__aarch64__)
  const int slots = ws == NULL; /* w4a8_neon.c's 64-value blocks read the activations in their slots */
#else
  const int slots = 0; /* x86's blocks layout (octets, w4a8_blocks.h) reads them in plain order */
#endif
  quantize_rows(x, ldx, M, K, G, a.xq, a.xd, a.xs, slots, nthreads);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += N_CHUNK)
    chunk(wq, ws, wzt, a.xq, a.xd, a.xs, M, N, K, G, n0, n0 + N_CHUNK < N ? n0 + N_CHUNK : N, y);
  free(a.block);
  return 0;
}
