"""An OpenAI-compatible upstream over HTTP (httpx): JSON calls and SSE pass-through with timeouts.

Each deployment has its own connection pool of `max_connections`, split over small httpx clients
(gateway/routing/http_pool.py; bench/README.md, `## routing`: one big shared client is the slowest layout).
Failures become `UpstreamError`, which says whether another try (here or elsewhere) may succeed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.routing.config import DeploymentConfig
from gateway.routing.http_pool import ShardedClient

DONE = b"[DONE]"


class UpstreamError(Exception):
    """A failed upstream call. `retryable`: connect errors, timeouts, 429, 5xx, broken streams.

    `client_fault` (400, 413, 422...): the request itself is wrong; it goes back to the client as is."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        retryable: bool = True,
        retry_after_s: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.body = body

    @property
    def client_fault(self) -> bool:
        return self.status in (400, 413, 422)


def retry_after(headers: httpx.Headers) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from APIs and is treated as absent)."""
    raw = headers.get("retry-after-ms")
    if raw is not None:
        try:
            return max(0.0, float(raw) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def _error_body(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("error"), dict) else None


def status_error(response: httpx.Response, content: bytes) -> UpstreamError:
    status = response.status_code
    retryable = status == 429 or status >= 500 or status in (401, 403, 404, 408)  # 401/403/404: this deployment is misconfigured
    return UpstreamError(
        f"upstream answered {status}",
        status=status,
        retryable=retryable,
        retry_after_s=retry_after(response.headers),
        body=_error_body(content),
    )


@dataclass
class Upstream:
    """One OpenAI-compatible server; `post` and `stream` take paths relative to base_url (…/v1)."""

    cfg: DeploymentConfig
    pool: ShardedClient

    @classmethod
    def open(cls, cfg: DeploymentConfig) -> Upstream:
        headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
        return cls(cfg, ShardedClient(cfg.base_url, headers, cfg.max_connections, timeout))

    async def close(self) -> None:
        await self.pool.aclose()

    async def post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[dict[str, Any], httpx.Headers]:
        shard = self.pool.lease()
        try:
            call = self.pool.clients[shard].post(path, content=orjson.dumps(body), headers=headers)
            response = await asyncio.wait_for(call, self.cfg.timeout_s)
        except (httpx.TransportError, TimeoutError) as exc:
            raise UpstreamError(f"upstream unreachable or too slow: {type(exc).__name__}") from exc
        finally:
            self.pool.release(shard)
        if response.status_code != 200:
            raise status_error(response, response.content)
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError("upstream sent invalid JSON") from exc
        if not isinstance(data, dict):
            raise UpstreamError("upstream sent a non-object JSON body")
        return data, response.headers

    async def stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> AsyncGenerator[bytes, None]:
        """The `data:` payloads of an SSE response, up to (not including) [DONE].

        The first payload must come within first_token_timeout_s, each next one within idle_timeout_s;
        a stream that ends without [DONE] raises (the upstream broke off)."""
        shard = self.pool.lease()
        try:
            async with aclosing(self._stream(self.pool.clients[shard], path, body, headers)) as payloads:
                async for payload in payloads:
                    yield payload
        finally:
            self.pool.release(shard)

    async def _stream(
        self, client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str] | None
    ) -> AsyncGenerator[bytes, None]:
        request = client.build_request("POST", path, content=orjson.dumps(body), headers=headers)
        try:
            response = await asyncio.wait_for(client.send(request, stream=True), self.cfg.first_token_timeout_s)
        except (httpx.TransportError, TimeoutError) as exc:
            raise UpstreamError(f"upstream unreachable or too slow: {type(exc).__name__}") from exc
        try:
            if response.status_code != 200:
                content = await asyncio.wait_for(response.aread(), self.cfg.idle_timeout_s)
                raise status_error(response, content)
            lines = response.aiter_lines()
            timeout = self.cfg.first_token_timeout_s
            while True:
                line = await _next_line(lines, timeout)
                if line is None:
                    raise UpstreamError("upstream stream ended without [DONE]")
                if not line.startswith("data:"):
                    continue  # comments (pings), event names, blank separators
                payload = line[5:].strip().encode()
                if payload == DONE:
                    return
                timeout = self.cfg.idle_timeout_s
                yield payload
        finally:
            await response.aclose()


async def _next_line(lines: AsyncIterator[str], timeout: float) -> str | None:
    try:
        return await asyncio.wait_for(anext(lines), timeout)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
        raise UpstreamError(f"upstream stream stalled for {timeout:g}s") from exc
    except (httpx.TransportError, httpx.StreamError) as exc:
        raise UpstreamError(f"upstream stream broke off: {type(exc).__name__}") from exc


@dataclass
class HttpEmbedder:
    """EmbeddingClient over an upstream's /v1/embeddings (for `model: auto` in a torch-free gateway)."""

    upstream: Upstream
    model_name: str
    dimensions: int = 0

    @property
    def identity(self) -> str:
        return f"{self.model_name}@{self.upstream.cfg.base_url}"

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        try:
            data, _ = await self.upstream.post("/embeddings", {"model": self.model_name, "input": texts})
        except UpstreamError as exc:
            raise RuntimeError(str(exc)) from exc
        vectors = [item["embedding"] for item in sorted(data["data"], key=lambda d: d["index"])]
        return vectors, int(data.get("usage", {}).get("prompt_tokens", 0))
