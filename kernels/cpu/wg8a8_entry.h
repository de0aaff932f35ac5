/* The grouped W8A8 GEMM's entry points, shared by wg8a8.c (AVX2, wg8a8_octets.h's tiles) and wg8a8_avx512.c
 * (wg8a8_neon.c has its own, with the same layouts): each defines WG_LANES (the weight rows a chunk of the layout
 * holds: 8, or 16), WG_ROWS (the weight rows a thread takes at a time), W8_GROUP_SUMS (whether its int8 tiles start a
 * group's sum from the group's sum of int8 activations) and includes this, and defines wg_rows (every row of x times
 * the weight rows [n0, n1), with the tiles it has, for the int8 layout or the nibble one).
 *
 * The nibble layout (wg4a8_linear) holds a GGUF's 4-bit values (backend/quant/gguf_grouped.py) as unsigned
 * u = q + offset, offset 0 (Q4_K, Q4_1) or 8 (Q4_0), in groups of 32: where the int8 layout's chunk t (4 values of each
 * of the chunk's rows, WG_LANES x 4 bytes) and chunk t + 1 are two chunks, one chunk of the same size, chunk t in the
 * low nibbles and t + 1 in the high ones. Each group's integer sum starts at -offset times the group's sum of int8
 * activations, so it ends as the int8 layout's sum exactly, and every float step after it is the int8 layout's: the
 * same weights give the same bits in either layout, in half its weight bytes. */
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include "quantize.h"

typedef struct { /* one call's operands, as wg_rows reads them */
  const int8_t *w;
  const void *ws; /* float, or with `half` fp16: every scale exactly an fp16 value (Q8_0, Q5_0, Q4_0: the file's d) */
  const float *wz;
  const int8_t *xq;
  const int32_t *xsum; /* each row's group sums of xq, where W8_GROUP_SUMS or an offset needs them */
  const float *xd, *xs;
  int64_t M, N, K, G;
  float *y;
  int nib;        /* w is in the nibble layout */
  int32_t offset; /* the nibble layout's values are u - offset */
  int half;       /* ws holds fp16 values */
  const uint8_t *hi; /* with nib: each value's fifth bit (the 5-bit layout), or NULL */
  int stream;        /* y is large (an LM head's logits) and 64-byte aligned: tiles may store it past the caches */
} wg_args;

static void wg_rows(const wg_args *a, int64_t n0, int64_t n1);

/* A thread's buffer for the 5-bit and nibble weights unpacked to bytes (each kernel's wg_unpack), kept from call to
 * call (OpenMP's threads are reused); NULL if it cannot grow. */
static int8_t *wg_unpack_buffer(int64_t bytes) {
  static __thread int8_t *buf;
  static __thread int64_t cap;
  if (bytes > cap) {
    free(buf);
    cap = (bytes + 63) / 64 * 64;
    buf = aligned_alloc(64, (size_t)cap);
    if (!buf) cap = 0;
  }
  return buf;
}

/* The rows a chunk of the weight layout holds: the packer (kernels/cpu/wg8a8.py) asks, and lays the rows out so. */
int wg8a8_lanes(void) { return WG_LANES; }

/* y (M, N) float = x (M, K) float (rows ldx floats apart) @ W^T, W in chunks of WG_LANES rows; N a multiple of
 * WG_LANES, K of 32, G 16 or 32 (32 for nibbles). Returns 0, -1 when the scratch could not be allocated, -2 on a shape
 * it does not take. */
static int wg_linear(const float *x, int64_t ldx, const int8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                     int64_t K, int64_t G, int32_t offset, float *y, int nthreads, int nib, int half, const uint8_t *hi) {
  if (K % 32 || N % WG_LANES || (G != 16 && G != 32) || (nib && G != 32) || (hi && !nib)) return -2;
  const int64_t ng = K / G;
  const quantized a = quantized_alloc(M, K, 32);
  int32_t *xsum = malloc(sizeof(int32_t) * (size_t)(M * ng));
  if (!a.block || !xsum) {
    free(a.block);
    free(xsum);
    return -1;
  }
  quantize_rows(x, ldx, M, K, 32, a.xq, a.xd, a.xs, 0, nthreads);
  if (W8_GROUP_SUMS || offset || hi)
    for (int64_t i = 0; i < M * ng; i++) { /* the exact int8 sum of each row's group (the tiles' starting values) */
      int32_t s = 0;
      for (int64_t k = 0; k < G; k++) s += a.xq[i * G + k];
      xsum[i] = s;
    }
  /* 8 MB and more of y: written through the caches, every line would be read from memory first (a write allocate)
   * and evicted later, a third more memory traffic for Gemma 3's 262,144-row head at 32 rows of x */
  const int stream = (double)M * (double)N * sizeof(float) >= 8e6 && (uintptr_t)y % 64 == 0;
  const wg_args args = {w, ws, wz, a.xq, xsum, a.xd, a.xs, M, N, K, G, y, nib, offset, half, hi, stream};
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += WG_ROWS) wg_rows(&args, n0, n0 + WG_ROWS < N ? n0 + WG_ROWS : N);
  free(a.block);
  free(xsum);
  return 0;
}

#include "wg8a8_exports.h"
