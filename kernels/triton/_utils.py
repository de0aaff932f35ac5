"""Small helpers shared by the kernel files (no import-time side effects beyond importing triton).

* ``is_interpreted(kernel)``: whether a ``@triton.jit`` function was decorated while ``TRITON_INTERPRET=1``
  (Triton decides interpreter-vs-compiler once, at decoration time, i.e. when the kernel module is imported).
* ``multi_processor_count(device)``: the GPU's SM count, read once per device (launchers size their grids with it
  on every call, so it stays a host-side lookup: nothing a CUDA graph capture could trip on).
* ``mma(a, b, acc, UPCAST)``: ``tl.dot`` with two fixes applied at compile time:
  - float32 operands use ``input_precision="ieee"`` (no silent TF32 rounding on the GPU);
  - ``UPCAST`` (set by launchers only for bfloat16 under the interpreter) converts the operands to float32
    first. Triton 3.9's interpreter stores bfloat16 as uint16 and its ``create_dot`` runs ``np.matmul`` on
    those raw bit patterns, so a bfloat16 ``tl.dot`` returns garbage on the CPU. bf16 x bf16 products are
    exact in float32, so the upcast gives the same result a GPU's bf16 MMA with fp32 accumulation gives.
"""

import functools

import torch
import triton
import triton.language as tl


def is_interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def triton_stdlib_interpreted() -> bool:
    """Whether triton's own jit helpers (tl.sum, tl.max, ...) were built for the interpreter."""
    return is_interpreted(tl.standard.sum)


def dot_upcast(kernel, dtype: torch.dtype) -> bool:
    return is_interpreted(kernel) and dtype == torch.bfloat16


def multi_processor_count(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def check_device(kernel, *tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    for t in tensors:
        assert t.device == dev, f"all tensors must be on one device, got {t.device} and {dev}"
    if is_interpreted(kernel):
        assert triton_stdlib_interpreted(), (
            "triton was imported before TRITON_INTERPRET=1 was set, so tl.sum/tl.max cannot run in the "
            "interpreter: set it before the first `import triton`, or call kernels.use_interpreter()"
        )
    else:
        assert dev.type == "cuda", (
            "compiled Triton kernels need CUDA tensors; on the CPU set TRITON_INTERPRET=1 before importing "
            "kernels (or call kernels.use_interpreter())"
        )


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif a.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc
