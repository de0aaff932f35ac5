"""Counting tokens for upstreams that omit `usage` (some servers do, and streams often do).

With a tokenizer.json (the `tokenizers` library: no torch) the counts are exact for that tokenizer
and close for others; without one, about four characters per token. Chat prompts add a few tokens
per message for the template, as OpenAI's own cookbook estimate does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

_PER_MESSAGE = 4


def load_counter(tokenizer_json: str) -> Callable[[str], int]:
    """`tokenizer_json` ("" = the default model's, when fetched) -> text -> token count."""
    path = Path(tokenizer_json) if tokenizer_json else _default_tokenizer()
    if path is not None and path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids) if text else 0
    return lambda text: (len(text) + 3) // 4


def _default_tokenizer() -> Path | None:
    from backend.config import default_model_path  # a dataclass module: no torch

    return default_model_path() / "tokenizer.json"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_tokens(count: Callable[[str], int], body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(_PER_MESSAGE + count(_text(m.get("content"))) for m in messages if isinstance(m, dict)) + 2
    prompt = body.get("prompt", "")
    prompts = prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
    return sum(count(p) if isinstance(p, str) else len(p) for p in prompts)


def usage_of(count: Callable[[str], int], body: dict[str, Any], completion_text: str) -> dict[str, int]:
    p, c = prompt_tokens(count, body), count(completion_text)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def completion_text(response: dict[str, Any]) -> str:
    """All generated text of a chat.completion or text_completion object."""
    out = []
    for choice in response.get("choices") or ():
        message = choice.get("message") or {}
        out.append(_text(message.get("content")) if message else str(choice.get("text") or ""))
    return "".join(out)


def delta_text(chunk: dict[str, Any]) -> str:
    """The text one streamed chunk adds (chat deltas or completion text)."""
    out = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        out.append(_text(delta.get("content")) if isinstance(delta, dict) else str(choice.get("text") or ""))
    return "".join(out)
