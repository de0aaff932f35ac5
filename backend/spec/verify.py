"""Verify a draft against the target's distributions (Leviathan et al. 2023; Chen et al. 2023).

# Draft token x_i was proposed with probability q(x_i) (the draft model's distribution, or 1 for a
# copied n-gram: q is a point mass).
# Accept it with probability min(1, p(x_i) / q(x_i)); on the first rejection, draw from
# norm(max(0, p - q)) and stop. Every emitted token is then distributed exactly as p says.
With greedy decoding, p is a point mass on the argmax, so a draft token is accepted iff it is
the argmax, and the output is token-identical to decoding without speculation.
A seeded request's draws are keyed by position (backend/engine/sampler.py, `seeded_noise`), so its verification
draws the token plain decoding would at each position (the exponential race with that position's noise) and
accepts a draft token iff it is that token (`verify_seeded`): the output is token-identical to decoding without
speculation too, and still exactly distributed as p.
"""

from __future__ import annotations

import torch


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """logits: (k+1, vocab), row i predicts the token after draft[:i]. Returns (accepted, next_token)."""
    best = logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == best[accepted]:
        accepted += 1
    return accepted, best[accepted]


def verify_sampled(
    probs: torch.Tensor, draft: list[int], q: torch.Tensor | None, generator: torch.Generator | None
) -> tuple[int, int]:
    """probs: (k+1, vocab) target distributions after temperature/top-k/top-p; q: (k, vocab) the draft
    model's distributions the draft was sampled from, or None for a point mass (a copied n-gram)."""
    uniforms = torch.rand(len(draft), generator=generator, device=probs.device).tolist()
    for i, token in enumerate(draft):
        q_x = 1.0 if q is None else float(q[i, token])  # > 0: the token was drawn from q
        if uniforms[i] * q_x >= float(probs[i, token]):  # reject with probability 1 - min(1, p/q)
            residual = probs[i].clone()
            if q is None:
                residual[token] = 0.0  # max(0, p - q) for a point mass q on `token`
            else:
                residual.sub_(q[i]).clamp_(min=0.0)
            if float(residual.sum()) <= 0.0:  # p == q up to rounding: a rejection had ~0 probability
                residual = probs[i]
            return i, _draw(residual, generator)
    return len(draft), _draw(probs[len(draft)], generator)


def verify_seeded(probs: torch.Tensor, draft: list[int], noise: torch.Tensor) -> tuple[int, int]:
    """probs: (k+1, vocab) target distributions; noise: (k+1, vocab) the seeded draws' Exp(1) noise at those
    positions. Row i's token is the one plain sampling draws there; drafts are accepted while they equal it."""
    return verify_greedy(probs / noise, draft)


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
