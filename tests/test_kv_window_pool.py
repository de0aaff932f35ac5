"""The windowed layers' own KV pool (backend/engine/kv_cache.py), for models that mix full and sliding-window layers:
the block bookkeeping on its own, and the engine against HF transformers with it (chunked prefill past the window,
prefix-cache hits that need the window's blocks, preemption), holding per sequence about a window of blocks in the
windowed layers' pool while the full layers' table covers the whole context."""

from pathlib import Path

from transformers import Gemma3TextConfig, Qwen2Config

from backend.config import EngineConfig
from backend.engine.block_pool import BlockPool
from backend.engine.kv_cache import KVCacheManager
from backend.engine.llm_engine import LLMEngine
from backend.engine.request import Sequence
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import assert_no_leaks, hf_greedy, run_to_completion, save_random_model, token_ids

BS, WINDOW = 4, 10


def computed(kv: KVCacheManager, seq: Sequence, n: int, cached: object = None) -> None:
    """Allocate and 'compute' n more tokens of seq, as a step would."""
    assert kv.allocate_slots(seq, n, cached)  # type: ignore[arg-type]
    seq.num_computed_tokens += n
    kv.cache_full_blocks(seq)


def test_window_table_frees_only_the_windowed_layers_blocks() -> None:
    kv = KVCacheManager(BlockPool(64), BS, WINDOW, window_pool=BlockPool(12))
    seq = Sequence("a", 0, list(range(2, 42)), 40, SamplingParams(), None)  # type: ignore[arg-type]
    for _ in range(4):
        computed(kv, seq, 10)
    # the next query (position 40) sees keys >= 31: blocks 0..6 (positions < 28) left the window
    assert all(b is not kv.null_block for b in seq.block_table) and len(seq.block_table) == 10
    assert [b is kv.null_block for b in seq.window_table] == [True] * 7 + [False] * 3
    assert kv.window_pool is not None and kv.window_pool.num_free == 12 - 3
    kv.free(seq)
    assert kv.pool.num_free == 64 and kv.window_pool.num_free == 12


def test_a_prefix_hit_needs_the_window_before_it() -> None:
    kv = KVCacheManager(BlockPool(64), BS, WINDOW, window_pool=BlockPool(12))
    prompt = list(range(2, 42))
    first = Sequence("a", 0, list(prompt), 40, SamplingParams(), None)  # type: ignore[arg-type]
    computed(kv, first, 40)
    kv.free(first)  # its blocks stay findable in both pools
    again = Sequence("b", 0, [*prompt, 99], 41, SamplingParams(), None)  # type: ignore[arg-type]
    hit = kv.find_cached_prefix(again)
    # all 10 blocks of the prompt; the window before position 40 (keys >= 31) is blocks 7..9 of the window pool
    assert hit.num_blocks == 10
    assert [b is kv.null_block for b in hit.window_blocks] == [True] * 7 + [False] * 3
    # the window pool evicts what the first sequence left there: no hit whose window is gone
    assert kv.window_pool is not None
    taken = [kv.window_pool.allocate() for _ in range(kv.window_pool.num_free)]
    assert kv.find_cached_prefix(again).num_blocks == 0
    for block in taken:
        kv.window_pool.free(block)
    # a hit stops where the windowed layers' blocks stop: here the first 3 blocks (positions < 12) are held again
    head = Sequence("c", 0, prompt[:13], 13, SamplingParams(), None)  # type: ignore[arg-type]
    computed(kv, head, 13)
    kv.free(head)
    assert kv.find_cached_prefix(again).num_blocks == 3
    computed(kv, again, 41 - 12, kv.find_cached_prefix(again))
    assert again.num_computed_tokens == 41
    kv.free(again)
    assert kv.pool.num_free == 64 and kv.window_pool.num_free == 12


# 3 layers (windowed, full, windowed), window 8: Gemma 3's pattern in small
GEMMA3 = Gemma3TextConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)
QWEN2 = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=512, use_sliding_window=True, sliding_window=20,
                    max_window_layers=1, tie_word_embeddings=False)


def test_engine_with_a_window_pool_matches_hf(tmp_path: Path) -> None:
    """Gemma 3 in small through a shared prefix longer than the window (prefix hits need the window's blocks) and
    chunked prefill past the window: HF's greedy tokens, and the full layer's pool holds more than one pool would."""
    hf = save_random_model(GEMMA3, tmp_path, 0.3)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), block_size=BS, max_num_seqs=4, max_num_batched_tokens=24,
                                    kv_cache_memory_mb=1))
    window_pool = engine.kv.window_pool
    assert window_pool is not None, "mixed windowed and full layers get a pool of the windowed layers' own"
    unsplit = 1024 // 3  # blocks of 1 KiB per layer (2 x 2 heads x 16 x 4 bytes x 4 tokens) a 1 MiB budget holds for 3
    assert engine.kv.pool.num_blocks > 2 * unsplit, "the full layer holds more than twice the context of one pool"
    assert engine.runner.window_cache is not None and engine.runner.window_cache.shape[0] == 2
    assert engine.runner.kv_cache.shape[0] == 1
    shared = [(j * 13) % 500 + 2 for j in range(48)]
    prompts = [shared + [(i * 29 + j * 7) % 500 + 2 for j in range(60 + 6 * i)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    # r0 first, alone: its blocks then wait in both pools' prefix cache for the others
    outs = run_to_completion(engine, {0: [("r0", prompts[0], params)]})
    outs |= run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts) if i]})
    assert engine.kv.hits >= 48 // BS * BS, "the shared prefix (48 tokens, window 8) should hit in both pools"
    for i, prompt in enumerate(prompts):
        assert token_ids(outs[f"r{i}"]) == hf_greedy(prompt, 24, hf), f"prompt {i} diverged"
    assert_no_leaks(engine)


def test_window_pool_holds_a_window_per_sequence_and_survives_preemption(tmp_path: Path) -> None:
    """Qwen2 with its last layer windowed: a full-layer budget so small that sequences are preempted; the windowed
    layer's table holds at most the window plus a chunk, the full layer's the whole context; HF's greedy tokens."""
    hf = save_random_model(QWEN2, tmp_path)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), block_size=BS, max_num_seqs=3, max_num_batched_tokens=13,
                                    kv_cache_memory_mb=1))
    assert engine.kv.window_pool is not None
    # squeeze the full layer's pool to 80 blocks (320 tokens) so three 150-token sequences cannot all run at once (a
    # budget in whole MiB holds thousands of blocks of this model)
    engine.kv.pool = BlockPool(80)
    engine.scheduler.kv = engine.runner.kv = engine.kv
    prompts = [[(i * 37 + j * 11) % 500 + 2 for j in range(n)] for i, n in enumerate((90, 100, 110))]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    outs: dict[str, list] = {}
    most_window, most_full = 0, 0
    while engine.has_work:
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        for seq in engine.scheduler.running:
            most_window = max(most_window, sum(b is not engine.kv.null_block for b in seq.window_table))
            most_full = max(most_full, len(seq.block_table))
    assert engine.scheduler.num_preemptions > 0
    assert most_window <= 20 // BS + 2 + 13 // BS + 1, most_window
    assert most_full >= 110 // BS
    for i, prompt in enumerate(prompts):
        assert token_ids(outs[f"r{i}"]) == hf_greedy(prompt, 40, hf), f"prompt {i} diverged"
    assert_no_leaks(engine)


def test_speculation_rolls_back_in_both_tables(tmp_path: Path) -> None:
    """N-gram drafts of 4 tokens every step on Gemma 3 in small: rejected drafts are trimmed from both block tables,
    and the output is still HF's greedy one."""
    hf = save_random_model(GEMMA3, tmp_path, 0.3)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), block_size=BS, max_num_seqs=4, max_num_batched_tokens=24,
                                    kv_cache_memory_mb=1, num_speculative_tokens=4, speculative_row_cost=0.0))
    assert engine.kv.window_pool is not None
    prompts = [[(j % (5 + i)) * 17 + 3 for j in range(40 + 9 * i)] for i in range(4)]  # repeating: n-grams to draft from
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    stats = engine.speculator.stats
    assert 0 < stats.accepted < stats.proposed, (stats.accepted, stats.proposed)
    for i, prompt in enumerate(prompts):
        assert token_ids(outs[f"r{i}"]) == hf_greedy(prompt, 48, hf), f"prompt {i} diverged"
    assert_no_leaks(engine)
