"""How the router judges failures: which ones another attempt may cure, and the one error a client gets
when every deployment and fallback failed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.errors import GatewayError, InvalidRequest, RateLimited, ServiceUnavailable, to_gateway_error
from gateway.ratelimit import OverLimit
from gateway.routing.upstream import UpstreamError


class AllFailed(ServiceUnavailable):
    default_code = "all_deployments_failed"


@dataclass
class Attempted:
    """What one model's deployments did for this request."""

    last: BaseException | None = None
    limited: OverLimit | None = None
    cooling_s: float = 0.0  # every deployment cools down this long yet
    cooling_429: bool = False  # ...because the upstreams said 429
    empty: bool = False  # no replica at all: discovery (DNS) found none yet


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, UpstreamError):
        return exc.retryable and not exc.client_fault
    return to_gateway_error(exc).status in (429, 500, 502, 503)  # the embedded engine: queue full, dead, a bug


def client_error(exc: BaseException) -> BaseException:
    """The upstream said the request itself is wrong: the client sees the upstream's message."""
    if isinstance(exc, UpstreamError):
        error = (exc.body or {}).get("error") or {}
        return InvalidRequest(
            str(error.get("message") or f"The upstream rejected the request ({exc.status})."), param=error.get("param")
        )
    return exc


def final_error(chain: list[str], tried: list[Attempted]) -> GatewayError:
    names = " -> ".join(chain)
    lasts = [a.last for a in tried if a.last is not None]
    limits = [a.limited for a in tried if a.limited is not None]
    retry_afters = [e.retry_after_s for e in lasts if isinstance(e, UpstreamError) and e.status == 429 and e.retry_after_s]
    if not lasts and limits:
        return RateLimited(
            f"Every deployment of {names} is at its rate limit.", retry_after_s=min(e.retry_after_s for e in limits)
        )
    retry_afters += [a.cooling_s for a in tried if a.cooling_429 and a.cooling_s]
    if all(isinstance(e, UpstreamError) and e.status == 429 for e in lasts) and all(a.cooling_429 or a.last for a in tried):
        wait = max(1, math.ceil(min(retry_afters))) if retry_afters else 1
        return RateLimited(f"Every deployment of {names} is rate limited upstream.", retry_after_s=wait)
    if lasts:
        detail = f" (last error: {lasts[-1]})"
    elif all(a.empty for a in tried):
        detail = " (no replica is up: DNS discovery found none)"
    else:
        detail = " (every deployment is cooling down after failures)"
    return AllFailed(f"No deployment of {names} could serve the request{detail}. Retry later.")
