"""What one API key may do: its limits (`key_defaults`, or a key mapping's fields) and its policy (docs/security.md).

The `api_keys` and `key_defaults` sections are parsed into these in gateway/routing/config.py; gateway/keys/guard.py
enforces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

SHA256_PREFIX = "sha256:"  # a configured key given as the hex SHA-256 of the key


@dataclass(frozen=True)
class KeyLimits:
    """What a key may ask of the engine (docs/security.md). `key_defaults` sets these for every key (plain ones,
    mappings that leave a field out, and anonymous requests when no key is configured)."""

    rpm: int = 0  # requests per minute; 0 = unlimited
    tpm: int = 0  # tokens (prompt + completion) per minute
    priority: int = 0  # the best (lowest) `priority` a request may ask for, and its default; 0 = the normal class
    max_tokens: int = 1024  # cap on max_tokens / max_completion_tokens, and the value when a request sets none; 0 = none
    max_sequences: int = 16  # sequences one request may start: n (or best_of) x the number of prompts
    daily_budget: float = 0.0  # currency per UTC day (gateway/spend/budget.py); 0 = none
    monthly_budget: float = 0.0  # currency per UTC month; 0 = none


@dataclass(frozen=True)
class KeyPolicy:
    """What one API key may do. `models` empty: every model. `key`: the key itself or `sha256:<hex>` of it."""

    name: str = ""
    key: str = field(default="", repr=False)
    models: tuple[str, ...] = ()
    rpm: int = 0
    tpm: int = 0
    priority: int = 0
    max_tokens: int = 1024
    max_sequences: int = 16
    daily_budget: float = 0.0
    monthly_budget: float = 0.0
    team: str = ""  # keys of one team share its budgets (spend.teams)

    @classmethod
    def of(cls, name: str, key: str, limits: KeyLimits, models: tuple[str, ...] = (), *, team: str = "") -> KeyPolicy:
        return cls(name=name, key=key, models=models, team=team, **{f.name: getattr(limits, f.name) for f in fields(limits)})
