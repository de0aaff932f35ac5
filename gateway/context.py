"""GatewayContext: everything a route needs, built once by create_app (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.cache.service import ResponseCache
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, InternalError
from gateway.ids import IdGenerator
from gateway.keys import KeyGuard
from gateway.models import ModelCatalog
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.record import RequestRecord
from gateway.ops.stats import LiveStats


@dataclass
class Readiness:
    """Set by the app's lifespan once the engine runs."""

    ready: bool = False


@dataclass(frozen=True)
class GatewayContext:
    config: GatewayConfig
    engine: EngineClient
    embedder: EmbeddingClient | None
    catalog: ModelCatalog
    metrics: GatewayMetrics
    logger: Any
    cache: ResponseCache
    readiness: Readiness = field(default_factory=Readiness)
    ids: IdGenerator = field(default_factory=IdGenerator)
    stats: LiveStats = field(default_factory=LiveStats)
    guard: KeyGuard = None  # type: ignore[assignment]  # keys and their policies; built from `config` when not given

    def __post_init__(self) -> None:
        if self.guard is None:
            object.__setattr__(self, "guard", KeyGuard(self.config, self.logger))

    def report_error(self, rec: RequestRecord, exc: BaseException, err: GatewayError) -> None:
        """Note a failed request; unexpected exceptions are logged with their traceback."""
        rec.error_type = err.error_type
        if isinstance(err, InternalError) and not isinstance(exc, GatewayError):
            self.logger.error("unhandled_exception", request_id=rec.request_id, path=rec.path, exc_info=exc)
