/* Runs wg8a8_linear, or wg4a8_linear where NIBBLES is 1, or wg5a8_linear where FIFTH is 1 too (whichever build it is
 * linked with: tests/test_gguf_grouped.py cross-compiles it with kernels/cpu/wg8a8_neon.c and runs it under
 * qemu-aarch64) on inputs the test wrote:
 *
 *   wg8a8_harness DIR M N K G ZEROS THREADS NIBBLES OFFSET HALF FIFTH
 *
 * reads DIR/x (M, K) float, DIR/w (N, K) int8 in octets (N * K / 2 bytes in the nibble layout, values u - OFFSET),
 * DIR/ws (N, K/G) float (fp16 where HALF is 1), DIR/wz (N, K/32) float when ZEROS is 1, DIR/hi (N * K / 8 bytes: the
 * fifth bits) when FIFTH is 1, writes DIR/y (M, N) float: raw little-endian arrays.
 * Exit status 0, or the kernel's or I/O's error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int wg8a8_linear(const float *x, int64_t ldx, const int8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                 int64_t K, int64_t G, int half, float *y, int nthreads);
int wg8a8_lanes(void); /* what kernels/cpu/wg8a8.py's loader asks every build for */
int wg4a8_linear(const float *x, int64_t ldx, const uint8_t *w, const void *ws, const float *wz, int64_t M, int64_t N,
                 int64_t K, int64_t G, int half, int32_t offset, float *y, int nthreads);
int wg5a8_linear(const float *x, int64_t ldx, const uint8_t *w, const uint8_t *hi, const void *ws, const float *wz,
                 int64_t M, int64_t N, int64_t K, int64_t G, int half, int32_t offset, float *y, int nthreads);

static void *load(const char *dir, const char *name, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  void *data = malloc(bytes);
  if (!f || !data || fread(data, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(2);
  }
  fclose(f);
  return data;
}

int main(int argc, char **argv) {
  if (argc != 12) return 3;
  if (wg8a8_lanes() != 8) return 5; /* the octets the test packs */
  const char *dir = argv[1];
  const int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]), G = atoll(argv[5]);
  const int zeros = atoi(argv[6]), threads = atoi(argv[7]), nibbles = atoi(argv[8]), offset = atoi(argv[9]);
  const int half = atoi(argv[10]), fifth = atoi(argv[11]);
  float *x = load(dir, "x", sizeof(float) * M * K);
  void *ws = load(dir, "ws", (half ? 2 : sizeof(float)) * N * (K / G));
  int8_t *w = load(dir, "w", nibbles ? N * K / 2 : N * K);
  float *wz = zeros ? load(dir, "wz", sizeof(float) * N * (K / 32)) : NULL, *y = malloc(sizeof(float) * M * N);
  const uint8_t *hi = fifth ? load(dir, "hi", N * K / 8) : NULL;
  const int rc = fifth     ? wg5a8_linear(x, K, (const uint8_t *)w, hi, ws, wz, M, N, K, G, half, offset, y, threads)
                 : nibbles ? wg4a8_linear(x, K, (const uint8_t *)w, ws, wz, M, N, K, G, half, offset, y, threads)
                         : wg8a8_linear(x, K, w, ws, wz, M, N, K, G, half, y, threads);
  if (rc) return 4;
  char path[512];
  snprintf(path, sizeof path, "%s/y", dir);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(y, sizeof(float), M * N, f) != (size_t)(M * N)) return 2;
  fclose(f);
  return 0;
}
