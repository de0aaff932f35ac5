/* Grouped W8A8 GEMM for x86 CPUs with AVX2 + FMA: a GGUF file's blocks in their own values (wg8a8_octets.h says how),
 * built by kernels/cpu/wg8a8.py; wg8a8_avx512.c is the same entry point with VNNI.
 *
 * Why: every GGUF block type (Q4_0 ... Q8_0, the K-quants' sub-blocks) is an integer q per weight times a float scale
 * per group of 16 or 32, plus for some a float term per 32. Held as int8 + fp32 scales these are the file's own values
 * (bit for bit what gguf-py's dequantization gives) at 1.06-1.25 bytes a weight (fp16 scales where the file's are
 * fp16, read through F16C), instead of a float32 copy at 4.
 *
 * The dot product: vpmaddubsw multiplies unsigned by signed bytes, so the weight's sign moves onto the activation
 * (|q| * sign(x, q), exact), each pair sum (<= 2 x 128 x 127) fits int16, and vpmaddwd widens it to int32 lanes.
 */
#include <immintrin.h>
#include <stdint.h>

#define W8_PREP(v) (v)
#define W8_DOT(acc, wv, xb) \
  _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xb, wv)), _mm256_set1_epi16(1)))
#define W8_START(sum) _mm256_setzero_si256()
#define W8_GROUP_SUMS 0
#include "wg8a8_octets.h"
