/* Grouped W8A8 GEMM for aarch64 CPUs with the dot-product extension (Armv8.2-A +dotprod): wg8a8.c's entry point,
 * layout (wg8a8_octets.h: octets of weight rows, the scales of a group's eight rows in one vector) and activation
 * quantization (quantize.h's NEON build), loaded by kernels/cpu/wg8a8.py where build.cpu_isa() says "neon-dotprod".
 *
 * SDOT (vdotq_s32) multiplies signed by signed bytes, four products a lane into int32: an octet's 32-byte chunk is two
 * vectors (rows 0-3, rows 4-7) against four activations broadcast, so each lane ends as one output's exact group sum,
 * as on x86. The fp32 steps per lane are the x86 kernels' (cvt, the scale times x's scale, one fused multiply-add; the
 * terms likewise), so the results are the same bits. Every (m, n) result is the same sequence of operations whatever M
 * is. Built and tested under emulation (qemu-aarch64, tests/test_gguf_grouped.py); no ARM hardware has timed it.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quantize.h"

static inline int8x16_t broadcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return vreinterpretq_s8_s32(vdupq_n_s32(t));
}

/* One octet of weight rows against MT rows of x. NIB 0: the int8 layout; 1: the nibble layout (wg8a8_entry.h: chunks
 * t and t + 1 in the low and high nibbles of one), whose u (0..15, which SDOT takes as signed bytes as they are) stand
 * for u - offset: its sums start at -offset times the group's sum of x; 2: the 5-bit layout, the nibbles holding u's
 * low four bits and hi (K / 32, 32) bytes a group's fifth bits (bit c of byte i for byte i of the group's chunk c,
 * kernels/cpu/wg8a8.py), each moved to bit 4 by one byte shift and added back as 16. */
#define TILE(MT, NIB)                                                                                            \
  static void tile_##MT##_##NIB(const int8_t *w, const uint8_t *fifth, const void *ws, const float *wz,         \
                                const int8_t *xq,                                                               \
                                const int32_t *xsum, const float *xd, const float *xs, int64_t K, int64_t G,    \
                                int32_t offset, int half, float *y, int64_t ldy) {                              \
    const int64_t nb = K / 32, ng = K / G, per = 32 / G;                                                         \
    float32x4_t lo[MT], hi[MT];                                                                                  \
    for (int r = 0; r < MT; r++) lo[r] = hi[r] = vdupq_n_f32(0.f);                                               \
    for (int64_t b = 0; b < nb; b++) {                                                                           \
      for (int64_t h = 0; h < per; h++) {                                                                        \
        const int64_t g = b * per + h;                                                                           \
        int32x4_t dlo[MT], dhi[MT];                                                                              \
        for (int r = 0; r < MT; r++) dlo[r] = dhi[r] = vdupq_n_s32(NIB && offset ? -offset * xsum[r * ng + g] : 0); \
        for (int64_t t = 0; t < G / 4; t += 2) { /* 1. the group's exact integer sums, chunks t and t + 1 */     \
          int8x16_t w0[2], w1[2]; /* rows 0-3, rows 4-7 of chunks t and t + 1 */                                 \
          if (NIB) {                                                                                             \
            const uint8_t *p = (const uint8_t *)w + (g * G / 8 + t / 2) * 32;                                    \
            const uint8x16_t v0 = vld1q_u8(p), v1 = vld1q_u8(p + 16), low = vdupq_n_u8(15);                      \
            w0[0] = vreinterpretq_s8_u8(vandq_u8(v0, low)), w1[0] = vreinterpretq_s8_u8(vandq_u8(v1, low));      \
            w0[1] = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), w1[1] = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));      \
            if (NIB == 2) { /* the group's fifth bits of chunk t + c: bit t + c of each byte, to bit 4 */         \
              const uint8x16_t p0 = vld1q_u8(fifth + g * 32), p1 = vld1q_u8(fifth + g * 32 + 16);                \
              for (int c = 0; c < 2; c++) {                                                                      \
                const int8x16_t by = vdupq_n_s8((int8_t)(4 - t - c));                                            \
                const uint8x16_t sixteen = vdupq_n_u8(16);                                                       \
                w0[c] = vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(w0[c]), vandq_u8(vshlq_u8(p0, by), sixteen))); \
                w1[c] = vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(w1[c]), vandq_u8(vshlq_u8(p1, by), sixteen))); \
              }                                                                                                  \
            }                                                                                                    \
          } else {                                                                                               \
            const int8_t *p = w + (g * G / 4 + t) * 32;                                                          \
            w0[0] = vld1q_s8(p), w1[0] = vld1q_s8(p + 16), w0[1] = vld1q_s8(p + 32), w1[1] = vld1q_s8(p + 48);  \
          }                                                                                                      \
          for (int c = 0; c < 2; c++)                                                                            \
            for (int r = 0; r < MT; r++) {                                                                       \
              const int8x16_t a = broadcast4(xq + r * K + g * G + 4 * (t + c));                                  \
              dlo[r] = vdotq_s32(dlo[r], w0[c], a);                                                              \
              dhi[r] = vdotq_s32(dhi[r], w1[c], a);                                                              \
            }                                                                                                    \
        }                                                                                                        \
        float32x4_t slo, shi; /* the rows' group scales, float or fp16 (`half`) */                               \
        if (half) {                                                                                              \
          const float16_t *h = (const float16_t *)ws + g * 8;                                                    \
          slo = vcvt_f32_f16(vld1_f16(h)), shi = vcvt_f32_f16(vld1_f16(h + 4));                                  \
        } else {                                                                                                 \
          slo = vld1q_f32((const float *)ws + g * 8), shi = vld1q_f32((const float *)ws + g * 8 + 4);            \
        }                                                                                                        \
        for (int r = 0; r < MT; r++) { /* 2. times the rows' group scales and x's block scale */                \
          const float32x4_t d = vdupq_n_f32(xd[r * nb + b]);                                                     \
          lo[r] = vfmaq_f32(lo[r], vcvtq_f32_s32(dlo[r]), vmulq_f32(slo, d));                                    \
          hi[r] = vfmaq_f32(hi[r], vcvtq_f32_s32(dhi[r]), vmulq_f32(shi, d));                                    \
        }                                                                                                        \
      }                                                                                                          \
      if (wz) { /* 3. the block's terms times x's exact block sum */                                            \
        const float32x4_t zlo = vld1q_f32(wz + b * 8), zhi = vld1q_f32(wz + b * 8 + 4);                          \
        for (int r = 0; r < MT; r++) {                                                                           \
          const float32x4_t s = vdupq_n_f32(xs[r * nb + b]);                                                     \
          lo[r] = vfmaq_f32(lo[r], zlo, s);                                                                      \
          hi[r] = vfmaq_f32(hi[r], zhi, s);                                                                      \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) {                                                                               \
      vst1q_f32(y + r * ldy, lo[r]);                                                                             \
      vst1q_f32(y + r * ldy + 4, hi[r]);                                                                         \
    }                                                                                                            \
  }
TILE(4, 0) TILE(1, 0) TILE(4, 1) TILE(1, 1) TILE(4, 2) TILE(1, 2)

/* wg8a8.c's entry points: y (M, N) float = x (M, K) float (rows ldx floats apart) @ W^T, W in octets (nib: in the
 * nibble layout, values u - offset; with hi, the 5-bit layout); N a multiple of 8, K of 32, G 16 or 32 (32 for
 * nibbles). Returns 0, -1 when the scratch could not be allocated, -2 on a shape it does not take. */
static int wg_linear(const float *x, int64_t ldx, const int8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                     int64_t K, int64_t G, int32_t offset, float *y, int nthreads, int nib, int half,
                     const uint8_t *hi) {
  if (K % 32 || N % 8 || (G != 16 && G != 32) || (nib && G != 32) || (hi && !nib)) return -2;
  const int64_t row_bytes = nib ? K / 2 : K;
  const int64_t nb = K / 32, ng = K / G;
  const quantized a = quantized_alloc(M, K, 32);
  int32_t *xsum = malloc(sizeof(int32_t) * (size_t)(M * ng));
  if (!a.block || !xsum) {
    free(a.block);
    free(xsum);
    return -1;
  }
  quantize_rows(x, ldx, M, K, 32, a.xq, a.xd, a.xs, 0, nthreads);
  if (offset)
    for (int64_t i = 0; i < M * ng; i++) { /* the exact int8 sum of each row's group (the offset's share) */
      int32_t sum = 0;
      for (int64_t k = 0; k < G; k++) sum += a.xq[i * G + k];
      xsum[i] = sum;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t n1 = n0 + 16 < N ? n0 + 16 : N;
#define AT(n, m) w + (n) * row_bytes, hi ? hi + (n) * (K / 8) : 0, (const char *)ws + (n) * ng * (half ? 2 : 4),          \
                 wz ? wz + (n) * nb : 0, a.xq + (m) * K, xsum + (m) * ng, a.xd + (m) * nb, a.xs + (m) * nb, K, G, offset,  \
                 half, y + (m) * N + (n), N
    for (int64_t mb = 0; mb < M; mb += 32) {
      const int64_t me = mb + 32 < M ? mb + 32 : M;
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = n0; n < n1; n += 8) (hi ? tile_4_2 : nib ? tile_4_1 : tile_4_0)(AT(n, m));
      for (; m < me; m++)
        for (int64_t n = n0; n < n1; n += 8) (hi ? tile_1_2 : nib ? tile_1_1 : tile_1_0)(AT(n, m));
    }
#undef AT
  }
  free(a.block);
  free(xsum);
  return 0;
}

/* The rows a chunk of the layout holds (octets), as the packer asks (kernels/cpu/wg8a8.py lanes_of). */
int wg8a8_lanes(void) { return 8; }

#include "wg8a8_exports.h"
