"""kernels/triton/gguf_gemm.py (Triton interpreter here, compiled on a GPU) against its float64 torch reference, and
GgufLinear's Triton path (what a GGUF's grouped weights run on a GPU) against its CPU path on the same weight."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

import pytest
import torch

from kernels.cpu.wg8a8 import GroupedInt8
from kernels.triton import gguf_gemm as gg
from kernels.triton.testing import TOL, device_for, generator, poison, ready

ready(gg)
DEV = device_for(gg)
K, N = 128, 72  # N not a multiple of any column tile (16, 32, 64, 128); K four groups of 32, eight of 16


def random_grouped(g: torch.Generator, n: int, k: int, group: int, zeros: bool) -> GroupedInt8:
    """Every int8 value (-128 too), positive scales of GGUF's order of magnitude, terms of either sign."""
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
    return GroupedInt8(q, scales, torch.randn(n, k // 32, generator=g) * 0.05 if zeros else None)


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Error relative to the output's magnitude (a GEMM's outputs can cancel to ~0 elementwise): the rounding of the
    result to its dtype, and for fp32 of the sums' order, with 2x margin."""
    assert not out.isnan().any()
    err = (out.double().cpu() - ref.double()).abs().max() / ref.double().abs().max()
    assert err <= 2 * TOL[dtype][1], f"relative error {err:.2e}"


def test_the_column_layout_holds_the_same_values() -> None:
    g = random_grouped(generator("gguf-layout"), 40, 64, 16, True)
    cols = gg.columns(g, DEV)
    assert cols.shape == (40, 64) and cols.group == 16 and cols.qt.shape == (64, 40)
    assert torch.equal(cols.dequantized().cpu(), g.dequantized())  # bit for bit: the same two float32 operations
    ids = torch.tensor([39, 0, 7, 39])
    assert torch.equal(cols.rows(ids.to(DEV)).cpu(), g.dequantized(ids))
    assert cols.nbytes() == 40 * 64 * (1 + 4 / 16 + 4 / 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 5, 64])
@pytest.mark.parametrize(("group", "zeros"), [(16, False), (16, True), (32, False), (32, True)],
                         ids=["g16", "g16-terms", "g32", "g32-terms"])
def test_gguf_gemm_default_config(dtype: torch.dtype, m: int, group: int, zeros: bool) -> None:
    """The tiles a call gets by default: gemv for 1 row, MMA for 5 and 64."""
    g = generator("gguf-gemm", dtype, m, group, zeros)
    w = random_grouped(g, N, K, group, zeros)
    x = (torch.randn(m, K, generator=g) * 2).to(dtype)
    cols = gg.columns(w, DEV)
    out = poison(m, N, dtype=dtype, device=DEV)
    res = gg.gguf_gemm(x.to(DEV), cols.qt, cols.scales_t, cols.zeros_t, out=out)
    assert res is out
    check(out, gg.gguf_gemm_ref(x, w), dtype)


CONFIGS = [  # both kinds at other tiles, split-K (even and uneven slices), a gemv K tile falling back to 32
    gg.GroupedConfig("gemv", 1, 32, 128),
    gg.GroupedConfig("gemv", 1, 64, 64, split_k=3),
    gg.GroupedConfig("mma", 16, 32, split_k=2),
    gg.GroupedConfig("mma", 32, 128, split_k=3),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize(("group", "zeros"), [(16, True), (32, True), (32, False)], ids=["g16-terms", "g32-terms", "g32"])
def test_gguf_gemm_every_kind_and_split(cfg: gg.GroupedConfig, group: int, zeros: bool) -> None:
    k = 160  # five groups of 32: gemv's 128- and 64-input tiles do not divide it, the splits are uneven
    g = generator("gguf-configs", cfg, group, zeros)
    w = random_grouped(g, N, k, group, zeros)
    x = torch.randn(5, k, generator=g).half()
    cols = gg.columns(w, DEV)
    out = poison(5, N, dtype=torch.float16, device=DEV)
    gg.gguf_gemm(x.to(DEV), cols.qt, cols.scales_t, cols.zeros_t, out=out, config=cfg)
    check(out, gg.gguf_gemm_ref(x, w), torch.float16)


def test_default_tiles_per_m() -> None:
    assert [gg.default_config(m).kind for m in (1, 3, 4, 5, 16, 64, 300)] == ["gemv"] * 3 + ["mma"] * 4
    assert gg.default_config(300).block_m == 64 and gg.default_config(5).block_m == 16


def test_rows_do_not_depend_on_the_batch_within_a_bucket() -> None:
    """A row's result is bit-identical whether it runs with 5 or 8 rows (one bucket: what CUDA graphs pad to)."""
    g = generator("gguf-bucket")
    w = random_grouped(g, N, K, 32, True)
    x = torch.randn(8, K, generator=g).half().to(DEV)
    cols = gg.columns(w, DEV)
    args = (cols.qt, cols.scales_t, cols.zeros_t)
    assert torch.equal(gg.gguf_gemm(x[:5], *args), gg.gguf_gemm(x, *args)[:5])


def test_bad_inputs_are_refused() -> None:
    w = gg.columns(random_grouped(generator("gguf-bad"), 16, 64, 32, False), DEV)
    x = torch.randn(2, 64).to(DEV)
    with pytest.raises(AssertionError):
        gg.gguf_gemm(x[:, :32], w.qt, w.scales_t)  # K differs from the weight's
    with pytest.raises(AssertionError):
        gg.gguf_gemm(x.double(), w.qt, w.scales_t)  # float64 activations
    with pytest.raises(AssertionError):
        gg.gguf_gemm(x, w.qt.T, w.scales_t)  # the CPU's (N, K) rows instead of the column layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [16, 32])
def test_gguf_linear_on_the_triton_path_equals_its_cpu_path(dtype: torch.dtype, group: int) -> None:
    """swap_in_grouped with a device: every grouped linear on the Triton GEMM, the embedding and the tied head on the
    column layout; against the same model swapped in for the CPU without the C kernel (torch on the float32 values)."""
    from torch import nn

    from backend.quant.gguf_grouped import swap_in_grouped
    from backend.quant.gguf_linear import GgufEmbedding, GgufLinear

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("Config", (), {"tie_word_embeddings": True})()
            self.embed_tokens = nn.Embedding(48, K)
            self.proj = nn.Linear(K, N, bias=False)
            self.lm_head = nn.Linear(K, 48, bias=False)

    g = generator("gguf-linear", dtype, group)
    weights = {"embed_tokens": random_grouped(g, 48, K, group, True), "proj": random_grouped(g, N, K, group, False)}

    def state() -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for stem, w in weights.items():
            out[f"{stem}.gq"], out[f"{stem}.gs"] = w.q, w.scales
            if w.zeros is not None:
                out[f"{stem}.gz"] = w.zeros
        return out

    cpu, gpu = Tiny(), Tiny()
    swap_in_grouped(cpu, state(), None)
    swap_in_grouped(gpu, state(), None, device=DEV)
    assert isinstance(gpu.lm_head, GgufLinear) and isinstance(gpu.embed_tokens, GgufEmbedding)
    assert gpu.lm_head.weight_q is gpu.embed_tokens.weight_q  # the tied table held once, in the column layout
    assert [m.mode for m in (cpu.proj, cpu.lm_head)] == ["torch"] * 2
    assert [m.mode for m in (gpu.proj, gpu.lm_head)] == ["triton"] * 2 and "triton" in gpu.proj.extra_repr()
    assert gpu.proj.weight_bytes() == cpu.proj.weight_bytes()  # the same bytes (72 rows: no octet padded)
    ids = torch.tensor([[3, 47, 0]])
    e_cpu, e_gpu = cpu.embed_tokens(ids), gpu.embed_tokens(ids.to(DEV))
    assert torch.equal(e_gpu.cpu(), e_cpu)
    x = (torch.randn(2, 3, K, generator=g) * 2).to(dtype)
    for name in ("proj", "lm_head"):
        want, got = getattr(cpu, name)(x), getattr(gpu, name)(x.to(DEV))
        assert got.shape == want.shape and got.dtype == dtype
        check(got.float(), want.double(), dtype)
