"""OpenAI's Usage and Costs APIs over the ledger, for the admin key (the middleware checks it):

- GET /v1/organization/usage/completions (chat, completions, responses, messages) and /usage/embeddings:
  time buckets (bucket_width 1m | 1h | 1d) of token sums, group_by api_key_id (the key's configured name, never
  the key), model, batch; filters api_key_ids, models, batch; `limit` buckets per page, `page` the next cursor.
- GET /v1/organization/costs: daily buckets of cost in `spend.currency`, group_by api_key_id and line_item (the
  model).
Buckets start at `start_time` and are listed even when empty, as OpenAI does.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.protocol.jsonio import json_response
from gateway.spend.ledger import Ledger
from gateway.spend.stores import Aggregate

_WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}  # OpenAI's default and maximum buckets per page
_COSTS_LIMIT = (7, 180)
_EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True)
class Query:
    start: int
    end: int
    width: int
    limit: int
    group_by: tuple[str, ...]
    keys: tuple[str, ...]
    models: tuple[str, ...]
    batch: bool | None

    def wanted(self, a: Aggregate) -> bool:
        return ((not self.keys or a.key_name in self.keys) and (not self.models or a.model in self.models)
                and (self.batch is None or a.batch == self.batch))  # fmt: skip


def _list(request: Request, name: str) -> tuple[str, ...]:
    params = request.query_params
    return tuple(v for n in (name, name + "[]") for item in params.getlist(n) for v in item.split(",") if v)


def _int(request: Request, name: str, default: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        if default is None:
            raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"Invalid '{name}': {raw!r} is not an integer.", param=name) from None


def _query(request: Request, widths: tuple[str, ...], groups: tuple[str, ...], limits: tuple[int, int] | None) -> Query:
    width_name = request.query_params.get("bucket_width", "1d")
    if width_name not in widths:
        raise InvalidRequest(f"Invalid 'bucket_width': {width_name!r} (one of {', '.join(widths)}).", param="bucket_width")
    default, most = limits or _LIMITS[width_name]
    start = _int(request, "start_time")
    end = _int(request, "end_time", math.ceil(time.time()))
    start = _int(request, "page", start) if request.query_params.get("page") else start
    limit = _int(request, "limit", default)
    if start < 0 or end <= start:
        raise InvalidRequest("'end_time' must be after 'start_time' (unix seconds).", param="end_time")
    if not 1 <= limit <= most:
        raise InvalidRequest(f"Invalid 'limit': {limit} (1 to {most} buckets for bucket_width {width_name}).", param="limit")
    group_by = _list(request, "group_by")
    bad = [g for g in group_by if g not in groups]
    if bad:
        raise InvalidRequest(f"Invalid 'group_by': {bad[0]!r} (one of {', '.join(groups)}).", param="group_by")
    batch_raw = request.query_params.get("batch")
    batch = None if batch_raw is None else batch_raw.lower() in ("true", "1")
    return Query(start, end, _WIDTHS[width_name], limit, group_by, _list(request, "api_key_ids"), _list(request, "models"), batch)


class UsageAPI:
    def __init__(self, ledger: Ledger | None, currency: str) -> None:
        self.ledger = ledger
        self.currency = currency

    async def _aggregates(self, q: Query, stop: int) -> list[Aggregate]:
        ledger = self.ledger
        if ledger is None:
            raise NotFound("The ledger is off on this gateway (ledger.enabled: false): there is no usage to report.")
        await asyncio.to_thread(ledger.flush)  # what was answered before this request is counted
        try:
            return await asyncio.to_thread(ledger.read, lambda db: db.aggregate(q.start, stop, q.width))
        except Exception as exc:
            raise ServiceUnavailable(f"The ledger's database cannot be read now ({type(exc).__name__}).") from None

    async def _page(self, q: Query, result: Callable[[list[Aggregate], dict[str, Any]], dict[str, Any]],
                    keep: Callable[[Aggregate], bool]) -> Response:  # fmt: skip
        buckets = math.ceil((q.end - q.start) / q.width)
        shown = min(buckets, q.limit)
        stop = min(q.end, q.start + shown * q.width)
        groups: dict[tuple[int, tuple[Any, ...]], list[Aggregate]] = {}
        for a in await self._aggregates(q, stop):
            if q.wanted(a) and keep(a):
                groups.setdefault((a.bucket, self._group(q, a)), []).append(a)
        data = []
        for i in range(shown):
            begin = q.start + i * q.width
            results = [result(items, dict(zip(q.group_by, key, strict=True)))
                       for (b, key), items in sorted(groups.items(), key=lambda kv: str(kv[0])) if b == i]  # fmt: skip
            data.append({"object": "bucket", "start_time": begin, "end_time": min(begin + q.width, q.end), "results": results})
        more = shown < buckets
        return json_response({"object": "page", "data": data, "has_more": more, "next_page": str(stop) if more else None})

    @staticmethod
    def _group(q: Query, a: Aggregate) -> tuple[Any, ...]:
        values = {"api_key_id": a.key_name, "model": a.model, "batch": a.batch, "line_item": a.model}
        return tuple(values.get(g) for g in q.group_by)

    async def completions(self, request: Request) -> Response:
        q = _query(request, tuple(_WIDTHS), ("project_id", "user_id", "api_key_id", "model", "batch", "service_tier"), None)
        return await self._page(q, self._completions, lambda a: a.endpoint != _EMBEDDINGS)

    async def embeddings(self, request: Request) -> Response:
        q = _query(request, tuple(_WIDTHS), ("project_id", "user_id", "api_key_id", "model"), None)
        return await self._page(q, self._embeddings, lambda a: a.endpoint == _EMBEDDINGS)

    async def costs(self, request: Request) -> Response:
        q = _query(request, ("1d",), ("project_id", "line_item", "api_key_id"), _COSTS_LIMIT)
        return await self._page(q, self._costs, lambda a: True)

    @staticmethod
    def _completions(items: list[Aggregate], group: dict[str, Any]) -> dict[str, Any]:
        inp, cached = sum(a.input_tokens for a in items), sum(a.cached_tokens for a in items)
        out = sum(a.output_tokens for a in items)
        return {
            "object": "organization.usage.completions.result", "input_tokens": inp, "input_cached_tokens": cached,
            "input_uncached_tokens": inp - cached, "output_tokens": out, "input_text_tokens": inp - cached,
            "output_text_tokens": out, "input_cached_text_tokens": cached, "input_audio_tokens": 0,
            "input_cached_audio_tokens": 0, "output_audio_tokens": 0,
            "num_model_requests": sum(a.requests for a in items), "project_id": None, "user_id": None,
            "api_key_id": group.get("api_key_id"), "model": group.get("model"), "batch": group.get("batch"),
            "service_tier": None,
        }  # fmt: skip

    @staticmethod
    def _embeddings(items: list[Aggregate], group: dict[str, Any]) -> dict[str, Any]:
        return {
            "object": "organization.usage.embeddings.result", "input_tokens": sum(a.input_tokens for a in items),
            "num_model_requests": sum(a.requests for a in items), "project_id": None, "user_id": None,
            "api_key_id": group.get("api_key_id"), "model": group.get("model"),
        }  # fmt: skip

    def _costs(self, items: list[Aggregate], group: dict[str, Any]) -> dict[str, Any]:
        return {
            "object": "organization.costs.result", "amount": {"value": sum(a.cost for a in items), "currency": self.currency},
            "line_item": group.get("line_item"), "project_id": None, "api_key_id": group.get("api_key_id"),
            "quantity": None, "quantity_unit": None,
        }  # fmt: skip
