"""Non-streaming response bodies (chat.completion, text_completion, embeddings list)."""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from backend.engine.outputs import Usage
from gateway.protocol.generation import ChoiceState
from gateway.protocol.logprobs import chat_logprobs


def add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
    )


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def chat_choice(state: ChoiceState, with_logprobs: bool) -> dict[str, Any]:
    return {
        "index": state.index,
        "message": {"role": "assistant", "content": "".join(state.text), "refusal": None},
        "logprobs": chat_logprobs(state.logprobs) if with_logprobs else None,
        "finish_reason": state.finish_reason or "stop",
    }


def chat_completion(
    completion_id: str,
    created: int,
    model: str,
    choices: Sequence[ChoiceState],
    *,
    usage: Usage,
    with_logprobs: bool,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [chat_choice(c, with_logprobs) for c in choices],
        "usage": usage_json(usage),
    }
    return body if system_fingerprint is None else {**body, "system_fingerprint": system_fingerprint}


def system_fingerprint(model_fingerprint: str) -> str:
    """OpenAI's `system_fingerprint`: the backend configuration that determines the output. From the model
    fingerprint (gateway/cache/keys.py: weights, precision, kernels, EngineConfig.deterministic), so it changes
    whenever the same request could get different tokens (docs/determinism.md)."""
    return f"fp_{model_fingerprint[:12]}"


def text_completion(
    completion_id: str, created: int, model: str, choices: list[dict[str, Any]], *, usage: Usage | None,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def encode_vector(vector: list[float], fmt: str) -> list[float] | str:
    """`base64` is little-endian float32, as the OpenAI SDK decodes it."""
    if fmt == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def embedding_list(model: str, vectors: list[list[float]], prompt_tokens: int, fmt: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, fmt)} for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
