"""Declared request types: pydantic v2 against msgspec, on the same chat request class, side by side.

    python -m bench.request_types [--iterations 20000] [--rounds 5]

The gateway declares each request body once (gateway/protocol/declared.py, gateway/protocol/requests.py). Two
kept libraries can hold such a class; this measures both on the chat body as the gateway receives it (a dict
from orjson):

  pydantic   `ChatBody.parse`: what the gateway runs (validation, the error's translation, the field policies)
  msgspec    `msgspec.convert` into a `msgspec.Struct` with the same fields, types and bounds (strict, unknown
             fields forbidden), and its error message

on three bodies: a one-message chat (the gateway-overhead bench's), Claude Code's first request as the chat
pipeline sees it (system text, 12 tools: tests/client_requests.py's shape, built here), and a bad body (a
string temperature), whose error each library reports; the errors are printed next to the times, since the
choice is by speed and by what the error can say (pydantic's carries a type, a path and bounds as data;
msgspec's is one English sentence with a `$.path`). The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from bench.report import emit
from gateway.errors import InvalidRequest
from gateway.protocol.requests import ChatBody

SMALL = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8,
         "temperature": 0}  # fmt: skip


def _tool(i: int) -> dict[str, Any]:
    props = {f"arg{j}": {"type": "string", "description": f"argument {j} of tool {i}"} for j in range(6)}
    return {"type": "function", "function": {"name": f"tool_{i}", "description": "Does one thing. " * 40,
            "parameters": {"type": "object", "properties": props, "required": ["arg0"]}}}  # fmt: skip


AGENT = {
    "model": "claude-sonnet-4-5",
    "messages": [{"role": "system", "content": "You are a coding agent. " * 300},
                 *({"role": "user" if i % 2 == 0 else "assistant", "content": "Turn text. " * 60} for i in range(9))],
    "tools": [_tool(i) for i in range(12)],
    "max_tokens": 32000, "temperature": 1, "stream": True, "stream_options": {"include_usage": True},
    "metadata": {"user_id": "user_0123"}, "user": "user_0123",
}  # fmt: skip
BAD = {**SMALL, "temperature": "hot"}

# The same declaration in msgspec (fields, types and bounds as in gateway/protocol/requests.py's ChatBody).
Float2 = Annotated[float, msgspec.Meta(ge=0, le=2)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
Pos = Annotated[int, msgspec.Meta(ge=1)]


class MStreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class MFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class MTool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: MFunction


class MChatBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    messages: Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1)]
    stream: bool | None = None
    stream_options: MStreamOptions | None = None
    user: str | None = None
    temperature: Float2 | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    n: Pos | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: Pos | None = None
    max_completion_tokens: Pos | None = None
    top_k: int | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0)] | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[MTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    continue_final_message: bool | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None


def _pydantic(body: dict[str, Any]) -> str:
    try:
        ChatBody.parse(body)
    except InvalidRequest as exc:
        return f"{exc.param}: {exc}"
    return ""


def _msgspec(body: dict[str, Any]) -> str:
    try:
        msgspec.convert(body, MChatBody, strict=True)
    except msgspec.ValidationError as exc:
        return str(exc)
    return ""


def _per_call_us(fn: Callable[[dict[str, Any]], str], body: dict[str, Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        fn(body)
    return (time.perf_counter() - start) / iterations * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = {"pydantic": _pydantic, "msgspec": _msgspec}
    bodies = {"small": SMALL, "agent": AGENT, "bad": BAD}
    for fn in libs.values():  # both accept the good bodies and refuse the bad one
        assert fn(SMALL) == "" and fn(AGENT) == "" and fn(BAD) != ""
    times: dict[str, dict[str, list[float]]] = {lib: {b: [] for b in bodies} for lib in libs}
    for _ in range(args.rounds):  # in turns, so drift in the machine's speed hits both alike
        for name, body in bodies.items():
            n = args.iterations if name != "agent" else max(1, args.iterations // 10)
            for lib, fn in libs.items():
                times[lib][name].append(_per_call_us(fn, body, n))
    result: dict[str, Any] = {"bench": "request_types", "iterations": args.iterations, "rounds": args.rounds}
    for lib in libs:
        for name in bodies:
            result[f"{lib}_{name}_us"] = round(statistics.median(times[lib][name]), 2)
        result[f"{lib}_error"] = libs[lib](BAD)
    for name in bodies:
        result[f"pydantic_over_msgspec_{name}"] = round(result[f"pydantic_{name}_us"] / result[f"msgspec_{name}_us"], 2)
        print(f"{name:6s} pydantic {result[f'pydantic_{name}_us']:8.2f} us   msgspec {result[f'msgspec_{name}_us']:8.2f} us")
    print(f"errors: pydantic -> {result['pydantic_error']!r}\n        msgspec  -> {result['msgspec_error']!r}")
    emit(result, None if args.out is None else Path(args.out))


if __name__ == "__main__":
    main()
