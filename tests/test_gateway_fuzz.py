"""Fuzz the live gateway with schemathesis, from the official OpenAI OpenAPI spec (../shared): the
chat/completions, completions and models operations, positive and negative cases, a small example budget.
Whatever arrives, the answer is never a 5xx and never a hang.

The spec is 3 MB with 1400 schemas: only the four operations and the schemas they reach are loaded.
Generated bodies name the served model (so requests get past the model lookup into the real parsing)
and ask for at most a few tokens (the fuzz is about input handling, not long generations).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from gateway_fixtures import API_KEY, SPEC_PATH, LiveStack, live  # noqa: F401

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402  (after the skip: hypothesis comes with schemathesis)

# operation -> examples per generation mode
OPERATIONS = {
    ("/chat/completions", "post"): 12,
    ("/completions", "post"): 12,
    ("/models", "get"): 3,
    ("/models/{model}", "get"): 5,
}
SCALE = int(os.environ.get("SMOLGATE_FUZZ_SCALE", "1"))  # multiplies the example budget for a longer run by hand
# CI has the spec in ../shared beside the clone; a worktree elsewhere can point at it with this variable.
SPEC = Path(os.environ.get("SMOLGATE_OPENAI_SPEC", SPEC_PATH))
MAX_TOKENS = 4
CALL_TIMEOUT_S = 60  # a request still unanswered after this is a hang


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            out.add(ref)
        for value in node.values():
            _refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _refs(value, out)


def slim_spec(spec: dict[str, Any], operations: list[tuple[str, str]]) -> dict[str, Any]:
    """The spec with only `operations` and the components they reach (transitively)."""
    paths: dict[str, dict[str, Any]] = {}
    for path, method in operations:
        paths.setdefault(path, {})[method] = spec["paths"][path][method]
    todo: set[str] = set()
    _refs(paths, todo)
    seen: set[str] = set()
    components: dict[str, dict[str, Any]] = {}
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, kind, name = ref.removeprefix("#/").split("/")
        node = spec["components"][kind][name]
        components.setdefault(kind, {})[name] = node
        _refs(node, todo)
    return {"openapi": spec["openapi"], "info": spec["info"], "paths": paths, "components": components}


@cache
def _schema() -> Any:
    spec = json.loads(SPEC.read_text())
    return schemathesis.openapi.from_dict(slim_spec(spec, list(OPERATIONS)))


def _tame(body: Any, model: str) -> None:
    """Point the request at the served model, drop made-up field names (the spec allows extra fields, the gateway
    rejects them as OpenAI does: 400 before anything else is looked at) and keep generation short."""
    if not isinstance(body, dict):
        return
    for name in [k for k in body if not re.fullmatch(r"[a-z_]+", k)]:
        del body[name]
    body["model"] = model
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(field), int) and not isinstance(body[field], bool) and body[field] > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
    for field in ("n", "best_of"):
        if isinstance(body.get(field), int) and not isinstance(body[field], bool) and body[field] > 2:
            body[field] = 2


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize(("path", "method"), list(OPERATIONS), ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_fuzzed_requests_never_get_a_5xx_or_hang(live: LiveStack, path: str, method: str, mode: str) -> None:  # noqa: F811
    if not SPEC.exists():
        pytest.skip(f"the OpenAI OpenAPI spec is not at {SPEC} (CI has it in ../shared; or set SMOLGATE_OPENAI_SPEC)")
    if mode == "negative" and method == "get":
        pytest.skip("the GET operations have no body to break (and no path parameter schemathesis can make invalid)")
    operation = _schema()[path][method.upper()]
    generation = schemathesis.GenerationMode.POSITIVE if mode == "positive" else schemathesis.GenerationMode.NEGATIVE
    failures: list[str] = []
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=OPERATIONS[(path, method)] * SCALE,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a failure here is reproducible
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=generation))
    def fuzz(case: Any) -> None:
        _tame(case.body, live.engine.model_name)
        response = case.call(base_url=f"{live.url}/v1", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=CALL_TIMEOUT_S)
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(f"{response.status_code} for {case.method} {case.formatted_path} {str(case.body)[:300]}")

    # The engine, built on this thread, turned flush-to-zero on (backend/engine/llm_engine.py); hypothesis refuses to
    # generate floats without subnormals. The engine loop thread keeps its own setting.
    torch.set_flush_denormal(False)
    try:
        fuzz()
    finally:
        torch.set_flush_denormal(True)
    print(f"{method.upper()} {path} {mode}: statuses {dict(statuses)}")  # pytest -s shows what the fuzz reached
    assert failures == []
    assert live.wait_idle().kv_blocks_used == 0
