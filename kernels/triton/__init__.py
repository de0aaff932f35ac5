"""Triton kernels, one per file: the @triton.jit kernel, its launcher and a torch reference."""
