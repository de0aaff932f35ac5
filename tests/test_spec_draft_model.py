"""Draft-model speculation: greedy is token-identical, sampling keeps the target's distribution, no KV leaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import (
    QUESTIONS,
    assert_no_leaks,
    check_mixed_speculation,
    make_engine,
    rtn_int4_model,
    run_to_completion,
    save_random_model,
    token_ids,
    write_tokenizer,
)

PROMPTS = QUESTIONS[:4]
MAX_NEW = 24
# The default draft is the AWQ INT4 copy `make serve` builds; `make test` has none, so the same format, rounded to
# nearest (tests/engine_helpers.py), drafts here.
DRAFT = {"num_speculative_tokens": 4, "speculative_method": "draft", "speculative_row_cost": 0.0}  # always 4 tokens


@pytest.mark.parametrize(
    "overrides", [{}, {"max_num_batched_tokens": 24, "kv_cache_memory_mb": 10}], ids=["plain", "chunked+preempted"]
)
def test_greedy_draft_speculation_is_exact_in_mixed_batches(
    prompts: list[list[int]], reference: list[list[int]], overrides: dict
) -> None:
    """Every other request opts out of speculation; all must match HF's greedy output token for token."""
    engine = make_engine(**DRAFT, speculative_model=str(rtn_int4_model()), **overrides)
    engine.speculator.draft_model.min_confidence = 0.0  # always draft k tokens: more rejections to roll back
    check_mixed_speculation(engine, prompts, reference, MAX_NEW, preempts=bool(overrides))


def test_aborts_mid_draft_leak_nothing(prompts: list[list[int]]) -> None:
    """Abort sampled, speculating requests after a few steps: no blocks leak, unverified drafts are not output."""
    # some drafts wait, reserved, for a later step
    engine = make_engine(**DRAFT, speculative_model=str(rtn_int4_model()), max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=MAX_NEW, ignore_eos=True)
    delivered: dict[str, int] = {}
    for i, p in enumerate(prompts[:4]):
        engine.add_request(f"r{i}", p, params)
    for _ in range(4):
        for out in engine.step():
            delivered[out.request_id] = delivered.get(out.request_id, 0) + sum(len(d.token_ids) for d in out.deltas)
    assert engine.speculator.stats.proposed > 0
    for i in range(4):
        out = engine.abort(f"r{i}")
        assert out is not None and out.finished
        assert out.usage.completion_tokens == delivered.get(f"r{i}", 0) + sum(len(d.token_ids) for d in out.deltas)
    assert_no_leaks(engine)


def test_unknown_method_and_mismatched_vocabulary_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="speculative_method"):
        make_engine(num_speculative_tokens=2, speculative_method="eagle")
    save_random_model(TINY, tmp_path)
    with pytest.raises(ValueError, match="vocabulary"):
        make_engine(num_speculative_tokens=2, speculative_method="draft", speculative_model=str(tmp_path))


# ---- the sampling rule with a real, stochastic q ------------------------------------------------------
TINY = LlamaConfig(
    vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
)
PROMPT = [3, 5, 7]
BIAS = {4: 1.5, 9: -2.0}
PRESENCE = 1.0


def _processed(logits: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """The plain sampler's processors for BIAS and PRESENCE: logits (n, V), outputs (n, t) earlier output tokens."""
    logits = logits.clone()
    for token, bias in BIAS.items():
        logits[:, token] += bias
    if outputs.shape[1]:
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, outputs, True)
        logits -= PRESENCE * seen.float()
    return torch.softmax(logits, dim=-1)


@torch.inference_mode()
def exact_marginals(hf: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """P(2nd output token) and P(3rd output token) of the target with BIAS and PRESENCE, by enumeration."""
    v = TINY.vocab_size
    none = torch.empty(1, 0, dtype=torch.long)
    p1 = _processed(hf(torch.tensor([PROMPT])).logits[:, -1], none)[0]  # (V,)
    t1 = torch.arange(v)[:, None]
    p2 = _processed(hf(torch.cat([torch.tensor([PROMPT]).expand(v, -1), t1], 1)).logits[:, -1], t1)  # (V, V): [t1, t2]
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))  # (V*V, 2)
    ctx = torch.cat([torch.tensor([PROMPT]).expand(v * v, -1), pairs], 1)
    p3 = _processed(hf(ctx).logits[:, -1], pairs).view(v, v, v)  # [t1, t2, t3]
    second = p1 @ p2
    third = torch.einsum("a,ab,abc->c", p1, p2, p3)
    return second, third


def chi_square_p(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Pearson's test; bins expecting fewer than 5 draws are pooled. p-value = Q(df/2, stat/2)."""
    n = counts.sum()
    expected = expected_p * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = torch.tensor(float(keep.sum() - 1))
    return float(torch.special.gammaincc(df / 2, stat / 2))


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("restore_threads")
def test_draft_model_rule_keeps_the_target_distribution(tmp_path: Path) -> None:
    """A different random draft sampled at temperature 1 (q != p) proposes; the first two speculated
    tokens must follow the target's exact marginals (with logit_bias and a presence penalty)."""
    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    hf = save_random_model(TINY, target_dir)
    with torch.no_grad():
        hf.lm_head.weight.mul_(12.0)  # peaked, so a wrong acceptance rule shows
    hf.save_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(target_dir)
    with torch.no_grad():  # the target at temperature 5: q far enough from p that rejections (and the residual) matter
        draft.lm_head.weight.mul_(0.2)
    draft.save_pretrained(draft_dir)
    write_tokenizer(draft_dir, TINY.vocab_size)
    second, third = exact_marginals(hf)

    engine = LLMEngine(EngineConfig(
        model=str(target_dir), num_speculative_tokens=3, speculative_method="draft", speculative_model=str(draft_dir),
        speculative_row_cost=0.0,
        speculative_max_batch=10**6, max_num_seqs=256, max_num_batched_tokens=2048, max_waiting=10**5, kv_cache_memory_mb=64,
        num_threads=1,  # tiny tensors: a second thread only adds wake-ups on a busy machine
    ))
    engine.speculator.draft_model.min_confidence = 0.0
    n = 6000  # TV sampling noise ~0.025; resampling from p instead of max(0, p - q) would be off by ~0.08
    params = [SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=s, logit_bias=BIAS, presence_penalty=PRESENCE)
              for s in range(n)]
    outs = run_to_completion(engine, {0: [(f"r{s}", PROMPT, p) for s, p in enumerate(params)]})
    samples = torch.tensor([token_ids(outs[f"r{s}"]) for s in range(n)])  # (n, 4): tokens 2 and 3 were drafted
    stats = engine.speculator.stats
    assert stats.proposed >= n and 0 < stats.accepted < stats.proposed, stats
    for position, exact in ((1, second), (2, third)):
        counts = torch.bincount(samples[:, position], minlength=TINY.vocab_size).double()
        tv = 0.5 * (counts / n - exact.double()).abs().sum().item()
        assert tv < 0.05, (position, tv)
        assert chi_square_p(counts, exact.double()) > 1e-3, position
    assert_no_leaks(engine)
