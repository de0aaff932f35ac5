/* Paged decode attention for x86 CPUs with AVX2 + FMA (fp32 or bf16 KV cache), built by kernels/cpu/paged_decode.py.
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
