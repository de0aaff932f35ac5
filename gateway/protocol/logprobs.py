"""Logprobs in OpenAI's two shapes: chat (`content` token list) and legacy completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.engine.outputs import TokenLogprob

FLOOR = -9999.0  # OpenAI's stand-in for "very unlikely"; JSON has no -inf


def _finite(logprob: float) -> float:
    return logprob if logprob > FLOOR else FLOOR  # also maps NaN to the floor


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_token(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": _finite(lp.logprob),
        "bytes": _bytes(lp.token),
        "top_logprobs": [{"token": t, "logprob": _finite(v), "bytes": _bytes(t)} for _, t, v in lp.top],
    }


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [chat_token(lp) for lp in items], "refusal": None}


def completion_logprobs(items: Sequence[tuple[str, TokenLogprob | None]], start_offset: int = 0) -> dict[str, Any]:
    """`items` are (token text, logprob or None for the first prompt token when echoing)."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = start_offset
    for text, lp in items:
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        values.append(None if lp is None else _finite(lp.logprob))
        tops.append(None if lp is None else {t: _finite(v) for _, t, v in lp.top})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def generated_items(items: Sequence[TokenLogprob]) -> list[tuple[str, TokenLogprob | None]]:
    return [(lp.token, lp) for lp in items]
