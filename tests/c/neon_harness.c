/* The NEON kernels' test harness (tests/test_kernels_cpu_neon.py cross-compiles it with kernels/cpu/w4a8_neon.c and
 * w8a8_neon.c for aarch64 and runs it under qemu-aarch64 -cpu max).
 *
 *   neon_harness OUTDIR
 *
 * For fixed-seed random weights and activations (every supported group size, and W4A8's group-32 blocks layout;
 * M = 1, 3, 4, 17 rows of x, rows LDX floats apart) it runs each NEON GEMM and checks, itself:
 *   - against a plain scalar reference of the same arithmetic (the activations quantized as quantize.h does, exact
 *     integer dot products, scales, zero terms, bias and GELU in double): within fp32 rounding of the terms' size;
 *   - batch invariance: every row of an M-row call (THREADS OpenMP threads) equals, bit for bit, the same row
 *     computed alone (M = 1, one thread).
 * It writes the inputs and NEON outputs to OUTDIR (raw little-endian arrays) and one line per case to stdout,
 *   w4a8 NAME M N K G LDX,   w4a8_blocks NAME M N K 32 LDX   or   w8a8 NAME M N K G LDX BIAS GELU
 * so the test can run the x86 kernels on the same inputs and compare. Exit status 0: every check passed; 1 otherwise
 * (the failures on stderr). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int w4a8_linear(const float *x, int64_t ldx, const uint8_t *wq, const float *ws, const float *wzt, int64_t M, int64_t N,
                int64_t K, int64_t G, float *y, int nthreads);
int w8a8_linear(const float *x, int64_t ldx, const int8_t *w, const float *ws, const float *bias, int gelu, int64_t M,
                int64_t N, int64_t K, int64_t G, float *y, int nthreads);

enum { MAX_M = 17, N = 40 }; /* N: not a multiple of the kernels' 16-row chunks nor of their 4-column vectors */
enum { THREADS = 3 };        /* OpenMP threads of an M-row call (the rows computed alone: one thread) */
static const int64_t ROWS[] = {1, 3, 4, 17};
static const char *outdir;
static int failures;

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { /* xorshift64: the same numbers on every machine */
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 40) / (float)(1u << 24); }

static void save(const char *name, const char *what, const void *data, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.%s", outdir, name, what);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}

/* x (MAX_M, ldx): values in [-1, 1) with an outlier per row, and row 2's first group all zeros (its scale is 0);
 * exact: integers in -127..127 with each group's first 127, which quantize to themselves with scale 1 */
static float *activations(int64_t K, int64_t ldx, int64_t G, int exact) {
  float *x = malloc(sizeof(float) * MAX_M * ldx);
  for (int64_t i = 0; i < MAX_M * ldx; i++) x[i] = exact ? (float)((int)(next() % 255) - 127) : uniform(-1.f, 1.f);
  if (exact) {
    for (int64_t m = 0; m < MAX_M; m++)
      for (int64_t k = 0; k < K; k += G) x[m * ldx + k] = 127.f;
    return x;
  }
  for (int64_t m = 0; m < MAX_M; m++) x[m * ldx + (m * 37) % K] = uniform(-8.f, 8.f);
  for (int64_t k = 0; k < G; k++) x[2 * ldx + k] = 0.f;
  return x;
}

/* quantize.h's activation step, one value at a time: eight lane sums (lane i: values i, i + 8, ...) added in order */
static void quantize_ref(const float *v, int64_t G, int8_t *q, float *d, float *s) {
  float lane[8] = {0}, a = 0.f, sum = 0.f;
  for (int64_t i = 0; i < G; i++) {
    lane[i % 8] += v[i];
    a = fabsf(v[i]) > a ? fabsf(v[i]) : a;
  }
  for (int i = 0; i < 8; i++) sum += lane[i];
  const float inv = a > 0.f ? 127.f / a : 0.f;
  for (int64_t i = 0; i < G; i++) q[i] = (int8_t)rintf(v[i] * inv);
  *d = a / 127.f;
  *s = sum;
}

/* |got - want| within fp32 rounding of sums whose terms add up to `size` in magnitude; exact: equal (an integer matmul
 * small enough for fp32 to hold every partial sum) */
static void check(const char *name, int64_t m, int64_t n, float got, double want, double size, int exact) {
  if (exact ? (double)got != want : !(fabs(got - want) <= 4e-6 * size + 1e-6)) {
    fprintf(stderr, "%s: y[%ld, %ld] = %.9g, reference %.9g (terms of size %.3g)\n", name, (long)m, (long)n, got, want, size);
    failures++;
  }
}

/* every row of y (M rows) equals the same row of y1 (each row computed alone) bit for bit */
static void check_invariant(const char *name, int64_t M, const float *y, const float *y1) {
  if (memcmp(y, y1, sizeof(float) * M * N)) {
    fprintf(stderr, "%s: rows differ from the same rows computed alone (batch invariance)\n", name);
    failures++;
  }
}

/* exact: scales 1, zero terms 0 and integer activations, so y is the integer matmul */
static void w4a8_case(int64_t K, int64_t G, int exact) {
  const int64_t ldx = K + 16, ng = K / G;
  float *x = activations(K, ldx, G, exact), *ws = malloc(sizeof(float) * N * ng), *wzt = malloc(sizeof(float) * ng * N);
  uint8_t *q = malloc(N * K), *wq = calloc(N * K / 2, 1);
  for (int64_t i = 0; i < N * K; i++) q[i] = next() % 16;
  for (int64_t i = 0; i < N * ng; i++) ws[i] = exact ? 1.f : uniform(0.005f, 0.02f);
  for (int64_t i = 0; i < ng * N; i++) wzt[i] = exact ? 0.f : uniform(-0.15f, 0.15f);
  /* w4a8.py's pack_w4a8_terms: per 64-value block, byte j = value j | value j + 32 << 4 */
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) wq[n * K / 2 + k / 64 * 32 + k % 32] |= (uint8_t)(q[n * K + k] << (k % 64 >= 32 ? 4 : 0));
  char name[64];
  snprintf(name, sizeof name, "w4a8_g%ld%s", (long)G, exact ? "_exact" : "");
  save(name, "x", x, sizeof(float) * MAX_M * ldx);
  save(name, "wq", wq, N * K / 2);
  save(name, "ws", ws, sizeof(float) * N * ng);
  save(name, "wzt", wzt, sizeof(float) * ng * N);
  /* the reference */
  int8_t *xq = malloc(K);
  float *xd = malloc(sizeof(float) * ng), *xs = malloc(sizeof(float) * ng), *y1 = malloc(sizeof(float) * MAX_M * N);
  double *ref = malloc(sizeof(double) * MAX_M * N), *size = malloc(sizeof(double) * MAX_M * N);
  for (int64_t m = 0; m < MAX_M; m++) {
    for (int64_t g = 0; g < ng; g++) quantize_ref(x + m * ldx + g * G, G, xq + g * G, xd + g, xs + g);
    for (int64_t n = 0; n < N; n++) {
      double y = 0, s = 0;
      for (int64_t g = 0; g < ng; g++) {
        int64_t dot = 0;
        for (int64_t k = g * G; k < (g + 1) * G; k++) dot += (int64_t)q[n * K + k] * xq[k];
        const double t = (double)dot * ((double)ws[n * ng + g] * xd[g]), z = (double)xs[g] * wzt[g * N + n];
        y += t - z;
        s += fabs(t) + fabs(z);
      }
      ref[m * N + n] = y;
      size[m * N + n] = s;
    }
    w4a8_linear(x + m * ldx, ldx, wq, ws, wzt, 1, N, K, G, y1 + m * N, 1);
  }
  for (size_t r = 0; r < sizeof ROWS / sizeof *ROWS; r++) {
    const int64_t M = ROWS[r];
    float *y = malloc(sizeof(float) * M * N);
    if (w4a8_linear(x, ldx, wq, ws, wzt, M, N, K, G, y, THREADS)) {
      fprintf(stderr, "%s: w4a8_linear failed\n", name);
      exit(2);
    }
    char what[16];
    snprintf(what, sizeof what, "y%ld", (long)M);
    save(name, what, y, sizeof(float) * M * N);
    for (int64_t i = 0; i < M * N; i++) check(name, i / N, i % N, y[i], ref[i], size[i], exact);
    check_invariant(name, M, y, y1);
    printf("w4a8 %s %ld %d %ld %ld %ld\n", name, (long)M, N, (long)K, (long)G, (long)ldx);
    free(y);
  }
  free(x), free(ws), free(wzt), free(q), free(wq), free(xq), free(xd), free(xs), free(y1), free(ref), free(size);
}

/* The group-32 blocks layout (w4a8_blocks.h; w4a8.py's pack_w4a8_blocks), passed with ws = wzt = NULL: fp16 scales
 * d and zero terms z (w = q d - z) inline after each 64-value block's nibbles. exact: d 1, z 0, integer activations. */
static void w4a8_blocks_case(int64_t K, int exact) {
  const int64_t ldx = K + 16, ng = K / 32, row = K / 64 * 40;
  float *x = activations(K, ldx, 32, exact), *ws = malloc(sizeof(float) * N * ng), *wzt = malloc(sizeof(float) * ng * N);
  uint8_t *q = malloc(N * K), *wq = calloc(N * row, 1);
  for (int64_t i = 0; i < N * K; i++) q[i] = next() % 16;
  for (int64_t n = 0; n < N; n++)
    for (int64_t g = 0; g < ng; g++) { /* fp16 values (as GGUF stores them), kept as float for the reference */
      ws[n * ng + g] = exact ? 1.f : (float)(__fp16)uniform(0.005f, 0.02f);
      wzt[g * N + n] = exact ? 0.f : (float)(__fp16)uniform(-0.15f, 0.15f);
    }
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < K / 64; b++) {
      uint8_t *blk = wq + n * row + b * 40;
      for (int t = 0; t < 64; t++) { /* slot t holds value v: 4-byte lanes alternate between the two groups */
        const int v = (t / 4 % 2) * 32 + (t / 32) * 16 + (t % 32 / 8) * 4 + t % 4;
        blk[t % 32] |= (uint8_t)(q[n * K + b * 64 + v] << (t >= 32 ? 4 : 0));
      }
      const __fp16 h[4] = {(__fp16)ws[n * ng + 2 * b], (__fp16)ws[n * ng + 2 * b + 1], (__fp16)wzt[2 * b * N + n],
                           (__fp16)wzt[(2 * b + 1) * N + n]};
      memcpy(blk + 32, h, sizeof h);
    }
  char name[64];
  snprintf(name, sizeof name, "w4a8_blocks%s", exact ? "_exact" : "");
  save(name, "x", x, sizeof(float) * MAX_M * ldx);
  save(name, "wq", wq, N * row);
  save(name, "ws", ws, sizeof(float) * N * ng);
  save(name, "wzt", wzt, sizeof(float) * ng * N);
  int8_t *xq = malloc(K);
  float *xd = malloc(sizeof(float) * ng), *xs = malloc(sizeof(float) * ng), *y1 = malloc(sizeof(float) * MAX_M * N);
  double *ref = malloc(sizeof(double) * MAX_M * N), *size = malloc(sizeof(double) * MAX_M * N);
  for (int64_t m = 0; m < MAX_M; m++) {
    for (int64_t g = 0; g < ng; g++) quantize_ref(x + m * ldx + g * 32, 32, xq + g * 32, xd + g, xs + g);
    for (int64_t n = 0; n < N; n++) {
      double y = 0, s = 0;
      for (int64_t g = 0; g < ng; g++) {
        int64_t dot = 0;
        for (int64_t k = g * 32; k < (g + 1) * 32; k++) dot += (int64_t)q[n * K + k] * xq[k];
        const double t = (double)dot * ((double)ws[n * ng + g] * xd[g]), z = (double)xs[g] * wzt[g * N + n];
        y += t - z;
        s += fabs(t) + fabs(z);
      }
      ref[m * N + n] = y;
      size[m * N + n] = s;
    }
    w4a8_linear(x + m * ldx, ldx, wq, NULL, NULL, 1, N, K, 32, y1 + m * N, 1);
  }
  for (size_t r = 0; r < sizeof ROWS / sizeof *ROWS; r++) {
    const int64_t M = ROWS[r];
    float *y = malloc(sizeof(float) * M * N);
    if (w4a8_linear(x, ldx, wq, NULL, NULL, M, N, K, 32, y, THREADS)) {
      fprintf(stderr, "%s: w4a8_linear failed\n", name);
      exit(2);
    }
    char what[16];
    snprintf(what, sizeof what, "y%ld", (long)M);
    save(name, what, y, sizeof(float) * M * N);
    for (int64_t i = 0; i < M * N; i++) check(name, i / N, i % N, y[i], ref[i], size[i], exact);
    check_invariant(name, M, y, y1);
    printf("w4a8_blocks %s %ld %d %ld 32 %ld\n", name, (long)M, N, (long)K, (long)ldx);
    free(y);
  }
  free(x), free(ws), free(wzt), free(q), free(wq), free(xq), free(xd), free(xs), free(y1), free(ref), free(size);
}

static double gelu_ref(double v) { return 0.5 * v * erfc(-v / sqrt(2.0)); }

/* exact: weight scales 1 and integer activations, so y is the integer matmul */
static void w8a8_case(int64_t K, int64_t G, int with_bias, int gelu, int exact) {
  const int64_t ldx = K + 16, ng = K / G;
  float *x = activations(K, ldx, G, exact), *ws = malloc(sizeof(float) * N), *bias = malloc(sizeof(float) * N);
  int8_t *w = malloc(N * K);
  for (int64_t i = 0; i < N * K; i++) w[i] = (int8_t)((int)(next() % 255) - 127);
  for (int64_t n = 0; n < N; n++) ws[n] = exact ? 1.f : uniform(0.001f, 0.01f), bias[n] = uniform(-1.f, 1.f);
  char name[64];
  snprintf(name, sizeof name, "w8a8_k%ld_g%ld%s%s%s", (long)K, (long)G, with_bias ? "_bias" : "", gelu ? "_gelu" : "",
           exact ? "_exact" : "");
  save(name, "x", x, sizeof(float) * MAX_M * ldx);
  save(name, "w", w, N * K);
  save(name, "ws", ws, sizeof(float) * N);
  save(name, "bias", bias, sizeof(float) * N);
  int8_t *xq = malloc(K);
  float *xd = malloc(sizeof(float) * ng), *xs = malloc(sizeof(float) * ng), *y1 = malloc(sizeof(float) * MAX_M * N);
  double *ref = malloc(sizeof(double) * MAX_M * N), *size = malloc(sizeof(double) * MAX_M * N);
  const float *b = with_bias ? bias : NULL;
  for (int64_t m = 0; m < MAX_M; m++) {
    for (int64_t g = 0; g < ng; g++) quantize_ref(x + m * ldx + g * G, G, xq + g * G, xd + g, xs + g);
    for (int64_t n = 0; n < N; n++) {
      double y = 0, s = 0;
      for (int64_t g = 0; g < ng; g++) {
        int64_t dot = 0;
        for (int64_t k = g * G; k < (g + 1) * G; k++) dot += (int64_t)w[n * K + k] * xq[k];
        y += (double)dot * xd[g];
        s += fabs((double)dot * xd[g]);
      }
      y *= ws[n], s *= ws[n];
      if (b) y += b[n], s += fabs(b[n]);
      ref[m * N + n] = gelu ? gelu_ref(y) : y;
      size[m * N + n] = s;
    }
    w8a8_linear(x + m * ldx, ldx, w, ws, b, gelu, 1, N, K, G, y1 + m * N, 1);
  }
  for (size_t r = 0; r < sizeof ROWS / sizeof *ROWS; r++) {
    const int64_t M = ROWS[r];
    float *y = malloc(sizeof(float) * M * N);
    if (w8a8_linear(x, ldx, w, ws, b, gelu, M, N, K, G, y, THREADS)) {
      fprintf(stderr, "%s: w8a8_linear failed\n", name);
      exit(2);
    }
    char what[16];
    snprintf(what, sizeof what, "y%ld", (long)M);
    save(name, what, y, sizeof(float) * M * N);
    for (int64_t i = 0; i < M * N; i++) check(name, i / N, i % N, y[i], ref[i], size[i], exact);
    check_invariant(name, M, y, y1);
    printf("w8a8 %s %ld %d %ld %ld %ld %d %d\n", name, (long)M, N, (long)K, (long)G, (long)ldx, with_bias, gelu);
    free(y);
  }
  free(x), free(ws), free(bias), free(w), free(xq), free(xd), free(xs), free(y1), free(ref), free(size);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  outdir = argv[1];
  static const int64_t groups[] = {32, 64, 128, 256}; /* w4a8.py's GROUP_SIZES */
  for (int i = 0; i < 4; i++) w4a8_case(512, groups[i], 0), w4a8_case(512, groups[i], 1);
  w4a8_blocks_case(512, 0), w4a8_blocks_case(512, 1);
  w8a8_case(512, 64, 0, 0, 0); /* the lm_head's form */
  w8a8_case(512, 64, 1, 1, 0); /* the encoder's up projection: bias, GELU */
  w8a8_case(96, 32, 1, 0, 0);  /* K not a multiple of 64: groups of 32 */
  w8a8_case(512, 64, 0, 0, 1);
  w8a8_case(96, 32, 0, 0, 1);
  fflush(stdout);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  return failures ? 1 : 0;
}
