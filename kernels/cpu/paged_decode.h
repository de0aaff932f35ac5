/* Paged decode attention for x86 CPUs with AVX2 + FMA (fp32 or bf16 KV cache), built by kernels/cpu/paged_decode.py
 * from paged_decode.c (AVX2) and paged_decode_avx512.c (the same source; the prefill tiles on 512-bit vectors).
 *
 * Why: the torch path copies every sequence's context blocks out of the cache (index_select) into padded
 * tensors, then runs SDPA over them with a mask: two passes over the context plus ~8 ops a layer. Here each
 * (sequence, KV head) task reads its keys and values once, straight through the block table, for the whole
 * group of query heads that share them (GQA), with an exact two-pass softmax in fp32. A bf16 cache is read as
 * such (half the bytes: a 32-stream step reads every sequence's whole context in every layer) and widened in
 * registers.
 *
 * Layout: q, out (n, H, D); cache halves kc, vc (slots, KVH, D) with slot = block * bs + offset; tables (n,
 * max_blocks) int32; lens (n,) int32 = tokens in the cache, the new one included; window > 0 keeps the last
 * `window` tokens (sliding window). scores: scratch of nthreads * (H / KVH + 1) * max_len floats, one part per thread
 * (per task, a prefill chunk's queries attended this way would need tens of MB each layer, freshly page-faulted).
 */
#pragma once
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "simd.h"

#define MAX_GROUP 16 /* query heads per KV head */
#define MAX_D 256

/* The eight sums of eight vectors, as one vector (a transpose-and-add tree). */
static inline __m256 hsum8(const __m256 v[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* Eight K/V elements as fp32: an fp32 cache, or a bf16 one (its bits are the top half of an fp32). */
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* One (sequence, KV head) task, for a cache of element type T. `slots` (scratch, len ints): every context token's
 * cache slot, looked up once through the block table. */
#define TASK(NAME, T, LOAD8)                                                                                     \
  static void NAME(const float *q, const T *kc, const T *vc, const int32_t *table, int64_t len, int64_t start,  \
                   int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t kvh, float scale, float *s,            \
                   int32_t *slots, int64_t max_len, float *out) {                                                \
    const int64_t G = H / KVH, nd = D / 8, stride = KVH * D;                                                     \
    const float *qh = q + kvh * G * D; /* this KV head's G query heads are contiguous */                        \
    for (int64_t b = start / bs, t = start; t < len; b++)                                                        \
      for (int64_t o = t % bs; o < bs && t < len; o++, t++) slots[t] = table[b] * bs + o;                         \
    /* 1. scores, eight keys at a time (their dot products reduced together); the tail one by one */            \
    int64_t t = start;                                                                                           \
    for (; t + 8 <= len; t += 8) {                                                                               \
      const T *rows[8];                                                                                          \
      for (int r = 0; r < 8; r++) rows[r] = kc + (int64_t)slots[t + r] * stride + kvh * D;                       \
      for (int64_t g = 0; g < G; g++) {                                                                          \
        __m256 acc[8];                                                                                           \
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();                                               \
        for (int64_t j = 0; j < nd; j++) {                                                                       \
          const __m256 qv = _mm256_loadu_ps(qh + g * D + 8 * j);                                                 \
          for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(qv, LOAD8(rows[r] + 8 * j), acc[r]);             \
        }                                                                                                        \
        _mm256_storeu_ps(s + g * max_len + t, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));                \
      }                                                                                                          \
    }                                                                                                            \
    for (; t < len; t++) {                                                                                       \
      const T *k = kc + (int64_t)slots[t] * stride + kvh * D;                                                    \
      for (int64_t g = 0; g < G; g++) {                                                                          \
        __m256 acc = _mm256_setzero_ps();                                                                        \
        for (int64_t j = 0; j < nd; j++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * D + 8 * j), LOAD8(k + 8 * j), acc); \
        s[g * max_len + t] = hsum(acc) * scale;                                                                  \
      }                                                                                                          \
    }                                                                                                            \
    /* 2. softmax per query head */                                                                              \
    float inv[MAX_GROUP];                                                                                        \
    for (int64_t g = 0; g < G; g++) inv[g] = softmax_row(s + g * max_len, start, len);                          \
    /* 3. out = softmax @ V, 32 columns at a time so the G x 4 accumulators stay in registers */                \
    for (int64_t j0 = 0; j0 < nd; j0 += 4) {                                                                     \
      const int64_t nj = nd - j0 < 4 ? nd - j0 : 4;                                                              \
      __m256 acc[MAX_GROUP][4];                                                                                  \
      for (int64_t g = 0; g < G; g++)                                                                            \
        for (int64_t j = 0; j < 4; j++) acc[g][j] = _mm256_setzero_ps();                                        \
      for (t = start; t < len; t++) {                                                                           \
        const T *v = vc + (int64_t)slots[t] * stride + kvh * D + 8 * j0;                                         \
        for (int64_t g = 0; g < G; g++) {                                                                        \
          const __m256 p = _mm256_set1_ps(s[g * max_len + t]);                                                   \
          for (int64_t j = 0; j < nj; j++) acc[g][j] = _mm256_fmadd_ps(p, LOAD8(v + 8 * j), acc[g][j]);         \
        }                                                                                                        \
      }                                                                                                          \
      for (int64_t g = 0; g < G; g++)                                                                            \
        for (int64_t j = 0; j < nj; j++)                                                                         \
          _mm256_storeu_ps(out + (kvh * G + g) * D + 8 * (j0 + j), _mm256_mul_ps(acc[g][j], _mm256_set1_ps(inv[g]))); \
    }                                                                                                            \
  }

/* exp(s - max) in place over s[start:len]; returns 1 / sum (eight scores at a time, the tail scalar). */
static float softmax_row(float *s, int64_t start, int64_t len) {
  float m = -INFINITY, sum = 0.f;
  for (int64_t t = start; t < len; t++) m = s[t] > m ? s[t] : m;
  __m256 vsum = _mm256_setzero_ps();
  int64_t t = start;
  for (; t + 8 <= len; t += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(m)));
    _mm256_storeu_ps(s + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  for (; t < len; t++) { s[t] = expf(s[t] - m); sum += s[t]; }
  return 1.f / (sum + hsum(vsum));
}

TASK(task_f32, float, load8_f32)
TASK(task_bf16, uint16_t, load8_bf16)

static inline int64_t thread_index(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* kv_bf16: the cache holds bf16 (kc, vc point at uint16 bits), else fp32. scores: nthreads * (G + 1) * max_len. */
void paged_decode(const float *q, const void *kc, const void *vc, const int32_t *tables, int64_t max_blocks,
                  const int32_t *lens, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t window, float scale,
                  float *scores, int64_t max_len, float *out, int kv_bf16, int nthreads) {
  const int64_t G = H / KVH;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t task = 0; task < n * KVH; task++) {
    const int64_t i = task / KVH, kvh = task % KVH, len = lens[i];
    const int64_t start = window > 0 && len > window ? len - window : 0;
    float *s = scores + thread_index() * (G + 1) * max_len;
    int32_t *slots = (int32_t *)(s + G * max_len);
    if (kv_bf16)
      task_bf16(q + i * H * D, kc, vc, tables + i * max_blocks, len, start, H, KVH, D, bs, kvh, scale, s, slots, max_len, out + i * H * D);
    else
      task_f32(q + i * H * D, kc, vc, tables + i * max_blocks, len, start, H, KVH, D, bs, kvh, scale, s, slots, max_len, out + i * H * D);
  }
}

/* ---- storing the step's K/V ----------------------------------------------------------------------- */
static inline void store_row(const float *src, void *cache, int64_t slot, int64_t width, int bf16) {
  if (!bf16) {
    float *dst = (float *)cache + slot * width;
    for (int64_t j = 0; j < width; j++) dst[j] = src[j];
    return;
  }
  uint16_t *dst = (uint16_t *)cache + slot * width;
  for (int64_t j = 0; j < width; j++) { /* fp32 -> bf16, round to nearest even (as torch's .to()) */
    uint32_t bits;
    __builtin_memcpy(&bits, src + j, 4);
    const int nan = (bits & 0x7fffffffu) > 0x7f800000u;
    dst[j] = nan ? (uint16_t)((bits >> 16) | 0x40) : (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

/* k, v: (n, KVH, D) rows ldk / ldv floats apart (heads contiguous); cache halves kc, vc (slots, KVH, D) fp32 or bf16;
 * slot_mapping (n,) int64, -1 = skip (a padding token). */
void store_kv(const float *k, int64_t ldk, const float *v, int64_t ldv, void *kc, void *vc, const int64_t *slot_mapping,
              int64_t n, int64_t width, int kv_bf16) {
  for (int64_t i = 0; i < n; i++) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    store_row(k + i * ldk, kc, slot, width, kv_bf16);
    store_row(v + i * ldv, vc, slot, width, kv_bf16);
  }
}

/* ---- prefill: a chunk's query tokens, each attended exactly as paged_decode attends it, in tiles ----------------
 *
 * Why: attending a prefill chunk one decode query per token (what batch invariance needs: a token's attention must be
 * the same arithmetic in a prefill chunk as in a decode step, docs/determinism.md) re-read and re-widened the whole
 * context for every token, ~4 loads and conversions per FMA: 43% of a 2,000-token prefill. Here the chunks' keys and
 * values are widened to fp32 once per call, in token order, and a task takes TILE_Q consecutive query tokens of one
 * sequence and one KV head: each group of eight keys serves the tile's TILE_Q x G query heads, each value row four of
 * them at a time, so the FMAs are most of what is left.
 *
 * Bit-identical to paged_decode, per query: the same fp32 FMA chain per score lane, keys in groups of eight from 0
 * reduced by hsum8 and the tail (past the query's last multiple of eight) by hsum, softmax_row's values, and for the
 * output the same per-lane FMA chain over the keys in order, times 1 / sum; with a sliding window, over the keys in
 * it. Only the keys some query of a chunk sees are widened.
 * tables (nseq, max_blocks); cu (nseq + 1) the chunks' first rows in q; lens (nseq) the tokens in the cache after the
 * chunk, so query row j of chunk i sees lens[i] - (cu[i + 1] - cu[i]) + 1 + j tokens. scratch:
 * prefill_scratch_floats(H / KVH, KVH, D, max(lens), sum(lens), nseq, nthreads) floats.
 *
 * Built with AVX-512 (paged_decode_avx512.c) the tiles run on 512-bit vectors with the same arithmetic: a score's
 * eight lanes and an output lane's chain are the 256-bit ones, two keys (or sixteen output columns) a vector, and
 * four query heads share every key and value load. */
#define TILE_Q 16

/* Each chunk's K/V rows, as widened: its length rounded up to eight (the last group of keys zero-padded). */
static inline int64_t padded(int64_t len) { return (len + 7) / 8 * 8; }

int64_t prefill_scratch_floats(int64_t G, int64_t KVH, int64_t D, int64_t max_len, int64_t total_len, int64_t nseq,
                               int64_t nthreads) { /* scores per thread, then K/V as fp32 */
  return nthreads * TILE_Q * G * max_len + 2 * KVH * D * (total_len + 7 * nseq);
}

/* hsum's sum of eight lanes, in its order, from memory: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)). */
static inline float hsum_lanes(const float v[8]) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* softmax_row's result to the bit, its max found eight scores at a time (the max of a set is the same whichever order
 * reads it; where it is +-0, s - m is the same either way) instead of one scalar comparison a score. */
static float softmax_row_wide(float *s, int64_t len) {
  __m256 vm = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + t));
  float lanes[8], m = -INFINITY;
  _mm256_storeu_ps(lanes, vm);
  for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
  for (; t < len; t++) m = s[t] > m ? s[t] : m;
  float sum = 0.f;
  __m256 vsum = _mm256_setzero_ps();
  for (t = 0; t + 8 <= len; t += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(m)));
    _mm256_storeu_ps(s + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  for (; t < len; t++) { s[t] = expf(s[t] - m); sum += s[t]; }
  return 1.f / (sum + hsum(vsum));
}

/* The value side works on key ranges [ta, tb): an output lane's FMA chain over the keys in order starts from its row's
 * partial sum in acc (zeros where ta is the rows' first key, t0) and ends there, so prefill_task walks the values in
 * blocks that stay in L2 while every row of a tile reads them; storing and reloading an fp32 partial sum changes no
 * bit, so each chain is paged_decode's step 3. vf holds the values from key `first` on, rows of D floats. */
static inline __m256 chain_start8(int64_t ta, int64_t t0, const float *acc) {
  return ta == t0 ? _mm256_setzero_ps() : _mm256_loadu_ps(acc);
}

/* acc[.][d0 .. d0 + 16) for four query heads (score rows s[i], lengths l ascending; a row whose keys start after t0
 * has zeros before them: +0 plus a product of 0 stays +0): four heads share each value load. */
static void pv_four2(const float *const s[4], int64_t ta, int64_t tb, int64_t t0, const int64_t l[4],
                     float *const acc[4], const float *vf, int64_t first, int64_t D, int64_t d0) {
  const float *s0 = s[0], *s1 = s[1], *s2 = s[2], *s3 = s[3];
  const int64_t end0 = l[0] < tb ? l[0] : tb, end3 = l[3] < tb ? l[3] : tb;
  __m256 a00 = chain_start8(ta, t0, acc[0] + d0), a01 = chain_start8(ta, t0, acc[0] + d0 + 8);
  __m256 a10 = chain_start8(ta, t0, acc[1] + d0), a11 = chain_start8(ta, t0, acc[1] + d0 + 8);
  __m256 a20 = chain_start8(ta, t0, acc[2] + d0), a21 = chain_start8(ta, t0, acc[2] + d0 + 8);
  __m256 a30 = chain_start8(ta, t0, acc[3] + d0), a31 = chain_start8(ta, t0, acc[3] + d0 + 8);
  const float *v = vf + (ta - first) * D + d0;
  int64_t t = ta;
  for (; t < end0; t++, v += D) { /* plain variables: as an array gcc kept them on the stack */
    const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
    const __m256 p0 = _mm256_broadcast_ss(s0 + t), p1 = _mm256_broadcast_ss(s1 + t);
    const __m256 p2 = _mm256_broadcast_ss(s2 + t), p3 = _mm256_broadcast_ss(s3 + t);
    a00 = _mm256_fmadd_ps(p0, v0, a00); a01 = _mm256_fmadd_ps(p0, v1, a01);
    a10 = _mm256_fmadd_ps(p1, v0, a10); a11 = _mm256_fmadd_ps(p1, v1, a11);
    a20 = _mm256_fmadd_ps(p2, v0, a20); a21 = _mm256_fmadd_ps(p2, v1, a21);
    a30 = _mm256_fmadd_ps(p3, v0, a30); a31 = _mm256_fmadd_ps(p3, v1, a31);
  }
  __m256 a[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
  for (; t < end3; t++, v += D) /* the longer rows' last keys */
    for (int i = 1; i < 4; i++)
      if (t < l[i]) {
        const __m256 p = _mm256_broadcast_ss(s[i] + t);
        a[i][0] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), a[i][0]);
        a[i][1] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), a[i][1]);
      }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(acc[i] + d0, a[i][0]);
    _mm256_storeu_ps(acc[i] + d0 + 8, a[i][1]);
  }
}

/* The same for one vector (head_dim an odd multiple of 8), one query head. */
static void pv_one(const float *s, int64_t ta, int64_t tb, int64_t t0, int64_t l, float *acc, const float *vf,
                   int64_t first, int64_t D, int64_t d0) {
  __m256 a = chain_start8(ta, t0, acc + d0);
  for (int64_t t = ta; t < (l < tb ? l : tb); t++)
    a = _mm256_fmadd_ps(_mm256_set1_ps(s[t]), _mm256_loadu_ps(vf + (t - first) * D + d0), a);
  _mm256_storeu_ps(acc + d0, a);
}

/* Each key's eight lanes summed in hsum's order, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), for eight keys
 * at once (the vector form of paged_decode's tail: hsum8's tree adds the lanes in another order). */
static inline __m256 hsum_each8(const __m256 v[8]) {
  __m256 y[4];
  for (int i = 0; i < 4; i++) {
    const __m256 u = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                                   _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31)); /* keys 2i | 2i + 1 */
    const __m256 x = _mm256_add_ps(u, _mm256_permute_ps(u, 0x4e));                       /* u0 + u2, u1 + u3 */
    y[i] = _mm256_add_ps(x, _mm256_permute_ps(x, 0xb1)); /* every lane of a half: its key's sum */
  }
  const __m256 z = _mm256_shuffle_ps(y[0], y[1], 0), w = _mm256_shuffle_ps(y[2], y[3], 0); /* r0 r0 r2 r2 r1 r1 r3 r3 */
  return _mm256_permutevar8x32_ps(_mm256_blend_ps(z, w, 0xaa), _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7));
}

/* A score row's keys t .. t + 8 (of its [start, len)), from their eight accumulators (key r's dot product in lane
 * order in acc[r]), as paged_decode sums them: hsum8 for the keys in its groups of eight from `start`, hsum for the
 * tail past them; only the row's own keys are stored. */
static inline void store_scores(const __m256 acc[8], int64_t t, int64_t start, int64_t len, float scale, float *row) {
  const int64_t full = start + (len - start) / 8 * 8; /* the end of the row's groups of eight */
  const __m256 sc = _mm256_set1_ps(scale);
  if (t >= start && t + 8 <= full) {
    _mm256_storeu_ps(row + t, _mm256_mul_ps(hsum8(acc), sc));
    return;
  }
  const __m256i key = _mm256_add_epi32(_mm256_set1_epi32((int)t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i grouped = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)full), key);
  const __m256i own = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)start), key),
                                          _mm256_cmpgt_epi32(_mm256_set1_epi32((int)len), key));
  const __m256 sums = _mm256_blendv_ps(hsum_each8(acc), hsum8(acc), _mm256_castsi256_ps(grouped));
  _mm256_maskstore_ps(row + t, own, _mm256_mul_ps(sums, sc));
}

/* The query row p of a tile (token p / G, head p % G): its vector and its keys [QSTART, QLEN): the first `window`
 * before it where the layer has one. */
#define QROW(p) (q + ((p) / G) * H * D + (kvh * G + (p) % G) * D)
#define QLEN(p) (len0 + (p) / G)
#define QSTART(p) (window > 0 && QLEN(p) > window ? QLEN(p) - window : 0)
#define OROW(p) (out + ((p) / G) * H * D + (kvh * G + (p) % G) * D) /* its output row */

#ifdef __AVX512F__
/* The keys of a chunk as the wide tile reads them: pairs of keys, eight floats of each in turn, so one 512-bit load
 * is two keys' lanes j: kf[t * D + 16 j + e] = key t's 8 j + e, kf[t * D + 16 j + 8 + e] = key t + 1's (t even). */
static inline int64_t key_at(int64_t t, int64_t j, int64_t D) { return (t & ~1) * D + 16 * j + 8 * (t & 1); }

static inline __m256 high256(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* 1. scores: eight keys (four pairs) at a time for four query rows; each pair's accumulator holds both keys' lanes.
 * kf holds the keys from token `first` (a multiple of eight) on. */
static void tile_scores(const float *q, int64_t nq, int64_t len0, const float *kf, int64_t first, int64_t window,
                        int64_t H, int64_t KVH, int64_t D, int64_t kvh, float scale, float *s, int64_t max_len) {
  const int64_t G = H / KVH, nd = D / 8, rows = nq * G, lmax = len0 + nq - 1;
  for (int64_t t = QSTART(0) / 8 * 8; t < lmax; t += 8) {
    const float *keys = kf + (t - first) * D;
    for (int64_t p0 = 0; p0 < rows; p0 += 4) {
      const int64_t last = p0 + 3 < rows ? p0 + 3 : rows - 1;
      if (t >= QLEN(last) || t + 8 <= QSTART(p0)) continue; /* none of the rows' keys (starts and ends grow with p) */
      const float *qr[4];
      for (int r = 0; r < 4; r++) qr[r] = QROW(p0 + r <= last ? p0 + r : last);
      __m512 acc[4][4];
      for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
      for (int64_t j = 0; j < nd; j++) {
        __m512 k[4];
        for (int c = 0; c < 4; c++) k[c] = _mm512_loadu_ps(keys + c * 2 * D + 16 * j);
        for (int r = 0; r < 4; r++) {
          const __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(qr[r] + 8 * j))));
          for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(qv, k[c], acc[r][c]);
        }
      }
      for (int64_t p = p0; p <= last; p++) {
        if (t >= QLEN(p) || t + 8 <= QSTART(p)) continue;
        const __m512 *a = acc[p - p0];
        const __m256 eight[8] = {_mm512_castps512_ps256(a[0]), high256(a[0]), _mm512_castps512_ps256(a[1]), high256(a[1]),
                                 _mm512_castps512_ps256(a[2]), high256(a[2]), _mm512_castps512_ps256(a[3]), high256(a[3])};
        store_scores(eight, t, QSTART(p), QLEN(p), scale, s + p * max_len);
      }
    }
  }
}

/* 3. acc[.][d0 .. d0 + 64) for four query rows over the keys [ta, tb), as pv_four2. */
static void pv_four_wide(const float *const s[4], int64_t ta, int64_t tb, int64_t t0, const int64_t l[4],
                         float *const acc[4], const float *vf, int64_t first, int64_t D, int64_t d0) {
  __m512 a[4][4];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 4; c++) a[r][c] = ta == t0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc[r] + d0 + 16 * c);
  const int64_t end0 = l[0] < tb ? l[0] : tb, end3 = l[3] < tb ? l[3] : tb;
  const float *v = vf + (ta - first) * D + d0;
  int64_t t = ta;
  for (; t < end0; t++, v += D) {
    __m512 vv[4];
    for (int c = 0; c < 4; c++) vv[c] = _mm512_loadu_ps(v + 16 * c);
    for (int r = 0; r < 4; r++) {
      const __m512 p = _mm512_set1_ps(s[r][t]);
      for (int c = 0; c < 4; c++) a[r][c] = _mm512_fmadd_ps(p, vv[c], a[r][c]);
    }
  }
  for (; t < end3; t++, v += D) /* the longer rows' last keys */
    for (int r = 1; r < 4; r++)
      if (t < l[r]) {
        const __m512 p = _mm512_set1_ps(s[r][t]);
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * c), a[r][c]);
      }
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[r] + d0 + 16 * c, a[r][c]);
}
#define PV_WIDE 64 /* output columns a pv_four_wide pass */
#else
static inline int64_t key_at(int64_t t, int64_t j, int64_t D) { return t * D + 8 * j; }

/* 1. scores, eight keys at a time for every query row of the tile; kf from token `first` on */
static void tile_scores(const float *q, int64_t nq, int64_t len0, const float *kf, int64_t first, int64_t window,
                        int64_t H, int64_t KVH, int64_t D, int64_t kvh, float scale, float *s, int64_t max_len) {
  const int64_t G = H / KVH, nd = D / 8, lmax = len0 + nq - 1;
  for (int64_t t = QSTART(0) / 8 * 8; t < lmax; t += 8) {
    const float *keys = kf + (t - first) * D;
    for (int64_t p = 0; p < nq * G; p++) {
      if (t >= QLEN(p) || t + 8 <= QSTART(p)) continue;
      const float *qh = QROW(p);
      __m256 acc[8];
      for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
      for (int64_t j = 0; j < nd; j++) {
        const __m256 qv = _mm256_loadu_ps(qh + 8 * j);
        for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + r * D + 8 * j), acc[r]);
      }
      store_scores(acc, t, QSTART(p), QLEN(p), scale, s + p * max_len);
    }
  }
}
#define PV_WIDE 0
#endif

/* One (chunk, KV head, tile) task: query rows q[0 .. nq) (H heads of D each), the first seeing len0 tokens (the last
 * `window` of them where the layer has one); kf, vf: the chunk's keys (key_at's layout, zero-padded to a multiple of
 * eight) and values (rows of D, token order) of this KV head as fp32, from token `first` on; s: scratch of
 * TILE_Q * G * max_len. */
static void prefill_task(const float *q, int64_t nq, int64_t len0, const float *kf, const float *vf, int64_t first,
                         int64_t window, int64_t H, int64_t KVH, int64_t D, int64_t kvh, float scale, float *s,
                         int64_t max_len, float *out) {
  const int64_t G = H / KVH;
  tile_scores(q, nq, len0, kf, first, window, H, KVH, D, kvh, scale, s, max_len);
  /* 2. softmax per query head */
  float inv[TILE_Q * MAX_GROUP];
  for (int64_t p = 0; p < nq * G; p++) inv[p] = softmax_row_wide(s + p * max_len + QSTART(p), QLEN(p) - QSTART(p));
  /* 3. out = softmax @ V, four query heads at a time, the values in blocks of ~256 KB of keys: every row of the tile
   * reads a block while it is in L2 (a 16k-token context's values are 16 MB a head: streamed from memory once per
   * four rows, they made this step memory-bound), the partial sums kept in the rows' outputs */
  const int64_t tmin = QSTART(0), tmax = QLEN(nq * G - 1), block = 65536 / D;
  for (int64_t p = 0; p < nq * G; p++)
    for (int64_t t = tmin; t < QSTART(p); t++) s[p * max_len + t] = 0.f; /* the keys before its window */
  float spare[4][MAX_D]; /* the sums of the rows past the last head (copies of it, never stored) */
  for (int64_t ta = tmin; ta < tmax; ta += block)
    for (int64_t p0 = 0; p0 < nq * G; p0 += 4) {
      const float *rows[4];
      int64_t l[4];
      float *acc[4];
      for (int i = 0; i < 4; i++) {
        const int64_t p = p0 + i < nq * G ? p0 + i : nq * G - 1;
        rows[i] = s + p * max_len, l[i] = QLEN(p);
        acc[i] = p0 + i < nq * G ? OROW(p) : spare[i];
      }
      const int64_t t0 = QSTART(p0), from = ta > t0 ? ta : t0, tb = ta + block < tmax ? ta + block : tmax;
      if (from >= tb || from >= l[3]) continue;
      int64_t d0 = 0;
#if PV_WIDE
      for (; d0 + PV_WIDE <= D; d0 += PV_WIDE) pv_four_wide(rows, from, tb, t0, l, acc, vf, first, D, d0);
#endif
      for (; d0 + 16 <= D; d0 += 16) pv_four2(rows, from, tb, t0, l, acc, vf, first, D, d0);
      if (d0 < D)
        for (int i = 0; i < 4; i++) pv_one(rows[i], from, tb, t0, l[i], acc[i], vf, first, D, d0);
    }
  for (int64_t p = 0; p < nq * G; p++) /* times 1 / sum, as paged_decode ends its chains */
    for (int64_t d = 0; d < D; d++) OROW(p)[d] *= inv[p];
}
#undef QROW
#undef QLEN
#undef QSTART
#undef OROW

/* The chunks' keys and values as fp32, once per call (every tile of a chunk reads them all): row `r` of a chunk's
 * tokens [first, len) into its part of the scratch, kvf: K of each KV head (key_at's layout), then V of each (rows of
 * D floats), each padded(len - first) rows, the rows past len zeros (the last group of keys a tile reads). */
#define WIDEN(NAME, T, LOAD8)                                                                                    \
  static void NAME(const T *kc, const T *vc, const int32_t *table, int64_t r, int64_t first, int64_t len,       \
                   int64_t KVH, int64_t D, int64_t bs, float *kvf) {                                             \
    const int64_t rows = padded(len - first), t = first + r;                                                     \
    const T *k = t < len ? kc + ((int64_t)table[t / bs] * bs + t % bs) * KVH * D : 0;                            \
    const T *v = t < len ? vc + ((int64_t)table[t / bs] * bs + t % bs) * KVH * D : 0;                            \
    for (int64_t h = 0; h < KVH; h++)                                                                            \
      for (int64_t j = 0; j < D / 8; j++) {                                                                      \
        _mm256_storeu_ps(kvf + h * rows * D + key_at(r, j, D), k ? LOAD8(k + h * D + 8 * j) : _mm256_setzero_ps()); \
        _mm256_storeu_ps(kvf + ((KVH + h) * rows + r) * D + 8 * j, v ? LOAD8(v + h * D + 8 * j) : _mm256_setzero_ps()); \
      }                                                                                                          \
  }
WIDEN(widen_f32, float, load8_f32)
WIDEN(widen_bf16, uint16_t, load8_bf16)

/* The first token any query of chunk i sees (its first query's window start), down to a multiple of eight. */
static inline int64_t first_key(const int32_t *cu, const int32_t *lens, int64_t i, int64_t window) {
  const int64_t len0 = lens[i] - (cu[i + 1] - cu[i]) + 1;
  return window > 0 && len0 > window ? (len0 - window) / 8 * 8 : 0;
}

/* window: 0, or the keys a query sees (a sliding-window layer: the last `window` tokens, itself included). */
void paged_prefill(const float *q, const void *kc, const void *vc, const int32_t *tables, int64_t max_blocks,
                   const int32_t *cu, const int32_t *lens, int64_t nseq, int64_t H, int64_t KVH, int64_t D, int64_t bs,
                   int64_t window, float scale, float *scratch, int64_t max_len, float *out, int kv_bf16, int nthreads) {
  int64_t ntiles = 0, total = 0;
  for (int64_t i = 0; i < nseq; i++)
    ntiles += (cu[i + 1] - cu[i] + TILE_Q - 1) / TILE_Q, total += padded(lens[i] - first_key(cu, lens, i, window));
  float *kvf = scratch + nthreads * TILE_Q * (H / KVH) * max_len;
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t row = 0; row < total; row++) {
      int64_t i = 0, base = 0;
      while (row - base >= padded(lens[i] - first_key(cu, lens, i, window))) base += padded(lens[i] - first_key(cu, lens, i, window)), i++;
      const int32_t *table = tables + i * max_blocks;
      float *chunk = kvf + 2 * KVH * D * base;
      const int64_t first = first_key(cu, lens, i, window);
      if (kv_bf16)
        widen_bf16(kc, vc, table, row - base, first, lens[i], KVH, D, bs, chunk);
      else
        widen_f32(kc, vc, table, row - base, first, lens[i], KVH, D, bs, chunk);
    }
    /* the last tiles of a chunk see the most keys: hand them out first, so the dynamic schedule ends evenly */
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = ntiles * KVH - 1; task >= 0; task--) {
      int64_t tile = task / KVH, i = 0, base = 0;
      const int64_t kvh = task % KVH;
      for (;; base += padded(lens[i] - first_key(cu, lens, i, window)), i++) {
        const int64_t n = (cu[i + 1] - cu[i] + TILE_Q - 1) / TILE_Q;
        if (tile < n) break;
        tile -= n;
      }
      const int64_t qlen = cu[i + 1] - cu[i], r0 = tile * TILE_Q, nq = qlen - r0 < TILE_Q ? qlen - r0 : TILE_Q;
      const int64_t first = first_key(cu, lens, i, window), rows = padded(lens[i] - first);
      const int64_t len0 = lens[i] - qlen + 1 + r0, row = cu[i] + r0;
      const float *chunk = kvf + 2 * KVH * D * base;
      prefill_task(q + row * H * D, nq, len0, chunk + kvh * rows * D, chunk + (KVH + kvh) * rows * D, first, window, H,
                   KVH, D, kvh, scale, scratch + thread_index() * TILE_Q * (H / KVH) * max_len, max_len,
                   out + row * H * D);
    }
  }
}
