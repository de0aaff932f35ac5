"""Schema tightening for small models: objects that do not say `additionalProperties` are closed.

An open object lets a small model keep inventing keys until max_tokens (it copies the schema's own
words); closing it only removes outputs, so whatever is generated still validates against the
client's schema.
"""

from __future__ import annotations

from typing import Any

_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalItems", "then", "else")  # never under `not` or `if`: that would widen


def close_objects(schema: Any) -> Any:
    """A copy of `schema` where every object schema with `properties` and no `additionalProperties` gets `false`."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: close_objects(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(v) for v in out[key]]
    for key in _SUBSCHEMA_ONE:
        if key in out:
            out[key] = close_objects(out[key])
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out
