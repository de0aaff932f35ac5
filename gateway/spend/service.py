"""Spend: the cost of each finished request (gateway/spend/prices.py) and its ledger row (gateway/spend/ledger.py).

`charge` runs once per request, when its usage is final and before the response's last bytes leave (the
middleware calls it there; batch lines when they end): it sets `rec.cost`, which the budgets settle to
(gateway/keys/guard.py), and journals the row.
"""

from __future__ import annotations

import time

from gateway.ids import IdGenerator
from gateway.ops.access_log import Logger
from gateway.ops.record import RequestRecord
from gateway.routing.config import RoutingConfig
from gateway.spend.config import SpendConfig
from gateway.spend.ledger import Ledger
from gateway.spend.prices import PriceTable
from gateway.spend.rows import LedgerRow

_HITS = ("hit", "semantic-hit")


class Spend:
    def __init__(self, cfg: SpendConfig, routing: RoutingConfig, logger: Logger, ids: IdGenerator) -> None:
        self.cfg = cfg
        self.prices = PriceTable(cfg, routing)
        self.ledger = Ledger(cfg.ledger, logger) if cfg.ledger.enabled else None
        self._ids = ids
        self._logger = logger

    def charge(self, rec: RequestRecord) -> None:
        """The request's cost, into `rec.cost` and (when it used tokens) the ledger."""
        replayed = rec.replayed if rec.cache in _HITS else None
        hit = replayed is not None
        if replayed is not None:
            input_tokens, cached, output = replayed.prompt_tokens, 0, replayed.completion_tokens
        else:
            input_tokens, cached, output = rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens
        if not (input_tokens or output):
            return
        price = self.prices.price(rec.model, rec.deployment)
        cost = price.cost(input_tokens, cached, output) * (self.cfg.cache_hit_factor if hit else 1.0)
        rec.cost = cost
        if self.ledger is None:
            return
        policy = rec.policy
        row = LedgerRow(
            id=self._ids.new(), time=time.time(), request_id=rec.request_id, key_name=rec.key,
            team=getattr(policy, "team", "") or "", model=rec.model, deployment=rec.deployment, endpoint=rec.path,
            batch=rec.batch, input_tokens=input_tokens, cached_tokens=cached, output_tokens=output, cost=cost,
            currency=self.cfg.currency, cache=rec.cache, status=rec.status or 200,
        )  # fmt: skip
        try:
            self.ledger.record(row)
        except OSError as exc:  # a full or failing disk: the answer still goes out, the loss is logged
            self._logger.error("ledger_journal_failed", request_id=rec.request_id, error=type(exc).__name__)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
