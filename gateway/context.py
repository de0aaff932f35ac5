"""GatewayContext: everything a route needs, built once by create_app (no module-level state)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from gateway.cache.service import ResponseCache
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, InternalError
from gateway.ids import IdGenerator
from gateway.keys.guard import KeyGuard
from gateway.models import ModelCatalog
from gateway.ops.access_log import Logger
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.record import RequestRecord
from gateway.ops.stats import LiveStats
from gateway.spend.budget import period_starts
from gateway.spend.service import Spend

if TYPE_CHECKING:  # the SDK is imported only when traces are exported
    from gateway.tracing.otel import Tracing


@dataclass
class Readiness:
    """Set by the app's lifespan once the engine runs."""

    ready: bool = False


@dataclass(frozen=True)
class OwnModel:
    """One model of the `models:` list: its own engine, and its own response-cache scope (fingerprint)."""

    engine: EngineClient
    cache: ResponseCache


@dataclass(frozen=True)
class GatewayContext:
    config: GatewayConfig
    engine: EngineClient
    embedder: EmbeddingClient | None
    catalog: ModelCatalog
    metrics: GatewayMetrics
    logger: Logger
    cache: ResponseCache
    readiness: Readiness = field(default_factory=Readiness)
    ids: IdGenerator = field(default_factory=IdGenerator)
    stats: LiveStats = field(default_factory=LiveStats)
    guard: KeyGuard = None  # type: ignore[assignment]  # keys and their policies; built from `config` when not given
    # the `models:` list's models by id (`engine` and `cache` are the first one's); empty: `engine` alone serves
    own_models: Mapping[str, OwnModel] = field(default_factory=lambda: MappingProxyType({}))
    tracing: Tracing | None = None  # when traces are exported (traces.endpoint); None: tracing off
    spend: Spend = None  # type: ignore[assignment]  # prices and the ledger (gateway/spend/); built from `config`

    def __post_init__(self) -> None:
        if self.guard is None:
            object.__setattr__(self, "guard", KeyGuard(self.config, self.logger))
        if self.spend is None:
            object.__setattr__(self, "spend", Spend(self.config.spend, self.config.routing, self.logger, self.ids))
            self._seed_budgets()

    def _seed_budgets(self) -> None:
        """In-process budget counters start from what the ledger holds for this day and month."""
        ledger, budgets = self.spend.ledger, self.guard.budgets
        if ledger is None or budgets.shared or not any(budgets.applies(p) for p in self.guard.policies):
            return
        day, month = period_starts(budgets.clock())
        try:
            ledger.flush()  # a dead process's journal first
            sums = ledger.read(lambda db: [db.sums(t, c) for c in ("key_name", "team") for t in (day, month)])
        except Exception as exc:  # the budgets then start from zero: say so
            self.logger.warning("budgets_not_seeded", error=type(exc).__name__)
            return
        budgets.seed((sums[0], sums[1]), (sums[2], sums[3]))

    def of_model(self, model_id: str) -> GatewayContext:
        """The context a handler of that `models:` list entry sees: its engine and cache, everything else shared."""
        own = self.own_models[model_id]
        return replace(self, engine=own.engine, cache=own.cache)

    def engine_for(self, model: object) -> EngineClient:
        """The engine that serves the model a request names (an alias resolved): its own with the `models:` list (for
        token counts and context limits), else `engine`."""
        own = self.own_models.get(self.catalog.canonical(model)) if isinstance(model, str) and self.own_models else None
        return own.engine if own is not None else self.engine

    def engines(self) -> list[EngineClient]:
        """Every engine this process runs (the lifespan starts and stops them)."""
        extra = [m.engine for m in self.own_models.values() if m.engine is not self.engine]
        return [self.engine, *extra]

    def report_error(self, rec: RequestRecord, exc: BaseException, err: GatewayError) -> None:
        """Note a failed request; unexpected exceptions are logged with their traceback."""
        rec.error_type = err.error_type
        if isinstance(err, InternalError) and not isinstance(exc, GatewayError):
            self.logger.error("unhandled_exception", request_id=rec.request_id, path=rec.path, exc_info=exc)
