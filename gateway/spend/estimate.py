"""What a request may cost at most, before it runs: the tpm limit's token estimate (the body's bytes / 4 for
the prompt, as gateway/batches/runner.py's estimate_tokens) plus every token it may generate, at a price."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.keys.config import KeyPolicy
from gateway.spend.config import Price

_BYTES_PER_TOKEN = 4
_COMPLETIONS_DEFAULT = 16  # OpenAI's documented default max_tokens for /v1/completions
# the chat template's tokens a body does not show (role markers, a default system prompt such as SmolLM2's)
_TEMPLATE_TOKENS = 64


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def estimate_tokens(endpoint: str, raw: dict[str, Any], policy: KeyPolicy) -> tuple[int, int]:
    """(input, output) tokens at most; `endpoint`: chat | completions | embeddings."""
    try:
        prompt = len(orjson.dumps(raw)) // _BYTES_PER_TOKEN
    except TypeError:
        prompt = 0
    if endpoint == "embeddings":
        return prompt, 0
    if endpoint == "chat":
        prompt += _TEMPLATE_TOKENS
    limit = next((_int(raw.get(k)) for k in ("max_completion_tokens", "max_tokens") if _int(raw.get(k)) is not None), None)
    if limit is None:
        limit = policy.max_tokens if endpoint == "chat" and policy.max_tokens else _COMPLETIONS_DEFAULT
        if endpoint == "chat" and not policy.max_tokens:
            limit = 4096  # no cap and no max_tokens: a long answer (the model's context bounds it anyway)
    sequences = max(_int(raw.get("n")) or 1, _int(raw.get("best_of")) or 1)
    prompts = raw.get("prompt")
    several = endpoint == "completions" and isinstance(prompts, list) and prompts and isinstance(prompts[0], str)
    count = len(prompts) if several and isinstance(prompts, list) else 1
    return prompt, limit * sequences * count


def estimate_cost(endpoint: str, raw: dict[str, Any], policy: KeyPolicy, price: Price) -> float:
    tokens_in, tokens_out = estimate_tokens(endpoint, raw, policy)
    return price.cost(tokens_in, 0, tokens_out)
