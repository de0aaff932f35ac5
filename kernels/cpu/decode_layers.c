/* A decode step's whole decoder-layer stack in one call, for INT4 (W4A8) Llama models on x86 CPUs; built by
 * kernels/cpu/decode_layers.py.
 *
 * Why: at one sequence an INT4 decode step of SmolLM2-135M (30 layers, 1 thread) spends ~13 of its ~21 ms in the C
 * kernels and the rest in Python around them: per layer 11 ctypes calls, ~12 tensor allocations and ~20 views and
 * splits. This is backend/model/llama.py's DecoderLayer.forward as a C loop over the layers, calling the very same
 * kernels (W4A8 GEMM, RMSNorm + residual, RoPE, K/V store, paged decode attention, SwiGLU), in the same order on the
 * same inputs, so its result is bit-identical to the layer-by-layer path. What CUDA graphs do for the GPU's launches.
 *
 * The kernels live in their own libraries; the launcher hands their entry points in (`kernels`), so nothing here
 * duplicates their arithmetic. Scratch for the activations is allocated once per call.
 *
 * Per layer l (M decode tokens, hidden size E, H query and KVH key/value heads of D, intermediate I):
 *   h, stream = rms_norm(x + stream)                         x: the previous layer's MLP output (the embeddings at l=0)
 *   q | k | v = h @ Wqkv           q, k rotated by their position; k, v stored at their slots of layer l's cache
 *   attn = paged_decode(q, cache l)                         (M, H, D)
 *   h, stream = rms_norm(attn @ Wo + stream)
 *   x = silu_and_mul(h @ Wgate_up) @ Wdown
 * and the step returns (x, stream): the model's final norm reads both.
 */
#include <stdint.h>
#include <stdlib.h>

typedef int (*w4a8_fn)(const float *x, int64_t ldx, const uint8_t *wq, const float *ws, const float *wzt, int64_t M,
                       int64_t N, int64_t K, int64_t G, float *y, int nthreads);
typedef void (*rms_norm_fn)(const float *x, int64_t ldx, const float *residual, int64_t ldr, const float *weight,
                            float eps, int64_t M, int64_t D, float *out, float *residual_out);
typedef void (*rotary_fn)(const float *x, int64_t ldx, const float *table, int64_t M, int64_t H, int64_t D, float *out);
typedef void (*silu_fn)(const float *gate_up, int64_t ld, int64_t M, int64_t I, float *out);
typedef void (*decode_fn)(const float *q, const void *kc, const void *vc, const int32_t *tables, int64_t max_blocks,
                          const int32_t *lens, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t window,
                          float scale, float *scores, int64_t max_len, float *out, int kv_bf16, int nthreads);
typedef void (*store_fn)(const float *k, int64_t ldk, const float *v, int64_t ldv, void *kc, void *vc,
                         const int64_t *slot_mapping, int64_t n, int64_t width, int kv_bf16);

typedef struct {
  w4a8_fn w4a8;
  rms_norm_fn rms_norm;
  rotary_fn rotary;
  silu_fn silu_and_mul;
  decode_fn paged_decode;
  store_fn store_kv;
} kernels;

typedef struct { /* a W4A8 weight (kernels/cpu/w4a8.c's layout): y (M, n) = x (M, k) @ W^T */
  const uint8_t *q;
  const float *scales, *zeros_t;
  int64_t n, k, group;
} w4a8_weight;

typedef struct {
  const float *input_norm, *post_norm; /* RMSNorm weights, (E,) each */
  w4a8_weight qkv, o, gate_up, down;
  int64_t window; /* sliding window in tokens, 0 = full attention */
} layer;

typedef struct {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps, scale;
} dims;

typedef struct { /* this step's tokens: M decode tokens, one per sequence */
  const float *rope;                 /* (M, D) [cos | sin] of each token's position */
  const int32_t *block_tables, *lens; /* (M, max_blocks), (M,): tokens in the cache, the new one included */
  int64_t max_blocks, max_len, block_size; /* block_size: tokens per cache block */
  const int64_t *slots; /* (M,) where each token's K/V goes */
  void *cache;          /* (layers, 2, slots, KVH, D) fp32 or bf16 */
  int64_t layer_stride, half_stride; /* in elements: layer l's K half at cache + l * layer_stride, V half + half_stride */
  int kv_bf16;
} step;

typedef struct { float *h, *qkv, *q, *k, *attn, *o, *gate_up, *act, *scores; void *block; } scratch;

static scratch scratch_alloc(const dims *d, int64_t M, int64_t max_len, int nthreads) {
  const int64_t E = d->hidden, HD = d->heads * d->head_dim, KD = d->kv_heads * d->head_dim, I = d->intermediate;
  const int64_t sizes[9] = {M * E, M * (HD + 2 * KD), M * HD, M * KD, M * HD, M * E, M * 2 * I, M * I,
                            nthreads * (d->heads / d->kv_heads + 1) * max_len}; /* paged_decode's, per thread */
  int64_t total = 0;
  for (int i = 0; i < 9; i++) total += (sizes[i] + 15) & ~(int64_t)15; /* 64-byte aligned parts */
  scratch s = {0};
  s.block = aligned_alloc(64, (size_t)total * sizeof(float));
  if (!s.block) return s;
  float **parts[9] = {&s.h, &s.qkv, &s.q, &s.k, &s.attn, &s.o, &s.gate_up, &s.act, &s.scores};
  float *p = (float *)s.block;
  for (int i = 0; i < 9; i++) {
    *parts[i] = p;
    p += (sizes[i] + 15) & ~(int64_t)15;
  }
  return s;
}

static int linear(const kernels *k, const float *x, const w4a8_weight *w, int64_t M, float *y, int nthreads) {
  return k->w4a8(x, w->k, w->q, w->scales, w->zeros_t, M, w->n, w->k, w->group, y, nthreads);
}

/* Attention of one layer: q, k rotated, this step's K/V stored, then paged decode over the whole context. */
static void attend(const kernels *k, const dims *d, const layer *l, const step *st, int64_t li, int64_t M,
                   const scratch *s, int nthreads) {
  const int64_t D = d->head_dim, HD = d->heads * D, KD = d->kv_heads * D, ld = HD + 2 * KD;
  char *base = (char *)st->cache + li * st->layer_stride * (st->kv_bf16 ? 2 : 4);
  void *kc = base, *vc = base + st->half_stride * (st->kv_bf16 ? 2 : 4);
  k->rotary(s->qkv, ld, st->rope, M, d->heads, D, s->q);
  k->rotary(s->qkv + HD, ld, st->rope, M, d->kv_heads, D, s->k);
  k->store_kv(s->k, KD, s->qkv + HD + KD, ld, kc, vc, st->slots, M, KD, st->kv_bf16);
  k->paged_decode(s->q, kc, vc, st->block_tables, st->max_blocks, st->lens, M, d->heads, d->kv_heads, D, st->block_size,
                  l->window, d->scale, s->scores, st->max_len, s->attn, st->kv_bf16, nthreads);
}

/* x (M, E): in, the embeddings; out, the last layer's MLP output. stream (M, E): out, the residual stream. Returns 0,
 * or -1 when scratch memory could not be allocated. */
int decode_layers(const kernels *k, const dims *d, const layer *layers, int64_t num_layers, const step *st, int64_t M,
                  float *x, float *stream, int nthreads) {
  const int64_t E = d->hidden, I = d->intermediate;
  const scratch s = scratch_alloc(d, M, st->max_len, nthreads);
  if (!s.block) return -1;
  int err = 0;
  for (int64_t li = 0; li < num_layers && !err; li++) {
    const layer *l = &layers[li];
    /* 1. norm (the stream starts as the embeddings), q | k | v, attention, output projection */
    k->rms_norm(x, E, li ? stream : NULL, E, l->input_norm, d->eps, M, E, s.h, stream);
    err |= linear(k, s.h, &l->qkv, M, s.qkv, nthreads);
    attend(k, d, l, st, li, M, &s, nthreads);
    err |= linear(k, s.attn, &l->o, M, s.o, nthreads);
    /* 2. norm, then the MLP: SwiGLU's gate between the two projections */
    k->rms_norm(s.o, E, stream, E, l->post_norm, d->eps, M, E, s.h, stream);
    err |= linear(k, s.h, &l->gate_up, M, s.gate_up, nthreads);
    k->silu_and_mul(s.gate_up, 2 * I, M, I, s.act);
    err |= linear(k, s.act, &l->down, M, x, nthreads);
  }
  free(s.block);
  return err ? -1 : 0;
}
