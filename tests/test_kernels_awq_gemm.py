"""kernels/triton/awq_gemm.py against its torch reference (Triton interpreter), and the reference's pack/unpack
against AutoAWQ's own packing loop and hand-computed words."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

import pytest
import torch

from kernels.triton import awq_gemm as aw
from kernels.triton.testing import TOL, device_for, generator, poison, ready

ready(aw)
DEV = device_for(aw)


def random_awq(g, k, n, group_size):
    qweight = torch.randint(-(2**31), 2**31, (k, n // 8), generator=g, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-(2**31), 2**31, (k // group_size, n // 8), generator=g, dtype=torch.int64)
    scales = (torch.rand(k // group_size, n, generator=g) * 0.02 + 0.001).half()
    return qweight, qzeros.to(torch.int32), scales


def check(out, ref, dtype):
    """Error relative to the output's magnitude (a GEMM's outputs can cancel to ~0 elementwise)."""
    assert not out.isnan().any()
    err = (out.float().cpu() - ref.float()).abs().max() / ref.float().abs().max()
    assert err <= 2 * TOL[dtype][1], f"relative error {err:.2e}"


# (M, K, N, group_size, split_k, block_m, block_n): a single token, odd M crossing BLOCK_M, N not a multiple
# of BLOCK_N, all group sizes, split-K with an uneven K split
GEMM_CASES = [
    (1, 256, 136, 32, 1, 16, 64),
    (5, 256, 72, 64, 3, 16, 32),
    (33, 256, 64, 128, 2, 16, 64),
    (17, 384, 40, 128, 1, 32, 16),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: f"m{c[0]}k{c[1]}n{c[2]}g{c[3]}sk{c[4]}")
def test_awq_gemm(dtype, case):
    m, k, n, group_size, split_k, block_m, block_n = case
    g = generator("awq", dtype, case)
    qweight, qzeros, scales = random_awq(g, k, n, group_size)
    x = torch.randn(m, k, generator=g).to(dtype)
    ref = aw.awq_gemm_ref(x.float(), qweight, qzeros, scales, group_size=group_size)
    out = poison(m, n, dtype=dtype, device=DEV)
    args = [t.to(DEV) for t in (x, qweight, qzeros, scales)]
    res = aw.awq_gemm(*args, group_size, out=out, split_k=split_k, block_m=block_m, block_n=block_n)
    assert res is out
    check(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", GEMM_CASES[:2], ids=lambda c: f"m{c[0]}k{c[1]}n{c[2]}g{c[3]}sk{c[4]}")
def test_awq_gemm_float_zero_terms(dtype, case):
    """GGUF Q4_1 blocks (w = q * d + m): float zero terms -m per group instead of integer zero points."""
    m, k, n, group_size, split_k, block_m, block_n = case
    g = generator("awq-zt", dtype, case)
    qweight, _, scales = random_awq(g, k, n, group_size)
    mins = -(torch.rand(k // group_size, n, generator=g) * 0.1).half()
    w = aw.awq_unpack(qweight).float() * scales.float().repeat_interleave(group_size, 0)
    w = w + mins.float().repeat_interleave(group_size, 0)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = poison(m, n, dtype=dtype, device=DEV)
    zt = (-mins.float()).contiguous()
    aw.awq_gemm(*(t.to(DEV) for t in (x, qweight)), None, scales.to(DEV), group_size, out=out, split_k=split_k,
                block_m=block_m, block_n=block_n, zero_terms=zt.to(DEV))
    check(out, x.float() @ w, dtype)


def test_int4_linear_gguf_blocks_on_the_triton_path():
    """Int4Linear's CUDA preparation of GGUF blocks (AWQ packing, fp16 scales, fp32 zero terms) through the kernel."""
    from backend.quant.gguf_blocks import dequantize_blocks
    from backend.quant.int4_linear import Int4Linear

    g = generator("awq-gguf-layer")
    q = torch.randint(0, 16, (48, 128), generator=g, dtype=torch.uint8)
    d = (torch.rand(48, 4, generator=g) * 0.01 + 1e-3).half()
    m = (-torch.rand(48, 4, generator=g) * 0.08).half()
    layer = Int4Linear(128, 48, 32, bias=False, layout="gguf")
    layer.prepare_triton_blocks(*(t.to(DEV) for t in (q, d.float(), m.float())))
    assert layer.mode == "triton"
    x = torch.randn(5, 128, generator=g).half()
    check(layer(x.to(DEV)), x.float() @ dequantize_blocks(q, d, m).T, torch.float16)


def test_awq_gemm_quantized_linear_close_to_fp():
    """End to end on a real weight: quantise, run the kernel, compare with the float matmul."""
    g = generator("awq-linear")
    w = torch.randn(128, 96, generator=g) * 0.05
    qweight, qzeros, scales = aw.awq_quantize(w, 64)
    deq = aw.awq_dequantize(qweight, qzeros, scales, 64)
    assert (deq - w).abs().max() <= scales.float().max() * 0.51  # rounding error of a min/max quantiser
    x = torch.randn(3, 128, generator=g).half()
    out = aw.awq_gemm(*(t.to(DEV) for t in (x, qweight, qzeros, scales)), 64)
    check(out, x.float() @ deq, torch.float16)


def autoawq_pack(intweight):
    """AutoAWQ's WQLinear_GEMM.from_linear packing loop, verbatim in structure."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            qweight[:, col] |= intweight[:, col * 8 + order_map[i]].to(torch.int32) << (i * 4)
    return qweight


def test_awq_pack_unpack_reference():
    g = generator("awq-pack")
    values = torch.randint(0, 16, (6, 32), generator=g, dtype=torch.int32)
    packed = aw.awq_pack(values)
    assert torch.equal(packed, autoawq_pack(values))
    assert torch.equal(aw.awq_unpack(packed), values)
    # hand-computed: columns 0..7 holding their own index pack to nibbles 0,2,4,6,1,3,5,7 (low to high)
    assert aw.awq_pack(torch.arange(8, dtype=torch.int32)[None]).item() == 0x75316420
    # per element, straight from the bit layout, with Python ints
    for r in range(6):
        for c in range(32):
            word = int(packed[r, c // 8]) & 0xFFFFFFFF
            nibble = [0, 2, 4, 6, 1, 3, 5, 7].index(c % 8)
            assert (word >> (4 * nibble)) & 0xF == values[r, c]


def test_awq_dequantize_reference_per_element():
    g = generator("awq-deq")
    qweight, qzeros, scales = random_awq(g, 64, 16, 32)
    deq = aw.awq_dequantize(qweight, qzeros, scales, 32)
    for k, n in [(0, 0), (31, 15), (32, 1), (63, 8), (40, 13)]:
        q = aw.awq_unpack(qweight)[k, n]
        z = aw.awq_unpack(qzeros)[k // 32, n]
        assert deq[k, n] == (q - z).float() * scales[k // 32, n].float()


@pytest.mark.parametrize("m", [1, 3, 16, 64])
@pytest.mark.parametrize(("float_zero", "group_size"), [(False, 128), (True, 32)])  # AWQ; GGUF blocks
def test_awq_gemm_every_tuning_candidate(m, float_zero, group_size):
    """Every configuration the GPU tuner may pick (GEMV programs, MMA tiles with word or per-column unpacking,
    split-K, dequantize-then-matmul) computes the same product: the tuner chooses by speed only."""
    k, n = 256, 272  # N not a multiple of the widest column tile
    g = generator("awq-candidates", m, float_zero)
    qweight, qzeros, scales = random_awq(g, k, n, group_size)
    x = torch.randn(m, k, generator=g).half()
    zt = (torch.rand(k // group_size, n, generator=g) * 0.05).half() if float_zero else None
    w = aw.awq_unpack(qweight).float() * scales.float().repeat_interleave(group_size, 0)
    if float_zero:
        ref = x.float() @ (w - zt.float().repeat_interleave(group_size, 0))
    else:
        ref = aw.awq_gemm_ref(x.float(), qweight, qzeros, scales, group_size=group_size)
    configs = aw.candidates(m, group_size)
    assert aw.default_config(m, group_size) in configs and any(not c.words for c in configs)
    assert any(c.kind == "gemv" for c in configs) == (m <= 16)  # one row per program only for decode-sized calls
    assert any(c.kind == "dequant" for c in configs) == (m >= 64)  # cuBLAS on a dense copy only for many rows
    for cfg in [*configs, aw.GemmConfig(aw.default_config(m, group_size).block_m, 64, 64, split_k=3)]:
        out = poison(m, n, dtype=torch.float16, device=DEV)
        aw.awq_gemm(x.to(DEV), qweight.to(DEV), None if float_zero else qzeros.to(DEV), scales.to(DEV), group_size=group_size,
                    out=out, zero_terms=None if zt is None else zt.to(DEV), config=cfg)
        check(out, ref, torch.float16)


def test_awq_gemm_rows_do_not_depend_on_the_batch_within_a_bucket():
    """A row's result is bit-identical whether it runs alone or padded into its bucket (what CUDA graphs do)."""
    g = generator("awq-bucket")
    qweight, qzeros, scales = random_awq(g, 256, 64, 64)
    x = torch.randn(8, 256, generator=g).half()
    args = [t.to(DEV) for t in (qweight, qzeros, scales)]
    five = aw.awq_gemm(x[:5].to(DEV), *args, 64)
    eight = aw.awq_gemm(x.to(DEV), *args, 64)
    assert torch.equal(five, eight[:5])
