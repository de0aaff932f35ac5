"""Claude Code and Codex CLI, the real programs at pinned versions (`make clients` installs them into .clients/),
run non-interactively against a live gateway (a `python -m gateway` subprocess serving the real default model,
SmolLM2-135M-Instruct, with its own 8,192-token context).

- Claude Code's default prompt (~12.7k tokens: system, 12 tools, a per-turn system message) does not fit: the only
  error it may show is the context-length one, from Anthropic's wording `prompt is too long: N tokens > 8192
  maximum`, which it turns into "Prompt is too long · ... (limit 8192)".
- Claude Code completes turns with a prompt that fits: `--tools ""` leaves its 12 tool definitions (8.2k tokens)
  out, the rest is its default prompt (~4.2k tokens) and every other field it sends: thinking, context_management,
  output_config, metadata, system blocks with cache_control, the per-turn system message, the beta flags.
- Codex CLI's default prompt (~7.9k tokens, 9 tools of which 3 are left out) fits, and completes its turn as is.
- A tool round trip through Codex: asked "Use exec_command to list the files.", the model calls exec_command itself
  (greedy, tool_choice "auto" as Codex sends it), Codex runs the command, and its next request carries the output
  (function_call_output, seen on the wire by a pass-through proxy). The model never ends that turn: it repeats the
  call after each result until the context is spent (a 400 for a prompt too long, or a call cut short).
- No tool call has come through Claude Code: SmolLM2-135M answers its prompts in text (docs/clients/claude-code.md).

A completed turn: exit status 0, the model's text printed in the CLI's own format, no "API Error", and no 4xx/5xx
line in the gateway's access log for the run. The gateway runs with `make serve`'s defaults but one setting: it
answers greedily (sampling_defaults: temperature 0, as neither CLI sends a temperature) so a run is repeatable.
Answers are capped by the key's max_tokens (1024 by default) and the context left: Claude Code asks for 32,000
tokens or more, Codex for no limit.

Served past its 8,192 trained positions (engine.allow_long_max_model_len), the model does take Claude Code's
default prompt, but its answer degenerates ("#\n#\n..." greedy) and never ends, so that proof would show only
Claude Code's max-output error: it is not run here (docs/clients/claude-code.md).

Telemetry is off and both CLIs get a fresh HOME (and CODEX_HOME) with nothing but the gateway configured; the
gateway listens on the loopback only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cache_fixtures import free_port
from gateway_fixtures import AppServers
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".clients" / "node_modules" / ".bin"
KEY = "sk-clients-test-key"
PROMPT = "Say hi in three words."
TURN_TIMEOUT_S = 600  # a turn prefills 2-8k tokens: 5-30 s on two free cores, minutes when they are shared


def _cli(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in .clients/ (`make clients` needs npm and the npm registry)")
    return path


@dataclass
class Gateway:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def lines_since(self, offset: int) -> list[dict[str, Any]]:
        """The access-log lines written after `offset` (bytes), the run's requests."""
        time.sleep(0.5)  # the line is written just after the response
        with self.log.open("rb") as fh:
            fh.seek(offset)
            raw = fh.read().decode(errors="replace").splitlines()
        out = []
        for line in raw:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and "status" in entry:
                out.append(entry)
        return out

    def offset(self) -> int:
        return self.log.stat().st_size


def _start(tmp: Path, name: str, config: str) -> Gateway:
    port = free_port()
    (tmp / f"{name}.yaml").write_text(config)
    env = {
        **os.environ,
        "SMOLGATE_CONFIG": str(tmp / f"{name}.yaml"),
        "SMOLGATE_API_KEYS": KEY,
        "SMOLGATE_EMBEDDINGS": "false",
        "HOST": "127.0.0.1",
        "PORT": str(port),
    }
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {name} gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return Gateway(url, log, proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the {name} gateway did not become ready: {log.read_text()[-2000:]}")


def _stop(gw: Gateway) -> None:
    gw.proc.terminate()
    try:
        gw.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        gw.proc.kill()


CONFIG = "sampling_defaults:\n  temperature: 0\n"  # otherwise `make serve`'s defaults


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    _cli("claude")
    _cli("codex")
    gw = _start(tmp_path_factory.mktemp("gateway"), "gateway", CONFIG)
    yield gw
    _stop(gw)


@pytest.fixture
def workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The CLI's working directory, at the same path on every run: both CLIs put it in the prompt, so a path that
    changed with pytest's run number (pytest-243/...) changed what the greedy model answered."""
    path = Path(tempfile.gettempdir()) / "smolgate-cli" / request.node.name[:40]
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _home(tmp: Path) -> dict[str, str]:
    """A clean environment: a fresh HOME, no proxies, no keys of the caller's, telemetry and updates off."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    return {
        **keep,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def _claude(gw: Gateway, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**_home(tmp), "ANTHROPIC_BASE_URL": gw.url, "ANTHROPIC_API_KEY": KEY}
    cmd = [str(_cli("claude")), "-p", PROMPT, *args]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S)


CODEX_CONFIG = """\
model = "gpt-5.5-codex"
model_provider = "smolgate"
check_for_update_on_startup = false

[model_providers.smolgate]
name = "smolgate"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "SMOLGATE_API_KEY"

[analytics]
enabled = false
"""


def _codex(gw: Gateway, tmp: Path, prompt: str = PROMPT, url: str | None = None) -> subprocess.CompletedProcess[str]:
    codex_home = tmp / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(url=url or gw.url))
    env = {**_home(tmp), "CODEX_HOME": str(codex_home), "SMOLGATE_API_KEY": KEY}
    cmd = [str(_cli("codex")), "exec", "--json", "--skip-git-repo-check", prompt]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S, stdin=subprocess.DEVNULL)


@dataclass
class Recorder:
    """A pass-through proxy in front of the gateway that keeps each request body: what the CLI sent, on the wire."""

    upstream: str
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])

    async def _forward(self, request: Request) -> StreamingResponse:
        body = await request.body()
        if body:
            self.bodies.append(json.loads(body))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        client = httpx.AsyncClient(timeout=None)
        url = f"{self.upstream}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body), stream=True)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        passed = {k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=passed)


def _statuses(gw: Gateway, offset: int) -> list[tuple[str, int]]:
    return [(str(e.get("path")), int(e["status"])) for e in gw.lines_since(offset)]


def _clean_run(gw: Gateway, offset: int, path: str) -> None:
    """The run reached the gateway, and every request it made was answered with a 2xx."""
    seen = _statuses(gw, offset)
    assert any(p == path for p, _ in seen), seen
    assert all(status < 400 for _, status in seen), seen


def test_claude_code_default_prompt_shows_only_the_context_length_error(gateway: Gateway, workdir: Path) -> None:
    offset = gateway.offset()
    run = _claude(gateway, workdir)
    shown = run.stdout + run.stderr
    # Claude Code reads Anthropic's wording and says it its own way: "Prompt is too long · the request is ~12723
    # tokens (limit 8192) but this conversation is only ~2514 tokens — the rest is system prompt, tool definitions..."
    assert "Prompt is too long" in shown and "(limit 8192)" in shown, shown
    seen = _statuses(gateway, offset)
    assert seen and all(status < 400 or (path == "/v1/messages" and status == 400) for path, status in seen), seen
    assert any(status == 400 for _, status in seen), seen


def test_claude_code_print_completes_a_turn(gateway: Gateway, workdir: Path) -> None:
    offset = gateway.offset()
    run = _claude(gateway, workdir, "--tools", "")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() and "API Error" not in run.stdout, run.stdout + run.stderr  # the model's text
    _clean_run(gateway, offset, "/v1/messages")


def test_claude_code_stream_json_completes_a_turn(gateway: Gateway, workdir: Path) -> None:
    offset = gateway.offset()
    run = _claude(gateway, workdir, "--tools", "", "--output-format", "stream-json", "--verbose")
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    result = events[-1]
    assert result["type"] == "result" and result["subtype"] == "success" and not result["is_error"], result
    assert result["result"].strip() and result["num_turns"] == 1 and result["usage"]["output_tokens"] > 0, result
    texts = [b["text"] for e in events if e["type"] == "assistant" for b in e["message"]["content"] if b["type"] == "text"]
    assert texts == [result["result"]], events
    _clean_run(gateway, offset, "/v1/messages")


def test_codex_exec_completes_a_turn(gateway: Gateway, workdir: Path) -> None:
    offset = gateway.offset()
    run = _codex(gateway, workdir)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed" and "error" not in kinds, kinds
    messages = [e["item"]["text"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert messages and messages[-1].strip(), events
    assert events[-1]["usage"]["input_tokens"] > 4000 and events[-1]["usage"]["output_tokens"] > 0, events[-1]
    _clean_run(gateway, offset, "/v1/responses")


# The model picks the tool itself (tool_choice "auto", as Codex sends it): greedy, this prompt's first token is `<`,
# which the grammar holds to a well-formed call. What it puts in `cmd` is its own (a file listing, or a made-up
# command name that the shell does not find); either way Codex runs it and sends back what came out.
TOOL_PROMPT = "Use exec_command to list the files."
OUT_OF_ROOM = "ran out of room in the model's context window"
CUT_SHORT = "Incomplete response returned, reason: max_output_tokens"


def test_codex_exec_runs_the_models_tool_call_and_sends_back_its_output(gateway: Gateway, workdir: Path) -> None:
    recorder = Recorder(gateway.url)
    servers = AppServers()
    [url] = servers.start([recorder.app()], "recorder")
    offset = gateway.offset()
    try:
        run = _codex(gateway, workdir, TOOL_PROMPT, url)
    finally:
        servers.stop()
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    turns = [b for b in recorder.bodies if "input" in b]
    assert len(turns) >= 2, recorder.bodies
    assert not any(i.get("type") == "function_call_output" for i in turns[0]["input"]), turns[0]["input"]
    follow_up = turns[1]["input"]
    calls = [i for i in follow_up if i.get("type") == "function_call"]
    outputs = [i for i in follow_up if i.get("type") == "function_call_output"]
    assert calls and calls[0]["name"] == "exec_command", follow_up  # the gateway's answer, as Codex read it back
    assert outputs and outputs[0]["call_id"] == calls[0]["call_id"] and outputs[0]["output"].strip(), follow_up
    # what Codex ran and what came out: the model's arguments vary with the working directory's path (probed offline,
    # some held an empty `cmd` or a made-up `shell`), so the round trip above is asserted whether or not a command ran
    ran = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    if ran:
        assert ran[0]["aggregated_output"].strip() in outputs[0]["output"], (ran[0], outputs[0])
        assert f"Process exited with code {ran[0]['exit_code']}" in outputs[0]["output"], outputs[0]

    # Greedy, the 135M model calls the same tool again after each result, so Codex keeps going until the context is
    # spent: either a request's prompt outgrows the 8,192 tokens (a 400, "ran out of room") or the context left cuts
    # the model's next call short (a 200 with status incomplete, "max_output_tokens"). Those are the two ends allowed.
    seen = _statuses(gateway, offset)
    assert sum(1 for p, s in seen if p == "/v1/responses" and s == 200) >= 2, seen
    if run.returncode == 0:
        assert events[-1]["type"] == "turn.completed" and all(s < 400 for _, s in seen), (events, seen)
    elif OUT_OF_ROOM in events[-1].get("error", {}).get("message", ""):
        assert events[-1]["type"] == "turn.failed", events[-1]
        assert all(s < 400 for _, s in seen[:-1]) and seen[-1] == ("/v1/responses", 400), seen
    else:
        assert events[-1]["type"] == "turn.failed" and CUT_SHORT in events[-1]["error"]["message"], events[-1]
        assert all(s < 400 for _, s in seen), seen


def test_the_clis_are_the_pinned_versions() -> None:
    claude = subprocess.run([str(_cli("claude")), "--version"], capture_output=True, text=True, timeout=60)
    codex = subprocess.run([str(_cli("codex")), "--version"], capture_output=True, text=True, timeout=60)
    assert claude.stdout.startswith("2.1.328") and codex.stdout.strip() == "codex-cli 0.169.0"
