"""How each request field is handled, declared once per endpoint object: used, an accepted hint, or refused.

Clients such as Claude Code and Codex CLI always send hints a local model cannot act on (metadata, effort
levels, context management, reasoning summaries...). A hint does not change the meaning of the answer, so it
is accepted and has no effect; its note says what it does here (docs/clients/fields.md lists every one). A
field that would make the answer wrong if ignored is refused with a 400 naming it, in the endpoint's own
error wording. `strict_params: true` (GatewayConfig) refuses every hint too, as before the clients came.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import InvalidRequest


@dataclass(frozen=True)
class Param:
    kind: Literal["used", "hint", "refused"]
    note: str = ""  # a hint: what it does here; refused: why
    neutral: Callable[[Any], bool] = lambda value: False  # values that ask for nothing (kept under strict_params)


USED = Param("used")


def hint(note: str, neutral: Callable[[Any], bool] = lambda value: False) -> Param:
    return Param("hint", note, neutral)


def refused(why: str) -> Param:
    return Param("refused", why)


@dataclass(frozen=True)
class Wording:
    """An API's words for a field it does not know, and for one this server does not honour."""

    unknown: Callable[[str], str]
    unsupported: Callable[[str, str], str]


OPENAI = Wording(
    unknown=lambda name: f"Unrecognized request argument supplied: {name}",
    unsupported=lambda name, why: f"'{name}' is not supported by this server: {why}",
)
ANTHROPIC = Wording(
    unknown=lambda name: f"{name}: Extra inputs are not permitted.",
    unsupported=lambda name, why: f"'{name}' is not supported: {why}",
)
STRICT_WHY = "strict_params is on, and here it would have no effect"


@dataclass(frozen=True)
class Params:
    """The declared fields of one request object (the body, or a nested object at `where`)."""

    fields: Mapping[str, Param]
    wording: Wording
    where: str = ""
    unknown_ok: bool = False  # an object whose keys are free (never refused as unknown)
    nested: Mapping[str, Params] = field(default_factory=dict)

    def check(self, obj: Mapping[str, Any], strict: bool, where: str | None = None) -> None:
        """Refuses an unknown field, a refused one, and under `strict` a hint; checks declared nested objects.
        `where`: this object's path when it varies (`messages[3]`)."""
        at = self.where if where is None else where
        for key, value in obj.items():
            name = f"{at}.{key}" if at else key
            spec = self.fields.get(key)
            if spec is None:
                if self.unknown_ok:
                    continue
                raise InvalidRequest(self.wording.unknown(name), param=name)
            if value is None or spec.kind == "used":
                if isinstance(value, dict) and key in self.nested:
                    self.nested[key].check(value, strict, name)
                continue
            if spec.kind == "refused":
                raise InvalidRequest(self.wording.unsupported(name, spec.note), param=name)
            if strict and not spec.neutral(value):
                raise InvalidRequest(self.wording.unsupported(name, f"{STRICT_WHY} ({spec.note})"), param=name)

    def hints(self) -> dict[str, str]:
        """Every hint of this object and its nested ones, by path: what the docs table lists."""
        out = {(f"{self.where}.{k}" if self.where else k): p.note for k, p in self.fields.items() if p.kind == "hint"}
        for sub in self.nested.values():
            out.update(sub.hints())
        return out


def left_out(strict: bool, wording: Wording, name: str, why: str) -> None:
    """A tool the server cannot run is left out of what the model sees; under strict_params, refused."""
    if strict:
        raise InvalidRequest(wording.unsupported(name, why), param=name)
