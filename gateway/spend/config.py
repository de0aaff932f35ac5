"""SpendConfig: the `spend:` section (prices, ledger, team budgets); env SMOLGATE_LEDGER_URL overrides ledger_url.

Prices are per 1M tokens in `currency`; each names a model (served, routed or the upstream's own id) or a
deployment (its `name`). Budgets per key are KeyLimits fields (`daily_budget`, `monthly_budget`, `team`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from backend.config import cache_dir


@dataclass(frozen=True)
class Price:
    """Per 1M tokens. `cached_input`: the prompt tokens served from a prefix cache (None: the input price)."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        cached = min(max(cached_tokens, 0), input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return ((input_tokens - cached) * self.input + cached * cached_price + output_tokens * self.output) / 1e6


FREE = Price()


@dataclass(frozen=True)
class TeamBudget:
    daily_budget: float = 0.0  # currency per UTC day; 0 = none
    monthly_budget: float = 0.0  # currency per UTC month; 0 = none


def default_dir() -> Path:
    return cache_dir() / "ledger"


@dataclass(frozen=True)
class LedgerConfig:
    """The `ledger:` section."""

    enabled: bool = True  # one row per request that produced tokens
    url: str = field(default="", repr=False)  # "" = SQLite in `dir`; sqlite:///abs/path.db; postgresql://... (shared)
    dir: str = ""  # the SQLite file and the journal; "" = $SMOLGATE_CACHE/ledger (~/.cache/smolgate/...)
    journal_segment_bytes: int = 4 * 1024 * 1024  # the journal moves to a new file past this size

    def __post_init__(self) -> None:
        if self.journal_segment_bytes < 4096:
            raise ValueError("ledger.journal_segment_bytes must be at least 4096")
        if self.url and not self.url.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("ledger.url must be sqlite:///path or postgresql://...")

    @property
    def path(self) -> Path:
        return Path(self.dir).expanduser() if self.dir else default_dir()

    @property
    def sqlite_path(self) -> Path:
        if self.url.startswith("sqlite://"):  # sqlite:///abs/path.db
            return Path(self.url[len("sqlite://") :]).expanduser()
        return self.path / "ledger.sqlite3"


@dataclass(frozen=True)
class SpendConfig:
    """The `spend:` section, plus `ledger:`."""

    currency: str = "usd"  # lowercase ISO 4217, as OpenAI's Costs API writes it
    cache_hit_factor: float = 0.0  # a cached answer costs this fraction of its price (0: free, 1: full price)
    shipped_prices: bool = True  # upstream (kind openai) deployments get OpenAI's/Anthropic's list prices by default
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}))
    teams: Mapping[str, TeamBudget] = field(default_factory=lambda: MappingProxyType({}))
    ledger: LedgerConfig = field(default_factory=LedgerConfig)

    def __post_init__(self) -> None:
        if self.cache_hit_factor < 0:
            raise ValueError("spend.cache_hit_factor must be >= 0")
