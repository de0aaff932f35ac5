"""Ticket: one request's path through the cache — lookup (exact, then semantic), replay on a hit,
and on a miss a store of the finished answer (from the JSON body, or tapped from the stream)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

import orjson
from starlette.responses import Response

from backend.engine.outputs import RequestOutput, Usage
from backend.engine.sampling_params import SamplingParams
from gateway.cache import replay
from gateway.cache.config import CacheConfig
from gateway.cache.index import Candidate
from gateway.cache.keys import exact_key, semantic_scope
from gateway.cache.matcher import LearnedMatcher, QueryScorer
from gateway.cache.metrics import CacheMetrics
from gateway.cache.policy import CacheControl, exact_allowed, semantic_allowed
from gateway.cache.relevance import AnswerVector, cosine, excerpt
from gateway.cache.sampled import SampledCheck
from gateway.cache.semantic import NearMiss, Verify, embed_query, embed_texts, match
from gateway.cache.stores import CacheStore
from gateway.cache.thresholds import EntryThresholds
from gateway.cache.verify import Answer, EngineVerifier
from gateway.client import EmbeddingClient
from gateway.errors import GatewayError
from gateway.ids import IdGenerator
from gateway.ops.access_log import Logger
from gateway.ops.record import RequestRecord
from gateway.protocol.events import Step
from gateway.protocol.generation import Generation
from gateway.protocol.jsonio import json_response
from gateway.protocol.requests import StreamMode
from gateway.protocol.sse import ChatStream, SSEStream, StreamLimits
from gateway.tracing import spans

_ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-"}
_HEADER_VALUE = {"hit": "hit", "semantic-hit": "semantic-hit", "miss": "miss", "bypass": "miss"}


class CacheParts(Protocol):
    """What a ticket uses of its cache (gateway/cache/service.py's ResponseCache): named here, so the service
    imports the ticket and not the other way round. Read-only (properties), so a cache may hold a narrower type
    (a SafeStore as its store, None as its verifier)."""

    @property
    def cfg(self) -> CacheConfig: ...
    @property
    def store(self) -> CacheStore | None: ...
    @property
    def embedder(self) -> EmbeddingClient | None: ...
    @property
    def metrics(self) -> CacheMetrics: ...
    @property
    def logger(self) -> Logger: ...
    @property
    def ids(self) -> IdGenerator: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def stream_limits(self) -> StreamLimits: ...
    @property
    def verifier(self) -> EngineVerifier | None: ...
    @property
    def thresholds(self) -> EntryThresholds | None: ...
    @property
    def sampled(self) -> SampledCheck | None: ...  # for a third-party model's entries (the engine cannot verify them)
    @property
    def learned(self) -> LearnedMatcher | None: ...  # cache.semantic_match: learned or union


class Ticket:
    """status: none (cache off) | bypass (not cacheable / lookup skipped) | miss | hit | semantic-hit."""

    def __init__(self, cache: CacheParts, endpoint: str, control: CacheControl, ns: str) -> None:
        """`ns`: the tenant namespace (gateway/cache/tenancy.py: the client's key, or one signed by the router)."""
        self.cache = cache
        self.endpoint = endpoint
        self.control = control
        self.namespace = ns
        self.status = "none" if cache.store is None else "bypass"
        self.key: str | None = None
        self.scope: str | None = None
        self.query = ""
        self.vector: list[float] | None = None
        self.similarity: float | None = None
        self.near_miss: NearMiss | None = None  # extension point: a draft for speculative decoding
        self.prompt_ids: tuple[int, ...] = ()
        self.sample: tuple[Candidate, bytes] | None = None  # a hit sent to the provider anyway, to compare answers

    async def lookup(
        self,
        rec: RequestRecord,
        body: dict[str, Any],
        params: SamplingParams,
        stream: StreamMode,
        *,
        messages: list[dict[str, Any]] | None = None,
        prompt: object = None,
        prompt_ids: Sequence[int] | None = None,
    ) -> Response | None:
        """A replayed response on a hit; None on a miss (generate, then `store` or `tap`). The exact key holds `prompt`
        (default: `messages`) and `prompt_ids`; `messages` (chat only) are also what a semantic match compares."""
        store, cfg = self.cache.store, self.cache.cfg
        if store is None or not exact_allowed(cfg, params):
            self._done(rec)
            return None
        with spans.start("cache.lookup", "internal", {"smolgate.cache.endpoint": self.endpoint}) as span:
            response = await self._lookup(
                store, rec, body, params, stream=stream,
                messages=messages, prompt=messages if prompt is None else prompt, prompt_ids=prompt_ids,
            )  # fmt: skip
            span.set_all({"smolgate.cache.result": self.status, "smolgate.cache.similarity": self.similarity})
            return response

    async def _lookup(
        self,
        store: CacheStore,
        rec: RequestRecord,
        body: dict[str, Any],
        params: SamplingParams,
        *,
        stream: StreamMode,
        messages: list[dict[str, Any]] | None,
        prompt: object,
        prompt_ids: Sequence[int] | None,
    ) -> Response | None:
        cfg, fp = self.cache.cfg, self.cache.fingerprint
        self.key = exact_key(self.namespace, fp, self.endpoint, body, params=params, prompt=prompt, prompt_ids=prompt_ids)
        embedder = self.cache.embedder
        if messages and self.control.semantic and embedder is not None and semantic_allowed(cfg, body, messages, params):
            self.scope = semantic_scope(self.namespace, fp, embedder.identity, self.endpoint, body=body, params=params,
                                        context=messages[:-1])
            self.query = messages[-1]["content"]
            self.prompt_ids = tuple(prompt_ids or ())
        if not self.control.lookup:
            self._done(rec)
            return None
        self.status = "miss"
        entry = await store.get(self.key)
        if entry is not None:
            return self._hit(rec, "hit", entry, stream)
        entry = await self._semantic()
        if entry is not None:
            return self._hit(rec, "semantic-hit", entry, stream)
        self._done(rec)
        return None

    async def _semantic(self) -> bytes | None:
        store, cfg, embedder = self.cache.store, self.cache.cfg, self.cache.embedder
        if store is None or self.scope is None or embedder is None:
            return None
        scorer = None
        if self.cache.learned is not None:  # one forward: the query's vector and the token states the matcher reads
            scorer = await _read_query(self.cache.learned, self.query, self.cache.logger)
            self.vector = None if scorer is None else scorer.vector
        else:
            self.vector = await embed_query(embedder, self.query, self.cache.logger)
        if self.vector is None:
            return None
        found = await match(
            store, self.scope, self.query, self.vector, threshold=cfg.similarity_threshold, margin=cfg.near_miss_margin,
                verify=self._verify(),
            relevance_margin=cfg.relevance_margin if cfg.relevance else None, learned=scorer,
        )
        self.near_miss = found.near_miss
        if found.near_miss is not None:
            self.cache.metrics.near_misses.labels(found.near_miss.reason).inc()
        if found.hit is None or not await self._admitted(found.hit, found.entry):
            return None
        self.similarity = found.hit.similarity
        return found.entry

    async def _admitted(self, hit: Candidate, entry: bytes | None) -> bool:
        """For a third-party model with `cache.upstream_sample`: the lexical check's hit is served, or sent to the
        provider (this request's answer is then compared with the cached one in `keep`), or refused because its
        entry's answer disagreed before at this similarity or above."""
        check = self.cache.sampled
        if check is None or entry is None:
            return True
        admission = await check.admit(hit.key, hit.similarity)
        if admission != "serve":
            self.cache.metrics.verifications.labels(admission).inc()
        if admission == "sample":
            self.sample = (hit, entry)
        return admission == "serve"

    def _verify(self) -> Verify | None:
        """The engine check of a candidate entry, when this cache has a verifier and the prompt's token ids."""
        verifier = self.cache.verifier
        if verifier is None or not self.prompt_ids:
            return None
        prompt_ids = self.prompt_ids

        verify_all = self.cache.cfg.semantic_verify == "all"

        async def verify(cand: Candidate, entry: bytes, uncertain: bool) -> bool:
            if not uncertain and not verify_all:  # the lexical check decided: words in their roles
                return True
            answer = Answer.from_json(orjson.loads(entry).get("answer"))
            if answer is None:  # stored without its log-probabilities: it cannot be verified, so it is not served
                return False
            learned = self.cache.thresholds
            if learned is not None and not uncertain:
                await learned.refresh()  # what the other replicas learned meanwhile
                if learned.decide(cand.key, cand.similarity).skip:
                    self.cache.metrics.verifications.labels("skipped").inc()  # this entry's record bounds the error
                    return True
            accepted = await verifier.verify(prompt_ids, answer, uncertain)
            self.cache.metrics.verifications.labels("accepted" if accepted else "rejected").inc()
            if learned is not None:
                await learned.record(cand.key, cand.similarity, accepted)
            return accepted

        return verify

    async def keep(self, body: dict[str, Any]) -> None:
        """A third-party model's answer: compared with the cached one when this request was a sampled hit, then
        stored."""
        if self.sample is not None:
            await self._compare(body, *self.sample)
            self.sample = None
        await self.store(body)

    async def _compare(self, body: dict[str, Any], cand: Candidate, entry: bytes) -> None:
        check, embedder = self.cache.sampled, self.cache.embedder
        fresh, cached = _text_of(body), _text_of(orjson.loads(entry)["body"])
        if check is None or embedder is None or fresh is None or cached is None:
            return
        vectors = await embed_texts(embedder, [excerpt(fresh), excerpt(cached)], self.cache.logger)
        if vectors is None:
            return
        agreed = await check.observe(cand.key, cand.similarity, cosine(vectors[0], vectors[1]))
        self.cache.metrics.verifications.labels("agreed" if agreed else "disagreed").inc()

    @property
    def records_answer(self) -> bool:
        """Whether the generation should return its tokens' log-probabilities, kept with the entry for verification
        (the response shows them only if the client asked)."""
        return self.cache.verifier is not None and self.scope is not None and self.storing

    async def near_miss_answer(self) -> str | None:
        """The answer cached for the nearest rejected question: chat hands it to the engine as the
        speculative-decoding reference (drafts it verifies token by token), never serves it as is."""
        store = self.cache.store
        if self.near_miss is None or store is None:
            return None
        entry = await store.get(self.near_miss.candidate.key)
        if entry is None:
            return None
        choice = orjson.loads(entry)["body"]["choices"][0]
        text = choice["message"].get("content") if "message" in choice else choice.get("text")
        return text or None

    def _done(self, rec: RequestRecord) -> None:
        rec.cache = self.status
        if self.status != "none":
            self.cache.metrics.lookup(self.endpoint, self.status)
        return None

    def _hit(self, rec: RequestRecord, status: str, entry: bytes, stream: StreamMode) -> Response:
        self.status = rec.cache = status
        self.cache.metrics.lookup(self.endpoint, status)
        stored = orjson.loads(entry)["body"]
        body = replay.rebrand(stored, _ID_PREFIX[self.endpoint] + self.cache.ids.new())
        usage = stored["usage"]
        self.cache.metrics.saved(usage["prompt_tokens"], usage["completion_tokens"])
        rec.replayed = Usage(usage["prompt_tokens"], usage["completion_tokens"], 0)  # the ledger's row of this hit
        rec.first_token()
        if not stream.stream:
            return self.mark(json_response(body))
        if self.endpoint != "chat":
            events = replay.events(replay.completion_chunks(body, stream.include_usage))
            return self.mark(SSEStream(events, [], self.cache.stream_limits, rec.client_disconnected))
        steps = replay.chat_steps(body, stream.include_usage)
        return self.mark(ChatStream(steps, _unrendered, _never_fails, 1, engine_streams=[], limits=self.cache.stream_limits,
                                         on_disconnect=rec.client_disconnected))

    def mark(self, response: Response) -> Response:
        """x-cache (hit | semantic-hit | miss) and, for semantic hits, x-cache-similarity."""
        if self.status != "none":
            response.headers["x-cache"] = _HEADER_VALUE[self.status]
            if self.similarity is not None:
                response.headers["x-cache-similarity"] = f"{self.similarity:.4f}"
        return response

    @property
    def storing(self) -> bool:
        return self.key is not None and self.control.store and self.status in ("miss", "bypass")

    async def store(self, body: dict[str, Any], gen: Generation | None = None) -> None:
        """Keep a finished answer (and its question's vector, for semantic lookups). `gen`: the generation, whose
        token ids and log-probabilities are kept for the verifier when it recorded them."""
        store = self.cache.store
        if store is None or self.key is None or not self.storing or not replay.replayable(body):
            return
        ttl = self.control.ttl_s or self.cache.cfg.ttl_s
        entry: dict[str, Any] = {"v": 1, "query": self.query, "body": body}
        answer = _answer_of(gen)
        if answer is not None and self.scope is not None:
            entry["answer"] = answer.to_json()
        embedder = self.cache.embedder
        if self.scope is not None and embedder is not None and self.vector is None:
            self.vector = await embed_query(embedder, self.query, self.cache.logger)
        if self.vector is not None and embedder is not None and self.cache.cfg.relevance:
            relevance = await _answer_vector(embedder, body, self.vector, self.cache.logger)
            if relevance is not None:  # without it the entry is never served semantically (only exactly)
                entry["relevance"] = relevance.to_json()
        await store.put(self.key, orjson.dumps(entry), ttl)
        self.cache.metrics.stores.labels(self.endpoint).inc()
        if self.scope is not None and self.vector is not None:
            await store.add_vector(self.scope, self.key, self.query, self.vector, ttl_s=ttl)

    async def tap(
        self, outputs: AsyncGenerator[RequestOutput, None], build: Callable[[Generation], dict[str, Any]]
    ) -> AsyncGenerator[RequestOutput, None]:
        """Pass a live stream through; once it has finished cleanly (no abort), store the answer."""
        if not self.storing:
            async with aclosing(outputs):
                async for out in outputs:
                    yield out
            return
        gen, aborted, finished = Generation(), False, False
        async with aclosing(outputs):
            async for out in outputs:
                gen.absorb(out)
                aborted = aborted or any(d.finish_reason == "abort" for d in out.deltas)
                finished = out.finished
                yield out
        if finished and not aborted:
            await self.store(build(gen), gen)


def _unrendered(step: Step) -> bytes:
    return b""  # a replay's steps carry their chunks' bytes


def _never_fails(exc: BaseException, err: GatewayError) -> None:
    return None


def _answer_of(gen: Generation | None) -> Answer | None:
    """One choice's token ids with a log-probability for each (n > 1 answers are not verified)."""
    if gen is None or len(gen.choices) != 1:
        return None
    choice = next(iter(gen.choices.values()))
    if not choice.token_ids or len(choice.logprobs) != len(choice.token_ids):
        return None
    return Answer(tuple(choice.token_ids), tuple(lp.logprob for lp in choice.logprobs))


async def _read_query(learned: LearnedMatcher, query: str, logger: Logger) -> QueryScorer | None:
    try:
        return await learned.query(query)
    except Exception as exc:  # e.g. longer than the embedding model reads: this request is just not matched
        logger.warning("cache_embedding_failed", error=type(exc).__name__, detail=str(exc)[:200])
        return None


async def _answer_vector(embedder: EmbeddingClient, body: dict[str, Any], question: list[float], logger: Logger
                         ) -> AnswerVector | None:  # fmt: skip
    """The embedded opening of a single-choice answer with its cosine to the question (gateway/cache/relevance.py)."""
    text = _text_of(body)
    if text is None:
        return None
    vector = await embed_query(embedder, excerpt(text), logger)
    return None if vector is None else AnswerVector.of(vector, question)


def _text_of(body: dict[str, Any]) -> str | None:
    """A single-choice answer's text (chat or completions); None for anything else or an empty one."""
    choices = body.get("choices") or []
    if len(choices) != 1:
        return None
    choice = choices[0]
    text = (choice.get("message") or {}).get("content") if "message" in choice else choice.get("text")
    return text if isinstance(text, str) and text.strip() else None
