"""The OpenTelemetry GenAI semantic conventions (gen_ai.*, semconv 1.37+) as this gateway fills them in: from the
request body, the request's record (gateway/ops/record.py), and, only with `traces.content`, the messages."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.ops.record import RequestRecord
from gateway.tracing.spans import AttrValue

# the endpoints that run a model, and their gen_ai.operation.name
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/embeddings": "embeddings",
}
ROUTER_OPERATIONS = {"chat": "chat", "completions": "text_completion"}  # the router's endpoints
PROVIDER = "smolgate"  # gen_ai.provider.name of this project's engine and replicas

_NUMBERS = {  # body field -> attribute; a number the client sent is recorded as is
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "max_output_tokens")  # OpenAI's new, old; Responses'


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_attributes(body: dict[str, Any]) -> dict[str, AttrValue | None]:
    """gen_ai.request.* from a request body (OpenAI's or Anthropic's shape)."""
    attrs: dict[str, AttrValue | None] = {k: _number(body.get(f)) for f, k in _NUMBERS.items()}
    model = body.get("model")
    attrs["gen_ai.request.model"] = model if isinstance(model, str) else None
    attrs["gen_ai.request.max_tokens"] = next((v for f in _MAX_TOKENS if (v := _number(body.get(f))) is not None), None)
    n = _number(body.get("n"))
    attrs["gen_ai.request.choice.count"] = n if n is not None and n != 1 else None  # semconv: only when not 1
    attrs["gen_ai.request.stream"] = body.get("stream") if isinstance(body.get("stream"), bool) else None
    stop = body.get("stop", body.get("stop_sequences"))
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stops, list) and stops and all(isinstance(s, str) for s in stops):
        attrs["gen_ai.request.stop_sequences"] = stops
    return attrs


def record_attributes(rec: RequestRecord) -> dict[str, AttrValue | None]:
    """What the request did, from its record: the model that answered, usage, the cache's verdict, the deployment."""
    served = rec.model or None
    return {
        "gen_ai.response.model": served,
        "gen_ai.usage.input_tokens": rec.prompt_tokens if served else None,
        "gen_ai.usage.output_tokens": rec.completion_tokens if served else None,
        "gen_ai.usage.cache_read.input_tokens": rec.cached_tokens or None,
        "gen_ai.response.time_to_first_chunk": rec.ttft_s,
        "smolgate.cache.result": rec.cache if served else None,
        "smolgate.deployment": rec.deployment or None,
        "smolgate.request_id": rec.request_id,
        "smolgate.api_key.name": rec.key,  # the dashboard's label: a configured name or "…" + 4 characters, never a key
    }


# ---- content (traces.content) -----------------------------------------------------------------------------------


def _text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts (OpenAI's and Anthropic's)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _message(role: str, text: str, limit: int, finish: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text[:limit]}]}
    if finish is not None:
        out["finish_reason"] = finish
    return out


def input_messages(path: str, body: dict[str, Any], limit: int) -> str | None:
    """gen_ai.input.messages (JSON) of a request: chat and Anthropic messages, a completion prompt, Responses input."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = [_message(str(m.get("role", "user")), _text(m.get("content")), limit) for m in messages if isinstance(m, dict)]
        system = _text(body.get("system"))  # Anthropic's system prompt
        out = [_message("system", system, limit), *out] if system else out
    elif isinstance(body.get("prompt"), str):
        out = [_message("user", body["prompt"], limit)]
    elif isinstance(body.get("input"), str) and path == "/v1/responses":
        out = [_message("user", body["input"], limit)]
    elif isinstance(body.get("input"), list) and path == "/v1/responses":
        out = [_message(str(m.get("role", "user")), _text(m.get("content")), limit) for m in body["input"]
               if isinstance(m, dict) and "role" in m]  # fmt: skip
    else:
        return None
    return orjson.dumps(out).decode()


def output_messages(objects: list[object], path: str, limit: int) -> str | None:
    """gen_ai.output.messages (JSON) from the answer objects the endpoint at `path` sent (gateway/ops/sent.py): OpenAI
    chat / completions, Anthropic Messages, Responses, as JSON or events. An endpoint that runs the chat pipeline in
    process (Messages, Responses) also saw the chat answer it was built from: only the endpoint's own shape counts.
    None for anything else (an error, embeddings)."""
    own = _OWN_SHAPE.get(path, _openai)
    texts: dict[int, list[str]] = {}
    finish: dict[int, str] = {}
    for obj in objects:
        if isinstance(obj, dict) and own(obj):
            _absorb(obj, texts, finish)
    if not texts:
        return None
    out = [_message("assistant", "".join(texts[i]), limit, finish.get(i)) for i in sorted(texts)]
    return orjson.dumps(out).decode()


def _openai(obj: dict[str, Any]) -> bool:
    return "choices" in obj


def _anthropic(obj: dict[str, Any]) -> bool:
    return "choices" not in obj and "object" not in obj


def _responses(obj: dict[str, Any]) -> bool:
    return "choices" not in obj and (obj.get("object") == "response" or str(obj.get("type", "")).startswith("response."))


_OWN_SHAPE = {"/v1/messages": _anthropic, "/v1/responses": _responses}


def _absorb(obj: dict[str, Any], texts: dict[int, list[str]], finish: dict[int, str]) -> None:
    for choice in obj.get("choices") or ():  # OpenAI: chat (message / delta) and completions (text)
        if not isinstance(choice, dict):
            continue
        i = choice.get("index", 0) if isinstance(choice.get("index"), int) else 0
        part = choice.get("message") or choice.get("delta") or {}
        text = _text(part.get("content")) if isinstance(part, dict) else ""
        plain = choice.get("text")
        texts.setdefault(i, []).append(text or (plain if isinstance(plain, str) else ""))
        if isinstance(choice.get("finish_reason"), str):
            finish[i] = choice["finish_reason"]
    kind = obj.get("type")
    if kind == "message" and obj.get("role") == "assistant":  # Anthropic, JSON
        texts.setdefault(0, []).append(_text(obj.get("content")))
        if isinstance(obj.get("stop_reason"), str):
            finish[0] = obj["stop_reason"]
    elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):  # Anthropic, SSE
        texts.setdefault(0, []).append(str(obj["delta"].get("text") or ""))
    elif kind == "message_delta" and isinstance(obj.get("delta"), dict) and isinstance(obj["delta"].get("stop_reason"), str):
        finish[0] = obj["delta"]["stop_reason"]
    elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):  # Responses, SSE
        texts.setdefault(0, []).append(obj["delta"])
    elif obj.get("object") == "response" and isinstance(obj.get("output"), list):  # Responses, JSON
        for item in obj["output"]:
            if isinstance(item, dict) and item.get("type") == "message":
                texts.setdefault(0, []).append(
                    "".join(c.get("text", "") for c in item.get("content") or () if isinstance(c, dict)))
