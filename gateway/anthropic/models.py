"""GET /v1/models in Anthropic's shape, for a client that sends `anthropic-version` (Claude Code, the SDK)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import Headers


def wants_anthropic(headers: Headers) -> bool:
    return "anthropic-version" in headers


def model_info(model: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Model object as Anthropic's ModelInfo."""
    created = datetime.fromtimestamp(int(model.get("created", 0)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": model["id"], "display_name": model["id"], "created_at": created}


def model_list(models: list[dict[str, Any]]) -> dict[str, Any]:
    data = [model_info(m) for m in models]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
