/* A BERT encoder's whole layer stack in one call, for int8 (W8A8) weights on x86 CPUs; built by
 * kernels/cpu/encoder_layers.py.
 *
 * Why: the semantic cache embeds one short user message on each request's path, so a hit costs what the embedder's
 * forward costs. For a 10-token query the int8 forward's GEMMs take ~2 ms (2 threads, AMD EPYC) while the forward
 * as tensor ops took ~5: per layer four ctypes calls and their tensor allocations, two LayerNorm calls and seven
 * torch ops of attention (views, permutes, SDPA) for a (12 heads x 10 x 10) problem. This is backend/embed/minilm.py's
 * layer loop in C over the same GEMM and LayerNorm kernels (their entry points are handed in, `kernels`), with a
 * small attention of its own, so everything but the attention is bit-identical to the layer-by-layer path.
 *
 * Per layer (post-norm BERT; M = B x S tokens, hidden E, H heads of D, intermediate I):
 *   qkv = x @ Wqkv + b                      (M, 3E): [q | k | v], heads contiguous within each
 *   a = softmax(q k^T / sqrt(D) + mask) v   per sequence and head; padding keys (mask 0) weigh exactly 0
 *   x = LayerNorm(a @ Wo + b + x)
 *   x = LayerNorm(gelu(x @ Wup + b) @ Wdown + b + x)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

typedef int (*w8a8_fn)(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu,
                       int64_t M, int64_t N, int64_t K, int64_t G, float *y, int nthreads);
typedef void (*layer_norm_fn)(const float *x, int64_t ldx, const float *residual, int64_t ldr, const float *weight,
                              const float *bias, float eps, int64_t M, int64_t D, float *out);

typedef struct {
  w8a8_fn w8a8;
  layer_norm_fn layer_norm;
} kernels;

typedef struct { /* a W8A8 weight (kernels/cpu/w8a8.c's layout) and its bias: y (M, n) = x (M, k) @ W^T + b */
  const int8_t *q;
  const float *scales, *bias;
  int64_t n, k, group;
} w8a8_weight;

typedef struct {
  w8a8_weight qkv, out, up, down;
  const float *attn_norm_w, *attn_norm_b, *mlp_norm_w, *mlp_norm_b; /* (E,) each */
} layer;

typedef struct {
  int64_t hidden, heads, head_dim, intermediate;
  float eps;
} dims;

/* One query's attention over its sequence's S keys: scores (S rounded up to 8 floats) is scratch. */
static void attend_row(const float *q, const float *keys, const float *values, int64_t ld, const uint8_t *mask,
                       int64_t S, int64_t D, float scale, float *scores, float *out) {
  /* 1. scaled dot products, padding keys at -inf */
  float top = -INFINITY;
  for (int64_t j = 0; j < S; j++) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < D; c += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(keys + j * ld + c), acc);
    scores[j] = mask && !mask[j] ? -INFINITY : hsum(acc) * scale;
    top = scores[j] > top ? scores[j] : top;
  }
  /* 2. exp(s - max), eight at a time; padding keys and the tail past S are set to exactly 0 */
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < S; j += 8) {
    float *s = scores + j;
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s), _mm256_set1_ps(top)));
    _mm256_storeu_ps(s, e);
    for (int64_t i = 0; i < 8; i++)
      if (j + i >= S || (mask && !mask[j + i])) s[i] = 0.f;
    total = _mm256_add_ps(total, _mm256_loadu_ps(s));
  }
  /* 3. the probability-weighted sum of the values */
  const float sum = hsum(total), inv = sum > 0.f ? 1.f / sum : 0.f; /* 0: every key masked */
  for (int64_t c = 0; c < D; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; j++) acc = _mm256_fmadd_ps(_mm256_set1_ps(scores[j]), _mm256_loadu_ps(values + j * ld + c), acc);
    _mm256_storeu_ps(out + c, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
  }
}

/* Bidirectional attention of B sequences of S tokens: qkv (B * S, 3 * H * D) rows as the QKV GEMM writes them, mask
 * (B, S) 1 for real tokens (NULL: none padded), out (B * S, H * D). scores: B * H * round8(S) floats of scratch.
 * A sequence with every key masked gets zeros (not NaN). */
void encoder_attention(const float *qkv, const uint8_t *mask, int64_t B, int64_t S, int64_t H, int64_t D, float *scores,
                       float *out, int nthreads) {
  const int64_t HD = H * D, ld = 3 * HD, S8 = (S + 7) / 8 * 8;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H;
    const float *base = qkv + b * S * ld + h * D;
    const uint8_t *m = mask ? mask + b * S : NULL;
    float *s = scores + bh * S8;
    for (int64_t i = 0; i < S; i++) {
      for (int64_t j = S; j < S8; j++) s[j] = -INFINITY; /* the tail exp256 reads */
      attend_row(base + i * ld, base + HD, base + 2 * HD, ld, m, S, D, 1.f / sqrtf((float)D), s, out + (b * S + i) * HD + h * D);
    }
  }
}

static int linear(const kernels *k, const float *x, const w8a8_weight *w, int gelu, int64_t M, float *y, int nthreads) {
  return k->w8a8(x, w->k, w->q, w->scales, w->bias, gelu, M, w->n, w->k, w->group, y, nthreads);
}

/* x (B * S, E): in, the embeddings after their LayerNorm; out, the last layer's hidden states. mask (B, S) or NULL.
 * Returns 0, or -1 when scratch memory could not be allocated. */
int encoder_layers(const kernels *k, const dims *d, const layer *layers, int64_t num_layers, const uint8_t *mask,
                   int64_t B, int64_t S, float *x, int nthreads) {
  const int64_t E = d->hidden, I = d->intermediate, M = B * S, H = d->heads;
  const int64_t sizes[4] = {M * 3 * E, M * E, M * I, B * H * ((S + 7) / 8 * 8)}; /* qkv, a, up, scores */
  float *block = malloc((size_t)(sizes[0] + sizes[1] + sizes[2] + sizes[3]) * sizeof(float));
  if (!block) return -1;
  float *qkv = block, *a = qkv + sizes[0], *up = a + sizes[1], *scores = up + sizes[2];
  float *h = qkv; /* the projections' (M, E) outputs reuse qkv's space once attention has read it */
  int err = 0;
  for (int64_t li = 0; li < num_layers && !err; li++) {
    const layer *l = &layers[li];
    /* 1. attention, output projection, LayerNorm(. + x) into x (row by row: x is read before it is written) */
    err |= linear(k, x, &l->qkv, 0, M, qkv, nthreads);
    encoder_attention(qkv, mask, B, S, H, d->head_dim, scores, a, nthreads);
    err |= linear(k, a, &l->out, 0, M, h, nthreads);
    k->layer_norm(h, E, x, E, l->attn_norm_w, l->attn_norm_b, d->eps, M, E, x);
    /* 2. the MLP, GELU in the up-projection's epilogue, then LayerNorm(. + x) */
    err |= linear(k, x, &l->up, 1, M, up, nthreads);
    err |= linear(k, up, &l->down, 0, M, h, nthreads);
    k->layer_norm(h, E, x, E, l->mlp_norm_w, l->mlp_norm_b, d->eps, M, E, x);
  }
  free(block);
  return err ? -1 : 0;
}
