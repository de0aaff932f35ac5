/* Grouped W8A8 GEMM for x86 CPUs with AVX-512 VNNI: wg8a8.c's arithmetic (wg8a8_octets.h says it) on 512-bit vectors,
 * the dot product on vpdpbusd (unsigned x signed bytes, four products a lane into int32, one instruction).
 *
 * Why its own tile: with sixteen weight rows a chunk (`hexadecets`, kernels/cpu/wg8a8.py packs them so for this
 * kernel) one 64-byte load and one broadcast of four activations give sixteen outputs' partial sums, twice the work
 * of the 256-bit octets per instruction, and the 32 vector registers hold six rows of x times two hexadecets a pass.
 * On a 2-core Zen 5, Gemma 3's 262,144 x 640 LM head at 32 rows of x took 20.6 ms here against 34-36 ms with the
 * 256-bit VNNI tile of wg8a8_octets.h (65% of the cores' measured vpdpbusd peak).
 *
 * The weight bytes are made unsigned by flipping their top bit (q + 128), and each group's sum starts at -128 times the
 * group's sum of int8 activations, so every lane ends as the same exact integer sum as wg8a8.c's, and the float
 * operations after it are the same sequence: the same bits. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define WG_LANES 16
#define WG_ROWS 32
#define W8_GROUP_SUMS 1
#include "wg8a8_entry.h"

static inline __m512i wg_broadcast4(const int8_t *p) {
  int32_t t;
  memcpy(&t, p, sizeof t);
  return _mm512_set1_epi32(t);
}

/* 64 bytes of the nibble layout: chunk t's values u in the low nibbles (u[0]), chunk t + 1's in the high ones (u[1]),
 * with `fifth` (the 5-bit layout) each chunk's 8 bytes of fifth bits added back as 16 through its 64-bit mask. */
static inline __attribute__((always_inline)) void wg_nibbles(const int8_t *src, const uint8_t *fifth, __m512i u[2]) {
  const __m512i low = _mm512_set1_epi8(15), v = _mm512_loadu_si512((const void *)src);
  u[0] = _mm512_and_si512(v, low);
  u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  if (fifth) {
    uint64_t b0, b1;
    memcpy(&b0, fifth, 8);
    memcpy(&b1, fifth + 8, 8);
    u[0] = _mm512_mask_add_epi8(u[0], _cvtu64_mask64(b0), u[0], _mm512_set1_epi8(16));
    u[1] = _mm512_mask_add_epi8(u[1], _cvtu64_mask64(b1), u[1], _mm512_set1_epi8(16));
  }
}

/* MT rows of x times H hexadecets (16 H weight rows, consecutive in the layout): each hexadecet's w (K / 4, 16, 4)
 * int8, or with NIB (K / 8, 16, 4) bytes of two 4-bit values u (wg8a8_entry.h: chunks t and t + 1 in the low and high
 * nibbles), unsigned as vpdpbusd takes them (no flip; with NIB 2 the sums start at -offset times the group's int8 sum
 * of x, for u - offset),
 * ws (K / G, 16) float or with HALF fp16, wz (K / 32, 16) or NULL. NIB 3 is the 5-bit layout (Q5_0, Q5_1, Q5_K): the
 * nibble layout with an offset holding each value's low four bits, and hi (K / 4, 64 bits) each chunk's fifth bits, bit
 * i for byte i of the unpacked chunk, added as 16 through the chunk's 64-bit mask (one masked add); 0.69 bytes a value
 * with its fp16 scale against the int8 layout's 1.06. NIB 4 reads wg_unpack's bytes u. MT, H, G, NIB and HALF are
 * constants where it is inlined (wg_rows), so the loops unroll and the sums stay in registers. With H = 2 each
 * broadcast of x feeds two dot products (from 16 rows of x on: below, the weights' bandwidth bounds it and H = 1
 * measured faster), and MT = 6 keeps 12 sums, 12 accumulators and the chunks in the 32 registers. */
static inline __attribute__((always_inline)) void wgtile(const int MT, const int H, const int64_t G, const int NIB,
                                                         const int HALF, const wg_args *a, int64_t n, int64_t m,
                                                         const int8_t *unpacked) {
  /* every pass also asks L2 for the same group of the thread's next weight rows (WG_ROWS on): while the rows of x
   * pass over these weights from L1, the next ones come from memory (22.5 -> 21 ms for Gemma 3's head at 32 rows of
   * x; 6.8 -> 4.5 ms at one row, on a Zen 4) */
  const int PACKED = NIB >= 1 && NIB <= 3; /* NIB 4: the values u as bytes (wg_unpack's), read as they are */
  const int64_t K = a->K, nb = K / 32, ng = K / G, per = 32 / G, row_bytes = PACKED ? K / 2 : K, next = WG_ROWS * row_bytes;
  const int8_t *w = NIB == 4 ? unpacked : a->w + n * row_bytes, *xq = a->xq + m * K;
  const float *wz = a->wz ? a->wz + n * nb : 0, *xd = a->xd + m * nb, *xs = a->xs + m * nb;
  const float *ws = HALF ? 0 : (const float *)a->ws + n * ng;
  const uint16_t *wsh = HALF ? (const uint16_t *)a->ws + n * ng : 0;
  const int32_t *xsum = a->xsum + m * ng;
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int32_t offset = NIB == 0 ? 128 : NIB >= 2 ? a->offset : 0; /* the flip adds 128 to every int8 weight */
  const uint8_t *hi = NIB == 3 ? a->hi + n * (K / 8) : 0; /* a row's fifth bits: K / 8 bytes */
  __m512 acc[6][2];
  for (int r = 0; r < MT; r++)
    for (int j = 0; j < H; j++) acc[r][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t h = 0; h < per; h++) {
      const int64_t g = b * per + h;
      __m512i sum[6][2];
      for (int r = 0; r < MT; r++) {
        const __m512i start = NIB == 1 ? _mm512_setzero_si512() : _mm512_set1_epi32(-offset * xsum[r * ng + g]);
        for (int j = 0; j < H; j++) sum[r][j] = start;
      }
      const int8_t *p = w + g * G * (PACKED ? 8 : 16);
      for (int j = 0; NIB != 4 && j < H; j++) { /* (wg_unpack read the unpacked ones' weights, and asks ahead itself) */
        _mm_prefetch((const char *)(p + j * row_bytes * 16 + 4096), _MM_HINT_T0);
        for (int64_t c = 0; c < G * (PACKED ? 8 : 16); c += 64) _mm_prefetch((const char *)(p + j * row_bytes * 16 + next + c), _MM_HINT_T1);
      }
      for (int64_t t = 0; t < G / 4; t += 2) { /* 1. the group's exact integer sums, chunks t and t + 1 */
        __m512i u[2][2];
        for (int j = 0; j < H; j++) {
          const int8_t *c = p + j * row_bytes * 16;
          if (NIB == 4) {
            u[0][j] = _mm512_loadu_si512((const void *)(c + 64 * t));
            u[1][j] = _mm512_loadu_si512((const void *)(c + 64 * t + 64));
          } else if (NIB) { /* with NIB 3, chunks t and t + 1's fifth bits: 8 bytes each, the group's 8 chunks 64 */
            __m512i pair[2];
            wg_nibbles(c + 32 * t, NIB == 3 ? hi + j * K * 2 + g * 64 + t * 8 : 0, pair);
            u[0][j] = pair[0], u[1][j] = pair[1];
          } else {
            u[0][j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * t)), flip);
            u[1][j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * t + 64)), flip);
          }
        }
        for (int r = 0; r < MT; r++) {
          const __m512i x0 = wg_broadcast4(xq + r * K + g * G + 4 * t), x1 = wg_broadcast4(xq + r * K + g * G + 4 * t + 4);
          for (int j = 0; j < H; j++) sum[r][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[r][j], u[0][j], x0), u[1][j], x1);
        }
      }
      for (int j = 0; j < H; j++) { /* 2. times the rows' group scales and x's block scale */
        const __m512 s = HALF ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wsh + j * ng * 16 + g * 16)))
                              : _mm512_loadu_ps(ws + j * ng * 16 + g * 16);
        for (int r = 0; r < MT; r++)
          acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][j]), _mm512_mul_ps(s, _mm512_set1_ps(xd[r * nb + b])),
                                      acc[r][j]);
      }
    }
    if (wz) /* 3. the block's terms times x's exact block sum */
      for (int j = 0; j < H; j++) {
        const __m512 z = _mm512_loadu_ps(wz + j * nb * 16 + b * 16);
        for (int r = 0; r < MT; r++) acc[r][j] = _mm512_fmadd_ps(z, _mm512_set1_ps(xs[r * nb + b]), acc[r][j]);
      }
  }
  for (int r = 0; r < MT; r++)
    for (int j = 0; j < H; j++) {
      float *y = a->y + (m + r) * a->N + n + 16 * j;
      if (a->stream) /* past the caches (wg_linear says when): no read of the line before it is written */
        _mm512_stream_ps(y, acc[r][j]);
      else
        _mm512_storeu_ps(y, acc[r][j]);
    }
}

#define WG_TILES(H, G, NIB, HALF)                                                                                 \
  for (; m + 6 <= me; m += 6) wgtile(6, H, G, NIB, HALF, a, n, m, unpacked);                                     \
  for (; m + 4 <= me; m += 4) wgtile(4, H, G, NIB, HALF, a, n, m, unpacked);                                     \
  for (; m < me; m++) wgtile(1, H, G, NIB, HALF, a, n, m, unpacked);

/* Hexadecets [n, n + 16 H) of the nibble or 5-bit layout as bytes u, in the int8 layout's order of chunks, into `out`
 * (16 H K bytes): what wgtile's NIB 4 reads. Several passes over the same weights (from 12 rows of x: a decode batch,
 * a prefill chunk) then unpack them once instead of once a pass: the same bytes u, so the same sums and bits. */
static void wg_unpack(const wg_args *a, int64_t n, int H, int8_t *out) {
  const int64_t K = a->K;
  for (int j = 0; j < H; j++) {
    const int8_t *src = a->w + (n + 16 * j) * (K / 2);
    const uint8_t *hi = a->hi ? a->hi + (n + 16 * j) * (K / 8) : 0;
    int8_t *dst = out + j * 16 * K;
    for (int64_t pair = 0; pair < K / 8; pair++) { /* 64 source bytes: chunks 2 pair and 2 pair + 1 */
      _mm_prefetch((const char *)(src + 64 * pair + WG_ROWS * K / 2), _MM_HINT_T1); /* the thread's next rows */
      __m512i u[2];
      wg_nibbles(src + 64 * pair, hi ? hi + 16 * pair : 0, u);
      _mm512_storeu_si512((void *)(dst + 128 * pair), u[0]);
      _mm512_storeu_si512((void *)(dst + 128 * pair + 64), u[1]);
    }
  }
}

/* Rows [n0, n1) of the weight with its scales' width HALF (a constant in each instantiation below). */
static inline __attribute__((always_inline)) void wg_rows_of(const int HALF, const wg_args *a, int64_t n0, int64_t n1) {
  for (int64_t mb = 0; mb < a->M; mb += 32) { /* 32 rows of x stay in L1 while the rows' weights pass */
    const int64_t me = mb + 32 < a->M ? mb + 32 : a->M;
    int8_t *unpacked = a->nib && me - mb >= 12 ? wg_unpack_buffer(32 * a->K) : 0; /* two six-row passes or more */
    for (int64_t n = n0; n < n1;) {
      const int two = a->M >= 16 && n + 32 <= n1; /* memory-bound below: one stream a core reads faster */
      int64_t m = mb;
      if (unpacked) { /* 4- or 5-bit values, unpacked once for every pass */
        wg_unpack(a, n, two ? 2 : 1, unpacked);
        if (two) {
          WG_TILES(2, 32, 4, HALF)
        } else {
          WG_TILES(1, 32, 4, HALF)
        }
      } else if (a->hi) { /* 5-bit values, groups of 32 (Q5_0: offset 16; Q5_1, Q5_K: none) */
        if (two) {
          WG_TILES(2, 32, 3, HALF)
        } else {
          WG_TILES(1, 32, 3, HALF)
        }
      } else if (a->nib && a->offset) { /* 4-bit values come in groups of 32 (Q4_0: offset 8; Q4_1, Q4_K: none) */
        if (two) {
          WG_TILES(2, 32, 2, HALF)
        } else {
          WG_TILES(1, 32, 2, HALF)
        }
      } else if (a->nib) {
        if (two) {
          WG_TILES(2, 32, 1, HALF)
        } else {
          WG_TILES(1, 32, 1, HALF)
        }
      } else if (two && a->G == 32) {
        WG_TILES(2, 32, 0, HALF)
      } else if (two) {
        WG_TILES(2, 16, 0, HALF)
      } else if (a->G == 32) {
        WG_TILES(1, 32, 0, HALF)
      } else {
        WG_TILES(1, 16, 0, HALF)
      }
      n += two ? 32 : 16;
    }
  }
}

static void wg_rows(const wg_args *a, int64_t n0, int64_t n1) {
  if (a->half)
    wg_rows_of(1, a, n0, n1);
  else
    wg_rows_of(0, a, n0, n1);
  if (a->stream) _mm_sfence(); /* the streamed stores are weakly ordered: visible before the threads join */
}
