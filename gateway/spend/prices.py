"""Which price a request pays: the operator's table first, then the providers' list prices for upstream models.

Lookup for one answered request, first match wins: the deployment's name, the served model's name, the upstream's
own model id (an operator's entry, then, for `kind: openai` deployments, the shipped list below by longest
prefix: `gpt-4o-mini-2024-07-18` pays gpt-4o-mini's). Anything else (the embedded engine, this project's own
backend replicas) costs 0 unless priced: an operator charges GPU time back that way.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.routing.config import DeploymentConfig, RoutingConfig
from gateway.spend.config import FREE, Price, SpendConfig

# USD per 1M tokens: the providers' published list prices (standard tier) for their common models, Nov 2026.
# An operator's `spend.prices` entry of the same name replaces one; `spend.shipped_prices: false` drops them all.
SHIPPED: Mapping[str, Price] = MappingProxyType(
    {
        # OpenAI
        "gpt-5": Price(1.25, 10.0, 0.125),
        "gpt-5-mini": Price(0.25, 2.0, 0.025),
        "gpt-5-nano": Price(0.05, 0.40, 0.005),
        "gpt-4.1": Price(2.0, 8.0, 0.50),
        "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
        "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
        "gpt-4o": Price(2.50, 10.0, 1.25),
        "gpt-4o-mini": Price(0.15, 0.60, 0.075),
        "o3": Price(2.0, 8.0, 0.50),
        "o4-mini": Price(1.10, 4.40, 0.275),
        "gpt-3.5-turbo": Price(0.50, 1.50),
        "text-embedding-3-small": Price(0.02),
        "text-embedding-3-large": Price(0.13),
        "text-embedding-ada-002": Price(0.10),
        # Anthropic (cached_input: a cache read)
        "claude-opus-4-5": Price(5.0, 25.0, 0.50),
        "claude-opus-4-1": Price(15.0, 75.0, 1.50),
        "claude-opus-4": Price(15.0, 75.0, 1.50),
        "claude-sonnet-4": Price(3.0, 15.0, 0.30),
        "claude-haiku-4-5": Price(1.0, 5.0, 0.10),
        "claude-3-5-haiku": Price(0.80, 4.0, 0.08),
    }
)


def _shipped(model: str) -> Price | None:
    """The shipped price of the longest name `model` starts with (a dated snapshot pays its family's price)."""
    best = max((n for n in SHIPPED if model == n or model.startswith(n + "-")), key=len, default=None)
    return SHIPPED[best] if best is not None else None


class PriceTable:
    def __init__(self, spend: SpendConfig, routing: RoutingConfig) -> None:
        self._own = dict(spend.prices)
        self._shipped = spend.shipped_prices
        # deployment label -> (its config, the model id it is asked for upstream)
        self._deployments: dict[str, DeploymentConfig] = {d.label: d for m in routing.models for d in m.deployments}
        self._routes = {m.name: m for m in routing.models}

    def price(self, model: str, deployment: str = "") -> Price:
        """The price of a request `model` answered through `deployment` ("" without routing)."""
        dep = self._deployments.get(deployment) if deployment else None
        upstream = (dep.model or model) if dep is not None else ""
        for name in (deployment, model, upstream):
            if name and name in self._own:
                return self._own[name]
        if dep is not None and dep.kind == "openai" and self._shipped:
            return _shipped(upstream) or FREE
        return FREE

    def most(self, model: str) -> Price:
        """The dearest price `model` may be answered at (the budget's estimate, before a deployment is chosen)."""
        route = self._routes.get(model)
        if route is None:
            return self.price(model)
        prices = [self.price(model, d.label) for d in route.deployments]
        return max(prices, key=lambda p: (p.input + p.output, p.input))
