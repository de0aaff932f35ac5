"""Several embedded models in one gateway (`models:` as a list): SmolLM2 (the default model, as `make serve` serves it)
and Gemma 3 270M (its Q4_K_M GGUF, a base model given chat through `chat_template: gemma`), each run by its own engine
with its own KV budget, plus MiniLM for embeddings, behind one real `python -m gateway` process, through the OpenAI
client: listing, dispatch by `model`, `auto`, a key's model list, cache scopes and metrics keep the models apart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backend.fetch import fetch_gemma_gguf
from bench.server import free_port, wait_ready
from gateway.config import ConfigError, apply_env, from_mapping

ROOT = Path(__file__).resolve().parents[1]
ALL_KEY = "sk-multi-model-every-model-0001"
SMALL_KEY = "sk-multi-model-smollm2-only-01"
ADMIN_KEY = "sk-multi-model-admin-key-00001"
SMOL, GEMMA = "smollm2", "gemma-3-270m"
NO_CACHE = {"x-smolgate-cache": "no-lookup, no-store"}
HELLO = [{"role": "user", "content": "Name a color."}]


def _config(gguf: Path) -> dict:
    return {
        "host": "127.0.0.1",
        "api_keys": [{"key": ALL_KEY, "name": "all"}, {"key": SMALL_KEY, "name": "small-only", "models": [SMOL, "auto"]}],
        "admin_keys": [ADMIN_KEY],
        "cache": {"backend": "memory"},
        "engine": {"max_model_len": 512},  # what the entries leave out, they share
        "models": [
            {"id": SMOL, "engine": {"kv_cache_memory_mb": 16}},
            {"id": GEMMA, "engine": {"model": str(gguf), "chat_template": "gemma", "kv_cache_memory_mb": 24}},
        ],
        "auto": {"small": SMOL, "large": GEMMA},
    }


def _env() -> dict[str, str]:
    """This process's environment without the gateway's own settings (they would override the file)."""
    keep = {"SMOLGATE_CACHE", "SMOLGATE_CPU_ISA"}
    return {k: v for k, v in os.environ.items() if not k.startswith("SMOLGATE_") or k in keep}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("models") / "config.yaml"
    path.write_text(yaml.safe_dump(_config(fetch_gemma_gguf())))
    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "--config", str(path), "--port", str(port)]
    log = path.with_name("gateway.log").open("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, timeout_s=180.0)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.seek(0)
        out = log.read()
        assert proc.returncode in (0, -signal.SIGTERM), out[-2000:]
        assert ALL_KEY not in out and SMALL_KEY not in out and ADMIN_KEY not in out  # never a secret in the logs


def _client(url: str, key: str = ALL_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_models_lists_every_model(url: str) -> None:
    ids = {m.id for m in _client(url).models.list()}
    assert {SMOL, GEMMA, "auto", "all-MiniLM-L6-v2"} <= ids
    assert _client(url).models.retrieve(GEMMA).id == GEMMA


def test_each_model_answers_from_its_own_engine(url: str) -> None:
    client = _client(url)
    # completions: the echoed prompt's first token is Gemma's <bos> (its tokenizer adds one; SmolLM2's adds none)
    first = {}
    for model in (SMOL, GEMMA):
        resp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                         echo=True, logprobs=0, extra_headers=NO_CACHE)  # fmt: skip
        assert resp.model == model
        assert resp.choices[0].logprobs is not None and resp.choices[0].logprobs.tokens
        first[model] = resp.choices[0].logprobs.tokens[0]
    assert first == {SMOL: "The", GEMMA: "<bos>"}
    # chat: Gemma answers through its configured template (a base model: without it, chat would be a 400)
    answers = {}
    for model in (SMOL, GEMMA):
        runs = [client.chat.completions.create(model=model, messages=HELLO, max_tokens=16, temperature=0,  # type: ignore[arg-type]
                                               extra_headers=NO_CACHE) for _ in range(2)]  # fmt: skip
        assert all(r.model == model for r in runs)
        texts = [r.choices[0].message.content for r in runs]
        assert texts[0] and texts[0] == texts[1], texts  # greedy: the same answer each time, from the same engine
        answers[model] = texts[0]
    assert answers[SMOL] != answers[GEMMA], answers
    # the Responses API reaches the same engines: its answer is the chat answer of the model it names
    for model in (SMOL, GEMMA):
        resp = client.responses.create(model=model, input=HELLO, max_output_tokens=16, temperature=0,  # type: ignore[arg-type]
                                       extra_headers=NO_CACHE, store=False)  # fmt: skip
        assert resp.model == model and resp.output_text == answers[model]


def test_a_key_limited_to_one_model_cannot_reach_the_other(url: str) -> None:
    small = _client(url, SMALL_KEY)
    assert {m.id for m in small.models.list()} & {SMOL, GEMMA} == {SMOL}
    with pytest.raises(openai.NotFoundError) as err:
        small.chat.completions.create(model=GEMMA, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        small.completions.create(model=GEMMA, prompt="Hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        small.models.retrieve(GEMMA)
    # `auto` (a name the key lists) chooses only among the key's models
    raw = small.chat.completions.with_raw_response.create(model="auto", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert raw.headers["x-smolgate-model"] == SMOL and raw.parse().model == SMOL


def test_auto_picks_one_of_the_models(url: str) -> None:
    raw = _client(url).chat.completions.with_raw_response.create(model="auto", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    tier = raw.headers["x-smolgate-auto-tier"]
    assert raw.headers["x-smolgate-model"] == {"small": SMOL, "large": GEMMA}[tier] == raw.parse().model


def test_the_cache_never_serves_one_models_answer_for_another(url: str) -> None:
    client = _client(url)
    prompt = "A short list of fruits:"

    def ask(model: str) -> tuple[str, str, str]:
        raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        resp = raw.parse()
        return raw.headers["x-cache"], resp.model, resp.choices[0].text

    assert ask(SMOL)[0] == "miss"
    hit = ask(SMOL)
    assert hit[:2] == ("hit", SMOL)
    other = ask(GEMMA)  # the same request to the other model: its own answer, not the cached one
    assert other[:2] == ("miss", GEMMA) and other[2] != hit[2]
    assert ask(GEMMA)[:2] == ("hit", GEMMA)


def test_metrics_carry_each_model(url: str) -> None:
    _client(url).completions.create(model=GEMMA, prompt="Hello", max_tokens=2)
    _client(url).completions.create(model=SMOL, prompt="Hello", max_tokens=2)
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    for model in (SMOL, GEMMA):
        assert f'smolgate_engine_up{{model="{model}"}} 1.0' in text
        blocks = re.search(rf'smolgate_kv_cache_blocks_total{{model="{model}"}} ([0-9.]+)', text)
        assert blocks is not None and float(blocks.group(1)) > 0  # each engine its own KV pool
        assert re.search(rf'smolgate_requests_total{{[^}}]*model="{model}"[^}}]*status="200"}}', text)
        assert re.search(rf'smolgate_router_attempts_total{{[^}}]*model="{model}"', text)
    assert not re.search(r"^smolgate_kv_cache_blocks_total ", text, re.M)  # no unlabelled engine series beside them


@pytest.mark.parametrize(
    ("models", "line"),
    [
        ([{"id": "a"}, {"id": "a", "engine": {"kv_cache_memory_mb": 8}}],
         "configuration error: models: two entries have the id 'a'"),
        # the last entry's file is checked before the first model loads
        ([{"id": "a"}, {"id": "b", "engine": {"model": "/nonexistent/b.gguf"}}],
         "model error: b: model not found (need an HF directory or a .gguf file): /nonexistent/b.gguf"),
    ],
)  # fmt: skip
def test_a_bad_list_stops_startup_in_one_line(tmp_path: Path, models: list, line: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"models": models, "embeddings": False}))
    proc = subprocess.run([sys.executable, "-m", "gateway", "--config", str(path)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip() == line


@pytest.mark.parametrize(
    ("models", "error"),
    [
        ([], "models: the list is empty"),
        ([{"id": "a", "engines": {}}], "unknown models[0] keys: ['engines']"),
        ([{"id": "a", "engine": {"kv_cache_mb": 8}}], "models[0] (a): unknown engine config keys: ['kv_cache_mb']"),
        ([{"id": "a", "engine": {"kv_cache_memory_mb": "lots"}}], "models[0] (a): engine.kv_cache_memory_mb must be"),
        ([{"id": "auto"}], "models[0].id must be a non-empty model name ('auto' is reserved)"),
        ([{"engine": {}}], "models[0].id must be a non-empty model name"),
        ([{"id": "a", "engine": {"served_model_name": "b"}}], "models[0].engine.served_model_name: the entry's id"),
        (["a"], "models[0] must be a mapping"),
    ],
)
def test_a_bad_entry_is_refused_with_what_is_wrong(models: list, error: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({"models": models})
    assert str(err.value).startswith(error), str(err.value)


def test_an_entry_sets_its_own_fields_and_shares_the_rest() -> None:
    """An entry's own fields win; the rest come from the `engine:` section, and then the environment."""
    data = {"engine": {"max_model_len": 1024, "kv_cache_memory_mb": 64},
            "models": [{"id": "a", "engine": {"kv_cache_memory_mb": 16}}, {"id": "b", "engine": {"chat_template": "gemma"}}]}
    cfg = apply_env(from_mapping(data), {"SMOLGATE_MAX_MODEL_LEN": "512", "SMOLGATE_KV_CACHE_MEMORY_MB": "32"})
    engines = {m.name: m.engine.config for m in cfg.routing.own_engines if m.engine is not None}
    assert [(e.served_model_name, e.kv_cache_memory_mb, e.max_model_len, e.chat_template) for e in engines.values()] == [
        ("a", 16, 512, ""), ("b", 32, 512, "gemma")]
    assert cfg.routing.model("a") is not None and cfg.routing.model("a").deployments[0].kind == "embedded"  # type: ignore[union-attr]
