"""The model catalog: served model ids, aliases from configuration, and lookups."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.aliases import Aliases
from gateway.errors import ModelNotFound

ModelKind = Literal["chat", "embedding"]
OWNER = "smolgate"
_ARTICLE: dict[ModelKind, str] = {"chat": "a chat", "embedding": "an embedding"}


@dataclass(frozen=True)
class ServedModel:
    id: str
    kind: ModelKind
    created: int

    def to_json(self, shown_id: str | None = None) -> dict[str, Any]:
        return {"id": shown_id or self.id, "object": "model", "created": self.created, "owned_by": OWNER}


class ModelCatalog:
    """Resolves a requested name (a model id or an alias) to a served model."""

    def __init__(self, models: list[ServedModel], aliases: Mapping[str, str]) -> None:
        self._models = {m.id: m for m in models}
        self._aliases = Aliases(aliases, self._models)

    def resolve(self, name: str, kind: ModelKind) -> ServedModel:
        model = self._models.get(self._aliases.get(name, name))
        if model is None:
            raise ModelNotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")
        if model.kind != kind:
            raise ModelNotFound(
                f"The model `{name}` is {_ARTICLE[model.kind]} model and cannot serve this endpoint.",
                param="model",
            )
        return model

    def canonical(self, name: str) -> str:
        """The served model id a name stands for (an alias resolved); the name itself when it is neither."""
        return self._aliases.get(name, name)

    def lookup(self, name: str) -> dict[str, Any]:
        """The Model object for GET /v1/models/{id}; an alias is shown under its own name."""
        model = self._models.get(self._aliases.get(name, name))
        if model is None:
            raise ModelNotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")
        return model.to_json(shown_id=name)

    def listing(self, allowed: Callable[[str], bool] = lambda _: True) -> list[dict[str, Any]]:
        """Served models and aliases; `allowed(model id)`: only those an API key may use."""
        served = [m.to_json() for m in self._models.values() if allowed(m.id)]
        aliases = [self._models[t].to_json(shown_id=a) for a, t in sorted(self._aliases.items()) if allowed(t)]
        return served + aliases
