"""Medusa heads: the trainer learns, the Medusa format round-trips, greedy output is token-identical to plain
decoding, sampling keeps the target's distribution, no KV leaks. Exactness must not depend on head quality,
so the heads here come from a few seconds of training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.request import Sequence
from backend.engine.sampling_params import SamplingParams
from backend.quant.calibration import CALIBRATION
from backend.spec import medusa_train
from backend.spec.medusa import MedusaDrafter, MedusaHeads, load_medusa, save_medusa
from tests.engine_helpers import (
    QUESTIONS,
    assert_no_leaks,
    chat_ids,
    check_mixed_speculation,
    hf_greedy,
    hf_model,
    make_engine,
    model_path,
    run_to_completion,
    save_random_model,
    token_ids,
    tokenizer,
)

PROMPTS = QUESTIONS[:4]
MAX_NEW = 32
# Drafts of all k tokens whatever the heads' confidence: the exactness checks need drafts to verify.
MEDUSA: dict = {"speculative_method": "medusa", "medusa_min_confidence": 0.0, "speculative_row_cost": 0.0}  # always k


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """Heads trained for a few seconds on a few passages: (their Medusa-format directory, the step losses)."""
    torch.manual_seed(0)
    model = hf_model()
    samples = medusa_train.chat_samples(tokenizer(), CALIBRATION, 128)[:4]
    data = medusa_train.features(model, samples, num_heads=3)
    heads = medusa_train.new_heads(model, num_heads=3, num_layers=1)
    losses = medusa_train.train(heads, data, seconds=60, lr=3e-3, batch=64, max_steps=40, log_every=0)
    path = tmp_path_factory.mktemp("medusa")
    save_medusa(heads, path, str(model_path()))
    return path, losses


def test_trainer_loss_decreases(trained: tuple[Path, list[float]]) -> None:
    losses = trained[1]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.8 * sum(losses[:5])


class RefResBlock(nn.Module):
    """FasterDecoding/Medusa's ResBlock, as its checkpoints are written."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def test_medusa_format_round_trip(tmp_path: Path) -> None:
    """A checkpoint in the reference layout (.pt, 2 shared ResBlocks, distinct final linears) loads and computes the same;
    saving it again (safetensors) and loading gives the same again."""
    torch.manual_seed(0)
    hidden, vocab, num_heads, num_layers = 16, 40, 3, 2
    ref = nn.ModuleList(
        nn.Sequential(*([RefResBlock(hidden)] * num_layers), nn.Linear(hidden, vocab, bias=False)) for _ in range(num_heads)
    )
    torch.save(ref.state_dict(), tmp_path / "medusa_lm_head.pt")
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "x"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert sorted(ref.state_dict())[:3] == ["0.0.linear.bias", "0.0.linear.weight", "0.1.linear.bias"]
    x = torch.randn(5, hidden)
    want = torch.stack([head(x) for head in ref])
    heads = load_medusa(tmp_path)
    assert not heads.shared_lm_head
    torch.testing.assert_close(heads(x), want)
    save_medusa(heads, tmp_path / "again", "x", dtype=torch.float32)
    torch.testing.assert_close(load_medusa(tmp_path / "again")(x), want)


@pytest.mark.parametrize(
    "overrides", [{}, {"max_num_batched_tokens": 24, "kv_cache_memory_mb": 5}], ids=["plain", "chunked+preempted"]
)
def test_greedy_medusa_is_exact_in_mixed_batches(
    trained: tuple[Path, list[float]], prompts: list[list[int]], reference: list[list[int]], overrides: dict
) -> None:
    """Every other request opts out of speculation; all must match HF's greedy output token for token."""
    engine = make_engine(num_speculative_tokens=3, **MEDUSA, speculative_model=str(trained[0]),
                         speculative_max_batch=len(prompts), **overrides)  # every step speculates, all 4 running too
    assert engine.speculator.medusa is not None and engine.speculator.medusa.heads.shared_lm_head
    check_mixed_speculation(engine, prompts, reference, MAX_NEW, preempts=bool(overrides))


def test_sampled_medusa_is_seeded(trained: tuple[Path, list[float]], prompts: list[list[int]]) -> None:
    engine = make_engine(num_speculative_tokens=3, **MEDUSA, speculative_model=str(trained[0]))
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True)
    first = run_to_completion(engine, {0: [("a", prompts[0], params)]})
    again = run_to_completion(engine, {0: [("b", prompts[0], params)]})
    assert token_ids(first["a"]) == token_ids(again["b"]) and len(token_ids(first["a"])) == 16
    assert engine.speculator.stats.proposed > 0
    assert_no_leaks(engine)


TINY = LlamaConfig(
    vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
)


def test_sampled_medusa_keeps_the_target_distribution(tmp_path: Path) -> None:
    """P(second token) with Medusa drafts (random heads: some accepted, most not) equals the exact value."""
    hf = save_random_model(TINY, tmp_path)
    with torch.no_grad():
        hf.lm_head.weight.mul_(8.0)  # a peaked distribution, so a wrong acceptance rule shows
    hf.save_pretrained(tmp_path)
    heads = MedusaHeads(TINY.hidden_size, TINY.vocab_size, num_heads=2)
    heads.share_lm_head(hf.lm_head.weight.detach().clone())
    save_medusa(heads, tmp_path / "heads", str(tmp_path), dtype=torch.float32)
    prompt = [3, 5, 7]
    with torch.inference_mode():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        both = torch.tensor([[*prompt, t] for t in range(TINY.vocab_size)])
        exact = p1 @ torch.softmax(hf(both).logits[:, -1], -1)  # P(second token)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), num_speculative_tokens=2, **MEDUSA,
                                    speculative_model=str(tmp_path / "heads"), speculative_max_batch=10**6,
                                    max_num_seqs=256, max_num_batched_tokens=2048, max_waiting=10**5))
    n = 3000
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=s) for s in range(n)]
    outs = run_to_completion(engine, {0: [(f"r{s}", prompt, p) for s, p in enumerate(params)]})
    seconds = torch.tensor([token_ids(outs[f"r{s}"])[1] for s in range(n)])
    stats = engine.speculator.stats
    assert stats.proposed >= n and 0 < stats.accepted < stats.proposed
    tv = 0.5 * (torch.bincount(seconds, minlength=TINY.vocab_size).float() / n - exact).abs().sum().item()
    assert tv < 0.06, tv
    assert_no_leaks(engine)


def test_generated_answers_are_the_engines_greedy_output(tmp_path: Path) -> None:
    """medusa_data: the training text is the base's own greedy answer after the chat prompt, cached on disk;
    the features learn only from the answer's positions."""
    from backend.spec import medusa_data

    requests = medusa_data.chat_requests(tokenizer(), CALIBRATION, limit=2)
    assert len(requests) == 2 and requests[0][0]["content"] != requests[1][0]["content"]
    cache = tmp_path / "answers.pt"
    samples = medusa_data.cached_answers(cache, model_path(), tokenizer(), CALIBRATION, limit=2, max_tokens=6)
    assert cache.exists() and medusa_data.cached_answers(cache, model_path(), tokenizer(), CALIBRATION, limit=2,
        max_tokens=6) == samples
    for (ids, start), msgs in zip(samples, requests, strict=True):
        prompt = chat_ids(msgs[0]["content"])
        assert ids[:start] == prompt and ids[start:] == hf_greedy(prompt, 6)[: len(ids) - start]
    data = medusa_train.features(hf_model(), [ids for ids, _ in samples], 2, [start for _, start in samples])
    assert len(data.hidden) == sum(len(ids) - start + 1 for ids, start in samples)
    for n, (ids, start) in enumerate(samples[:1]):  # head i at position t learns token t+2+i (on greedy text)
        for row, t in enumerate(range(start - 1, len(ids) - 2)):
            for i in range(2):
                if t + 2 + i < len(ids):
                    assert data.targets[row, i] == ids[t + 2 + i], (n, t, i)


def test_online_proposals_are_the_heads_on_the_newest_tokens_hidden_state(tmp_path: Path) -> None:
    """Serving reads the heads exactly where training taught them: the draft proposed when a sequence is L
    tokens long is the heads' argmax on the final hidden state at position L-2 (the row whose logits chose
    token L-1), in plain decode steps and after verifications alike. Offline: HF's forward over the output."""
    hf = save_random_model(TINY, tmp_path)
    torch.manual_seed(1)
    heads = MedusaHeads(TINY.hidden_size, TINY.vocab_size, num_heads=3)
    for block in heads:
        nn.init.normal_(block[0].linear.weight, std=0.3)  # not the identity: each head says something else
    heads.share_lm_head(hf.lm_head.weight.detach().clone())
    save_medusa(heads, tmp_path / "heads", str(tmp_path), dtype=torch.float32)
    heads = load_medusa(tmp_path / "heads")
    engine = LLMEngine(EngineConfig(model=str(tmp_path), num_speculative_tokens=3, **MEDUSA,
                                    speculative_model=str(tmp_path / "heads")))
    drafter = engine.speculator.medusa
    assert drafter is not None
    proposals: list[tuple[int, list[int]]] = []
    propose = drafter.propose

    def logged(wanted: list) -> dict:
        drafts = propose(wanted)
        proposals.extend((seq.num_tokens, draft) for seq, draft in drafts.items())
        return drafts

    drafter.propose = logged  # type: ignore[method-assign]
    prompt = [3, 5, 7, 11]
    out = run_to_completion(engine, {0: [("a", prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))]})
    ids = prompt + token_ids(out["a"])
    assert len(proposals) >= 5 and engine.speculator.stats.verifications >= 5
    with torch.inference_mode():
        hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]  # after the final norm, as served
        offline = heads(hidden).argmax(dim=-1).t()  # (positions, heads)
    for length, draft in proposals:
        assert draft == offline[length - 2, : len(draft)].tolist(), length


def test_draft_vocabulary_limits_proposals_and_round_trips(tmp_path: Path) -> None:
    """With a draft vocabulary (ours, optional next to the Medusa files) the drafter proposes the heads' argmax
    among those token ids only, scoring just their lm_head rows."""
    torch.manual_seed(0)
    heads = MedusaHeads(16, 40, num_heads=2)
    heads.share_lm_head(torch.randn(40, 16))
    heads.draft_vocab = torch.tensor([3, 7, 11, 30])
    save_medusa(heads, tmp_path, "x", dtype=torch.float32)
    loaded = load_medusa(tmp_path)
    assert loaded.draft_vocab is not None and loaded.draft_vocab.tolist() == [3, 7, 11, 30]
    seq = Sequence("r", 0, [1, 2, 3], 3, SamplingParams(), None)  # type: ignore[arg-type]
    hidden = torch.randn(16)
    drafter = MedusaDrafter(loaded, min_confidence=0.0)
    drafter.remember(seq, hidden, seq.num_tokens)
    want = loaded.draft_vocab[loaded(hidden[None])[:, 0, loaded.draft_vocab].argmax(dim=-1)].tolist()
    assert drafter.propose([(seq, 2)]) == {seq: want}
