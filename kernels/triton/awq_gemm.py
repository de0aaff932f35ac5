"""W4A16 GEMM for AutoAWQ's "GEMM" layout: y = x @ dequant(qweight, qzeros, scales), dequantised in tiles.

Layout (AutoAWQ ``WQLinear_GEMM``, w_bit 4, K = in_features, N = out_features)
    qweight:  (K, N / 8) int32. Word c of row k packs columns 8c..8c+7: nibble i (bits 4i..4i+3) holds
              column 8c + AWQ_ORDER[i], AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; so column 8c + j is in nibble
              AWQ_REVERSE_ORDER[j] = [0, 4, 1, 5, 2, 6, 3, 7][j] = j // 2 + 4 * (j % 2).
    qzeros:   (K / group_size, N / 8) int32, the same packing, zero points 0..15 (stored as is, not minus 1).
    scales:   (K / group_size, N) float16 or bfloat16 (widened to float32 in the kernel).
    w[k, n] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n].
    Or, with ``zero_terms`` (K / group_size, N) float instead of qzeros (a GGUF file's Q4_0/Q4_1 blocks:
    backend/quant/gguf_blocks.py, whose Q4_1 minimum m is no integer multiple of the scale):
    w[k, n] = q[k, n] * s[k // group_size, n] - zero_terms[k // group_size, n].

Algorithm: three kinds (`GemmConfig.kind`), one chosen per shape
    mma      Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), split_k). A program owns an output tile and a slice of K.
             Per K tile (BLOCK_K rows, inside one quantisation group since group_size % BLOCK_K == 0): x tile
             [BLOCK_M, BLOCK_K]; the packed weights unpacked either word-wise (WORDS: each word loaded once, shifted
             by the 8 nibble offsets, [BLOCK_K, BLOCK_N / 8, 8] reshaped in order to [BLOCK_K, BLOCK_N]) or per
             column (column n loads word n // 8 itself); one row of zeros and scales for the group;
             w = (nibble - zero) * scale in fp32, cast to x's dtype; acc += x @ w with tl.dot (fp32 accumulation).
    gemv     Grid (M, cdiv(N, BLOCK_N), split_k): one row of x per program (decode). The weights as a
             [BLOCK_K, BLOCK_N / 8, 8] float32 tile, the nibble lane on its own axis (no reshape); products
             accumulated per (k, column) and summed over K once at the end.
    dequant  The dense (K, N) weight written in x's dtype (the same lane tiles), then torch.matmul (cuBLAS): for
             many rows, where the 4-bit bytes no longer decide the time.
    split_k > 1 (small M: too few output tiles to fill the GPU) writes fp32 partials, summed after in a fixed order.

Tiles per shape
    A call takes its configuration (`GemmConfig`) from, in order: the arguments; `tuned` (measured on this GPU the
    first time a shape is seen outside a CUDA-graph capture: every candidate of `candidates()` captured in a CUDA
    graph and replayed, the L2 flushed before each call, the fastest kept for the process, keyed by M's
    power-of-two bucket, N, K, group, dtypes); `default_config` (the heuristic, also what a capture or the
    interpreter uses). Within one bucket the configuration does not depend on M, so a row's result does not depend
    on how many rows share the call.

Limits
    4-bit only; group_size in {32, 64, 128} (any multiple of BLOCK_K works); N a multiple of 8; x
    (M, K) with a contiguous last dim in float16/bfloat16 (float32 accepted for testing); no bias (add it
    outside); no act-order / g_idx (that is GPTQ, not AWQ).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device, dot_upcast, mma, multi_processor_count

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


@triton.jit
def _unpack(words, shifts8, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_R, BLOCK_N / 8] packed words -> [BLOCK_R, BLOCK_N] nibbles in column order (shifts8: the 8 offsets)."""
    q = (words[:, :, None] >> shifts8[None, None, :]) & 0xF
    return tl.reshape(q, (BLOCK_R, BLOCK_N))


@triton.jit
def _awq_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_qw, stride_qz, stride_s, group_size, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WORDS: tl.constexpr,
    UPCAST: tl.constexpr, FLOAT_ZERO: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # 1. Where each output column's nibble sits in its packed word (AWQ's interleaved order).
    if WORDS:
        j8 = tl.arange(0, 8)
        shifts8 = (j8 // 2 + (j8 % 2) * 4) * 4
        words = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        w_mask = words < N // 8
    else:
        j = offs_n % 8
        shifts = (j // 2 + (j % 2) * 4) * 4
        word = offs_n // 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        # 2. Activations and packed weights of this K tile, unpacked to [BLOCK_K, BLOCK_N] nibbles.
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :], mask=m_mask[:, None],
                    other=0.0)
        if WORDS:
            qw = tl.load(qw_ptr + offs_k[:, None].to(tl.int64) * stride_qw + words[None, :], mask=w_mask[None, :],
                         other=0)
            q = _unpack(qw, shifts8, BLOCK_K, BLOCK_N)
        else:
            qw = tl.load(qw_ptr + offs_k[:, None].to(tl.int64) * stride_qw + word[None, :], mask=n_mask[None, :],
                         other=0)
            q = (qw >> shifts[None, :]) & 0xF
        # 3. The group's zero points and scales (one row: the tile lies inside one group).
        grp = k0 // group_size
        sc = tl.load(s_ptr + grp * stride_s + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if FLOAT_ZERO:  # qz_ptr holds float zero terms, one per column: w = q * s - zt
            zt = tl.load(qz_ptr + grp * stride_qz + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            w = (q.to(tl.float32) * sc[None, :] - zt[None, :]).to(x.dtype)
        else:
            if WORDS:
                qz = tl.load(qz_ptr + grp * stride_qz + words, mask=w_mask, other=0)
                z = tl.reshape(_unpack(qz[None, :], shifts8, 1, BLOCK_N), (BLOCK_N,))
            else:
                qz = tl.load(qz_ptr + grp * stride_qz + word, mask=n_mask, other=0)
                z = (qz >> shifts) & 0xF
            w = ((q - z[None, :]).to(tl.float32) * sc[None, :]).to(x.dtype)
        # 4. The MMA, fp32 accumulation.
        acc = mma(x, w, acc, UPCAST)
    out_ptrs = out_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * stride_om
    out_ptrs += offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _weight_lanes(qw_ptr, qz_ptr, s_ptr, offs_k, words, w_mask, grp, stride_qw, stride_qz, stride_s,
                  FLOAT_ZERO: tl.constexpr):
    """The float32 weights of rows offs_k and columns 8 * words + j as a [rows, words, 8] tile: nibble lane j stays on
    the last axis, so a word is loaded once and nothing is reshaped (no layout change between loads and math)."""
    j8 = tl.arange(0, 8)
    shifts = (j8 // 2 + (j8 % 2) * 4) * 4
    cols = words[:, None] * 8 + j8[None, :]
    qw = tl.load(qw_ptr + offs_k[:, None].to(tl.int64) * stride_qw + words[None, :], mask=w_mask[None, :], other=0)
    q = ((qw[:, :, None] >> shifts[None, None, :]) & 0xF).to(tl.float32)
    sc = tl.load(s_ptr + grp * stride_s + cols, mask=w_mask[:, None], other=0.0).to(tl.float32)
    if FLOAT_ZERO:
        zt = tl.load(qz_ptr + grp * stride_qz + cols, mask=w_mask[:, None], other=0.0).to(tl.float32)
        w = q * sc[None, :, :] - zt[None, :, :]
    else:
        qz = tl.load(qz_ptr + grp * stride_qz + words, mask=w_mask, other=0)
        z = ((qz[:, None] >> shifts[None, :]) & 0xF).to(tl.float32)
        w = (q - z[None, :, :]) * sc[None, :, :]
    return w


@triton.jit
def _awq_gemv_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_qw, stride_qz, stride_s, group_size, k_per_split,
    BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, FLOAT_ZERO: tl.constexpr,
):
    """One row of x per program (decode): products accumulated per (k, column) in fp32 and summed over K once at the
    end, so the K loop has no cross-thread reduction and no MMA tile padded from 1 row to 16."""
    row = tl.program_id(0).to(tl.int64)
    pid_w = tl.program_id(1)
    pid_k = tl.program_id(2)
    words = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_mask = words < N // 8
    acc = tl.zeros([BLOCK_K, BLOCK_W, 8], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):  # whole tiles: K and the split are multiples of BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + row * stride_xm + offs_k).to(tl.float32)
        w = _weight_lanes(qw_ptr, qz_ptr, s_ptr, offs_k, words, w_mask, k0 // group_size, stride_qw, stride_qz,
                          stride_s, FLOAT_ZERO)
        acc += xk[:, None, None] * w
    cols = words[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(out_ptr + pid_k.to(tl.int64) * M * N + row * stride_om + cols,
             tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=w_mask[:, None])


@triton.jit
def _awq_dequant_kernel(
    qw_ptr, qz_ptr, s_ptr, w_ptr, N, stride_qw, stride_qz, stride_s, group_size,
    BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, FLOAT_ZERO: tl.constexpr,
):
    """The dense (K, N) weight in w_ptr's dtype, for many rows: then cuBLAS runs the product at its own speed."""
    pid_k = tl.program_id(0)
    pid_w = tl.program_id(1)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    words = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_mask = words < N // 8
    w = _weight_lanes(qw_ptr, qz_ptr, s_ptr, offs_k, words, w_mask, (pid_k * BLOCK_K) // group_size, stride_qw,
                      stride_qz, stride_s, FLOAT_ZERO)
    cols = words[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(w_ptr + offs_k[:, None, None].to(tl.int64) * N + cols[None, :, :], w.to(w_ptr.dtype.element_ty),
             mask=w_mask[None, :, None])


KINDS = ("mma", "gemv", "dequant")


@dataclass(frozen=True)
class GemmConfig:
    """One way to run a shape. kind: mma (tl.dot tiles of block_m rows), gemv (one row per program; block_m 1),
    dequant (the dense weight written once per call, then cuBLAS: for many rows). split_k None: enough K slices for
    ~2 programs per SM, counted from M's bucket, not M."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int | None = None
    words: bool = True
    num_warps: int = 4
    num_stages: int = 3
    kind: str = "mma"

    def label(self) -> str:
        split = "auto" if self.split_k is None else self.split_k
        return (f"{self.kind}_m{self.block_m}n{self.block_n}k{self.block_k}s{split}{'w' if self.words else 'c'}"
                f"_{self.num_warps}x{self.num_stages}")


def m_bucket(m: int) -> int:
    """The power of two at or above M: calls in one bucket share a tile configuration."""
    return triton.next_power_of_2(max(1, m))


def default_config(m: int, group_size: int) -> GemmConfig:
    """The heuristic: MMA tiles of up to 64 rows, 64 columns, K tiles of up to 64 inside a group, words unpacked."""
    return GemmConfig(min(64, max(16, m_bucket(m))), 64, min(group_size, 64))


def candidates(m: int, group_size: int) -> list[GemmConfig]:
    """What the tuner times for M's bucket: GEMV programs for decode-sized calls, MMA tiles of growing height, the
    dequantize-then-cuBLAS route for many rows, and the heuristic's tile with the per-column loads (the previous
    unpacking), so a regression of either unpacking shows."""
    bucket, bk = m_bucket(m), min(group_size, 64)
    out: list[GemmConfig] = []
    if bucket <= 16:  # decode: one row per program, wide column tiles
        for bn, k, warps in ((128, 64, 4), (256, 32, 4), (256, 64, 8), (512, 32, 8)):
            out.append(GemmConfig(1, bn, min(k, group_size), None, True, warps, 3, "gemv"))
    heights = [16] if bucket <= 16 else [16, 32, 64] if bucket <= 64 else [64, 128]
    out += [GemmConfig(h, bn, bk, None, True, 8 if h * bn >= 8192 else 4) for h in heights for bn in (64, 128)]
    if bucket >= 64:
        out.append(GemmConfig(1, 128, bk, 1, True, 4, 3, "dequant"))
    default = default_config(m, group_size)
    out += [default, GemmConfig(default.block_m, default.block_n, default.block_k, None, False)]
    return list(dict.fromkeys(out))


tuned: dict[tuple, GemmConfig] = {}  # (bucket, N, K, group, x dtype, scales dtype, float zeros) -> the fastest
tuning_ms: dict[tuple, dict[str, float]] = {}  # the same keys -> every candidate's time (for bench.gpu's report)
_flush: dict[torch.device, torch.Tensor] = {}


def _launch(x, qweight, qzeros, scales, out, group_size: int, cfg: GemmConfig, float_zero: bool):
    M, K = x.shape
    N = qweight.shape[1] * 8
    block_k = min(cfg.block_k, group_size)
    assert cfg.kind in KINDS, cfg
    assert group_size % block_k == 0 and block_k >= 16, (group_size, block_k)
    assert cfg.block_n % 8 == 0 and cfg.block_n >= 16, cfg
    strides = (qweight.stride(0), qzeros.stride(0), scales.stride(0))
    if cfg.kind == "dequant":
        w = torch.empty(K, N, dtype=x.dtype, device=x.device)
        _awq_dequant_kernel[(K // block_k, triton.cdiv(N, cfg.block_n))](
            qweight, qzeros, scales, w, N, *strides, group_size,
            BLOCK_W=cfg.block_n // 8, BLOCK_K=block_k, FLOAT_ZERO=float_zero, num_warps=cfg.num_warps,
        )
        return torch.matmul(x, w, out=out)
    # programs counted from M's bucket, not M: the split, and so each row's sums, are the same for every M in it
    tiles = triton.cdiv(m_bucket(M), cfg.block_m) * triton.cdiv(N, cfg.block_n)
    split_k = cfg.split_k
    if split_k is None:
        split_k = 1
        if x.device.type == "cuda":
            split_k = max(1, min(triton.cdiv(2 * multi_processor_count(x.device), tiles), K // block_k, 16))
    k_per_split = triton.cdiv(K // block_k, split_k) * block_k
    split_k = triton.cdiv(K, k_per_split)
    target = out if split_k == 1 else torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
    common = (x, qweight, qzeros, scales, target, M, N, K, x.stride(0), N if split_k > 1 else out.stride(0), *strides,
              group_size, k_per_split)
    if cfg.kind == "gemv":
        _awq_gemv_kernel[(M, triton.cdiv(N, cfg.block_n), split_k)](
            *common, BLOCK_W=cfg.block_n // 8, BLOCK_K=block_k, FLOAT_ZERO=float_zero,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    else:
        _awq_gemm_kernel[(triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), split_k)](
            *common, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, WORDS=cfg.words,
            UPCAST=dot_upcast(_awq_gemm_kernel, x.dtype), FLOAT_ZERO=float_zero,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if split_k > 1:
        out.copy_(target.sum(dim=0))
    return out


def _graph_ms(fn, reps: int) -> float:
    """Median ms of one replay of a CUDA graph holding `fn` (launch overhead on the host is not in it)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _time_config(run, flush: torch.Tensor, reps: int = 5, calls: int = 8) -> float:
    """GPU ms of one `run`, each after an L2 flush (a weight that fits in L2 would time the cache): `calls` of
    (flush, run) and `calls` flushes alone, each captured in a CUDA graph and replayed, the difference per call.
    Timed eagerly, a call of a few microseconds on the GPU measures the host's launch instead (seen on an H200:
    88 us eager for a 16 us kernel), and the fastest launcher, not the fastest kernel, would win."""
    run()
    torch.cuda.synchronize()

    def flushed_runs() -> None:
        for _ in range(calls):
            flush.zero_()
            run()

    def flushes() -> None:
        for _ in range(calls):
            flush.zero_()

    both, alone = _graph_ms(flushed_runs, reps), _graph_ms(flushes, reps)
    return max(both - alone, 1e-6) / calls


def tune(x, qweight, qzeros, scales, out, group_size: int, float_zero: bool) -> tuple[GemmConfig, dict[str, float]]:
    """Time every candidate for this call's shape on its GPU: (the fastest, each candidate's ms). A candidate that
    fails to compile, launch or be captured (e.g. out of shared memory for its tile on this GPU) is not one here."""
    flush = _flush.setdefault(x.device, torch.empty(128 * 2**20 // 4, dtype=torch.int32, device=x.device))
    timed: dict[str, float] = {}
    best, best_ms = default_config(x.shape[0], group_size), float("inf")
    for cfg in candidates(x.shape[0], group_size):
        try:
            ms = _time_config(lambda c=cfg: _launch(x, qweight, qzeros, scales, out, group_size, c, float_zero), flush)
        except Exception:  # not a candidate on this GPU
            continue
        timed[cfg.label()] = round(ms, 5)
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best, timed


def awq_gemm(x, qweight, qzeros, scales, group_size: int, out=None, split_k: int | None = None,
             block_m: int | None = None, block_n: int | None = None, block_k: int | None = None, zero_terms=None,
             config: GemmConfig | None = None):
    """y = x @ W for an AWQ-packed W (K, N); x (M, K) -> (M, N) in x's dtype. `zero_terms` (K / group_size, N) float
    replaces qzeros (then None): w = q * scale - zero_term. Tiles: `config`, or the given block sizes over the
    heuristic, or the tuned configuration for this shape (on a GPU), or the heuristic."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    M, K = x.shape
    assert qweight.dtype == torch.int32 and qweight.dim() == 2 and qweight.shape[0] == K, (qweight.dtype, qweight.shape, K)
    assert qweight.is_contiguous(), qweight.stride()
    N = qweight.shape[1] * 8
    assert K % group_size == 0, (K, group_size)
    if zero_terms is not None:
        assert qzeros is None, "zero_terms replace qzeros"
        assert zero_terms.shape == (K // group_size, N) and zero_terms.is_contiguous(), zero_terms.shape
        assert zero_terms.dtype in (torch.float16, torch.bfloat16, torch.float32), zero_terms.dtype
        qzeros = zero_terms  # the kernel reads them through the zero points' pointer (FLOAT_ZERO)
    else:
        assert qzeros.dtype == torch.int32, qzeros.dtype
        assert qzeros.shape == (K // group_size, N // 8) and qzeros.is_contiguous(), qzeros.shape
    assert scales.shape == (K // group_size, N) and scales.is_contiguous(), scales.shape
    assert scales.dtype in (torch.float16, torch.bfloat16, torch.float32), scales.dtype
    assert x.dtype in (torch.float16, torch.bfloat16, torch.float32), x.dtype
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (M, N) and out.dtype == x.dtype and out.stride(1) == 1, (out.shape, out.dtype)
    check_device(_awq_gemm_kernel, x, qweight, qzeros, scales, out)
    if M == 0:
        return out
    float_zero = zero_terms is not None
    if config is None and (split_k, block_m, block_n, block_k) != (None,) * 4:
        d = default_config(M, group_size)
        config = GemmConfig(block_m or d.block_m, block_n or d.block_n, block_k or d.block_k, split_k)
    if config is None and x.device.type == "cuda":
        key = (m_bucket(M), N, K, group_size, x.dtype, scales.dtype, float_zero)
        config = tuned.get(key)
        if config is None and not torch.cuda.is_current_stream_capturing():
            config, tuning_ms[key] = tune(x, qweight, qzeros, scales, out, group_size, float_zero)
            tuned[key] = config
    return _launch(x, qweight, qzeros, scales, out, group_size, config or default_config(M, group_size), float_zero)


# ---- torch reference: pack / unpack / dequantise / quantise / matmul ----

def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """(R, C) ints in 0..15 -> (R, C / 8) int32 in AWQ's nibble order."""
    r, c = values.shape
    v = values.to(torch.int64).reshape(r, c // 8, 8)[:, :, AWQ_ORDER]
    packed = (v << (4 * torch.arange(8, device=values.device))).sum(-1)  # < 2^32, no overlap between nibbles
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """(R, C / 8) int32 -> (R, C) int32 values 0..15 (inverse of ``awq_pack``)."""
    shifts = 4 * torch.tensor(AWQ_REVERSE_ORDER, device=packed.device, dtype=torch.int32)
    return ((packed[:, :, None] >> shifts) & 0xF).reshape(packed.shape[0], -1)


def awq_dequantize(qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """The float32 (K, N) weight the packed tensors stand for."""
    q = awq_unpack(qweight).float()
    z = awq_unpack(qzeros).float().repeat_interleave(group_size, dim=0)
    return (q - z) * scales.float().repeat_interleave(group_size, dim=0)


def awq_quantize(w: torch.Tensor, group_size: int):
    """Asymmetric min/max 4-bit quantisation of a (K, N) weight -> (qweight, qzeros, scales fp16)."""
    k, n = w.shape
    g = w.float().reshape(k // group_size, group_size, n)
    lo, hi = g.amin(1), g.amax(1)
    scales = ((hi - lo).clamp(min=1e-5) / 15).half()
    zeros = (-lo / scales.float()).round().clamp(0, 15)
    q = (g / scales.float()[:, None] + zeros[:, None]).round().clamp(0, 15).reshape(k, n)
    return awq_pack(q.int()), awq_pack(zeros.int()), scales


def awq_gemm_ref(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """Torch reference: dequantise to float32 and matmul; result in x's dtype."""
    return (x.float() @ awq_dequantize(qweight, qzeros, scales, group_size)).to(x.dtype)
