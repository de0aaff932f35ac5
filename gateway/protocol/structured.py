"""`response_format` -> the engine's constraint fields (`guided_json`, `guided_json_object`).

The schema itself is compiled by the engine (llguidance) when the request is submitted; a schema
feature it cannot enforce (e.g. `not`, `if`/`then`) is a 400 whose message names the keywords.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from backend.engine.sampling_params import SamplingParams
from gateway.errors import InvalidRequest
from gateway.protocol.fields import Body
from gateway.protocol.json_schema import close_objects
from gateway.protocol.tools import ToolConfig, tool_grammar

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_FORMAT_KEYS = {"type", "json_schema"}
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


@dataclass(frozen=True)
class Guided:
    json_schema: str | None = None
    json_object: bool = False

    @property
    def active(self) -> bool:
        return self.json_schema is not None or self.json_object


def parse_response_format(body: Body) -> Guided:
    fmt = body.get("response_format")
    if fmt is None:
        return Guided()
    if not isinstance(fmt, dict):
        raise InvalidRequest("Invalid type for 'response_format': expected an object.", param="response_format")
    extra = set(fmt) - _FORMAT_KEYS
    if extra:
        raise InvalidRequest(f"Unrecognized argument in 'response_format': {sorted(extra)[0]}", param="response_format")
    kind = fmt.get("type")
    if kind == "text":
        return Guided()
    if kind == "json_object":
        return Guided(json_object=True)
    if kind == "json_schema":
        return Guided(json_schema=_json_schema(fmt.get("json_schema")))
    raise InvalidRequest(
        f"Invalid value for 'response_format.type': {kind!r}; expected 'text', 'json_object' or 'json_schema'.",
        param="response_format.type",
    )


def _json_schema(spec: object) -> str:
    param = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param)
    extra = set(spec) - _SCHEMA_KEYS
    if extra:
        raise InvalidRequest(f"Unrecognized argument in '{param}': {sorted(extra)[0]}", param=param)
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(f"'{param}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$.", param=f"{param}.name")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise InvalidRequest(f"Invalid type for '{param}.strict': expected a boolean.", param=f"{param}.strict")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequest(f"Invalid type for '{param}.schema': expected an object.", param=f"{param}.schema")
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
