"""One ledger row: what one request used and cost. Never the key itself: its configured name."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class LedgerRow:
    id: str  # unique per row (replaying the journal twice writes it once)
    time: float  # unix seconds when the response ended
    request_id: str
    key_name: str
    team: str
    model: str
    deployment: str
    endpoint: str  # the path: /v1/chat/completions, /v1/messages, /v1/responses, /v1/embeddings...
    batch: bool  # a batch line
    input_tokens: int
    cached_tokens: int  # of input_tokens, served from a prefix cache
    output_tokens: int
    cost: float
    currency: str
    cache: str  # the response cache: none | bypass | miss | hit | semantic-hit
    status: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerRow:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow))
