"""Priority scheduling on the real model: a saturated engine serves urgent requests first, preempts the
least urgent, and with ageing nothing starves. Greedy outputs stay exact whatever the order."""

from __future__ import annotations

import time

import pytest

from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import BACKGROUND_PRIORITY
from backend.errors import InvalidRequestError
from tests.engine_helpers import QUESTIONS, assert_no_leaks, chat_ids, make_engine, token_ids

MAX_NEW = 16
LOW, HIGH = 10, 0  # vLLM's convention: lower value = more urgent


def params(priority: int, max_tokens: int = MAX_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, priority=priority)


def run(engine, arrivals: dict[int, list[tuple]]) -> tuple[dict[str, list], dict[str, int], dict[str, float]]:
    """Step until idle; returns outputs, the step of each request's first token and its TTFT in seconds."""
    outputs: dict[str, list] = {}
    first_step: dict[str, int] = {}
    submitted: dict[str, float] = {}
    ttft: dict[str, float] = {}
    step = 0
    while engine.has_work or arrivals:
        for args in arrivals.pop(step, []):
            engine.add_request(*args)
            submitted[args[0]] = time.perf_counter()
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
            if out.request_id not in first_step and any(d.token_ids for d in out.deltas):
                first_step[out.request_id] = step
                ttft[out.request_id] = time.perf_counter() - submitted[out.request_id]
        step += 1
    return outputs, first_step, ttft


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [chat_ids(q) for q in QUESTIONS[:8]]


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> list[list[int]]:
    """Greedy outputs at default priority, one batch (batching never changes greedy tokens: test_engine_greedy)."""
    outs, _, _ = run(make_engine(), {0: [(f"r{i}", p, params(0)) for i, p in enumerate(prompts)]})
    return [token_ids(outs[f"r{i}"]) for i in range(len(prompts))]


def test_saturated_engine_serves_high_priority_first(prompts: list[list[int]], reference: list[list[int]]) -> None:
    """8 requests at once, 2 sequence slots: the 4 urgent ones (submitted last) all start before any low one,
    every request finishes, and each output equals the default-priority reference."""
    engine = make_engine(max_num_seqs=2, priority_aging_s=0.0)
    reqs = [(f"r{i}", prompts[i], params(LOW if i < 4 else HIGH)) for i in range(8)]
    outs, first, ttft = run(engine, {0: reqs})
    assert set(outs) == {r[0] for r in reqs}, "every request finishes"
    assert max(first[f"r{i}"] for i in range(4, 8)) < min(first[f"r{i}"] for i in range(4))
    high, low = (sum(ttft[f"r{i}"] for i in span) / 4 for span in (range(4, 8), range(4)))
    print(f"mean TTFT high {high * 1000:.0f} ms, low {low * 1000:.0f} ms")
    for i in range(8):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"r{i} diverged"
    assert_no_leaks(engine)


def test_preemption_takes_the_lowest_priority_first(prompts: list[list[int]], reference: list[list[int]]) -> None:
    """A KV pool with room for 7 blocks, one low-priority request admitted first, an urgent one a step later: both
    outgrow the pool, and the low one is preempted (by arrival order the urgent one would be), outputs exact."""
    # 7 blocks of 16 tokens, each request needs 4; no prefix caching, so the shared chat template costs blocks too.
    engine = make_engine(kv_cache_memory_mb=5, enable_prefix_caching=False, priority_aging_s=0.0)
    victims: list[int] = []
    preempt = engine.scheduler._preempt

    def spy(seq, out):  # records who is preempted, then preempts for real
        victims.append(seq.params.priority)
        preempt(seq, out)

    engine.scheduler._preempt = spy
    outs, _, _ = run(engine, {0: [("r0", prompts[0], params(LOW))], 1: [("r2", prompts[2], params(HIGH))]})
    assert victims and set(victims) == {LOW}, victims
    for i in (0, 2):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"r{i} diverged"
    assert_no_leaks(engine)


def test_ageing_prevents_starvation(prompts: list[list[int]]) -> None:
    """One slot, a low-priority request and a new urgent one every step: with ageing the low one is served long
    before the urgent stream ends; without it, it waits for all of them."""
    engine = make_engine(max_num_seqs=1)
    stream = 24
    positions = {}
    for aging in (0.0, 0.05):
        engine.scheduler.priority_aging_s = aging
        arrivals = {step: [(f"high{step}-{aging}", prompts[1 + step % 7], params(HIGH, 1))] for step in range(stream)}
        arrivals[0].insert(0, (f"low-{aging}", prompts[0], params(LOW, 1)))
        outs, first, _ = run(engine, arrivals)
        assert len(outs) == stream + 1, "every request finishes"
        positions[aging] = sorted(first, key=first.get).index(f"low-{aging}")
        assert_no_leaks(engine)
    assert positions[0.0] == stream, "without ageing the low request goes last"
    assert positions[0.05] < stream - 4, positions


def test_background_work_gets_short_steps(prompts: list[list[int]], reference: list[list[int]]) -> None:
    """Only batch-priority (2**31 - 1) sequences here: every step stays within background_max_batched_tokens (a
    live request arriving mid-step waits for a short one); once a live request is here, steps get the full
    budget again and its whole prompt goes in one step; every output equals the reference."""
    engine = make_engine(background_max_batched_tokens=16, max_num_batched_tokens=512)
    steps: list[tuple[int, bool]] = []  # (tokens scheduled, a live sequence present)
    schedule = engine.scheduler.schedule

    def spy():  # records each step's size, then schedules for real
        live = any(s.params.priority < BACKGROUND_PRIORITY for s in (*engine.scheduler.running, *engine.scheduler.waiting))
        out = schedule()
        steps.append((out.num_tokens, live))
        return out

    engine.scheduler.schedule = spy
    background = [(f"r{i}", prompts[i], params(BACKGROUND_PRIORITY)) for i in range(3)]
    outs, _, _ = run(engine, {0: background, 4: [("r3", prompts[3], params(0))]})
    alone = [n for n, live in steps if not live]
    assert alone and max(alone) <= 16, steps  # the prompts (~30 tokens each) went in 16-token chunks
    live_steps = [n for n, live in steps if live]
    assert live_steps[0] >= len(prompts[3]), steps  # the live prompt whole, past the background budget
    for i in range(4):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"r{i} diverged"
    assert_no_leaks(engine)


def test_priority_is_validated() -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(priority=2**40)
