"""Fixtures for the gateway tests: the REAL engine, model and embedder behind a real uvicorn
server on a free port, plus an OpenAPI validator for response shapes.

The only stand-in is `FaultyEngine`, which wraps the real engine to simulate faults
(queue full, a crash before or in the middle of a stream, a dead engine).

Test modules import the fixtures they use from here. One server serves the whole
session: the stack is cached per process, because an imported fixture is registered
once per importing module.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from jsonschema import Draft202012Validator

from backend.config import EngineConfig, engine_config_from_env
from backend.engine.outputs import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.errors import EngineDeadError, QueueFullError
from gateway.app import build_context, create_app
from gateway.config import GatewayConfig
from gateway.spend.config import LedgerConfig, SpendConfig

API_KEY = "sk-test-gateway-key-never-logged"
MAX_BODY_BYTES = 256 * 1024
TEST_MAX_MODEL_LEN = 2048
SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "openai-openapi" / "openapi.json"


class FaultyEngine:
    """Wraps the real engine; `mode` selects the fault the next generate() call shows."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.model_name = real.model_name
        self.max_model_len = real.max_model_len
        self.mode = "queue_full"

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def tokenize(self, text: str) -> list[int]:
        return self.real.tokenize(text)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.real.detokenize(token_ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        return self.real.apply_chat_template(messages, add_generation_prompt, continue_final_message)

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if self.mode == "queue_full":
            raise QueueFullError("simulated: the waiting queue is full")
        if self.mode == "dead":
            raise EngineDeadError("simulated: the engine loop died")
        if self.mode == "crash":
            raise RuntimeError("simulated bug with a secret detail")
        async for out in self.real.generate(prompt, params, request_id):
            yield out
            raise RuntimeError("simulated failure in the middle of a stream")

    async def abort(self, request_id: str) -> None:
        await self.real.abort(request_id)

    def stats(self) -> Any:
        return self.real.stats()


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@dataclass
class AppServers:
    """ASGI apps served by uvicorn on free loopback ports, all in one background thread: the fixtures' real servers."""

    servers: list[uvicorn.Server] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self, apps: list[Any], what: str, timeout: float = 120.0) -> list[str]:
        """Serve `apps`; their base URLs, in order, once every one has started."""
        sockets = [_bound_socket() for _ in apps]
        config = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": 2}
        self.servers = [uvicorn.Server(uvicorn.Config(app, **config)) for app in apps]  # type: ignore[arg-type]

        async def serve() -> None:
            await asyncio.gather(*(s.serve(sockets=[k]) for s, k in zip(self.servers, sockets, strict=True)))

        self.thread = threading.Thread(target=asyncio.run, args=(serve(),), name=f"uvicorn-{what}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not all(s.started for s in self.servers):
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the {what} test servers did not start")
            time.sleep(0.05)
        return [f"http://127.0.0.1:{k.getsockname()[1]}" for k in sockets]

    def stop(self) -> None:
        for server in self.servers:
            server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=30)
            self.thread = None


@dataclass
class LiveStack:
    """The real engine + embedder behind two live servers: `url` (real) and `fault_url` (faults)."""

    engine: Any
    faulty: FaultyEngine
    log_path: Path
    url: str = ""
    fault_url: str = ""
    _servers: AppServers = field(default_factory=AppServers)

    def client(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("api_key", API_KEY)
        return openai.OpenAI(base_url=f"{kw.pop('url', self.url)}/v1", max_retries=0, timeout=120, **kw)

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=120, **kw
        )

    def fault_client(self) -> openai.OpenAI:
        return self.client(url=self.fault_url)

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def log_lines_of(self, request_id: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """This request's log lines; the line is written just after the response, so wait for it."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log_lines() if line.get("request_id") == request_id]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def wait_idle(self, timeout: float = 10.0) -> Any:
        """Poll engine.stats() until nothing runs and no KV block is held; return the stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_blocks_used == 0:
                return stats
            if time.monotonic() > deadline:
                return stats
            time.sleep(0.02)

    def start(self, config: GatewayConfig, embedder: Any) -> None:
        log = self.log_path.open("a", buffering=1)
        main = create_app(build_context(config, self.engine, embedder, log_sink=log))
        fault = create_app(build_context(config, self.faulty, None, log_sink=log), manage_engine=False)
        self.url, self.fault_url = self._servers.start([main, fault], "gateway")

    def stop(self) -> None:
        self._servers.stop()


@cache
def _test_ledger_dir() -> str:
    """The spend ledger of this test process: its own directory, not the user's ~/.cache/smolgate/ledger."""
    return tempfile.mkdtemp(prefix="smolgate-test-ledger-")


def gateway_test_config() -> GatewayConfig:
    engine = engine_config_from_env(EngineConfig(max_model_len=TEST_MAX_MODEL_LEN, kv_cache_memory_mb=256))
    # The test key is the operators' key too (admin_keys): it reads /metrics and /v1/stats.
    spend = SpendConfig(ledger=LedgerConfig(dir=_test_ledger_dir()))
    return GatewayConfig(api_keys=(API_KEY,), admin_keys=(API_KEY,), max_body_bytes=MAX_BODY_BYTES, engine=engine,
                         spend=spend)  # fmt: skip


@cache
def _shared_stack(log_dir: Path) -> LiveStack:
    from backend.embed.embeddings import Embedder
    from backend.engine.async_engine import AsyncEngine

    config = gateway_test_config()
    engine = AsyncEngine.from_config(config.engine)
    stack = LiveStack(engine=engine, faulty=FaultyEngine(engine), log_path=log_dir / "gateway.log")
    stack.start(config, Embedder())
    return stack


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    stack = _shared_stack(tmp_path_factory.getbasetemp())
    yield stack
    stack.stop()  # idempotent: every importing module's copy of this fixture ends here


@pytest.fixture()
def client(live: LiveStack) -> openai.OpenAI:
    return live.client()


# ---- OpenAPI response-shape validation ------------------------------------------------------------


def _nullable_to_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 `nullable: true` -> JSON Schema `anyOf: [..., {"type": "null"}]`, recursively."""
    if isinstance(node, list):
        return [_nullable_to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _spec() -> dict[str, Any]:
    if not SPEC_PATH.exists():
        pytest.skip(f"the OpenAI OpenAPI spec is not at {SPEC_PATH}")
    return _nullable_to_json_schema(json.loads(SPEC_PATH.read_text()))


@cache
def _validator(schema_name: str) -> Draft202012Validator:
    root = copy.copy(_spec())
    root["$ref"] = f"#/components/schemas/{schema_name}"
    return Draft202012Validator(root)


def assert_schema(schema_name: str, instance: Any) -> None:
    """Validate a response body (dict) against components/schemas/<schema_name>."""
    errors = sorted(_validator(schema_name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{schema_name}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def assert_completion_chunk(chunk: dict[str, Any]) -> None:
    """A streamed text_completion chunk. OpenAI sends `finish_reason: null` until a choice ends,
    which the spec's CreateCompletionResponse (written for the final object) does not allow;
    check that and validate the rest against the spec."""
    finished = copy.deepcopy(chunk)
    for choice in finished["choices"]:
        assert "finish_reason" in choice
        if choice["finish_reason"] is None:
            choice["finish_reason"] = "length"
    assert_schema("CreateCompletionResponse", finished)
