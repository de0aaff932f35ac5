/* W4A8 GEMM for aarch64 CPUs with the dot-product extension (Armv8.2-A +dotprod: Apple M1 and later, AWS Graviton 2
 * and later): w4a8.c's kernel with SDOT (vdotq_s32); the same entry point, weight layout and activation quantization
 * (quantize.h's NEON build), loaded by kernels/cpu/w4a8.py where kernels/cpu/build.py's cpu_isa() says "neon-dotprod".
 *
 * Why SDOT: it multiplies signed bytes, four products a lane into int32, so the unsigned nibbles (0..15, which are
 * also valid signed bytes) times the int8 activations need no offset and no int16 stage: the group's integer dot
 * product is exact, as w4a8.c's. Built and tested under emulation (qemu-aarch64, tests/test_kernels_cpu_neon.py);
 * no ARM hardware has timed it.
 *
 *   y[m, n] = sum_g cvt(int dot(q[n, g], xq[m, g])) * (s[n, g] * xd[m, g])  -  sum_g (z s)[n, g] * xs[m, g]
 *
 * The int32 lanes hold other partial sums than the x86 kernels' (four lanes of four adjacent products), and the fp32
 * accumulators have four lanes, so the results agree with w4a8.c and w4a8_avx512.c to fp32 rounding, not bit for bit.
 * Every (m, n) result is computed by the same sequence of operations whatever M and the tiling are, so a row's output
 * does not depend on its batch-mates (the engine's batch invariance). Group sizes 32, 64, 128, 256, and the group-32
 * blocks layout (ws NULL, below) that GGUF Q4_0 / Q4_1 weights are served in.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "quantize.h" /* quantize_rows: x -> per-row, per-group int8 + scales + exact sums (NEON build) */

#define PREFETCH 2048 /* bytes ahead of the weight stream (w4a8.c's reason; not measured on ARM) */

/* The weight layout, in this one place. wq (N, K/2) uint8: row n, 64-value block b (32 bytes): byte j holds value
 * 64b + j in its low nibble and value 64b + 32 + j in its high nibble (w4a8.py's pack_w4a8_terms). So the 32-value
 * half h of a row (values 32h .. 32h + 31) is the low (h even) or high (h odd) nibbles of block h / 2; a group of G
 * values is halves G/32 g .. G/32 (g + 1) - 1 (G = 32: one half, the low or high nibbles of a block; GGUF's Q4_0/Q4_1
 * blocks as the Python side packs them). out: the half's 32 values in order, as two vectors of 16 signed bytes. */
static inline void w4_half(const uint8_t *row, int64_t h, int8x16_t out[2]) {
  const uint8_t *p = row + (h >> 1) * 32;
  __builtin_prefetch(p + PREFETCH);
  uint8x16_t v0 = vld1q_u8(p), v1 = vld1q_u8(p + 16);
  if (h & 1) {
    v0 = vshrq_n_u8(v0, 4);
    v1 = vshrq_n_u8(v1, 4);
  } else {
    v0 = vandq_u8(v0, vdupq_n_u8(15));
    v1 = vandq_u8(v1, vdupq_n_u8(15));
  }
  out[0] = vreinterpretq_s8_u8(v0);
  out[1] = vreinterpretq_s8_u8(v1);
}

/* One weight row against MT rows of x, group size G (compile-time: the group's G/32 unpacked halves, up to 16 of the
 * 32 NEON registers, and the MT fp32 accumulators stay in registers). */
#define TILE(MT, G)                                                                                              \
  static void tile_##MT##_##G(const uint8_t *wq, const float *ws, const int8_t *xq, const float *xd, int64_t K,  \
                              float *y, int64_t ldy) {                                                           \
    const int64_t ng = K / G;                                                                                    \
    float32x4_t acc[MT];                                                                                         \
    for (int r = 0; r < MT; r++) acc[r] = vdupq_n_f32(0.f);                                                     \
    for (int64_t g = 0; g < ng; g++) {                                                                           \
      int8x16_t w[G / 32][2];                                                                                    \
      for (int h = 0; h < G / 32; h++) w4_half(wq, g * (G / 32) + h, w[h]);                                      \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + g * G;                                                                    \
        /* 1. the group's exact integer dot product, 2. scaled by both scales into the fp32 accumulator */      \
        int32x4_t p = vdupq_n_s32(0);                                                                            \
        for (int h = 0; h < G / 32; h++) {                                                                       \
          p = vdotq_s32(p, w[h][0], vld1q_s8(a + 32 * h));                                                       \
          p = vdotq_s32(p, w[h][1], vld1q_s8(a + 32 * h + 16));                                                  \
        }                                                                                                        \
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(ws[g] * xd[r * ng + g]));                      \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = vaddvq_f32(acc[r]);                                               \
  }
#define TILES(G) TILE(4, G) TILE(1, G)
TILES(32)
TILES(64)
TILES(128)
TILES(256)

typedef void (*tile_fn)(const uint8_t *, const float *, const int8_t *, const float *, int64_t, float *, int64_t);
typedef struct { tile_fn four, single; } tiles;

static tiles tiles_for(int64_t G) {
  switch (G) {
    case 32: return (tiles){tile_4_32, tile_1_32};
    case 64: return (tiles){tile_4_64, tile_1_64};
    case 128: return (tiles){tile_4_128, tile_1_128};
    default: return (tiles){tile_4_256, tile_1_256}; /* 256 (the launcher checks) */
  }
}

/* The group-32 blocks layout (ws NULL; w4a8_blocks.h describes it: per weight row 40-byte blocks of 64 values, the
 * nibbles in slots whose 4-byte lanes alternate between the block's two groups, then fp16 d0 d1 z0 z1; the activations
 * quantized into the same slots by quantize_rows' `blocks`). Four SDOT per 64 values into one int32x4, whose even
 * lanes are group 2b's partial sums and odd lanes group 2b + 1's (the slots' lane order, in 16-byte vectors as in the
 * x86 kernels' 32-byte ones); one cvt, one fmla with [d0 xd0, d1 xd1, d0 xd0, d1 xd1] and one fmls with
 * [z0, z1, z0, z1] x [xs0, xs1, 0, 0] (the zero terms folded in, no separate pass). fp16 -> fp32 (vcvt_f32_f16) is
 * exact and part of Armv8's base NEON. As in the other layouts, the int32 lanes and fp32 accumulators are not the x86
 * kernels', so results agree with theirs to fp32 rounding; a row's result does not depend on M or the tiling. */
#define BLOCK_BYTES 40

#define BTILE(MT)                                                                                                \
  static void btile_##MT(const uint8_t *wq, const int8_t *xq, const float *xd, const float *xs, int64_t K, float *y, \
                         int64_t ldy) {                                                                          \
    const int64_t nb = K / 64, ng = K / 32;                                                                      \
    float32x4_t acc[MT];                                                                                         \
    for (int r = 0; r < MT; r++) acc[r] = vdupq_n_f32(0.f);                                                     \
    for (int64_t b = 0; b < nb; b++) {                                                                           \
      const uint8_t *p = wq + b * BLOCK_BYTES;                                                                   \
      __builtin_prefetch(p + PREFETCH);                                                                          \
      const uint8x16_t v0 = vld1q_u8(p), v1 = vld1q_u8(p + 16), mask = vdupq_n_u8(15);                          \
      const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, mask)), lo1 = vreinterpretq_s8_u8(vandq_u8(v1, mask)); \
      const int8x16_t hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));  \
      uint64_t h;                                                                                                \
      memcpy(&h, p + 32, sizeof h);                                                                              \
      const float32x4_t dz = vcvt_f32_f16(vreinterpret_f16_u64(vcreate_u64(h))); /* d0 d1 z0 z1 */              \
      const float32x4_t d = vcombine_f32(vget_low_f32(dz), vget_low_f32(dz));                                   \
      const float32x4_t z = vcombine_f32(vget_high_f32(dz), vget_high_f32(dz));                                 \
      for (int r = 0; r < MT; r++) {                                                                             \
        const int8_t *a = xq + r * K + b * 64;                                                                   \
        int32x4_t q = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo0, vld1q_s8(a)), lo1, vld1q_s8(a + 16));            \
        q = vdotq_s32(vdotq_s32(q, hi0, vld1q_s8(a + 32)), hi1, vld1q_s8(a + 48));                              \
        const float32x2_t xd2 = vld1_f32(xd + r * ng + 2 * b);                                                   \
        const float32x4_t xsv = vcombine_f32(vld1_f32(xs + r * ng + 2 * b), vdup_n_f32(0.f));                   \
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(q), vmulq_f32(d, vcombine_f32(xd2, xd2)));                     \
        acc[r] = vfmsq_f32(acc[r], z, xsv);                                                                      \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < MT; r++) y[r * ldy] = vaddvq_f32(acc[r]);                                               \
  }
BTILE(4)
BTILE(1)

/* Weight rows [n0, n1) of the blocks layout against all M rows of x. */
static void chunk_blocks(const uint8_t *wq, const int8_t *xq, const float *xd, const float *xs, int64_t M, int64_t N,
                         int64_t K, int64_t n0, int64_t n1, float *y) {
  const int64_t ng = K / 32, row = K / 64 * BLOCK_BYTES;
#define BAT(n, m) wq + (n) * row, xq + (m) * K, xd + (m) * ng, xs + (m) * ng, K, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += 32) { /* 32 rows of x stay in L1 while the chunk's weights pass */
    const int64_t me = mb + 32 < M ? mb + 32 : M;
    for (m = mb; m + 4 <= me; m += 4)
      for (int64_t n = n0; n < n1; n++) btile_4(BAT(n, m));
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n++) btile_1(BAT(n, m));
  }
#undef BAT
}

#define N_CHUNK 16 /* weight rows a thread takes at a time */
#define M_BLOCK 32 /* rows of x multiplied by those weight rows in one pass (32 x K bytes stay in L1) */

static void chunk(const uint8_t *wq, const float *ws, const float *wzt, const int8_t *xq, const float *xd,
                  const float *xs, int64_t M, int64_t N, int64_t K, int64_t G, int64_t n0, int64_t n1, float *y) {
  if (!ws) { /* the blocks layout: zero terms inline, no zero pass */
    chunk_blocks(wq, xq, xd, xs, M, N, K, n0, n1, y);
    return;
  }
  const int64_t ng = K / G;
  const tiles t = tiles_for(G);
#define AT(n, m) wq + (n) * (K / 2), ws + (n) * ng, xq + (m) * K, xd + (m) * ng, K, y + (m) * N + (n), N
  int64_t m;
  for (int64_t mb = 0; mb < M; mb += M_BLOCK) {
    const int64_t me = mb + M_BLOCK < M ? mb + M_BLOCK : M;
    for (m = mb; m + 4 <= me; m += 4)
      for (int64_t n = n0; n < n1; n++) t.four(AT(n, m));
    for (; m < me; m++)
      for (int64_t n = n0; n < n1; n++) t.single(AT(n, m));
  }
#undef AT
  /* 3. the zero points: y[m, n] -= sum_g xs[m, g] * (z s)[n, g], four columns at a time; the tail takes the same
   * fused multiply-adds one column at a time (fmaf rounds as a vector lane's vfmaq does) */
  for (m = 0; m < M; m++) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
      float32x4_t z = vdupq_n_f32(0.f);
      for (int64_t g = 0; g < ng; g++) z = vfmaq_f32(z, vdupq_n_f32(xs[m * ng + g]), vld1q_f32(wzt + g * N + n));
      vst1q_f32(y + m * N + n, vsubq_f32(vld1q_f32(y + m * N + n), z));
    }
    for (; n < n1; n++) {
      float z = 0.f;
      for (int64_t g = 0; g < ng; g++) z = __builtin_fmaf(xs[m * ng + g], wzt[g * N + n], z);
      y[m * N + n] -= z;
    }
  }
}

#include "w4a8_entry.h" /* w4a8_linear: quantize x, then chunk() over the weight rows */
