"""The router: one client request -> a model (alias, `auto`, fallbacks) -> a deployment, with retries.

Per request: the API key's policy (gateway/keys/guard.py: allowed models, caps, rpm/tpm) is checked against the
model that will serve (`auto` and fallbacks choose only among the key's models); the model's deployments are
tried by gateway/routing/balancer.py's choice, an attempt failing with a connect error, a timeout, a 429 or a
5xx is retried on another deployment (or the same one later) after an exponential, jittered backoff;
a deployment's Retry-After keeps traffic away from it that long. When every deployment of a model has
failed, the next fallback model is tried; when those fail too, the client gets one OpenAI-style error
(503, or 429 with Retry-After when limits were the cause). Nothing waits without a bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.aliases import Aliases
from gateway.cache.service import ResponseCache
from gateway.cache.tenancy import forwarded_headers
from gateway.client import EmbeddingClient
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, InvalidRequest, RateLimited
from gateway.keys.guard import KeyGuard
from gateway.ops.access_log import Logger
from gateway.ops.record import RequestRecord, record_of
from gateway.protocol.events import Steps, steps_of
from gateway.protocol.generation import unless_disconnected
from gateway.protocol.jsonio import read_json
from gateway.protocol.sse import StreamLimits
from gateway.ratelimit import Limit, OverLimit, build_limiter
from gateway.routing.auto import AutoChoice, AutoRouter
from gateway.routing.balancer import Balancer, Choice, DeploymentState, request_affinity_key
from gateway.routing.cached import UpstreamCache
from gateway.routing.config import DeploymentConfig
from gateway.routing.discovery import Discovery, Target
from gateway.routing.errors import Attempted, client_error, final_error, retryable
from gateway.routing.metrics import RouterMetrics
from gateway.routing.proxy import Keep, Outcome, call_json, call_stream
from gateway.routing.token_count import load_counter
from gateway.routing.upstream import HttpEmbedder, Upstream, UpstreamError
from gateway.tracing import spans
from gateway.tracing.genai import PROVIDER, ROUTER_OPERATIONS

Endpoint = Literal["chat", "completions"]
LocalHandler = Callable[[Request, dict[str, Any]], Awaitable[Response]]
_PATHS: dict[Endpoint, str] = {"chat": "/chat/completions", "completions": "/completions"}
_CACHE_VERDICT = ("x-cache", "x-cache-similarity")
_TRACE_CONTEXT = ("traceparent", "tracestate")


def _trace_headers(span: spans.Span, client: Any) -> dict[str, str]:
    """W3C trace context for an upstream call: this attempt's span as the parent, or, when this gateway does not
    trace the request, the client's own headers passed on unchanged (the upstream's spans join the client's trace)."""
    return span.headers() or {name: client[name] for name in _TRACE_CONTEXT if name in client}


class Tracked:
    """Runs a response, then closes its attempt (outstanding count, health) and spends its tokens."""

    def __init__(self, response: Response, on_done: Callable[[bool], Awaitable[None]], outcome: Outcome, rec: RequestRecord):
        self.response, self.on_done, self.outcome, self.rec = response, on_done, outcome, rec
        self.headers = response.headers
        self.span = spans.NO_SPAN  # the router's span: it lasts until the answer is sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self._done()

    def steps(self) -> Steps:
        """A streamed answer's steps (gateway/protocol/events.py); closing them closes the attempt."""
        return Steps(steps_of(self.response), self._done)

    async def _done(self) -> None:
        failed = self.outcome.failed or self.rec.error_type not in (None, "client_disconnected")
        await self.on_done(not failed)
        if failed:
            self.span.fail(self.rec.error_type or "upstream_error")
        self.span.end()


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        local: dict[Endpoint, LocalHandler],
        metrics_registry: CollectorRegistry,
        logger: Logger,
        *,
        embedder: EmbeddingClient | None,
        guard: KeyGuard | None = None,
        cache: ResponseCache | None = None,
        own: Mapping[str, dict[Endpoint, LocalHandler]] | None = None,
    ) -> None:
        """`cache`: the gateway's response cache, for the models third-party APIs serve (gateway/routing/cached.py).
        `own`: the handlers of the `models:` list's models, each over its own engine (`local`: the `engine:` one's)."""
        rc = config.routing
        self.guard = guard if guard is not None else KeyGuard(config, logger)
        self.cfg, self.rcfg, self.local, self.logger = config, rc.router, local, logger
        self.own = own or {}
        self.balancers = {m.name: Balancer(m.deployments, rc.router) for m in rc.models}
        self.upstreams = {
            (m, s.index): Upstream.open(s.cfg) for m, b in self.balancers.items() for s in b.states if s.cfg.kind != "embedded"
        }
        # replicas found by DNS (`discovery: dns`) come and go: their upstreams open and close with them
        targets = [Target(m.name, i, d, self.balancers[m.name]) for m in rc.models for i, d in enumerate(m.deployments)
                   if d.discovery]  # fmt: skip
        self.discovery = Discovery(targets, rc.router, self._replicas_changed, logger)
        self._retired: dict[tuple[str, int], DeploymentState] = {}  # gone from DNS, their upstream still open
        self._closing: set[asyncio.Task[None]] = set()
        self.aliases = Aliases(config.model_aliases, self.balancers)
        self.metrics = RouterMetrics(metrics_registry, lambda: self.balancers)
        self.limiter = build_limiter(rc.router.redis_url, rc.router.redis_prefix, self._limiter_error)
        self.auto = AutoRouter(rc.auto.small, rc.auto.large, rc.auto.threshold, self._auto_embedder(embedder))
        self.auto_enabled = rc.auto.enabled
        self.count = load_counter(rc.router.tokenizer)
        self.cache = UpstreamCache(cache, rc.models) if cache is not None else None
        self._last_warning = 0.0

    def _auto_embedder(self, local: EmbeddingClient | None) -> EmbeddingClient | None:
        auto = self.cfg.routing.auto
        if not auto.use_embeddings:
            return None
        if auto.embedding_base_url:  # a torch-free gateway borrows a backend's embedder
            dep = DeploymentConfig(kind="openai", base_url=auto.embedding_base_url.rstrip("/"), timeout_s=5.0, max_connections=8)
            self.upstreams[("", -1)] = upstream = Upstream.open(dep)
            return HttpEmbedder(upstream, auto.embedding_model)
        return local

    async def start(self) -> None:
        """Resolve the deployments found by DNS (once now, then in the background)."""
        await self.discovery.start()

    def _replicas_changed(self, model: str, added: list[DeploymentState], removed: list[DeploymentState]) -> None:
        for state in added:
            self.upstreams[(model, state.index)] = Upstream.open(state.cfg)
        for state in removed:  # no new attempt picks it; the ones in flight finish on its upstream
            self._retired[(model, state.index)] = state
        for key, state in list(self._retired.items()):
            if state.outstanding <= 0:
                del self._retired[key]
                upstream = self.upstreams.pop(key)
                task = asyncio.create_task(upstream.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self.discovery.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(u.close() for u in self.upstreams.values()), return_exceptions=True)
        await self.limiter.close()

    def _limiter_error(self, exc: BaseException) -> None:
        if time.monotonic() - self._last_warning > 10:
            self._last_warning = time.monotonic()
            self.logger.warning("rate_limit_store_unavailable", error=type(exc).__name__)

    async def handle(self, endpoint: Endpoint, request: Request, raw: dict[str, Any] | None = None) -> Response:
        """`raw`: the body, when a translating endpoint (/v1/responses) built it from its own."""
        rec = record_of(request)
        raw = raw if raw is not None else await read_json(request, self.cfg.max_body_bytes)
        name = raw.get("model")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("you must provide a model parameter", param="model")
        asked, headers = name, {}
        policy = rec.policy if rec.policy is not None else self.guard.anonymous

        def allowed(model: str) -> bool:  # the key's allow-list holds for the model that actually serves
            return self.guard.allows(policy, model, lambda n: self.aliases.get(n, n))

        if name == "auto" and self.auto_enabled and allowed("auto"):
            choice = await self._auto_choice(raw, allowed)
            if choice is None:  # neither of auto's models is one this key may use
                raise self.guard.not_found(asked)
            self.metrics.auto.labels(choice.tier, choice.model).inc()
            headers = {"x-smolgate-auto-tier": choice.tier, "x-smolgate-auto-score": str(choice.score)}
            name = choice.model
        model = self.aliases.get(name, name)
        if model not in self.balancers or not allowed(model):
            raise self.guard.not_found(asked)
        raw = self.guard.check_body(policy, endpoint, raw)
        try:
            await self.guard.admit(policy, rec, endpoint, raw, model=model)
        except RateLimited:
            self.metrics.rate_limited.labels("key").inc()
            raise
        rec.model = model
        hit, ticket = await self.cache.lookup(endpoint, request, raw, model, rec=rec) if self.cache else (None, None)
        if hit is not None:
            hit.headers.update({"x-smolgate-model": model, **headers})
            return hit
        chain = [model, *(m for m in self._fallbacks(model) if allowed(m))]  # fallbacks outside the list: skipped
        # the model's own answers (not a fallback's): stored, and compared with the cached one for a sampled hit
        keep = self.cache.keeper(endpoint, ticket) if self.cache and ticket and (ticket.storing or ticket.sample) else None
        route = spans.start(f"router {model}", "internal", {"smolgate.model": model, "smolgate.router.fallbacks": chain[1:]})
        try:
            with route.current():
                response = await self._route(endpoint, request, raw, chain, rec=rec, keep=keep)
        except BaseException as exc:
            route.fail(getattr(exc, "error_type", type(exc).__name__))
            route.end()
            raise
        response.span = route
        response.headers.update(headers)
        return ticket.mark(response) if ticket is not None else response

    async def _auto_choice(self, raw: dict[str, Any], allowed: Callable[[str], bool]) -> AutoChoice | None:
        """`auto`'s pick; the other tier when the key may not use the picked model; None when it may use neither."""
        choice = await self.auto.choose(raw)
        if allowed(choice.model):
            return choice
        other = self.auto.small if choice.tier == "large" else self.auto.large
        if not allowed(other):
            return None
        return dataclasses.replace(choice, model=other, tier="small" if choice.tier == "large" else "large")

    def _fallbacks(self, model: str) -> tuple[str, ...]:
        return self.cfg.routing.fallbacks.get(model, ())

    async def _route(
        self, endpoint: Endpoint, request: Request, raw: dict[str, Any], chain: list[str], *, rec: RequestRecord,
        keep: Keep | None = None,
    ) -> Any:
        """`keep`: given the first model's answer (the response cache's store)."""
        tried: list[Attempted] = []
        for i, model in enumerate(chain):
            if i:
                self.metrics.fallbacks.labels(chain[0], model).inc()
            attempted = Attempted()
            fallback_of = chain[0] if i else ""
            response = await self._try_model(endpoint, request, raw, model, rec=rec, attempted=attempted,
                keep=None if i else keep, fallback_of=fallback_of)
            if response is not None:
                response.headers["x-smolgate-model"] = model
                return response
            tried.append(attempted)
        self.metrics.exhausted.labels(chain[0]).inc()
        err = final_error(chain, tried)
        err.message = self.guard.redact(err.message)
        raise err

    async def _try_model(
        self,
        endpoint: Endpoint,
        request: Request,
        raw: dict[str, Any],
        model: str,
        *,
        rec: RequestRecord,
        attempted: Attempted,
        keep: Keep | None,
        fallback_of: str = "",
    ) -> Any:
        """`fallback_of`: the model this one stands in for (its deployments all failed)."""
        balancer = self.balancers[model]
        key = self._affinity(model, raw) if any(s.cfg.prefix_affinity for s in balancer.states) else ""
        failed: set[int] = set()
        limited: set[int] = set()
        attempts = 0
        while attempts <= self.rcfg.num_retries:
            started = time.perf_counter()
            choice = balancer.pick(key, failed | limited) or (balancer.pick(key, limited) if failed else None)
            self.metrics.decision.observe(time.perf_counter() - started)
            if choice is None:
                wait = _soonest(balancer, limited)
                if wait is None or wait > self.rcfg.max_retry_after_s:
                    attempted.cooling_s = wait or 0.0
                    cooling = [s for s in balancer.states if s.index not in limited]
                    attempted.cooling_429 = bool(cooling) and all(s.last_status == 429 for s in cooling)
                    attempted.empty = not balancer.states  # DNS found no replica (yet)
                    return None
                attempts += 1
                await asyncio.sleep(wait)
                continue
            state = choice.state
            dep_limit = Limit(f"deployment:{model}/{state.name}", state.cfg.rpm, state.cfg.tpm)
            try:
                await self.limiter.admit(dep_limit)
            except OverLimit as exc:
                balancer.release(state)
                self.metrics.rate_limited.labels("deployment").inc()
                limited.add(state.index)
                attempted.limited = exc
                continue
            if attempts:
                self.metrics.retries.labels(model).inc()
            span = self._attempt_span(endpoint, model, state, attempts, fallback_of=fallback_of)
            try:
                with span.current():
                    return await self._attempt(endpoint, request, raw, model, choice=choice, rec=rec, dep_limit=dep_limit,
                        keep=keep, span=span)
            except Exception as exc:
                _attempt_failed(span, exc)
                if not retryable(exc):
                    balancer.release(state)
                    err = client_error(exc)
                    if isinstance(err, GatewayError):  # an upstream's words: never a secret of ours
                        err.message = self.guard.redact(err.message)
                    raise err from None
                self._failed(balancer, model, state, exc)
                attempted.last = exc
                failed.add(state.index)
                attempts += 1
                if attempts <= self.rcfg.num_retries:  # no pause before a fallback model
                    delay = min(self.rcfg.backoff_max_s, self.rcfg.backoff_base_s * 2 ** (attempts - 1))
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            except BaseException as exc:  # cancelled (the server stops): the attempt counts for nothing
                _attempt_failed(span, exc)
                balancer.release(state)
                raise
        return None

    def _attempt_span(self, endpoint: Endpoint, model: str, state: DeploymentState, attempt: int, *,
        fallback_of: str) -> spans.Span:
        """A CLIENT span for one try of one deployment (GenAI conventions: `{operation} {model}`); retries and
        fallbacks are its siblings under the router's span."""
        if spans.tracer() is None:
            return spans.NO_SPAN
        operation, cfg = ROUTER_OPERATIONS[endpoint], state.cfg
        url = urlsplit(cfg.base_url) if cfg.kind != "embedded" else None
        return spans.start(f"{operation} {cfg.model or model}", "client", {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "openai" if cfg.kind == "openai" else PROVIDER,
            "gen_ai.request.model": cfg.model or model,
            "server.address": url.hostname if url else None,
            "server.port": (url.port or (443 if url.scheme == "https" else 80)) if url else None,
            "smolgate.model": model,
            "smolgate.deployment": state.name,
            "smolgate.deployment.kind": cfg.kind,
            "smolgate.attempt": attempt,  # 0: the first try of this model; 1+: retries
            "smolgate.fallback_of": fallback_of or None,
        })  # fmt: skip

    def _failed(self, balancer: Balancer, model: str, state: DeploymentState, exc: BaseException) -> None:
        retry_after = getattr(exc, "retry_after_s", None)
        state.last_status = getattr(exc, "status", 0)
        self.metrics.attempts.labels(model, state.name, "failure").inc()
        if balancer.done(state, False, float(retry_after) if retry_after else None):
            self.metrics.cooldowns.labels(model, state.name).inc()
            self.logger.warning("deployment_cooldown", model=model, deployment=state.name, error=str(exc))

    async def _attempt(
        self,
        endpoint: Endpoint,
        request: Request,
        raw: dict[str, Any],
        model: str,
        *,
        choice: Choice,
        rec: RequestRecord,
        dep_limit: Limit,
        keep: Keep | None,
        span: spans.Span = spans.NO_SPAN,
    ) -> Any:
        """`span`: this attempt's; it ends when the answer has been sent."""
        state = choice.state
        if choice.affinity:
            self.metrics.prefix.labels(choice.affinity).inc()
        body = {**raw, "model": state.cfg.model or model}
        if state.cfg.kind == "openai":
            body.pop("cache", None)  # this gateway's extension: a third party would refuse it
        outcome = Outcome()
        if state.cfg.kind == "embedded":
            response = await self.own.get(model, self.local)[endpoint](request, body)
        else:
            upstream = self.upstreams[(model, state.index)]
            # a backend replica caches under the tenant this gateway authenticated (signed), or not at all
            ours = state.cfg.kind == "backend"
            headers = forwarded_headers(self.cfg.cache.tenant_secret, request.headers) if ours else {}
            headers.update(_trace_headers(span, request.headers))
            if raw.get("stream"):
                limits = StreamLimits.of(self.cfg)
                call = call_stream(upstream, _PATHS[endpoint], body, rec, count=self.count, limits=limits, outcome=outcome,
                    headers=headers, keep=keep)
            else:
                relay = _CACHE_VERDICT if ours else ()  # its x-cache reaches the client; a third party's means nothing
                call = call_json(upstream, _PATHS[endpoint], body, rec, count=self.count, headers=headers, relay=relay, keep=keep)
            response = await unless_disconnected(request.receive, call)  # a client gone cancels the upstream call
        rec.model = model
        balancer = self.balancers[model]

        async def done(ok: bool) -> None:
            self.metrics.attempts.labels(model, state.name, "success" if ok else "failure").inc()
            balancer.done(state, ok)
            await self.limiter.spend(dep_limit, rec.prompt_tokens + rec.completion_tokens)  # the key's: the middleware
            span.set_all({"gen_ai.usage.input_tokens": rec.prompt_tokens, "gen_ai.usage.output_tokens": rec.completion_tokens})
            if not ok:
                span.fail(rec.error_type or "upstream_error")
            span.end()

        response.headers["x-smolgate-deployment"] = rec.deployment = state.name
        return Tracked(response, done, outcome, rec)

    def _affinity(self, model: str, raw: dict[str, Any]) -> str:
        return request_affinity_key(model, raw, self.rcfg.affinity_prefix_chars)


def _attempt_failed(span: spans.Span, exc: BaseException) -> None:
    """An attempt that got no answer: error.type is the upstream's HTTP status, or what kept it from answering (a
    connect error, a timeout: the cause of the UpstreamError), or the exception's type."""
    status = getattr(exc, "status", None)
    if isinstance(exc, UpstreamError) and exc.__cause__ is not None:  # no HTTP answer at all
        span.fail(type(exc.__cause__).__name__)
    elif isinstance(status, int):
        span.set("http.response.status_code", status)
        span.fail(str(status))
    else:
        span.fail(type(exc).__name__)
    span.end()


def _soonest(balancer: Balancer, skip: set[int]) -> float | None:
    """Seconds until a cooling deployment (not rate-limited for this request) takes traffic again."""
    now = time.monotonic()
    waits = [s.cooldown_until - now for s in balancer.states if s.index not in skip and s.cooldown_until > now]
    return max(0.0, min(waits)) if waits else None
