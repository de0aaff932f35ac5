"""Kernels of the embedded engine. Importing this package imports nothing else (no triton, no torch).

kernels/triton/ holds the Triton kernels (CUDA, or Triton's interpreter on a CPU), kernels/cpu/ the C kernels for
x86 CPUs with their ctypes wrappers (kernels/cpu/build.py compiles them). Triton: one file per kernel; each has
the ``@triton.jit`` kernel, a launcher that checks shapes/strides/dtypes, and a plain torch reference (``*_ref``)
next to it:

=====================  =============================================  ==========================
file                   launcher                                        torch reference
=====================  =============================================  ==========================
kv_store.py            store_kv(key, value, k_cache, v_cache, slots)  store_kv_ref
flash_prefill.py       flash_prefill(q, k_cache, v_cache, ...)         flash_prefill_ref
paged_decode.py        paged_decode(q, k_cache, v_cache, ...)          paged_decode_ref
awq_gemm.py            awq_gemm(x, qweight, qzeros, scales, group)     awq_gemm_ref (+ pack/unpack)
gguf_gemm.py           gguf_gemm(x, qt, scales_t, zeros_t)             gguf_gemm_ref (+ columns)
rmsnorm.py             rms_norm(x, weight, eps, residual=None)         rms_norm_ref
rotary.py              rotary_embedding(positions, q, k, cos_sin, ..)  rotary_embedding_ref
=====================  =============================================  ==========================

Dispatch note: the engine should call the Triton launchers when its tensors are on CUDA and the torch
references (or its own torch path) elsewhere. Triton picks compiler vs interpreter when a kernel module is
*imported* (``TRITON_INTERPRET`` is read by every ``@triton.jit``, triton's own ``tl.sum``/``tl.max``
included, so it must be set before ``triton`` itself is first imported). To run the kernels on the CPU
(tests, the engine's forced-Triton CPU mode), set ``TRITON_INTERPRET=1`` before anything imports triton, or
call ``use_interpreter()``, which sets it and re-imports what was already imported in compiled mode
(callers must then re-fetch launchers they bound with ``from kernels.triton.x import f`` before the call).
"""

# The Triton kernels of kernels/triton/ (the C kernels of kernels/cpu/ are not listed here).
KERNEL_MODULES = ("kv_store", "flash_prefill", "paged_decode", "awq_gemm", "gguf_gemm", "rmsnorm", "rotary")


def use_interpreter() -> None:
    """Switch to Triton's interpreter: kernels then run on CPU tensors (slowly; for tests and debugging).

    A recovery path for a process that imported triton before setting ``TRITON_INTERPRET=1``: triton's
    standard library (``tl.sum``, ``tl.max``, ...) was then built for the compiler and is re-imported, and so
    are the kernel modules already imported. Prefer setting the variable before the first ``import triton``.
    """
    import importlib
    import os
    import sys

    os.environ["TRITON_INTERPRET"] = "1"
    std = sys.modules.get("triton.language.standard")
    if std is not None and type(std.sum).__name__ != "InterpretedFunction":  # built for the compiler
        for name in ("triton.language.standard", "triton.language.math", "triton.language.random",
                     "triton.language"):
            if name in sys.modules:
                importlib.reload(sys.modules[name])
    for name in ("_utils", *KERNEL_MODULES):
        mod = sys.modules.get(f"{__name__}.triton.{name}")
        if mod is not None:
            importlib.reload(mod)
