"""The asyncio API: concurrent streams, abort on early exit, queue limits, typed errors."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from backend.config import EngineConfig
from backend.engine.async_engine import AsyncEngine
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.errors import ContextLengthError, QueueFullError
from tests.engine_helpers import assert_no_leaks


@pytest.fixture(scope="module")
async def engine():
    eng = AsyncEngine(lambda: LLMEngine(EngineConfig(quantization="none", max_waiting=4)))
    await eng.start()
    yield eng
    await eng.shutdown()
    assert_no_leaks(eng.engine)


async def collect(engine: AsyncEngine, prompt: str, params: SamplingParams, rid: str) -> tuple[str, int]:
    text, outputs = "", 0
    async for out in engine.generate(prompt, params, rid):
        text += "".join(d.text for d in out.deltas)
        outputs += 1
    return text, outputs


async def test_concurrent_streams_equal_sequential_greedy(engine: AsyncEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [f"The number {i} is" for i in range(4)]
    alone = [await collect(engine, p, params, f"a{i}") for i, p in enumerate(prompts)]
    together = await asyncio.gather(*(collect(engine, p, params, f"b{i}") for i, p in enumerate(prompts)))
    assert [t for t, _ in together] == [t for t, _ in alone]
    assert all(n > 1 for _, n in together), "outputs are streamed step by step, not in one piece"


async def test_leaving_the_stream_aborts_and_frees_blocks(engine: AsyncEngine) -> None:
    stream = engine.generate("Once upon a time", SamplingParams(max_tokens=500, ignore_eos=True), "leave")
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(100):
        await asyncio.sleep(0.05)
        stats = engine.stats()
        if stats.kv_blocks_used == 0 and stats.num_running == 0:
            break
    assert engine.stats().kv_blocks_used == 0 and "leave" not in engine.engine.requests


async def test_cancelled_task_aborts(engine: AsyncEngine) -> None:
    task = asyncio.create_task(collect(engine, "Tell me a story", SamplingParams(max_tokens=500, ignore_eos=True), "cancel"))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        await asyncio.sleep(0.05)
        if engine.stats().kv_blocks_used == 0:
            break
    assert engine.stats().kv_blocks_used == 0


async def test_full_queue_raises(engine: AsyncEngine) -> None:
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    streams = [engine.generate("Hello", params, f"q{i}") for i in range(12)]
    results = await asyncio.gather(*(s.__anext__() for s in streams), return_exceptions=True)
    assert any(isinstance(r, QueueFullError) for r in results)
    for s in streams:
        await s.aclose()


async def test_bad_request_raises_before_streaming(engine: AsyncEngine) -> None:
    with pytest.raises(ContextLengthError):
        await collect(engine, "Hi", replace(SamplingParams(), max_tokens=10**6), "too-long")


async def test_a_failing_step_fails_its_requests_but_not_the_engine(engine: AsyncEngine) -> None:
    """Fault injection: one step raises; the requests in flight get an error, later ones are served."""
    from backend.errors import EngineError

    real_step = engine.engine.step
    calls = {"n": 0}

    def flaky_step() -> list:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_step()

    engine.engine.step = flaky_step  # type: ignore[method-assign]
    try:
        with pytest.raises(EngineError, match="injected fault"):
            await collect(engine, "Tell me a story", SamplingParams(max_tokens=50, ignore_eos=True), "flaky")
    finally:
        engine.engine.step = real_step  # type: ignore[method-assign]
    assert engine.step_failures == 1 and engine.stats().kv_blocks_used == 0
    text, _ = await collect(engine, "Hello", SamplingParams(temperature=0, max_tokens=4), "after-fault")
    assert text


async def test_shutdown_fails_requests_in_flight() -> None:
    eng = AsyncEngine(lambda: LLMEngine(EngineConfig(quantization="none")))
    await eng.start()
    stream = eng.generate("Once upon a time", SamplingParams(max_tokens=500, ignore_eos=True), "in-flight")
    await stream.__anext__()
    await eng.shutdown()
    with pytest.raises(Exception, match="stopped"):
        async for _ in stream:
            pass
    assert_no_leaks(eng.engine)


async def test_startup_heap_is_frozen_and_the_thread_named(engine: AsyncEngine) -> None:
    """What the engine loaded is out of the cyclic collector's full passes (no mid-stream gen-2 stalls), and the
    engine thread carries its name in the OS (bench.stream_http reads it)."""
    import gc
    import sys
    from pathlib import Path

    assert gc.get_freeze_count() > 0
    if sys.platform == "linux":
        names = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
        assert "engine-loop" in names


async def test_one_step_outputs_reach_every_stream_in_order(engine: AsyncEngine) -> None:
    """A step's outputs go to the event loop in one batch; every stream still gets all of its own, in order."""
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)

    async def tokens(rid: str) -> list[int]:
        return [t async for out in engine.generate("Count: one, two,", params, rid) for d in out.deltas for t in d.token_ids]

    alone = await tokens("o0")
    together = await asyncio.gather(*(tokens(f"o{i}") for i in range(1, 4)))
    assert all(t == alone and len(t) == 9 for t in together)


async def test_the_finished_output_reports_where_the_time_went(engine: AsyncEngine) -> None:
    """RequestTimings (what the gateway's engine spans are built from): in order, and only in the last output, with
    another request running beside it."""
    long = asyncio.create_task(collect(engine, "Tell me a story", SamplingParams(max_tokens=40, ignore_eos=True), "t-long"))
    await asyncio.sleep(0.05)
    outs = [out async for out in engine.generate("The sky is", SamplingParams(max_tokens=6, ignore_eos=True, n=2), "t-short")]
    await long
    assert all(out.timings is None for out in outs[:-1]) and outs[-1].finished
    t = outs[-1].timings
    assert t is not None and t.scheduled is not None and t.first_token is not None
    assert t.arrival <= t.scheduled <= t.first_token <= t.finished
    assert t.preemptions == 0
