/* Paged decode attention, and prefill chunks attended as decode queries, for x86 CPUs with AVX2 + FMA: the kernel is
 * paged_decode.h (built again with AVX-512 as paged_decode_avx512.c). */
#include "paged_decode.h"
