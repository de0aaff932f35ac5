"""The response cache for routed models that third-party APIs serve (every deployment of kind `openai`).

The gateway that authenticated the key caches their answers, as the embedded engine's handlers do for its own model:
under the key's namespace, keyed by the model's fingerprint (its name and its deployments' addresses and model names,
keys.upstream_fingerprint) and every output-affecting field of the request. Semantic matches (`cache.semantic`) are
decided by the lexical check alone: the engine cannot score another provider's answers. A backend replica of ours
caches for itself (under the tenant this gateway signs for it); a model that mixes kinds is not cached here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.cache.keys import upstream_fingerprint
from gateway.cache.service import ResponseCache
from gateway.cache.ticket import Ticket
from gateway.ops.record import RequestRecord
from gateway.protocol.requests import ChatRequest, parse_chat, parse_completion
from gateway.routing.config import ModelRoute
from gateway.routing.proxy import Keep


class UpstreamCache:
    def __init__(self, cache: ResponseCache, models: Sequence[ModelRoute]) -> None:
        self.cache = cache
        salt = cache.cfg.fingerprint
        self.fingerprints = {  # the models cached here (none unless cache.upstream)
            m.name: upstream_fingerprint(m.name, [(d.kind, d.base_url, d.model or m.name) for d in m.deployments], salt)
            for m in models
            if cache.cfg.upstream and m.deployments and all(d.kind == "openai" for d in m.deployments)
        }

    async def lookup(
        self, endpoint: str, request: Request, raw: dict[str, Any], model: str, *, rec: RequestRecord
    ) -> tuple[Response | None, Ticket | None]:
        """A cached response (a hit), or the ticket that stores the answer (a miss); (None, None) when `model` is not
        cached here."""
        fingerprint = self.fingerprints.get(model)
        if fingerprint is None:
            return None, None
        ticket = self.cache.ticket(endpoint, request.headers, raw, upstream=fingerprint)  # takes `cache` out of `raw`
        try:
            parsed = parse_chat(raw) if endpoint == "chat" else parse_completion(raw)
        except Exception:  # a field or value this gateway's parser refuses and the provider may take: not cached
            return None, None
        # the key holds the messages (or prompt) as the provider gets them, not as this gateway would render them
        prompt = raw.get("messages") if endpoint == "chat" else raw.get("prompt")
        messages = parsed.messages if isinstance(parsed, ChatRequest) else None
        return await ticket.lookup(rec, raw, parsed.params, parsed.stream, messages=messages, prompt=prompt), ticket

    def keeper(self, endpoint: str, ticket: Ticket) -> Keep:
        """What the proxy hands a finished answer to: kept in the shape this gateway replays, if it has that shape;
        a failure to keep it is logged and never fails the request (the answer is already the client's)."""

        async def keep(body: dict[str, Any]) -> None:
            answer = storable(body, endpoint)
            if answer is None:
                return
            try:
                await ticket.keep(answer)
            except Exception as exc:  # the cache must never cost the client its answer
                self.cache.logger.warning("cache_store_failed", error=type(exc).__name__)

        return keep


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def storable(body: dict[str, Any], endpoint: str) -> dict[str, Any] | None:
    """A provider's answer as this gateway stores and replays answers: the endpoint's object, every choice indexed,
    finished and plain text (no tool calls, refusal, audio or annotations), usage as counts; None for anything
    else (stored, an odd answer would fail every replay of it)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    kept = []
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict) or not isinstance(choice.get("finish_reason"), str):
            return None
        index = choice.get("index", i)
        if not isinstance(index, int) or isinstance(index, bool):
            return None
        logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else None
        out = {"index": index, "logprobs": logprobs, "finish_reason": choice["finish_reason"]}
        if endpoint == "chat":
            message = choice.get("message")
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                return None
            if any(v not in (None, "", [], {}) for k, v in message.items() if k not in ("role", "content")):
                return None
            out["message"] = {"role": "assistant", "content": message["content"], "refusal": None}
        elif isinstance(choice.get("text"), str):
            out["text"] = choice["text"]
        else:
            return None
        kept.append(out)
    usage = given if isinstance(given := body.get("usage"), dict) else {}
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    answer: dict[str, Any] = {
        "id": str(body.get("id") or ""), "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": _count(body.get("created")), "model": str(body.get("model") or ""), "choices": kept,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }  # fmt: skip
    if isinstance(body.get("system_fingerprint"), str):
        answer["system_fingerprint"] = body["system_fingerprint"]
    return answer
