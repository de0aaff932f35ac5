"""Test helpers for the kernel tests (and for engine tests that force the Triton path on the CPU).

Usage at the very top of a test module, before anything imports triton or a kernel module::

    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")   # Triton reads it when @triton.jit runs (module import)
    from kernels import paged_decode as pd
    from kernels.triton.testing import assert_close, device_for, poison, ready
    ready(pd)   # re-imports the module under the interpreter if it was already imported compiled, no GPU
    DEV = device_for(pd)

``TRITON_INTERPRET=0 pytest`` on a CUDA machine runs the same tests compiled, on the GPU.
"""

import importlib

import torch

from kernels.triton._utils import is_interpreted, triton_stdlib_interpreted

# Tolerances (atol, rtol) for outputs compared with a float32 reference computed from the same inputs.
TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def ready(module) -> None:
    """Ensure ``module``'s kernels can run here: on a CPU-only machine, switch to the interpreter if the
    module (or triton) was imported before ``TRITON_INTERPRET=1`` was set."""
    names = [n for n in dir(module) if n.startswith("_") and n.endswith("_kernel")]
    interpreted = triton_stdlib_interpreted() and all(is_interpreted(getattr(module, n)) for n in names)
    if not interpreted and not torch.cuda.is_available():
        import kernels

        kernels.use_interpreter()
        importlib.reload(module)  # in case it is not one of kernels.KERNEL_MODULES


def device_for(module) -> str:
    """"cpu" when ``module``'s kernels are interpreted, else "cuda"."""
    kernel_names = [n for n in dir(module) if n.startswith("_") and n.endswith("_kernel")]
    return "cpu" if is_interpreted(getattr(module, kernel_names[0])) else "cuda"


def poison(*shape, dtype, device) -> torch.Tensor:
    """An output buffer full of NaN, so any element a kernel forgets to write fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """Elementwise |out - ref| <= atol + rtol * |ref| with dtype tolerances (x scale); NaN anywhere fails."""
    atol, rtol = TOL[dtype or out.dtype]
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=atol * scale, rtol=rtol * scale,
                               equal_nan=False)


def generator(*key) -> torch.Generator:
    """A CPU generator seeded from the test parameters: fresh data per case, reproducible across runs."""
    import zlib

    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
