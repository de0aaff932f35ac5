"""Checking a batch's input file before anything runs: every line a JSON object with a unique `custom_id`,
method POST, the batch's `url`, a `body` naming a model this key may use. Any failure fails the whole batch,
with an `errors` entry per bad line (1-based line numbers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_ERRORS = 100  # the errors list names at most this many lines


@dataclass(frozen=True)
class Line:
    number: int  # 1-based line number in the input file
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Parsed:
    lines: list[Line]
    errors: list[dict[str, Any]]
    model: str | None


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def parse_input(
    path: Path, endpoint: str, max_lines: int, model_error: Callable[[str], str | None]
) -> Parsed:
    """`model_error(model)`: why this batch's key cannot send `model` to `endpoint`, or None when it can."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    models: dict[str, str | None] = {}
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if len(lines) + len(errors) >= max_lines:
                errors.append(_error("too_many_requests", f"A batch may hold at most {max_lines} requests.", number))
                break
            err = _check_line(raw, number, endpoint, seen, models=models, model_error=model_error, lines=lines)
            if err is not None:
                errors.append(err)
    if not lines and not errors:
        errors.append(_error("empty_file", "The input file holds no requests.", None))
    model = lines[0].body.get("model") if lines else None
    return Parsed(lines, errors[:MAX_ERRORS], model)


def _check_line(
    raw: bytes,
    number: int,
    endpoint: str,
    seen: dict[str, int],
    *,
    models: dict[str, str | None],
    model_error: Callable[[str], str | None],
    lines: list[Line],
) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _error("invalid_json_line", "This line is not valid JSON.", number)
    if not isinstance(obj, dict):
        return _error("invalid_request", "Each line must be a JSON object.", number)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error("missing_required_parameter", "Each line needs a non-empty string `custom_id`.", number, "custom_id")
    if custom_id in seen:
        return _error(
            "duplicate_custom_id",
            f"The custom_id {custom_id!r} is used on line {seen[custom_id]} already: custom_ids must be unique.",
            number,
            "custom_id",
        )
    seen[custom_id] = number
    if obj.get("method") != "POST":
        return _error("invalid_method", "Each line's `method` must be POST.", number, "method")
    url = obj.get("url")
    if url not in ENDPOINTS:
        return _error("invalid_url", f"Unknown endpoint {url!r}: use one of {list(ENDPOINTS)}.", number, "url")
    if url != endpoint:
        return _error("mismatched_url", f"The line's url {url!r} is not the batch's endpoint {endpoint!r}.", number, "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        return _error("invalid_request", "Each line needs a `body` JSON object.", number, "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _error("missing_required_parameter", "The body needs a `model`.", number, "body.model")
    if model not in models:
        models[model] = model_error(model)
    if models[model] is not None:
        return _error("model_not_found", str(models[model]), number, "body.model")
    if body.get("stream"):
        return _error("invalid_request", "Batch requests cannot stream: leave `stream` out.", number, "body.stream")
    lines.append(Line(number, custom_id, body))
    return None
