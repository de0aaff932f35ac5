"""AsyncEngine: the engine loop on its own thread, and an asyncio API for the gateway.

The loop thread owns the LLMEngine; nothing else touches it. Requests and aborts arrive
through a thread-safe inbox; each step's RequestOutputs go back to the event loop with
call_soon_threadsafe into one asyncio.Queue per request. torch releases the GIL inside its
kernels, so HTTP handling stays responsive while a step runs.

The loop thread is also the process's torch thread: it builds the engine, and other torch work
(the in-process embedder) runs on it between steps through `submit`. libgomp keeps one thread
pool per thread that ever ran a parallel region, and once the pools hold more threads than there
are cores its workers stop spinning between regions and sleep, so every small op pays a wake-up:
a 32-stream step took 1.7x as long on a second thread as on the thread that loaded the model
(bench/README.md, "one torch thread").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import EngineStats, RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.errors import EngineDeadError, EngineError, QueueFullError
from backend.model.tokenizer import apply_chat_template

log = logging.getLogger(__name__)

# A request's outputs, or the error that ended it, on its caller's event loop
_Sink = asyncio.Queue[RequestOutput | BaseException]


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    sink: _Sink
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    """Torch work from elsewhere in the process, run on the loop thread between steps."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future[Any]


class AsyncEngine:
    def __init__(self, build: Callable[[], LLMEngine]) -> None:
        """`build` makes the LLMEngine; it runs on the loop thread, which starts now (see the module docstring)."""
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Call | None] = queue.SimpleQueue()
        self._sinks: dict[str, tuple[_Sink, asyncio.AbstractEventLoop]] = {}
        self._dead: BaseException | None = None
        self._pending = 0  # submitted but not yet seen by the loop thread
        self.step_failures = 0
        built: Future[LLMEngine] = Future()
        self._thread: threading.Thread | None = self._start_loop(build, built)
        self.engine = built.result()  # what building raised is raised here
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self.output_identity = self.engine.output_identity  # the gateway's cache fingerprint reads it
        self._stats = self.engine.stats()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(lambda: LLMEngine(config))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run fn(*args) on the loop thread between steps (concurrent.futures.Executor's submit)."""
        future: Future[Any] = Future()
        if self._thread is None or self._dead is not None:
            future.set_exception(EngineDeadError("the engine loop is not running"))
        else:
            self._inbox.put(_Call(fn, args, future))
        return future

    # ---- lifecycle -------------------------------------------------------------------------------
    def _start_loop(self, build: Callable[[], LLMEngine], built: Future[LLMEngine]) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(build, built), name="engine-loop", daemon=True)
        thread.start()
        return thread

    async def start(self) -> None:
        """The loop runs from construction on; this restarts it after a shutdown."""
        if self._thread is None:
            self._dead = None
            built: Future[LLMEngine] = Future()
            self._thread = self._start_loop(lambda: self.engine, built)
            built.result()

    async def shutdown(self) -> None:
        if self._thread is not None:
            self._inbox.put(None)
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    # ---- tokenizer -------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """A completion prompt's ids, with the special tokens the tokenizer adds to a text (Gemma's <bos>, without
        which it degenerates; SmolLM2's adds none), as vLLM and llama.cpp do."""
        return list(self.engine.tokenizer.encode(text, add_special_tokens=True))

    def detokenize(self, token_ids: list[int]) -> str:
        text: str = self.engine.tokenizer.decode(token_ids, skip_special_tokens=False)
        return text

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        return apply_chat_template(self.engine.tokenizer, messages, add_generation_prompt, continue_final_message)

    # ---- requests --------------------------------------------------------------------------------
    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield this request's outputs as they come; stopping early aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine has stopped: {self._dead}")
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        stats = self._stats
        if stats.num_waiting + self._pending >= self.engine.config.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.engine.config.max_waiting} waiting)")
        self.engine._validate(request_id, ids, params)  # fail fast on this task, not in the loop
        sink: _Sink = asyncio.Queue()
        self._pending += 1
        self._inbox.put(_Add(request_id, ids, params, sink, asyncio.get_running_loop()))
        finished = False
        try:
            while not finished:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._inbox.put(_Abort(request_id))

    async def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    # ---- the loop thread -------------------------------------------------------------------------
    def _run(self, build: Callable[[], LLMEngine], built: Future[LLMEngine]) -> None:
        try:
            self.engine = build()
        except BaseException as exc:
            built.set_exception(exc)
            return
        # Everything loaded so far lives as long as the process: keep it out of the cyclic collector's full passes,
        # which walked ~355k objects (the tokenizer, the model's modules, the weights' tables) in 0.2-0.4 s, a stall of
        # every stream whenever a gen-2 collection fell mid-generation.
        gc.collect()
        gc.freeze()
        _name_os_thread("engine-loop")  # after the build: threads it starts (OpenMP's) would inherit the name
        built.set_result(self.engine)
        try:
            while self._drain_inbox(block=not self.engine.has_work):
                self._step()
        except BaseException as exc:  # the loop itself broke: nothing more can be served
            log.exception("engine loop died")
            self._dead = exc
        finally:  # on shutdown or death, nobody is left waiting for an answer that won't come
            self._dead = self._dead or EngineDeadError("the engine has shut down")
            self._fail_all(EngineDeadError(f"the engine stopped: {self._dead}"))
            self._fail_calls()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # a bug in one step fails the requests in flight, not the engine
            log.exception("engine step failed; failing the requests in flight")
            self.step_failures += 1
            self._fail_all(EngineError(f"internal engine error: {exc!r}"))
            return
        self._stats = self.engine.stats()  # before delivering: a caller that sees "finished" sees fresh stats
        self._deliver_all(outputs)

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, one wake-up per event loop: each call_soon_threadsafe writes the loop's self-pipe and
        is a callback of its own there, so at 32 streams one call per output made 32 wake-ups a step."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Sink, RequestOutput]]] = {}
        for out in outputs:
            target = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
            if target is not None:
                batches.setdefault(target[1], []).append((target[0], out))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _fail_calls(self) -> None:
        """Torch work still queued when the loop ends gets an error, so no caller waits forever."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call) and item.future.set_running_or_notify_cancel():
                item.future.set_exception(EngineDeadError("the engine loop stopped"))

    def _fail_all(self, exc: EngineError) -> None:
        """Abort every request the engine holds (freeing its blocks) and hand `exc` to its caller."""
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        self._stats = self.engine.stats()
        for rid in list(self._sinks):
            self._deliver(rid, exc, final=True)

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued adds/aborts; False once shutdown was asked."""
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            self._apply(item)

    def _apply(self, item: _Add | _Abort | _Call) -> None:
        if isinstance(item, _Call):
            _run_call(item)
            return
        if isinstance(item, _Abort):
            self.engine.abort(item.request_id)
            self._sinks.pop(item.request_id, None)
            return
        self._pending -= 1
        self._sinks[item.request_id] = (item.sink, item.loop)
        try:
            self.engine.add_request(item.request_id, item.prompt_token_ids, item.params)
        except EngineError as exc:
            self._deliver(item.request_id, exc, final=True)
        self._stats = self.engine.stats()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException, final: bool) -> None:
        target = self._sinks.pop(request_id, None) if final else self._sinks.get(request_id)
        if target is not None:
            sink, loop = target
            loop.call_soon_threadsafe(sink.put_nowait, item)


def _put_all(items: list[tuple[_Sink, RequestOutput]]) -> None:
    for sink, item in items:
        sink.put_nowait(item)


def _name_os_thread(name: str) -> None:
    """Give the calling thread its name in the OS too (Linux: /proc's comm), so top, py-spy and bench.stream_http
    can tell the engine thread from the OpenMP workers; Python 3.11's threading names it only for itself."""
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])


def _run_call(call: _Call) -> None:
    if not call.future.set_running_or_notify_cancel():
        return
    try:
        call.future.set_result(call.fn(*call.args))
    except BaseException as exc:  # the caller's failure, handed to the caller
        call.future.set_exception(exc)
