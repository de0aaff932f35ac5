"""The engine over `world` local processes on a gloo group, from Python (the TP/PP tests and bench.pipeline;
serving uses torchrun, backend/parallel/driver.py).

Rank 0 builds an LLMEngine and runs `job(engine)`, then releases the workers; the other ranks run
backend.parallel.driver's worker loop. The job's result (or rank 0's error) comes back through a queue."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable
from typing import Any, cast

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.model.ranks import Driver

Job = Callable[[LLMEngine], Any]  # a module-level function: spawn pickles it by name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) of an AF_INET socket; typeshed says Any
        return port


def rank_main(rank: int, world: int, port: int, config: EngineConfig, *, job: Job, results: mp.Queue[tuple[str, object]]) -> None:
    import torch.distributed as dist

    from backend.parallel.driver import worker_loop

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        if rank == 0:
            try:
                engine = LLMEngine(config)
            except Exception as e:  # the workers wait in a collective that never comes: the parent ends them
                results.put(("error", repr(e)))
                raise
            try:
                results.put(("ok", job(engine)))
            except Exception as e:
                results.put(("error", repr(e)))
                raise
            finally:
                cast(Driver, engine.runner.model).stop_workers()  # with > 1 rank the runner's model is the Driver
        else:
            worker_loop(config)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, config: EngineConfig, job: Job, timeout_s: float = 600) -> Any:
    """job(engine) as rank 0 of `world` spawned processes computed it; every process must exit cleanly."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, config), kwargs={"job": job, "results": results})
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        status, value = results.get(timeout=timeout_s)
        assert status == "ok", f"rank 0 failed: {value}"
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return value
