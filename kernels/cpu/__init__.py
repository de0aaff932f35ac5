"""C kernels for x86 CPUs (AVX2 + FMA), each next to its ctypes wrapper; build.py compiles them."""
