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
from gateway.errors import GatewayError
from gateway.ops.record import RequestRecord
from gateway.protocol.requests import parse_chat, parse_completion
from gateway.routing.config import ModelRoute


class UpstreamCache:
    def __init__(self, cache: ResponseCache, models: Sequence[ModelRoute]) -> None:
        self.cache = cache
        salt = cache.cfg.fingerprint
        self.fingerprints = {
            m.name: upstream_fingerprint(m.name, [(d.kind, d.base_url, d.model or m.name) for d in m.deployments], salt)
            for m in models
            if m.deployments and all(d.kind == "openai" for d in m.deployments)
        }

    async def lookup(
        self, endpoint: str, request: Request, raw: dict[str, Any], model: str, rec: RequestRecord
    ) -> tuple[Response | None, Ticket | None]:
        """A cached response (a hit), or the ticket that stores the answer (a miss); (None, None) when `model` is not
        cached here. Takes the `cache` extension out of `raw` for every third-party model: a provider would reject it."""
        fingerprint = self.fingerprints.get(model)
        if fingerprint is None:
            return None, None
        ticket = self.cache.ticket(endpoint, request.headers, raw, upstream=fingerprint)
        if not self.cache.cfg.upstream:
            return None, None
        try:
            if endpoint == "chat":
                chat = parse_chat(raw)
                hit = await ticket.lookup(rec, raw, chat.params, chat.messages, None, chat.stream, chat.messages)
            else:
                completion = parse_completion(raw)
                hit = await ticket.lookup(rec, raw, completion.params, completion.prompts, None, completion.stream)
        except GatewayError:  # a field this gateway's parser does not know (the provider may): passed on, not cached
            return None, None
        return hit, ticket
