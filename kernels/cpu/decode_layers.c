/* A decode step's whole decoder-layer stack in one call, for Llama-family models (Gemma 3 too) whose projections run
 * on the CPU's integer GEMMs: INT4 AWQ weights on the W4A8 kernel, or a GGUF's own blocks on the grouped W8A8 one
 * (int8, nibble or 5-bit layout); built by kernels/cpu/decode_layers.py.
 *
 * Why: at one sequence an INT4 decode step of SmolLM2-135M (30 layers, 1 thread) spends ~13 of its ~21 ms in the C
 * kernels and the rest in Python around them: per layer 11 ctypes calls, ~12 tensor allocations and ~20 views and
 * splits (Gemma 3, with its QK-norm and four norms a layer, ~17). This is backend/model/llama.py's DecoderLayer.forward
 * as a C loop over the layers, calling the very same kernels (GEMMs, RMSNorm + residual, RoPE, K/V store, paged decode
 * attention, SwiGLU or GeGLU), in the same order on the same inputs, so its result is bit-identical to the
 * layer-by-layer path. What CUDA graphs do for the GPU's launches.
 *
 * The kernels live in their own libraries; the launcher hands their entry points in (`kernels`), so nothing here
 * duplicates their arithmetic. Scratch for the activations is allocated once per call.
 *
 * Per layer l (M decode tokens, hidden size E, H query and KVH key/value heads of D, intermediate I):
 *   h, stream = rms_norm(x + stream)                         x: the previous layer's MLP output (the embeddings at l=0)
 *   q | k | v = h @ Wqkv           with QK-norm each head of q and k normalised; q, k rotated by their position (the
 *                                  layer's rope table); k, v stored at their slots of layer l's cache
 *   attn = paged_decode(q, cache l)                         (M, H, D), over the layer's sliding window if it has one
 *   h, stream = rms_norm(attn @ Wo + stream)                with sandwich norms: rms_norm(rms_norm(attn @ Wo) + stream)
 *   x = act_and_mul(h @ Wgate_up) @ Wdown                   with sandwich norms: rms_norm of it
 * and the step returns (x, stream): the model's final norm reads both.
 */
#include <stdint.h>
#include <stdlib.h>

typedef int (*w4a8_fn)(const float *x, int64_t ldx, const uint8_t *wq, const float *ws, const float *wzt, int64_t M,
                       int64_t N, int64_t K, int64_t G, float *y, int nthreads);
typedef void (*rms_norm_fn)(const float *x, int64_t ldx, const float *residual, int64_t ldr, const float *weight,
                            float eps, int64_t M, int64_t D, float *out, float *residual_out);
typedef void (*rotary_fn)(const float *x, int64_t ldx, const float *table, int64_t M, int64_t H, int64_t D, float *out);
typedef int (*wg8a8_fn)(const float *x, int64_t ldx, const int8_t *w, const void *ws, const float *wz, int64_t M,
                        int64_t N, int64_t K, int64_t G, int half, float *y, int nthreads);
typedef int (*wg4a8_fn)(const float *x, int64_t ldx, const uint8_t *w, const void *ws, const float *wz, int64_t M,
                        int64_t N, int64_t K, int64_t G, int half, int32_t offset, float *y, int nthreads);
typedef int (*wg5a8_fn)(const float *x, int64_t ldx, const uint8_t *w, const uint8_t *hi, const void *ws,
                        const float *wz, int64_t M, int64_t N, int64_t K, int64_t G, int half, int32_t offset, float *y,
                        int nthreads);
typedef void (*silu_fn)(const float *gate_up, int64_t ld, int64_t M, int64_t I, float *out);
typedef void (*decode_fn)(const float *q, const void *kc, const void *vc, const int32_t *tables, int64_t max_blocks,
                          const int32_t *lens, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t window,
                          float scale, float *scores, int64_t max_len, float *out, int kv_bf16, int nthreads);
typedef void (*store_fn)(const float *k, int64_t ldk, const float *v, int64_t ldv, void *kc, void *vc,
                         const int64_t *slot_mapping, int64_t n, int64_t width, int kv_bf16);

typedef struct { /* the entry points; a model's stack needs only those of its weights' kind */
  w4a8_fn w4a8;
  wg8a8_fn wg8a8;
  wg4a8_fn wg4a8;
  wg5a8_fn wg5a8;
  rms_norm_fn rms_norm;
  rotary_fn rotary;
  silu_fn silu_and_mul, gelu_and_mul; /* (the same signature) */
  decode_fn paged_decode;
  store_fn store_kv;
} kernels;

enum { W4A8, WG8A8, WG4A8, WG5A8 }; /* a weight's kernel and layout */

typedef struct { /* y (M, n) = x (M, k) @ W^T: kernels/cpu/w4a8.c's layout, or one of kernels/cpu/wg8a8.c's */
  int kind;
  const void *q;       /* W4A8: uint8 (two values a byte); WG8A8: int8; WG4A8, WG5A8: the nibble layout */
  const void *scales;  /* float, or (the grouped layouts) fp16 where `half` */
  const float *zeros;  /* W4A8: zeros_t; grouped: each block's terms, or NULL */
  const uint8_t *hi;   /* WG5A8: the fifth bits */
  int64_t n, k, group; /* n: the rows the kernel writes (the grouped layouts' padded rows) */
  int half;
  int32_t offset; /* WG4A8, WG5A8: values are u - offset */
} weight;

typedef struct {
  const float *input_norm, *post_norm;  /* RMSNorm weights, (E,) each */
  const float *q_norm, *k_norm;         /* QK-norm's, (D,) each, or NULL */
  const float *pre_ff_norm, *post_ff_norm; /* sandwich norms' (Gemma 3: post_norm then normalises attn @ Wo), or NULL */
  weight qkv, o, gate_up, down;
  int64_t window; /* sliding window in tokens, 0 = full attention */
  int64_t rope;   /* which of the step's rope tables the layer rotates with */
} layer;

typedef struct {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps, scale;
  int gelu; /* GeGLU's gate (Gemma), else SwiGLU's */
} dims;

typedef struct { /* the step's tokens as one pool of K/V blocks indexes them */
  const int32_t *block_tables, *lens; /* (M, max_blocks), (M,): tokens in the cache, the new one included */
  int64_t max_blocks, max_len;
  const int64_t *slots; /* (M,) where each token's K/V goes */
} view;

typedef struct { /* this step's tokens: M decode tokens, one per sequence */
  const float *rope[2]; /* (M, D) [cos | sin] of each token's position, per rope table (one, or two) */
  view views[2];        /* the full-attention layers', the windowed layers' (their own pool's, or the same) */
  int64_t block_size;   /* tokens per cache block */
  void *const *caches;  /* each layer's (2, slots, KVH, D) cache, fp32 or bf16 */
  const int64_t *half_strides; /* each layer's: elements from its K half to its V half */
  int kv_bf16;
} step;

typedef struct { float *h, *qkv, *q, *k, *attn, *o, *gate_up, *act, *scores, *normed, *spill; void *block; } scratch;

static scratch scratch_alloc(const dims *d, int64_t M, int64_t max_len, int nthreads) {
  const int64_t E = d->hidden, HD = d->heads * d->head_dim, KD = d->kv_heads * d->head_dim, I = d->intermediate;
  const int64_t sizes[11] = {M * E, M * (HD + 2 * KD), M * HD, M * KD, M * HD, M * E, M * 2 * I, M * I,
                             nthreads * (d->heads / d->kv_heads + 1) * max_len, /* paged_decode's, per thread */
                             M * (HD > E ? HD : E),  /* QK-norm's heads, a sandwich norm's output */
                             M * (HD > E ? HD : E)}; /* the sum a norm without a residual writes and nothing reads */
  int64_t total = 0;
  for (int i = 0; i < 11; i++) total += (sizes[i] + 15) & ~(int64_t)15; /* 64-byte aligned parts */
  scratch s = {0};
  s.block = aligned_alloc(64, (size_t)total * sizeof(float));
  if (!s.block) return s;
  float **parts[11] = {&s.h, &s.qkv, &s.q, &s.k, &s.attn, &s.o, &s.gate_up, &s.act, &s.scores, &s.normed, &s.spill};
  float *p = (float *)s.block;
  for (int i = 0; i < 11; i++) {
    *parts[i] = p;
    p += (sizes[i] + 15) & ~(int64_t)15;
  }
  return s;
}

static int linear(const kernels *k, const float *x, const weight *w, int64_t M, float *y, int nthreads) {
  switch (w->kind) {
  case W4A8:
    return k->w4a8(x, w->k, w->q, w->scales, w->zeros, M, w->n, w->k, w->group, y, nthreads);
  case WG8A8:
    return k->wg8a8(x, w->k, w->q, w->scales, w->zeros, M, w->n, w->k, w->group, w->half, y, nthreads);
  case WG4A8:
    return k->wg4a8(x, w->k, w->q, w->scales, w->zeros, M, w->n, w->k, w->group, w->half, w->offset, y, nthreads);
  case WG5A8:
    return k->wg5a8(x, w->k, w->q, w->hi, w->scales, w->zeros, M, w->n, w->k, w->group, w->half, w->offset, y,
                    nthreads);
  }
  return -2;
}

/* The `heads` heads of each token's row x (row stride ld) rotated into out (M, heads, D); with QK-norm (`norm`) each
 * head normalised over D first, the normalised heads (contiguous) being what the rotary reads. */
static void rotate_heads(const kernels *k, const dims *d, const float *x, int64_t ld, int64_t heads, const float *norm,
                         const float *rope, int64_t M, const scratch *s, float *out) {
  const int64_t D = d->head_dim;
  if (norm) {
    for (int64_t m = 0; m < M; m++)
      k->rms_norm(x + m * ld, D, NULL, 0, norm, d->eps, heads, D, s->normed + m * heads * D, s->spill);
    x = s->normed, ld = heads * D;
  }
  k->rotary(x, ld, rope, M, heads, D, out);
}

/* Attention of one layer: q, k (normalised per head, with QK-norm) rotated, this step's K/V stored, then paged decode
 * over the whole context (or the layer's window). */
static void attend(const kernels *k, const dims *d, const layer *l, const step *st, int64_t li, int64_t M,
                   const scratch *s, int nthreads) {
  const int64_t D = d->head_dim, HD = d->heads * D, KD = d->kv_heads * D, ld = HD + 2 * KD;
  void *kc = st->caches[li], *vc = (char *)kc + st->half_strides[li] * (st->kv_bf16 ? 2 : 4);
  const view *v = &st->views[l->window > 0];
  const float *rope = st->rope[l->rope];
  rotate_heads(k, d, s->qkv, ld, d->heads, l->q_norm, rope, M, s, s->q);
  rotate_heads(k, d, s->qkv + HD, ld, d->kv_heads, l->k_norm, rope, M, s, s->k);
  k->store_kv(s->k, KD, s->qkv + HD + KD, ld, kc, vc, v->slots, M, KD, st->kv_bf16);
  k->paged_decode(s->q, kc, vc, v->block_tables, v->max_blocks, v->lens, M, d->heads, d->kv_heads, D, st->block_size,
                  l->window, d->scale, s->scores, v->max_len, s->attn, st->kv_bf16, nthreads);
}

/* x (M, E): in, the embeddings; out, the last layer's MLP output. stream (M, E): out, the residual stream. Returns 0,
 * or -1 when scratch memory could not be allocated. */
int decode_layers(const kernels *k, const dims *d, const layer *layers, int64_t num_layers, const step *st, int64_t M,
                  float *x, float *stream, int nthreads) {
  const int64_t E = d->hidden, I = d->intermediate;
  const int64_t max_len = st->views[0].max_len > st->views[1].max_len ? st->views[0].max_len : st->views[1].max_len;
  const scratch s = scratch_alloc(d, M, max_len, nthreads);
  if (!s.block) return -1;
  int err = 0;
  for (int64_t li = 0; li < num_layers && !err; li++) {
    const layer *l = &layers[li];
    /* 1. norm (the stream starts as the embeddings), q | k | v, attention, output projection */
    k->rms_norm(x, E, li ? stream : NULL, E, l->input_norm, d->eps, M, E, s.h, stream);
    err |= linear(k, s.h, &l->qkv, M, s.qkv, nthreads);
    attend(k, d, l, st, li, M, &s, nthreads);
    err |= linear(k, s.attn, &l->o, M, s.o, nthreads);
    /* 2. norm (sandwich: the attention output normalised, then added to the stream and normalised again), then the
     * MLP: SwiGLU's or GeGLU's gate between the two projections (sandwich: its output normalised) */
    if (l->pre_ff_norm) {
      k->rms_norm(s.o, E, NULL, 0, l->post_norm, d->eps, M, E, s.normed, s.spill);
      k->rms_norm(s.normed, E, stream, E, l->pre_ff_norm, d->eps, M, E, s.h, stream);
    } else {
      k->rms_norm(s.o, E, stream, E, l->post_norm, d->eps, M, E, s.h, stream);
    }
    err |= linear(k, s.h, &l->gate_up, M, s.gate_up, nthreads);
    (d->gelu ? k->gelu_and_mul : k->silu_and_mul)(s.gate_up, 2 * I, M, I, s.act);
    if (l->post_ff_norm) {
      err |= linear(k, s.act, &l->down, M, s.o, nthreads);
      k->rms_norm(s.o, E, NULL, 0, l->post_ff_norm, d->eps, M, E, x, s.spill);
    } else {
      err |= linear(k, s.act, &l->down, M, x, nthreads);
    }
  }
  free(s.block);
  return err ? -1 : 0;
}
