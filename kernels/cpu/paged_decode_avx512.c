/* paged_decode.h built with AVX-512 (kernels/cpu/build.py's AVX512_FLAGS): the prefill tiles on 512-bit vectors, the
 * same bits as the AVX2 build (paged_decode.h says how). */
#include "paged_decode.h"
