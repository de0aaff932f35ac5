"""Sliding-window attention: the kernels (Triton interpreter) against their references and SDPA, and the engine
against HF transformers on small random Mistral / Qwen2 configs with prompts longer than the window (torch and
Triton paths, chunked prefill), with KV blocks that left the window freed early."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import MistralConfig, Qwen2Config

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.sliding_window import blocks_out_of_window, freeable_window, layer_windows
from kernels.triton import flash_prefill as fp
from kernels.triton import paged_decode as pd
from kernels.triton.testing import assert_close, device_for, generator, poison, ready
from tests.engine_helpers import assert_no_leaks, hf_greedy, save_random_model, token_ids
from tests.test_kernels_attention import make_paged

ready(pd)
ready(fp)
DEV = device_for(pd)
WINDOW = 20
SMALL = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)
MISTRAL = MistralConfig(**SMALL, sliding_window=WINDOW, head_dim=16)
# Per-layer windows: Qwen2 windows the layers from max_window_layers on (transformers fills layer_types).
QWEN2 = Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=False)


def windowed_sdpa(q, k, v, offset, window):
    """q (m, H, D) at positions offset + i, k/v (n, Hkv, D): causal + window, float64 SDPA."""
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))
    qpos, kpos = offset + torch.arange(q.shape[1]), torch.arange(k.shape[1])
    mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > qpos[:, None] - window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(0, 1)


# ---- kernels ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [1, 7, 40])
def test_paged_decode_window(num_splits: int, window: int) -> None:
    g = generator("decode-window", num_splits, window)
    lengths = [1, 37, 130]
    k_cache, v_cache, bt, ks, vs = make_paged(g, lengths, 3, 64, 16, torch.float32)
    q = torch.randn(3, 9, 64, generator=g)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    ref = pd.paged_decode_ref(q, k_cache, v_cache, bt, seq_lens=seq_lens, window=window)
    for i, n in enumerate(lengths):
        want = windowed_sdpa(q[i : i + 1], ks[i], vs[i], n - 1, window)[0]
        torch.testing.assert_close(ref[i].double(), want, atol=1e-5, rtol=1e-5)
    out = poison(*q.shape, dtype=torch.float32, device=DEV)
    pd.paged_decode(*(t.to(DEV) for t in (q, k_cache, v_cache, bt, seq_lens)), out=out, num_splits=num_splits,
                    block_n=16, window=window)
    assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 9, 33])
def test_flash_prefill_window(dtype: torch.dtype, window: int) -> None:
    """Whole prompts, a chunk after a long prefix (chunked prefill), a single token: all windowed."""
    g = generator("prefill-window", dtype, window)
    seqs = [(37, 37), (5, 70), (1, 50), (20, 27)]
    k_cache, v_cache, bt, ks, vs = make_paged(g, [n for _, n in seqs], 3, 64, 16, dtype)
    q_lens = [m for m, _ in seqs]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([n for _, n in seqs], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 9, 64, generator=g).to(dtype)
    ref = fp.flash_prefill_ref(q.float(), k_cache.float(), v_cache.float(), bt, cu_seqlens_q=cu, seq_lens=seq_lens, window=window)
    for i, (m, n) in enumerate(seqs):
        a, b = int(cu[i]), int(cu[i + 1])
        want = windowed_sdpa(q[a:b].float(), ks[i].float(), vs[i].float(), n - m, window)
        torch.testing.assert_close(ref[a:b].double(), want, atol=1e-4, rtol=1e-4)
    out = poison(*q.shape, dtype=dtype, device=DEV)
    fp.flash_prefill(*(t.to(DEV) for t in (q, k_cache, v_cache, bt, cu, seq_lens)), max_query_len=max(q_lens),
                     out=out, block_m=16, block_n=16, window=window)
    assert_close(out, ref, dtype)


# ---- which layers, which blocks ---------------------------------------------------------------------------------
def test_layer_windows_and_freeable_blocks() -> None:
    assert layer_windows(MISTRAL) == [WINDOW, WINDOW] and freeable_window(MISTRAL) == WINDOW
    assert layer_windows(QWEN2) == [0, WINDOW] and freeable_window(QWEN2) == 0  # a full layer reads every block
    assert layer_windows(MistralConfig(**SMALL, sliding_window=None)) == [0, 0]
    # next query at position 40 sees keys >= 21: blocks [0, 16) go, block [16, 32) stays
    assert blocks_out_of_window(40, WINDOW, 16) == 1 and blocks_out_of_window(20, WINDOW, 16) == 0


# ---- the engine against HF ----------------------------------------------------------------------------------------
PROMPTS = [[(i * 37 + j * 11) % 500 + 2 for j in range(n)] for i, n in enumerate((9, 45, 70))]
NEW = 14


def engine_run(model_dir: Path, backend: str = "torch", **kw: object) -> tuple[LLMEngine, dict[str, list], int]:
    """Greedy outputs, chunked prefill; also the most KV blocks any sequence held at once."""
    engine = LLMEngine(EngineConfig(model=str(model_dir), kernel_backend=backend, max_num_batched_tokens=13,
                                    kv_cache_memory_mb=4, **kw))  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, params)
    outs: dict[str, list] = {}
    most = 0
    while engine.has_work:
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        held = [sum(b is not engine.kv.null_block for b in s.block_table) for s in engine.scheduler.running]
        most = max([most, *held])
    assert_no_leaks(engine)
    return engine, outs, most


@pytest.mark.parametrize("family", ["mistral", "qwen2-per-layer"])
def test_engine_matches_hf_beyond_the_window(family: str, tmp_path: Path) -> None:
    config = MISTRAL if family == "mistral" else QWEN2
    hf = save_random_model(config, tmp_path)
    engine, outs, most = engine_run(tmp_path, block_size=4)
    assert engine.max_model_len == config.max_position_embeddings  # the window no longer caps the context
    for i, prompt in enumerate(PROMPTS):
        assert token_ids(outs[f"r{i}"]) == hf_greedy(prompt, NEW, hf), f"{family}: prompt {i} diverged"
    if family == "mistral":  # the window (20 tokens) spans at most 6 blocks of 4, plus this step's chunk
        assert most <= WINDOW // 4 + 1 + 13 // 4 + 1, most
    else:  # the full layer needs every block: nothing is freed
        assert most >= -(-len(PROMPTS[2]) // 4)


@pytest.mark.parametrize("family", ["mistral", "qwen2-per-layer"])
def test_triton_path_matches_torch_with_window(family: str, tmp_path: Path) -> None:
    """Every layer windowed (blocks freed), and full and windowed layers mixed (the windowed layers' own pool)."""
    save_random_model(MISTRAL if family == "mistral" else QWEN2, tmp_path)
    torch_engine, torch_outs, _ = engine_run(tmp_path, "torch", block_size=4)
    triton_engine, triton_outs, _ = engine_run(tmp_path, "triton", block_size=4)
    assert (torch_engine.kv.window_pool is None) == (triton_engine.kv.window_pool is None) == (family == "mistral")
    for i in range(len(PROMPTS)):
        assert token_ids(triton_outs[f"r{i}"]) == token_ids(torch_outs[f"r{i}"]), f"prompt {i} diverged"
