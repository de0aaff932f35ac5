"""What determinism (docs/determinism.md) rests on, without a model. Seeded draws keyed by position
(backend/engine/sampler.py): a seeded row's token depends only on its logits, its seed, choice index and position; not on its
batch-mates, their order, or earlier draws. A seeded speculative verify (`verify_seeded`) emits exactly the tokens
plain sampling draws at those positions. The response's system_fingerprint changes with EngineConfig.deterministic."""

from __future__ import annotations

from dataclasses import replace

import torch

from backend.config import EngineConfig
from backend.engine.request import Sequence
from backend.engine.sampler import Sampler, seeded_noise
from backend.engine.sampling_params import SamplingParams
from backend.spec.prefix import target_probs
from backend.spec.verify import verify_seeded

VOCAB = 200
PARAMS = SamplingParams(temperature=0.8, top_p=0.95, seed=42, max_tokens=64)


def seq(tokens: list[int], params: SamplingParams = PARAMS, index: int = 0) -> Sequence:
    gen = torch.Generator().manual_seed(params.seed + index) if params.seed is not None else None
    return Sequence("r", index, list(tokens), 3, params, None, gen)  # type: ignore[arg-type]


def test_a_seeded_row_draws_the_same_token_alone_or_batched() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, VOCAB) * 3
    target = seq([1, 2, 3, 4])
    others = [seq([5, 6, 7]), seq([1, 2], SamplingParams(temperature=1.0)), seq([9], SamplingParams(temperature=0)),
              seq([1, 2, 3, 4], index=1)]
    alone = Sampler(None, 0, "cpu")(logits[2:3].clone(), [target]).token_ids[0]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        rows = [others[i] for i in order[:2]] + [target] + [others[i] for i in order[2:]]
        batch = torch.cat([torch.randn(2, VOCAB), logits[2:3], torch.randn(2, VOCAB)])
        assert Sampler(None, 7, "cpu")(batch, rows).token_ids[2] == alone
    # draws made before (another position, a draft) do not move it
    seeded_noise(target, 99, VOCAB, "cpu")
    assert Sampler(None, 0, "cpu")(logits[2:3].clone(), [target]).token_ids[0] == alone


def test_a_seeded_verify_emits_the_tokens_plain_sampling_draws() -> None:
    torch.manual_seed(1)
    prompt = [1, 2, 3]
    logits = torch.randn(4, VOCAB) * 2  # rows for positions 3..6, whatever the tokens: only the noise's key matters
    plain = []
    for i in range(4):
        s = seq(prompt + plain)
        plain.append(Sampler(None, 0, "cpu")(logits[i : i + 1].clone(), [s]).token_ids[0])
    s = seq(prompt)
    noise = torch.stack([seeded_noise(s, len(prompt) + i, VOCAB, "cpu") for i in range(4)])
    probs = target_probs(logits.clone(), s)
    assert verify_seeded(probs, plain[:3], noise) == (3, plain[3])  # all accepted, the bonus is plain's 4th
    wrong = [plain[0], (plain[1] + 1) % VOCAB, plain[2]]
    assert verify_seeded(probs, wrong, noise) == (1, plain[1])  # the first mismatch emits plain's token


def test_system_fingerprint_changes_with_the_deterministic_switch() -> None:
    from gateway.cache.keys import model_fingerprint
    from gateway.protocol.responses import system_fingerprint

    on = EngineConfig(quantization="none")
    fingerprints = {system_fingerprint(model_fingerprint("m", c)) for c in (on, replace(on, deterministic=False))}
    assert len(fingerprints) == 2 and all(f.startswith("fp_") for f in fingerprints)
