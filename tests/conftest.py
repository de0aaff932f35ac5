"""Fixtures shared by the greedy-exactness tests: a module sets PROMPTS (questions) and MAX_NEW, or defines
its own `prompts` fixture; `reference` is then HF transformers' greedy continuation of each prompt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine_helpers import chat_ids, hf_greedy


@pytest.fixture(scope="module")
def prompts(request: pytest.FixtureRequest) -> list[list[int]]:
    """The module's PROMPTS, chat-templated."""
    return [chat_ids(q) for q in request.module.PROMPTS]


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest, prompts: list[list[int]]) -> list[list[int]]:
    """HF's greedy output for each prompt, the module's MAX_NEW tokens."""
    return [hf_greedy(p, request.module.MAX_NEW) for p in prompts]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    """A real PostgreSQL server (Debian's `postgres`, tests/spend_fixtures.py) for the module, or the test skips saying
    why."""
    from spend_fixtures import POSTGRES_SKIP, start_postgres

    server = start_postgres()
    if server is None:
        pytest.skip(POSTGRES_SKIP)
    yield server
    server.stop()
