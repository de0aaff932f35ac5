"""Who may do what (docs/security.md): API keys and their policies, the admin key, and the per-key checks every
generating request passes through whatever serves it (the embedded engine alone, the router, an upstream).

- Keys are compared as SHA-256 digests with hmac.compare_digest against every configured key (no early exit);
  the configuration may hold `sha256:<hex>` instead of a key.
- A key's policy: the models it may use (aliases resolved), rpm/tpm and its (and its team's) daily and monthly
  spend budgets (gateway/spend/budget.py; in process, or shared through Redis or PostgreSQL), the best
  `priority` it may ask for (also its default), caps on max_tokens (also the default when a request sets none)
  and on the sequences one request starts (n x prompts). A violation is a 400/404/429 in OpenAI's error shape.
- `redact` takes every configured secret out of a text (log lines, error messages relayed from upstreams).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeGuard, TypeVar

from gateway.config import GatewayConfig
from gateway.errors import AuthenticationFailed, InvalidRequest, ModelNotFound, QuotaExceeded, RateLimited
from gateway.keys.config import SHA256_PREFIX, KeyPolicy
from gateway.ops.access_log import Logger
from gateway.ops.record import RequestRecord
from gateway.ratelimit import Limit, OverLimit, build_limiter
from gateway.spend.budget import Budgets, OverBudget, Reservation
from gateway.spend.estimate import estimate_cost
from gateway.spend.prices import PriceTable

Endpoint = Literal["chat", "completions", "embeddings"]
MAX_PRIORITY = 2**31 - 1
REDACTED = "[redacted]"
MIN_REDACTED = 8  # shorter "secrets" (test keys like "k") would redact ordinary words


def digest(key: str) -> bytes:
    """The SHA-256 a configured key is compared by (`sha256:<hex>` is one already)."""
    if key.startswith(SHA256_PREFIX):
        return bytes.fromhex(key[len(SHA256_PREFIX) :])
    return hashlib.sha256(key.encode()).digest()


def bearer(authorization: bytes | str | None) -> bytes | None:
    """The key of an `Authorization: Bearer <key>` header, else None."""
    if not authorization:
        return None
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    scheme, _, key = raw.partition(b" ")
    key = key.strip()
    return key if scheme.lower() == b"bearer" and key else None


_Entry = TypeVar("_Entry")


def _match(presented: bytes, digests: Iterable[tuple[bytes, _Entry]]) -> _Entry | None:
    """The entry whose digest is the presented key's; every digest is compared (constant time per comparison)."""
    found: _Entry | None = None
    mine = hashlib.sha256(presented).digest()
    for d, entry in digests:
        if hmac.compare_digest(mine, d) and found is None:
            found = entry
    return found


def _scope(policy: KeyPolicy) -> str:
    """The rate-limit counters' name for a key: a short hash (never the key; names may repeat across configs)."""
    return "key:" + (digest(policy.key).hex()[:16] if policy.key else "anonymous")


class KeyGuard:
    def __init__(self, config: GatewayConfig, logger: Logger) -> None:
        self.config = config
        self.logger = logger
        policies = config.policies()
        self._keys = [(digest(p.key), p) for p in policies]
        self._admins = [(digest(k), True) for k in config.admin_keys]
        self.required = bool(self._keys)  # /v1/ needs a key
        self.ops_protected = bool(self._keys or self._admins)  # /metrics and /v1/stats need an admin key
        self.anonymous = KeyPolicy.of("anonymous", "", config.key_defaults)
        self._secrets = sorted({s for s in config.secrets() if len(s) >= MIN_REDACTED}, key=len, reverse=True)
        rc = config.routing.router
        self.limiter = build_limiter(rc.redis_url, rc.redis_prefix, self._limiter_error)
        self.prices = PriceTable(config.spend, config.routing)
        ledger = config.spend.ledger
        shared_db = ledger.url if ledger.enabled and ledger.url.startswith(("postgresql://", "postgres://")) else ""
        self.budgets = Budgets(config.spend.teams, rc.redis_url, rc.redis_prefix + ":budget", self._limiter_error,
                               postgres_url=shared_db)  # fmt: skip
        self._last_warning = 0.0
        self._limits = {id(p): Limit(_scope(p), p.rpm, p.tpm) for _, p in self._keys}
        self._limits[id(self.anonymous)] = Limit(_scope(self.anonymous), self.anonymous.rpm, self.anonymous.tpm)
        if self.required and not self._admins:
            logger.warning("no_admin_key", detail="api_keys are set but admin_keys are not: /metrics and /v1/stats answer 401")

    @property
    def policies(self) -> tuple[KeyPolicy, ...]:
        """The accepted keys' policies: the very objects the rate limits are kept for (`config.policies()` builds
        new ones on every call, which `admit` would not know)."""
        return tuple(p for _, p in self._keys)

    # ---- authentication ----------------------------------------------------------------------------------------

    def authenticate(self, authorization: bytes | None) -> KeyPolicy:
        """The policy of the request's key (anonymous when no key is configured); 401 otherwise."""
        if not self.required:
            return self.anonymous
        key = bearer(authorization)
        if key is None:
            if authorization:
                raise AuthenticationFailed("Incorrect API key provided.")
            raise AuthenticationFailed(
                "You didn't provide an API key. Send it in the Authorization header ('Bearer YOUR_KEY') or in x-api-key."
            )
        policy = _match(key, self._keys)
        if policy is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return policy

    def check_admin(self, authorization: bytes | None) -> None:
        """/metrics and /v1/stats: an admin key when any key is configured, else 401."""
        if not self.ops_protected:
            return
        key = bearer(authorization)
        if key is None or _match(key, self._admins) is None:
            raise AuthenticationFailed("This page needs an admin key (admin_keys): send it as 'Authorization: Bearer KEY'.")

    # ---- models --------------------------------------------------------------------------------------------------

    @staticmethod
    def allows(policy: KeyPolicy, model: str, resolve: Callable[[str], str] = lambda n: n) -> bool:
        """May `policy` use the served model `model`? Its `models` may name aliases; empty = every model."""
        return not policy.models or model in policy.models or any(resolve(m) == model for m in policy.models)

    @staticmethod
    def not_found(name: str) -> ModelNotFound:
        """The one answer for a model that does not exist and for one the key may not use (no oracle)."""
        return ModelNotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")

    # ---- caps ----------------------------------------------------------------------------------------------------

    def check_body(self, policy: KeyPolicy, endpoint: Endpoint, raw: dict[str, Any]) -> dict[str, Any]:
        """The key's caps on a generation request; the body with the default max_tokens when it sets none."""
        if endpoint == "embeddings":
            return raw
        _check_priority(policy, raw.get("priority"))
        names = ("max_completion_tokens", "max_tokens") if endpoint == "chat" else ("max_tokens",)
        given = next(((n, raw[n]) for n in names if raw.get(n) is not None), None)
        cap = policy.max_tokens
        if given is not None:
            param, value = given
            if cap and _number(value) and value > cap:
                raise InvalidRequest(
                    f"Invalid value for '{param}': {value} is more than this API key may ask for ({cap}).", param=param
                )
        elif cap and endpoint == "chat":  # completions default to 16 tokens (OpenAI's documented default)
            raw = {**raw, "max_tokens": cap}
        min_tokens = raw.get("min_tokens")
        if cap and _number(min_tokens) and min_tokens > cap:
            raise InvalidRequest(
                f"Invalid value for 'min_tokens': {min_tokens} is more than this API key may ask for ({cap}).",
                param="min_tokens",
            )
        _check_sequences(policy, endpoint, raw)
        return raw

    # ---- rate limits -------------------------------------------------------------------------------------------

    async def admit(
        self, policy: KeyPolicy, rec: RequestRecord, endpoint: Endpoint = "chat", raw: dict[str, Any] | None = None,
        *, model: str = "",
    ) -> None:
        """Count the request against its key's rpm (refused when its tpm is spent): 429 with Retry-After. Then,
        given its body, reserve its estimated cost at `model`'s price on the key's budgets: 429 insufficient_quota
        when one would be passed."""
        limit = self._limits.get(id(policy))
        if limit is not None and limit.active:
            try:
                await self.limiter.admit(limit)
            except OverLimit as exc:
                raise RateLimited(
                    f"Rate limit reached for your API key: {exc.what} per minute.", retry_after_s=exc.retry_after_s
                ) from None
            rec.limit = limit
        if raw is not None and self.budgets.applies(policy):
            estimate = estimate_cost(endpoint, raw, policy, self.prices.most(model))
            try:
                rec.reservation = await self.budgets.reserve(policy, estimate)
            except OverBudget as exc:
                raise QuotaExceeded(
                    f"You exceeded your current quota: this request (up to {estimate:.6g} {self.config.spend.currency}) "
                    f"would pass the {exc.what} ({exc.limit:g} {self.config.spend.currency}). Lower max_tokens, or wait "
                    "for the next period."
                ) from None

    async def tokens_left(self, policy: KeyPolicy) -> int | None:
        """What is left of the key's tokens per minute in this window; None when it has no tpm limit."""
        limit = self._limits.get(id(policy))
        return None if limit is None else await self.limiter.tokens_left(limit)

    async def spend(self, rec: RequestRecord) -> None:
        """The finished request's tokens, against its key's tpm; its budgets' reservation settled to `rec.cost`."""
        limit = rec.limit
        if isinstance(limit, Limit):
            await self.limiter.spend(limit, rec.prompt_tokens + rec.completion_tokens)
        if isinstance(rec.reservation, Reservation):
            reservation, rec.reservation = rec.reservation, None  # once, whoever calls first
            await self.budgets.settle(reservation, rec.cost)

    def _limiter_error(self, exc: BaseException) -> None:
        if time.monotonic() - self._last_warning > 10:
            self._last_warning = time.monotonic()
            self.logger.warning("rate_limit_store_unavailable", error=type(exc).__name__)

    async def close(self) -> None:
        await self.limiter.close()
        await self.budgets.close()

    # ---- secrets -------------------------------------------------------------------------------------------------

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_priority(policy: KeyPolicy, value: object) -> None:
    """A request may ask for its key's class or a later one (a higher number); a wrong type is parse's 400."""
    if not _number(value):
        return
    if value < policy.priority or value > MAX_PRIORITY:
        raise InvalidRequest(
            f"Invalid value for 'priority': {value} is outside what this API key may ask for "
            f"([{policy.priority}, {MAX_PRIORITY}]; lower values are served first).",
            param="priority",
        )


def _check_sequences(policy: KeyPolicy, endpoint: Endpoint, raw: dict[str, Any]) -> None:
    n = max((v for v in (raw.get("n"), raw.get("best_of")) if _number(v)), default=1)
    prompts = 1
    prompt = raw.get("prompt")
    if endpoint == "completions" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompts = len(prompt)
    cap = policy.max_sequences
    if n > cap:
        param = "best_of" if raw.get("best_of") == n and raw.get("n") != n else "n"
        raise InvalidRequest(f"Invalid value for '{param}': {n} is more than this API key may ask for ({cap}).", param=param)
    if n * prompts > cap:
        raise InvalidRequest(
            f"This request would start {int(n * prompts)} sequences ({prompts} prompts x n={n}); "
            f"this API key may start at most {cap} per request.",
            param="prompt",
        )
