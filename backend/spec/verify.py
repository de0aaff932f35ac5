"""Verify a draft against the target's distributions (Leviathan et al. 2023; Chen et al. 2023).

# Draft token x_i was proposed with probability q(x_i) (1 for a copied n-gram: q is a point mass).
# Accept it with probability min(1, p(x_i) / q(x_i)); on the first rejection, draw from
# norm(max(0, p - q)) and stop. Every emitted token is then distributed exactly as p says.
With greedy decoding, p is a point mass on the argmax, so a draft token is accepted iff it is
the argmax, and the output is token-identical to decoding without speculation.
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


def verify_sampled(probs: torch.Tensor, draft: list[int], generator: torch.Generator | None) -> tuple[int, int]:
    """probs: (k+1, vocab) target distributions after temperature/top-k/top-p. Point-mass draft."""
    uniforms = torch.rand(len(draft), generator=generator, device=probs.device).tolist()
    for i, token in enumerate(draft):
        if uniforms[i] >= float(probs[i, token]):  # reject with probability 1 - p(x)
            residual = probs[i].clone()
            residual[token] = 0.0  # max(0, p - q) for a point mass q on `token`
            return i, _draw(residual, generator)
    return len(draft), _draw(probs[len(draft)], generator)


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
