"""Triton kernels of the embedded engine. Importing this package imports nothing else (no triton, no torch).

One file per kernel; each has the ``@triton.jit`` kernel, a launcher that checks shapes/strides/dtypes, and a
plain torch reference (``*_ref``) next to it:

=====================  =============================================  ==========================
file                   launcher                                        torch reference
=====================  =============================================  ==========================
kv_store.py            store_kv(key, value, k_cache, v_cache, slots)  store_kv_ref
flash_prefill.py       flash_prefill(q, k_cache, v_cache, ...)         flash_prefill_ref
paged_decode.py        paged_decode(q, k_cache, v_cache, ...)          paged_decode_ref
awq_gemm.py            awq_gemm(x, qweight, qzeros, scales, group)     awq_gemm_ref (+ pack/unpack)
rmsnorm.py             rms_norm(x, weight, eps, residual=None)         rms_norm_ref
rotary.py              rotary_embedding(positions, q, k, cos_sin, ..)  rotary_embedding_ref
=====================  =============================================  ==========================

Dispatch note: the engine should call the Triton launchers when its tensors are on CUDA and the torch
references (or its own torch path) elsewhere. Triton picks compiler vs interpreter when a kernel module is
*imported* (``TRITON_INTERPRET`` is read by ``@triton.jit``). To run the kernels on the CPU (tests, the
engine's forced-Triton CPU mode), set ``TRITON_INTERPRET=1`` before importing them, or call
``use_interpreter()`` which sets it and reloads the kernel modules already imported (callers must then
re-fetch the launchers from the reloaded modules).
"""

KERNEL_MODULES = ("kv_store", "flash_prefill", "paged_decode", "awq_gemm", "rmsnorm", "rotary")


def use_interpreter() -> None:
    """Make every kernel module (re)load in Triton-interpreter mode, so the kernels run on CPU tensors."""
    import importlib
    import os
    import sys

    os.environ["TRITON_INTERPRET"] = "1"
    for name in ("_utils", *KERNEL_MODULES):
        mod = sys.modules.get(f"{__name__}.{name}")
        if mod is not None:
            importlib.reload(mod)
