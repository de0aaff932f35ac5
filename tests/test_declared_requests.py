"""The declared request classes (gateway/protocol/declared.py, requests.py): every field, whatever wrong JSON a
client sends in it, is a 400 naming that field, never another error; unknown fields, bounds, policies and hints
come out in the API's words."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import UploadFile

from backend.errors import InvalidRequestError
from gateway.anthropic.request import MessagesBody, translate
from gateway.batches.endpoints import BatchCreateBody, UploadForm
from gateway.errors import InvalidRequest
from gateway.openai_responses.request import ResponsesBody, parse_request
from gateway.protocol.declared import Declared, Hint, Refused, _declared_types, _is_tag, param_path, policy_of
from gateway.protocol.requests import (
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    parse_chat,
    parse_completion,
    parse_embedding,  # fmt: skip
)

MSG = [{"role": "user", "content": "hi"}]
BASE: dict[type[Declared], dict[str, Any]] = {
    ChatBody: {"model": "m", "messages": MSG},
    CompletionBody: {"model": "m", "prompt": "hi"},
    EmbeddingBody: {"model": "m", "input": "hi"},
}
BASE.update({
    MessagesBody: {"model": "m", "max_tokens": 5, "messages": MSG},
    ResponsesBody: {"model": "m", "input": "hi"},
    BatchCreateBody: {"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    UploadForm: {"file": UploadFile(io.BytesIO(b"{}"), size=2, filename="a.jsonl"), "purpose": "batch",
                 "expires_after": {"anchor": "created_at", "seconds": "3600"}},
})
PARSE: dict[type[Declared], Callable[[dict[str, Any]], object]] = {
    ChatBody: parse_chat, CompletionBody: parse_completion, EmbeddingBody: parse_embedding, MessagesBody: translate,
    ResponsesBody: lambda body: parse_request(body, lambda kind: f"{kind}_1"), BatchCreateBody: BatchCreateBody.parse,
    UploadForm: UploadForm.parse,
}  # fmt: skip
JSON_VALUES: list[Any] = ["text", 3, 2.5, True, [1, "a"], {"k": [1]}, [], {}, -1]


def _fields() -> list[tuple[type[Declared], str]]:
    return [(cls, name) for cls in BASE for name in cls.model_fields]


@pytest.mark.parametrize(("cls", "name"), _fields(), ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_any_json_in_any_field_is_a_400_naming_it_or_accepted(cls: type[Declared], name: str) -> None:
    """The class of the batch-create 500 found by fuzzing: wrong JSON types in declared fields. Each value is
    either served (parsed into a request) or refused with a 400 whose param starts with the field's name, on
    every declared body (chat, completions, embeddings, Messages, Responses, batches)."""
    alias = cls.model_fields[name].alias or name
    for value in JSON_VALUES:
        try:
            PARSE[cls]({**BASE[cls], alias: value})
        except (InvalidRequest, InvalidRequestError) as exc:  # the engine's checks: a 400 too (gateway/errors.py)
            assert exc.param is not None and exc.param.split(".")[0].split("[")[0] == alias, (alias, value, exc.param)
            assert not any(_is_tag(part) for part in re.split(r"[.\[\]]", exc.param)), exc.param  # API paths only


# Valid bodies that between them hold every declared object a body may contain (each tagged union's every member),
# so that every field of every nested object is fuzzed at its own path too
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
CACHE = {"type": "ephemeral", "ttl": "1h"}
RICH: dict[type[Declared], list[dict[str, Any]]] = {
    ChatBody: [{
        "model": "m", "messages": MSG, "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False},
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA, "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }, {
        "model": "m", "messages": MSG,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True,
                                                                   "description": "d"}},
    }],
    CompletionBody: [{"model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}],
    MessagesBody: [{
        "model": "m", "max_tokens": 5, "metadata": {"user_id": "u"}, "output_config": {"effort": "low"},
        "thinking": {"type": "adaptive", "display": "omitted"}, "cache_control": CACHE,
        "system": [{"type": "text", "text": "S", "cache_control": CACHE}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CACHE, "citations": []}],
             "output_config": {"effort": "low"}},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s", "cache_control": CACHE},
                {"type": "redacted_thinking", "data": "d", "cache_control": CACHE},
                {"type": "text", "text": "Let me see."},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"a": 1}, "cache_control": CACHE,
                 "caller": {"type": "direct"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                          "content": [{"type": "text", "text": "18C"}], "cache_control": CACHE}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ],
        "tools": [{"type": "custom", "name": "get", "description": "d", "input_schema": SCHEMA, "cache_control": CACHE,
                   "strict": True, "defer_loading": False, "input_examples": [{"a": 1}], "eager_input_streaming": True,
                   "allowed_callers": ["direct"]},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": True},
    }, {
        "model": "m", "max_tokens": 5, "messages": MSG, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
        "tools": [{"name": "get", "input_schema": SCHEMA}], "tool_choice": {"type": "none"},
    }, {
        "model": "m", "max_tokens": 5, "messages": MSG, "tools": [{"name": "get", "input_schema": SCHEMA}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": False},
        "thinking": {"type": "disabled"},
    }, {
        "model": "m", "max_tokens": 5, "messages": MSG, "tools": [{"name": "get", "input_schema": SCHEMA}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    }],
    ResponsesBody: [{
        "model": "m", "stream": True, "stream_options": {"include_obfuscation": False},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "a"}], "id": "msg_1",
             "status": "completed"},
            {"type": "message", "role": "assistant", "phase": "final_answer", "content": [
                {"type": "output_text", "text": "x", "annotations": [], "logprobs": []}, {"type": "refusal", "refusal": "no"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "1"}], "id": "fco_1",
             "status": "completed"},
        ],
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": SCHEMA, "strict": True},
                  {"type": "namespace", "name": "ns", "description": "d",
                   "tools": [{"type": "function", "name": "g"}, {"type": "web_search", "name": "ws"}]}],
        "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True, "description": "d"},
                 "verbosity": "low"},
        "reasoning": {"effort": "low", "summary": "auto", "generate_summary": "auto"},
    }, {
        "model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}],
        "tool_choice": {"type": "function", "name": "f"}, "text": {"format": {"type": "text"}},
    }, {
        "model": "m", "input": "hi", "text": {"format": {"type": "json_object"}},
    }],
    UploadForm: [BASE[UploadForm]],
}  # fmt: skip
# declared by their type alone and always refused (a media block, a built-in tool call...): checked on their own below
REFUSED_BY_TYPE = {"UnreadBlock", "MediaPart", "UnreadItem", "BuiltinChoice"}


def _objects(obj: Declared, at: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Declared]]:
    """Every declared object a validated body holds, with its JSON path (field aliases, list indices)."""
    for name, info in type(obj).model_fields.items():
        value, key = getattr(obj, name), info.alias or name
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, Declared):
                path = (*at, key) if i is None else (*at, key, i)
                yield path, item
                yield from _objects(item, path)


def _reachable(cls: type[Declared]) -> set[str]:
    found: set[str] = set()
    for info in cls.model_fields.values():
        for sub, _ in _declared_types(info.annotation):
            if sub.__name__ not in found:
                found |= {sub.__name__} | _reachable(sub)
    return found


def _copy(node: Any) -> Any:
    """A copy of every object and array (not deepcopy: it keeps one object shared where the body repeats one)."""
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    return [_copy(v) for v in node] if isinstance(node, list) else node


def _replaced(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = _copy(body)
    node: Any = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("cls", list(RICH), ids=lambda c: c.__name__)
def test_every_nested_object_is_fuzzed_and_a_bad_value_is_a_400_at_its_path(cls: type[Declared]) -> None:
    """Nested objects (content blocks, input items, tools, choices, formats) have the top level's guarantee: any JSON
    value in any of their fields is served or a 400 whose param is the field's path, or the path of the object
    holding it where the field is the object's `type` (another type is another object) or its role (a role decides
    which blocks a turn holds), or a check between fields the body names (a tool named by tool_choice)."""
    between = {"tool_choice.name", "tool_choice.tools[0]", "tool_choice", "tools", "output_config.format",
               "stream_options"}  # fmt: skip
    seen: set[str] = set()
    for body in RICH[cls]:
        PARSE[cls](body)  # valid as it stands
        for at, obj in _objects(cls.model_validate(body)):
            seen.add(type(obj).__name__)
            holder = param_path(at)
            for name, info in type(obj).model_fields.items():
                key = info.alias or name
                field = f"{holder}.{key}"
                for value in JSON_VALUES:
                    try:
                        PARSE[cls](_replaced(body, (*at, key), value))
                    except (InvalidRequest, InvalidRequestError) as exc:
                        param = exc.param or ""
                        assert not any(_is_tag(part) for part in re.split(r"[.\[\]]", param)), param
                        ok = param.startswith(field) or param in between or (
                            name in ("type", "role") and param.startswith(holder))
                        assert ok, (field, value, param, str(exc))
    assert _reachable(cls) - REFUSED_BY_TYPE <= seen, "RICH misses a declared object"


def test_rich_bodies_hold_every_body_with_nested_objects() -> None:
    assert {cls for cls in BASE if _reachable(cls)} <= set(RICH)


@pytest.mark.parametrize(("body", "param"), [
    ({**BASE[MessagesBody], "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({**BASE[ResponsesBody], "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ({**BASE[ResponsesBody], "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({**BASE[ResponsesBody], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
])  # fmt: skip
def test_objects_declared_by_their_type_alone_are_refused_by_it(body: dict[str, Any], param: str) -> None:
    cls = MessagesBody if "max_tokens" in body else ResponsesBody
    with pytest.raises(InvalidRequest) as err:
        PARSE[cls](body)
    assert err.value.param == param and "not supported" in err.value.message


@pytest.mark.parametrize(("cls", "change", "param", "message"), [
    (MessagesBody, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": 3}]}]},
     "messages[0].content[1].text", "messages[0].content[1].text: Input should be a valid string"),
    (MessagesBody, {"messages": [{"role": "user", "content": [{"type": "picture"}]}]},
     "messages[0].content[0].type", "messages[0].content[0].type: Input should be 'text', 'tool_use', 'tool_result', "),
    (MessagesBody, {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "messages[0].content[0].type", "content blocks of type 'tool_use' are not accepted in a user turn"),
    (MessagesBody, {"messages": [{"role": "user", "content": 3}]},
     "messages[0].content", "messages[0].content: Input should be a string or an array"),
    (MessagesBody, {"tools": [{"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]},
     "tools[0].cache_control.ttl", "tools[0].cache_control.ttl: Input should be '5m' or '1h'"),
    (MessagesBody, {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "none", "name": "f"}},
     "tool_choice.name", "tool_choice.name: Extra inputs are not permitted."),
    (ResponsesBody, {"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]},
     "input[0].call_id", "'input[0].call_id' must not be empty."),
    (ResponsesBody, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a", "lang": "en"}]}]},
     "input[0].content[0].lang", "Unrecognized request argument supplied: input[0].content[0].lang"),
    (ResponsesBody, {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "function", "name": 3}]}]},
     "tools[0].tools[0].name", "Invalid type for 'tools[0].tools[0].name': expected a string, but got an integer instead."),
    (ResponsesBody, {"tool_choice": "sometimes"},
     "tool_choice", "Invalid value for 'tool_choice': 'sometimes'. Supported values are: 'auto', 'none' or 'required'."),
    (ResponsesBody, {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function"}]}},
     "tool_choice.tools[0].name", "Missing required parameter: 'tool_choice.tools[0].name'."),
])  # fmt: skip
def test_an_error_inside_a_nested_object_names_its_own_path(
    cls: type[Declared], change: dict[str, Any], param: str, message: str
) -> None:
    """A union's error is its fitting member's (a list for `str | list[Block]`, the class a `type` picks), at the
    API's path, in the API's words; an unknown type lists the known ones."""
    with pytest.raises(InvalidRequest) as err:
        PARSE[cls]({**BASE[cls], **change})
    assert err.value.param == param and message in err.value.message, err.value.message


def test_wrong_types_and_bounds_in_the_apis_words() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "temperature": "hot"})
    assert err.value.param == "temperature"
    assert str(err.value) == "Invalid type for 'temperature': expected a number, but got a string instead."
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "top_logprobs": 21, "logprobs": True})
    assert err.value.param == "top_logprobs" and "at most 20" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "frobnicate": 1})
    assert str(err.value) == "Unrecognized request argument supplied: frobnicate"
    with pytest.raises(InvalidRequest) as err:
        parse_chat({"messages": MSG})
    assert err.value.param == "model" and str(err.value) == "Missing required parameter: 'model'."
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "stream": True, "stream_options": {"include_usage": "yes"}})
    assert err.value.param == "stream_options.include_usage"
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "tools": [{"type": "function", "function": {"name": "ok"}},
                                                {"type": "function", "function": {"name": "bad name"}}]})
    assert err.value.param == "tools[1].function.name" and "must match" in str(err.value)


def test_json_integers_may_be_written_as_whole_floats() -> None:
    assert parse_chat({**BASE[ChatBody], "n": 2.0, "max_tokens": 5.0}).params.n == 2
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "n": 2.5})
    assert err.value.param == "n" and "expected an integer" in str(err.value)
    with pytest.raises(InvalidRequest):
        parse_chat({**BASE[ChatBody], "n": True})  # a boolean is not a number in JSON


def test_policies_are_declared_with_the_fields() -> None:
    assert isinstance(policy_of(ChatBody, "audio"), Refused)
    assert isinstance(policy_of(ChatBody, "metadata"), Hint)
    assert policy_of(ChatBody, "temperature") is None  # used
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "reasoning_effort": "low"})
    assert err.value.param == "reasoning_effort" and "not a reasoning model" in str(err.value)
    hinted = {**BASE[ChatBody], "metadata": {"team": "a"}, "service_tier": "auto"}
    assert parse_chat(hinted).model == "m"  # accepted with no effect
    with pytest.raises(InvalidRequest) as err:
        parse_chat(hinted, strict_params=True)
    assert err.value.param in {"metadata", "service_tier"} and "strict_params" in str(err.value)
    assert set(ChatBody.hints()) == {"metadata", "safety_identifier", "service_tier"}


def test_nested_declared_objects_carry_their_policies() -> None:
    """A hint inside a declared object (Messages' output_config.effort, each turn's too) is refused under
    strict_params with its full path, and listed by hints() with it."""
    from gateway.anthropic.request import MessagesBody

    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    MessagesBody.parse({**body, "output_config": {"effort": "high"}})
    with pytest.raises(InvalidRequest) as err:
        MessagesBody.parse({**body, "output_config": {"effort": "high"}}, strict_params=True)
    assert err.value.param == "output_config.effort"
    turn = {"role": "user", "content": "hi", "output_config": {"effort": "low"}}
    with pytest.raises(InvalidRequest) as err:
        MessagesBody.parse({**body, "messages": [turn]}, strict_params=True)
    assert err.value.param == "messages[0].output_config.effort"
    assert {"output_config.effort", "messages[].output_config.effort", "thinking"} <= set(MessagesBody.hints())


def test_values_the_server_cannot_honour_say_why() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "store": True})
    assert err.value.param == "store" and "stored completions" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        parse_completion({**BASE[CompletionBody], "suffix": "end"})
    assert err.value.param == "suffix" and "fill-in-the-middle" in str(err.value)
    assert parse_completion({**BASE[CompletionBody], "suffix": ""}).prompts == ["hi"]


def test_param_paths() -> None:
    assert param_path(("messages", 0, "content")) == "messages[0].content"
    assert param_path(("tools", 2, "function", "name")) == "tools[2].function.name"
    assert param_path(("stop",)) == "stop"


def test_a_unions_errors_fold_into_one_at_its_path() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_request({"model": "m", "input": 42}, lambda kind: f"{kind}_1")
    assert err.value.param == "input"
    assert str(err.value) == "Invalid type for 'input': expected a string or an array, but got an integer instead."
    with pytest.raises(InvalidRequest) as err:
        parse_chat({**BASE[ChatBody], "stop": ["a", 3]})  # a member that fails deeper in: still the union's path
    assert err.value.param == "stop"


WHITELIST = Path(__file__).with_name("vulture_declared.py")
DECLARING = ("gateway.protocol.requests", "gateway.anthropic.blocks", "gateway.anthropic.request",
             "gateway.openai_responses.params", "gateway.openai_responses.request", "gateway.batches.endpoints",
             "bench.request_types")  # fmt: skip


def _whitelist() -> str:
    """tests/vulture_declared.py as it should read: each declared field named once, which is how vulture (static)
    learns that pydantic (and msgspec, in the bench) read them."""
    import importlib

    import msgspec

    lines = ['"""Every field of the declared request bodies, named for vulture: pydantic reads them by reflection, which',
             "vulture cannot see. Written by tests/test_declared_requests.py (SMOLGATE_WRITE_WHITELIST=1 rewrites it), which",
             'fails when a declared field is missing here."""', ""]  # fmt: skip
    for module in DECLARING:
        mod = importlib.import_module(module)
        classes = sorted(
            (name, obj) for name, obj in vars(mod).items()
            if isinstance(obj, type) and obj.__module__ == module
            and ((issubclass(obj, Declared) and obj.model_fields) or issubclass(obj, msgspec.Struct))
        )  # fmt: skip
        if not classes:
            continue
        lines.append(f"from {module} import {', '.join(name for name, _ in classes)}")
        lines.append("")
        for name, cls in classes:
            fields = sorted(cls.model_fields) if issubclass(cls, Declared) else sorted(cls.__struct_fields__)
            lines.extend(f"{name}.{field}" for field in fields)
        lines.append("")
    return "\n".join(lines)


def test_vulture_sees_every_declared_field() -> None:
    import os

    want = _whitelist()
    if os.environ.get("SMOLGATE_WRITE_WHITELIST"):
        WHITELIST.write_text(want)
    assert WHITELIST.read_text() == want, "declared fields changed: rerun with SMOLGATE_WRITE_WHITELIST=1"
