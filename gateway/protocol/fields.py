"""Typed readers for JSON request bodies; a wrong type is a 400 that names the parameter.

`null` counts as "not given", as in the OpenAI API. Ranges of sampling values are
checked once, by `SamplingParams`; only gateway-level limits are checked here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.errors import InvalidRequest

Body = Mapping[str, Any]


def _type_error(param: str, expected: str, value: object) -> InvalidRequest:
    got = "null" if value is None else type(value).__name__
    return InvalidRequest(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param=param)


def opt_bool(body: Body, key: str, *, param: str = "") -> bool | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _type_error(param or key, "a boolean", value)
    return value


def opt_str(body: Body, key: str, *, param: str = "") -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _type_error(param or key, "a string", value)
    return value


def req_str(body: Body, key: str, *, param: str = "") -> str:
    value = opt_str(body, key, param=param)
    if value is None:
        name = param or key
        raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    return value


def reject_unknown(body: Body, allowed: Collection[str]) -> None:
    """Like OpenAI: an argument the server does not know is a 400, never silently ignored."""
    for key in body:
        if key not in allowed:
            raise InvalidRequest(f"Unrecognized request argument supplied: {key}", param=key)
