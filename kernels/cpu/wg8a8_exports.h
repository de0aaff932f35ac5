/* The grouped GEMM's two exported entry points over a file's own `wg_linear` (wg8a8_entry.h for x86, wg8a8_neon.c),
 * which each defines with this signature before including this:
 *   static int wg_linear(x, ldx, w, ws, wz, M, N, K, G, offset, y, nthreads, nib, half, hi)
 * ws: float scales, or with `half` (non-zero) fp16 ones, each the same value (a GGUF type's own fp16 d). */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* y (M, N) = x (M, K) @ W^T, W in the int8 layout. */
int wg8a8_linear(const float *x, int64_t ldx, const int8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                 int64_t K, int64_t G, int half, float *y, int nthreads) {
  return wg_linear(x, ldx, w, ws, wz, M, N, K, G, 0, y, nthreads, 0, half, NULL);
}

/* The same with w in the nibble layout (K / 2 bytes a row), values u - offset. */
int wg4a8_linear(const float *x, int64_t ldx, const uint8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                 int64_t K, int64_t G, int half, int32_t offset, float *y, int nthreads) {
  return wg_linear(x, ldx, (const int8_t *)w, ws, wz, M, N, K, G, offset, y, nthreads, 1, half, NULL);
}

/* The same with w in the 5-bit layout: the nibble layout holding each value's low four bits, hi their fifth bits (K / 8
 * bytes a row, a bit a value, in the order kernels/cpu/wg8a8.py's PackedGrouped.fifth says), values u - offset. */
int wg5a8_linear(const float *x, int64_t ldx, const uint8_t *w, const uint8_t *hi, const void *ws, const float *wz,
                 int64_t M, int64_t N, int64_t K, int64_t G, int half, int32_t offset, float *y, int nthreads) {
  if (!hi) return -2;
  return wg_linear(x, ldx, (const int8_t *)w, ws, wz, M, N, K, G, offset, y, nthreads, 1, half, hi);
}
