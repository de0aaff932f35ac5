"""C kernels for x86 CPUs (AVX2 + FMA; `*_avx512.c`: AVX-512 VNNI variants), each next to its ctypes wrapper; build.py
compiles them."""
