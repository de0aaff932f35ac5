"""Model aliases: exact names, and patterns ending in `*` that match every name they start (`claude-*`).

Clients pick their own model ids (Claude Code asks for `claude-opus-...` or `claude-haiku-...`, Codex CLI for
`gpt-5...`), and a new one comes with each release: a pattern sends them all to the served model. An exact alias
wins over a pattern, and the longest pattern over a shorter one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping


class Aliases:
    def __init__(self, aliases: Mapping[str, str], served: Collection[str]) -> None:
        """Only the aliases of a `served` model apply, and a served model's own name is never an alias."""
        self.served = served
        kept = {a: t for a, t in aliases.items() if t in served and a not in served}
        self.exact = {a: t for a, t in kept.items() if not a.endswith("*")}
        self.patterns = sorted(((a[:-1], t) for a, t in kept.items() if a.endswith("*")), key=lambda p: -len(p[0]))

    def get(self, name: str, default: str) -> str:
        """The target `name` stands for; `default` when no alias matches it."""
        if name in self.served:
            return name
        target = self.exact.get(name)
        if target is not None:
            return target
        return next((t for prefix, t in self.patterns if name.startswith(prefix)), default)

    def items(self) -> Iterator[tuple[str, str]]:
        """The exact aliases (what GET /v1/models lists: a pattern names no model)."""
        return iter(self.exact.items())


def retarget_defaults(aliases: Mapping[str, str], defaults: Mapping[str, str], served: Mapping[str, str]) -> dict[str, str]:
    """The shipped aliases name the default models (`defaults`: model name -> kind). Serving another model instead
    (SMOLGATE_MODEL=gemma-3-270m...), those aliases name it: Claude Code's `claude-*` must reach whatever the one chat
    model is. `served`: model id -> kind. An alias whose target is served, or not a default, is left as it is."""
    by_kind: dict[str, list[str]] = {}
    for model, kind in served.items():
        by_kind.setdefault(kind, []).append(model)
    only = {kind: ids[0] for kind, ids in by_kind.items() if len(ids) == 1}
    return {a: only.get(defaults[t], t) if t not in served and t in defaults else t for a, t in aliases.items()}
