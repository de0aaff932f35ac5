"""`response_format` -> the engine's constraint fields (`guided_json`, `guided_json_object`).

The schema itself is compiled by the engine (llguidance) when the request is submitted; a schema
feature it cannot enforce (e.g. `not`, `if`/`then`) is a 400 whose message names the keywords.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from backend.engine.sampling_params import SamplingParams
from gateway.errors import InvalidRequest
from gateway.protocol.json_schema import close_objects
from gateway.protocol.tools import ToolConfig, tool_grammar


@dataclass(frozen=True)
class Guided:
    json_schema: str | None = None
    json_object: bool = False

    @property
    def active(self) -> bool:
        return self.json_schema is not None or self.json_object


def json_schema_text(schema: dict[str, Any]) -> str:
    """A response_format's schema as the engine compiles it: objects closed (no properties beyond the listed)."""
    return json.dumps(close_objects(schema))


def constrain(params: SamplingParams, guided: Guided, tools: ToolConfig | None) -> SamplingParams:
    """The request's SamplingParams with the constraint its response_format or tools ask for."""
    if tools is not None and guided.active:
        raise InvalidRequest(
            "'response_format' together with 'tools' is not supported: send tool_choice 'none' or no response_format.",
            param="response_format",
        )
    if tools is not None:
        return replace(params, guided_grammar=tool_grammar(tools))
    if guided.active:
        return replace(params, guided_json=guided.json_schema, guided_json_object=guided.json_object)
    return params
