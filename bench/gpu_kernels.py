"""The Triton kernels' own GPU time at Llama-3.1-8B's shapes, against torch's kernels on the same data (bench.gpu).

Timing: each case's calls (rotating over enough copies of the inputs that they do not fit in L2) are captured in one
CUDA graph and the graph's replays timed with CUDA events, so the launchers' Python is not in the figure (`do_bench`
around a launcher would time it). Where a capture fails the case is timed eagerly with events and says so.
On a CPU (--dry-run) every case runs once at toy sizes under Triton's interpreter and is checked against its torch
reference; no time is reported there.

    gemm      W4A16 (AWQ, group 128; GGUF blocks, group 32) against cuBLAS bf16, M = 1, 16, 64, 256, 8B's projections
    grouped   the grouped-int8 GEMM (GGUF blocks in their own bits: Q4_K/Q5_0/Q8_0's groups of 32, with terms; Q6_K's
              groups of 16) against cuBLAS bf16 on the dequantized weight, the same shapes; both kernel kinds timed
    decode    paged decode attention against SDPA's flash and cuDNN backends on the same K/V made contiguous
    prefill   causal flash prefill over the paged cache against SDPA flash, 2k-16k tokens
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ROTATE_BYTES = 256 * 2**20  # inputs rotated over at least this many bytes: several times an H100/H200's L2
BLOCK = 16


@dataclass(frozen=True)
class Ceilings:
    """What this device measured: device-to-device copy (bytes read + written per second), dense bf16 FLOP/s."""

    copy_bytes_per_s: float
    bf16_flops_per_s: float


def measure_ceilings(device: str) -> Ceilings:
    if device != "cuda":
        return Ceilings(float("nan"), float("nan"))
    a = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t_copy = event_ms(lambda: b.copy_(a), reps=10)
    x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t_mm = event_ms(lambda: x @ y, reps=10)
    return Ceilings(2 * a.numel() / (t_copy * 1e-3), 2 * 8192**3 / (t_mm * 1e-3))


def event_ms(fn: Callable[[], object], reps: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of `fn` by CUDA events (eager)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graph_us(calls: list[Callable[[], object]], reps: int = 7) -> tuple[float, str]:
    """Median GPU microseconds of one call: every call (one per input copy, repeated to >= 24 launches) captured in a
    CUDA graph, the replays timed. Falls back to events around an eager loop where capture fails."""
    seq = calls * max(1, math.ceil(24 / len(calls)))
    for c in calls:  # compile, tune, allocate outside the capture
        c()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in seq:
                c()
        return event_ms(graph.replay, reps=reps, warmup=2) * 1e3 / len(seq), "cuda_graph"
    except Exception as exc:  # a backend that cannot be captured is timed eagerly instead
        torch.cuda.synchronize()
        ms = event_ms(lambda: [c() for c in seq], reps=reps, warmup=1)
        return ms * 1e3 / len(seq), f"events (capture failed: {type(exc).__name__})"


def copies_for(nbytes: int) -> int:
    return max(1, min(64, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def _share(nbytes: float, us: float, rate: float) -> float | None:
    return round(nbytes / (us * 1e-6) / rate, 3) if us and rate == rate else None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


# ---- W4A16 GEMM ----------------------------------------------------------------------------------
def gemm_cases(dry: bool) -> list[tuple[int, int, int]]:
    if dry:
        return [(1, 256, 512), (16, 512, 256)]
    return [(m, k, n) for (k, n) in ((4096, 4096), (4096, 14336), (14336, 4096)) for m in (1, 16, 64, 256)]


def _awq_tensors(k: int, n: int, group: int, device: str, *, g: torch.Generator, gguf: bool):
    qw = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), dtype=torch.int32, device=device, generator=g)
    sc = (torch.rand(k // group, n, device=device, generator=g) * 0.01 + 0.002).half()
    if gguf:  # GGUF blocks on CUDA: fp16 zero terms -m (Int4Linear.prepare_triton_blocks)
        return qw, None, sc, (torch.rand(k // group, n, device=device, generator=g) * 0.08).half()
    qz = torch.randint(-(2**31), 2**31 - 1, (k // group, n // 8), dtype=torch.int32, device=device, generator=g)
    return qw, qz, sc, None


def bench_gemm(device: str, ceil: Ceilings, dry: bool) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for m, k, n in gemm_cases(dry):
        for fmt, group in (("awq", 128), ("gguf", 32)):
            if fmt == "gguf" and m > 16:
                continue  # the decode sizes: where 4-bit weights should pay
            rows.append(_gemm_case(m, k, n, fmt, group=group, device=device, g=g, ceil=ceil, dry=dry))
    return rows


def _gemm_case(m: int, k: int, n: int, fmt: str, *, group: int, device: str, g: torch.Generator, ceil: Ceilings,
               dry: bool) -> dict[str, Any]:
    from kernels.triton import awq_gemm as aw

    gguf = fmt == "gguf"
    w4_bytes = k * n // 2 + (k // group) * n * 2 + (k // group) * (n * 2 if gguf else n // 2)
    sets = [_awq_tensors(k, n, group, device, g=g, gguf=gguf) for _ in range(1 if dry else copies_for(w4_bytes))]
    x = torch.randn(m, k, device=device, generator=g).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    row: dict[str, Any] = {"kernel": "w4a16_gemm", "format": fmt, "group": group, "m": m, "k": k, "n": n,
                           "weight_bytes": w4_bytes}

    def call(s: tuple, config: Any = None) -> torch.Tensor:
        qw, qz, sc, zt = s
        return aw.awq_gemm(x, qw, qz, sc, group_size=group, out=out, zero_terms=zt, config=config)

    if dry:
        qw, qz, sc, zt = sets[0]
        w = aw.awq_unpack(qw).float() * sc.float().repeat_interleave(group, 0)
        w = w - (zt.float() if gguf else aw.awq_unpack(qz).float() * sc.float()).repeat_interleave(group, 0)
        row["rel_err"] = rel_err(call(sets[0]), x.float() @ w)
        return row
    us, how = graph_us([lambda s=s: call(s) for s in sets])
    key = (aw.m_bucket(m), n, k, group, x.dtype, sets[0][2].dtype, gguf)
    cfg = aw.tuned.get(key)
    row["tuner_us"] = {label: round(ms * 1e3, 2) for label, ms in aw.tuning_ms.get(key, {}).items()}
    # every candidate as this bench times it (rotating copies, graph replay): whether the tuner picked the fastest
    row["candidates_us"] = {c.label(): round(graph_us([lambda s=s, c=c: call(s, c) for s in sets])[0], 2)
                            for c in aw.candidates(m, group)}
    default = aw.default_config(m, group)
    us_default, _ = graph_us([lambda s=s: call(s, default) for s in sets])
    row.update({"us": round(us, 2), "timing": how, "config": cfg.label() if cfg else None,
                "default_us": round(us_default, 2), "default_config": default.label(),
                "share_of_copy_bw": _share(w4_bytes + 2 * m * (k + n), us, ceil.copy_bytes_per_s)})
    if not gguf:
        w16 = [torch.randn(n, k, device=device, generator=g).to(torch.bfloat16) for _ in range(copies_for(2 * k * n))]
        us_cublas, _ = graph_us([lambda w=w: F.linear(x, w) for w in w16])
        row.update({"cublas_bf16_us": round(us_cublas, 2), "speedup_vs_cublas": round(us_cublas / us, 3),
                    "cublas_share_of_copy_bw": _share(2 * k * n + 2 * m * (k + n), us_cublas, ceil.copy_bytes_per_s)})
    return row


# ---- grouped-int8 GEMM (GGUF blocks in their own bits) ---------------------------------------------------------
GROUPED_FORMATS = (("g32_terms", 32, True), ("g16", 16, False))  # Q4_K-like (Q5_0 / Q8_0: no terms); Q6_K-like


def bench_grouped(device: str, ceil: Ceilings, dry: bool) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(0)
    return [_grouped_case(m, k, n, fmt, device=device, g=g, ceil=ceil, dry=dry)
            for m, k, n in gemm_cases(dry) for fmt in GROUPED_FORMATS]


def _grouped_case(m: int, k: int, n: int, fmt: tuple[str, int, bool], *, device: str, g: torch.Generator,
                  ceil: Ceilings, dry: bool) -> dict[str, Any]:
    from kernels.cpu.wg8a8 import GroupedInt8
    from kernels.triton import gguf_gemm as gg

    name, group, terms = fmt
    nbytes = k * n + 4 * n * (k // group + (k // 32 if terms else 0))

    def weight() -> GroupedInt8:
        q = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device, generator=g)
        s = torch.rand(n, k // group, device=device, generator=g) * 0.002 + 1e-4
        z = torch.randn(n, k // 32, device=device, generator=g) * 0.01 if terms else None
        return GroupedInt8(q, s, z)

    first = weight()
    sets = [gg.columns(first, device)] + [gg.columns(weight(), device) for _ in range(0 if dry else copies_for(nbytes) - 1)]
    x = torch.randn(m, k, device=device, generator=g).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    row: dict[str, Any] = {"kernel": "grouped_int8_gemm", "format": name, "group": group, "m": m, "k": k, "n": n,
                           "weight_bytes": nbytes}

    def call(w: gg.GroupedColumns, config: gg.GroupedConfig | None = None) -> torch.Tensor:
        return gg.gguf_gemm(x, w.qt, w.scales_t, w.zeros_t, out=out, config=config)

    if dry:
        row["rel_err"] = rel_err(call(sets[0]), gg.gguf_gemm_ref(x.cpu(), GroupedInt8(*(
            None if t is None else t.cpu() for t in (first.q, first.scales, first.zeros)))))
        return row
    default = gg.default_config(m)
    # the other kind too, at its own default tile: where the switch between them (DECODE_ROWS) belongs
    other = gg.GroupedConfig("mma", 16, 64) if default.kind == "gemv" else gg.GroupedConfig("gemv", 1, 128, 64)
    us, how = graph_us([lambda w=w: call(w, default) for w in sets])
    us_other, _ = graph_us([lambda w=w: call(w, other) for w in sets])
    deq = [w.dequantized().to(torch.bfloat16) for w in sets[:copies_for(2 * k * n)]]
    us_cublas, _ = graph_us([lambda w=w: F.linear(x, w) for w in deq])
    row.update({"us": round(us, 2), "timing": how, "config": default.label(), "other_config": other.label(),
                "other_us": round(us_other, 2), "cublas_bf16_us": round(us_cublas, 2),
                "speedup_vs_cublas": round(us_cublas / us, 3),
                "share_of_copy_bw": _share(nbytes + 2 * m * (k + n), us, ceil.copy_bytes_per_s)})
    return row


# ---- attention -----------------------------------------------------------------------------------
def _paged_kv(b: int, ctx: int, hkv: int, d: int, *, device: str, g: torch.Generator):
    """K/V for b sequences of ctx tokens in shuffled pages, and the same K/V contiguous (b, hkv, ctx, d)."""
    per = ctx // BLOCK
    perm = torch.randperm(b * per, device=device, generator=g).to(torch.int32)
    kc = torch.randn(b * per, BLOCK, hkv, d, device=device, generator=g).to(torch.bfloat16)
    vc = torch.randn(b * per, BLOCK, hkv, d, device=device, generator=g).to(torch.bfloat16)
    bt = perm.view(b, per).contiguous()
    k = kc[bt.long()].reshape(b, ctx, hkv, d).transpose(1, 2).contiguous()
    v = vc[bt.long()].reshape(b, ctx, hkv, d).transpose(1, 2).contiguous()
    return kc, vc, bt, k, v


def _sdpa(backend_name: str, *args: torch.Tensor, **kw: Any) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, backend_name)):
        return F.scaled_dot_product_attention(*args, **kw)


def _timed_backends(row: dict[str, Any], calls: dict[str, list[Callable[[], object]]], nbytes: float, flops: float,
                    *, ceil: Ceilings) -> None:
    for name, fns in calls.items():
        try:
            us, how = graph_us(fns)
        except Exception as exc:  # a backend torch lacks for these shapes on this GPU
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            continue
        row[name] = {"us": round(us, 2), "timing": how, "share_of_copy_bw": _share(nbytes, us, ceil.copy_bytes_per_s),
                     "share_of_bf16_peak": _share(flops, us, ceil.bf16_flops_per_s)}
    ours = row.get("triton", {}).get("us")
    for name in calls:
        theirs = row.get(name, {}).get("us") if isinstance(row.get(name), dict) else None
        if name != "triton" and ours and theirs:
            row[name]["triton_time_ratio"] = round(ours / theirs, 3)  # < 1: ours faster


def bench_decode(device: str, ceil: Ceilings, dry: bool) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(1)
    cases = [(4, 2, 32, 2, 64)] if dry else [
        (32, 8, 128, 1, 4096), (32, 8, 128, 32, 4096), (32, 8, 128, 128, 1024), (32, 8, 64, 32, 4096)]
    return [_decode_case(*c, device=device, g=g, ceil=ceil, dry=dry) for c in cases]


def _decode_case(h: int, hkv: int, d: int, b: int, ctx: int, *, device: str, g: torch.Generator, ceil: Ceilings,  # noqa: PLR0917
                 dry: bool) -> dict[str, Any]:
    from kernels.triton import paged_decode as pd

    kv_bytes = 2 * b * ctx * hkv * d * 2
    sets = [_paged_kv(b, ctx, hkv, d, device=device, g=g) for _ in range(1 if dry else copies_for(kv_bytes))]
    q = torch.randn(b, h, d, device=device, generator=g).to(torch.bfloat16)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    row: dict[str, Any] = {"kernel": "paged_decode", "heads": h, "kv_heads": hkv, "head_dim": d, "batch": b,
                           "context": ctx, "kv_bytes": kv_bytes}
    if dry:
        kc, vc, bt, _, _ = sets[0]
        row["rel_err"] = rel_err(pd.paged_decode(q, kc, vc, bt, seq_lens=lens), pd.paged_decode_ref(q, kc, vc, bt, seq_lens=lens))
        return row
    q4 = q[:, :, None]
    calls = {
        "triton": [lambda s=s: pd.paged_decode(q, s[0], s[1], s[2], seq_lens=lens, out=out) for s in sets],
        "sdpa_flash": [lambda s=s: _sdpa("FLASH_ATTENTION", q4, s[3], s[4], enable_gqa=True) for s in sets],
        "sdpa_cudnn": [lambda s=s: _sdpa("CUDNN_ATTENTION", q4, s[3], s[4], enable_gqa=True) for s in sets],
    }
    _timed_backends(row, calls, kv_bytes + 4 * b * h * d, 4 * b * h * ctx * d, ceil=ceil)
    return row


def bench_prefill(device: str, ceil: Ceilings, dry: bool) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(2)
    cases = [(4, 2, 32, 64)] if dry else [(32, 8, 128, n) for n in (2048, 8192, 16384)]
    return [_prefill_case(*c, device=device, g=g, ceil=ceil, dry=dry) for c in cases]


def _prefill_case(h: int, hkv: int, d: int, n: int, *, device: str, g: torch.Generator, ceil: Ceilings,
                  dry: bool) -> dict[str, Any]:
    from kernels.triton import flash_prefill as fp

    kc, vc, bt, k, v = _paged_kv(1, n, hkv, d, device=device, g=g)
    q = torch.randn(n, h, d, device=device, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, n], dtype=torch.int32, device=device)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    row: dict[str, Any] = {"kernel": "flash_prefill", "heads": h, "kv_heads": hkv, "head_dim": d, "tokens": n}
    if dry:
        row["rel_err"] = rel_err(fp.flash_prefill(q, kc, vc, bt, cu_seqlens_q=cu, seq_lens=lens, max_query_len=n),
                                 fp.flash_prefill_ref(q, kc, vc, bt, cu_seqlens_q=cu, seq_lens=lens))
        return row
    out = torch.empty_like(q)
    qs = q.transpose(0, 1)[None]
    calls = {
        "triton": [lambda: fp.flash_prefill(q, kc, vc, bt, cu_seqlens_q=cu, seq_lens=lens, max_query_len=n, out=out)],
        "sdpa_flash": [lambda: _sdpa("FLASH_ATTENTION", qs, k, v, is_causal=True, enable_gqa=True)],
    }
    flops = 4 * h * d * n * (n + 1) / 2  # causal: half the score matrix, two matmuls
    _timed_backends(row, calls, 2 * (2 * n * h * d + 2 * n * hkv * d), flops, ceil=ceil)
    return row
