/* The decoder layer's small fused ops for x86 CPUs (AVX2 + FMA, fp32), built by kernels/cpu/elementwise.py, and the
 * BERT encoder's LayerNorm (backend/embed/minilm.py).
 *
 * Why: at one sequence a decode step is ~1,900 torch ops, mostly tiny, and their dispatch costs more than their
 * arithmetic. RMSNorm with its residual add is ~7 ops in torch, rotate-half RoPE on q and k ~14 (roll = slices +
 * cat), SwiGLU's silu(g) * u 3; here each is one call. The same holds for the embedder's one short query: its 13
 * LayerNorms, each after a residual add, were ~1/8 of an int8 forward in a torch profile. The arithmetic is the
 * reference's, operation for operation (products rounded, then summed; built with -ffp-contract=off so no
 * multiply-add is fused), except the norms' sums, whose order differs (and LayerNorm's two-pass moments against
 * torch's Welford), and the exp of silu and of GeGLU (a polynomial of ~1 ulp, like torch's own vectorised exp and
 * tanh, not the same).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd.h"

/* residual_out = x + residual (or x when residual is NULL); out = weight * (residual_out * rsqrt(mean(r^2) + eps)).
 * x, residual, out, residual_out: (M, D) rows with their own row strides (in floats); D % 8 == 0. */
void rms_norm_residual(const float *x, int64_t ldx, const float *residual, int64_t ldr, const float *weight, float eps,
                       int64_t M, int64_t D, float *out, float *residual_out) {
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * ldx;
    float *rm = residual_out + m * D;
    __m256 ss = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) { /* 1. the residual stream and its sum of squares */
      __m256 r = _mm256_loadu_ps(xm + j);
      if (residual) r = _mm256_add_ps(r, _mm256_loadu_ps(residual + m * ldr + j));
      _mm256_storeu_ps(rm + j, r);
      ss = _mm256_add_ps(ss, _mm256_mul_ps(r, r));
    }
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(ss), _mm256_extractf128_ps(ss, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    const float inv = 1.f / sqrtf(_mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a))) / (float)D + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int64_t j = 0; j < D; j += 8) /* 2. weight * (r * inv), the reference's order */
      _mm256_storeu_ps(out + m * D + j, _mm256_mul_ps(_mm256_loadu_ps(weight + j), _mm256_mul_ps(_mm256_loadu_ps(rm + j), vinv)));
  }
}

/* out = (r - mean(r)) / sqrt(var(r) + eps) * weight + bias with r = x + residual (or x when residual is NULL), per row;
 * var the biased one (torch's LayerNorm). x, residual: (M, D) rows with their own row strides (in floats); out (M, D)
 * contiguous; D % 8 == 0. Mean and variance take two passes over the row in L1 (no E[x^2] - E[x]^2 cancellation). */
void layer_norm_residual(const float *x, int64_t ldx, const float *residual, int64_t ldr, const float *weight,
                         const float *bias, float eps, int64_t M, int64_t D, float *out) {
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * ldx;
    float *om = out + m * D;
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) { /* 1. r = x + residual (into out) and its sum */
      __m256 r = _mm256_loadu_ps(xm + j);
      if (residual) r = _mm256_add_ps(r, _mm256_loadu_ps(residual + m * ldr + j));
      _mm256_storeu_ps(om + j, r);
      sum = _mm256_add_ps(sum, r);
    }
    const float mean = hsum(sum) / (float)D;
    const __m256 vmean = _mm256_set1_ps(mean);
    __m256 ss = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) { /* 2. the sum of squared deviations */
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(om + j), vmean);
      ss = _mm256_add_ps(ss, _mm256_mul_ps(d, d));
    }
    const float rstd = 1.f / sqrtf(hsum(ss) / (float)D + eps);
    /* 3. (r * rstd + (-mean * rstd)) * weight + bias: torch's order of operations */
    const __m256 vscale = _mm256_set1_ps(rstd), vshift = _mm256_set1_ps(-mean * rstd);
    for (int64_t j = 0; j < D; j += 8) {
      const __m256 n = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(om + j), vscale), vshift);
      _mm256_storeu_ps(om + j, _mm256_add_ps(_mm256_mul_ps(n, _mm256_loadu_ps(weight + j)), _mm256_loadu_ps(bias + j)));
    }
  }
}

/* Rotate-half RoPE of one (M, H, D) tensor with row stride ldx (floats; heads contiguous within a row) into out
 * (M, H, D) contiguous: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), halves of D. table (M, D): [cos | sin]
 * of each row's position. D % 16 == 0. */
void rotary_neox(const float *x, int64_t ldx, const float *table, int64_t M, int64_t H, int64_t D, float *out) {
  const int64_t half = D / 2;
  for (int64_t m = 0; m < M; m++) {
    const float *cs = table + m * D;
    for (int64_t h = 0; h < H; h++) {
      const float *v = x + m * ldx + h * D;
      float *o = out + (m * H + h) * D;
      for (int64_t j = 0; j < half; j += 8) {
        const __m256 x1 = _mm256_loadu_ps(v + j), x2 = _mm256_loadu_ps(v + half + j);
        const __m256 c = _mm256_loadu_ps(cs + j), s = _mm256_loadu_ps(cs + half + j);
        _mm256_storeu_ps(o + j, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
        _mm256_storeu_ps(o + half + j, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
      }
    }
  }
}

/* SwiGLU's gate: out (M, I) = silu(g) * u = g / (1 + exp(-g)) * u, gate_up (M, 2I) = [g | u] with row stride ld.
 * I % 8 == 0. */
void silu_and_mul(const float *gate_up, int64_t ld, int64_t M, int64_t I, float *out) {
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  for (int64_t m = 0; m < M; m++) {
    const float *g = gate_up + m * ld, *u = g + I;
    for (int64_t j = 0; j < I; j += 8) {
      const __m256 gv = _mm256_loadu_ps(g + j);
      const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
      _mm256_storeu_ps(out + m * I + j, _mm256_mul_ps(silu, _mm256_loadu_ps(u + j)));
    }
  }
}

/* GeGLU's gate (Gemma): out (M, I) = gelu_tanh(g) * u, gate_up (M, 2I) = [g | u] with row stride ld; I % 8 == 0.
 * gelu_tanh(g) = 0.5 g (1 + tanh(z)), z = b (g + 0.044715 g^3), b = sqrt(2 / pi) (torch's F.gelu(approximate="tanh"),
 * HF's gelu_pytorch_tanh), computed as g / (1 + exp(-2z)): the same function, without the cancellation of 1 + tanh(z)
 * where tanh is near -1 (torch's values there are multiples of float's spacing at 1; these are within ~1 ulp of the
 * exact ones, so they differ from torch's by up to ~1e-7 times |g u|). In torch it is five ops (chunk, gelu, mul and
 * their copies) and, at 32 rows of Gemma 3, most of a decoder layer's CPU time outside the C kernels. */
void gelu_tanh_and_mul(const float *gate_up, int64_t ld, int64_t M, int64_t I, float *out) {
  const __m256 one = _mm256_set1_ps(1.f), minus_two = _mm256_set1_ps(-2.f), zero = _mm256_setzero_ps();
  const __m256 past = _mm256_set1_ps(88.f); /* exp256 clamps its argument at 88.3: past it, gelu is 0 to the float */
  const __m256 beta = _mm256_set1_ps((float)(M_SQRT2 * M_2_SQRTPI * 0.5)), kappa = _mm256_set1_ps(0.044715f);
  for (int64_t m = 0; m < M; m++) {
    const float *g = gate_up + m * ld, *u = g + I;
    for (int64_t j = 0; j < I; j += 8) {
      const __m256 x = _mm256_loadu_ps(g + j);
      const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      const __m256 z = _mm256_mul_ps(beta, _mm256_add_ps(x, _mm256_mul_ps(kappa, cube)));
      const __m256 a = _mm256_mul_ps(minus_two, z);
      __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(one, exp256(a)));
      gelu = _mm256_blendv_ps(gelu, _mm256_mul_ps(zero, x), _mm256_cmp_ps(a, past, _CMP_GT_OQ)); /* -0, NaN at -inf */
      _mm256_storeu_ps(out + m * I + j, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + j)));
    }
  }
}
