/* Grouped W8A8 GEMM for x86 CPUs with AVX-512 VNNI: wg8a8.c's entry point and arithmetic (wg8a8_octets.h), the dot
 * product on vpdpbusd (unsigned x signed bytes, four products a lane into int32, one instruction).
 *
 * The weight bytes are made unsigned by flipping their top bit (q + 128), and each group's sum starts at -128 times the
 * group's sum of int8 activations, so the lane ends as the same exact integer sum as wg8a8.c's: the same bits. */
#include <immintrin.h>
#include <stdint.h>

#define W8_PREP(v) _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80))
#define W8_DOT(acc, u, xb) _mm256_dpbusd_epi32(acc, u, xb)
#define W8_START(sum) _mm256_set1_epi32(-128 * (sum))
#define W8_GROUP_SUMS 1
#define WG_MT 4
#include "wg8a8_octets.h"
