"""Fused RMSNorm with an optional residual add (Llama / SmolLM2 style).

Algorithm (one program per row of ``hidden`` elements, the whole row in one tile)
    without residual:  y = x / sqrt(mean(x^2) + eps) * weight
    with residual:     h = x + residual (rounded to the input dtype, as the unfused model does);
                       y = h / sqrt(mean(h^2) + eps) * weight; returns (y, h) so h feeds the next residual.
    Sums and the normalisation run in float32; y is written in x's dtype.

Layout
    x, residual: (num_tokens, hidden), last dim contiguous (row stride free); weight: (hidden,).
    Outputs are new contiguous tensors (or ``out=`` / ``residual_out=`` buffers; ``residual_out`` may be
    ``residual`` itself to update it in place, since each program reads its row before writing it).

Limits
    hidden <= 16384 (one tile per row; SmolLM2: 576 -> a 1024-wide tile, 44% masked lanes, which is free for
    a bandwidth-bound kernel). The HF model multiplies weight after rounding to the input dtype; here the
    product is taken in float32 and rounded once (differences are within a half-precision ulp).
"""

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    # 1. Load the row (and add the residual, rounding the sum to the activation dtype like the model).
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    # 2. Mean of squares in float32 (masked lanes are 0 and do not count: divide by hidden).
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    # 3. Normalise, scale by the weight, store in the activation dtype.
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    """Return ``(normed, new_residual)``; ``new_residual`` is ``x + residual`` or None without a residual."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    num_tokens, hidden = x.shape
    assert weight.shape == (hidden,) and weight.is_contiguous(), weight.shape
    assert x.dtype in (torch.float32, torch.float16, torch.bfloat16), x.dtype
    assert hidden <= 16384, hidden
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    assert out.shape == x.shape and out.stride(1) == 1 and out.dtype == x.dtype
    tensors = [x, weight, out]
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1 and residual.dtype == x.dtype
        if residual_out is None:
            residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        assert residual_out.shape == x.shape and residual_out.stride(1) == 1 and residual_out.dtype == x.dtype
        tensors += [residual, residual_out]
    check_device(_rms_norm_kernel, *tensors)
    if num_tokens > 0:
        r, ro = (residual, residual_out) if residual is not None else (x, out)  # dummies, never touched
        _rms_norm_kernel[(num_tokens,)](
            x, r, weight, out, ro,
            x.stride(0), r.stride(0), out.stride(0), ro.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
        )
    return out, residual_out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Torch reference, the HF LlamaRMSNorm computation (+ the decoder layer's residual add)."""
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * y).to(x.dtype), residual
