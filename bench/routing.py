"""Routing and scale-out: throughput with 1 vs 2 backend replicas behind one gateway, the latency routing adds,
recovery after a replica dies, and the upstream HTTP client's pool sizing.

    python -m bench.routing [--requests 32] [--concurrency 8] [--max-tokens 32] [--rounds 2] [--threads 1]

Processes, as in compose.yaml: two `python -m gateway --embedded-only` replicas (the real model, --threads torch threads
each), and two torch-free `python -m gateway` routers: `one` routes to backend b1 only, `two` to b1 and b2.
  throughput   the same load (distinct chat prompts, temperature 0) through `one` then `two`, alternated
               --rounds times; the ratio is the median of the per-round ratios (completion tokens/s).
  overhead     Balancer.pick+done in process (the routing decision), and sequential max_tokens=1 requests
               through `one` vs straight to b1 (what the extra HTTP hop costs end to end).
  recovery     steady load through `two`, b2 SIGKILLed a third of the way in: failed requests, the window in
               which requests failed, and (after b2 restarts) how long until the gateway sends it traffic again.
  http_pool    requests/s of httpx at 64 in flight against two fast local servers: one shared AsyncClient vs
               one client per deployment (what gateway/routing/upstream.py does), and a small pool.
The last line of output is one JSON object (also written to bench/results/routing.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.report import emit
from bench.routing_load import Load, echo_app, free_port, http_pool, run_load, wait_ready
from gateway.routing.balancer import Balancer
from gateway.routing.config import DeploymentConfig, RouterConfig

RESULTS = Path(__file__).resolve().parent / "results" / "routing.json"
MODEL = "SmolLM2-135M-Instruct"


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen([sys.executable, *args], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def backend(port: int, threads: int, log: Path) -> subprocess.Popen[bytes]:
    env = {"SMOLGATE_EMBEDDINGS": "false", "SMOLGATE_NUM_THREADS": str(threads), "SMOLGATE_ACCESS_LOG": "false",
           "SMOLGATE_API_KEYS": "", "SMOLGATE_KV_CACHE_MEMORY_MB": "256", "SMOLGATE_MAX_MODEL_LEN": "1024"}  # fmt: skip
    return spawn(["-m", "gateway", "--embedded-only", "--host", "127.0.0.1", "--port", str(port)], env, log)


def gateway(port: int, backends: dict[str, str], workdir: Path, cooldown_s: float) -> subprocess.Popen[bytes]:
    deps = [
        {"kind": "backend", "name": n, "base_url": f"{u}/v1", "model": MODEL, "first_token_timeout_s": 60.0}
        for n, u in backends.items()
    ]
    cfg = {"embeddings": False, "cache": {"backend": "off"}, "access_log": False, "models": {MODEL: {"deployments": deps}},
           "router": {"cooldown_failures": 1, "cooldown_s": cooldown_s}}  # fmt: skip
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return spawn(
        ["-m", "gateway", "--port", str(port)], {"SMOLGATE_CONFIG": str(path), "SMOLGATE_API_KEYS": ""}, workdir / "gw.log"
    )


def cpu_s(procs: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds (user + system, all threads) the processes used so far, from /proc."""
    total = 0.0
    for proc in procs:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def decision_us(n: int = 20000) -> dict[str, float]:
    deps = [DeploymentConfig(kind="backend", name=f"r{i}", prefix_affinity=True) for i in range(4)]
    b = Balancer(deps, RouterConfig())
    out = {}
    for key in ("", "conversation-key"):
        started = time.perf_counter()
        for _ in range(n):
            choice = b.pick(key, set())
            b.done(choice.state, True)  # type: ignore[union-attr]
        out["affinity" if key else "least_outstanding"] = round((time.perf_counter() - started) / n * 1e6, 2)
    return out


async def hop_ms(gateway_url: str, backend_url: str, n: int) -> dict[str, float]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    times: dict[str, list[float]] = {"gateway": [], "direct": []}
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(n):
            for name, url in (
                (("gateway", gateway_url), ("direct", backend_url))
                if i % 2
                else (("direct", backend_url), ("gateway", gateway_url))
            ):
                started = time.perf_counter()
                (await client.post(f"{url}/v1/chat/completions", json=body)).raise_for_status()
                times[name].append((time.perf_counter() - started) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "direct_p50_ms": round(med["direct"], 2),
        "gateway_p50_ms": round(med["gateway"], 2),
        "added_p50_ms": round(med["gateway"] - med["direct"], 2),
    }


async def recovery(url: str, victim: subprocess.Popen[bytes], load: Load, seconds: float) -> dict[str, Any]:
    kill_at: list[float] = []

    async def killer() -> None:
        await asyncio.sleep(seconds / 3)
        kill_at.append(time.perf_counter())
        victim.send_signal(signal.SIGKILL)

    task = asyncio.create_task(killer())
    results = await run_load(url, load, duration_s=seconds)
    await task
    t0 = kill_at[0]
    failed = [r for r in results if not r.ok]
    after = [r for r in results if r.start > t0]
    return {
        "requests": len(results),
        "failed": len(failed),
        "failed_kinds": sorted({r.error for r in failed}),
        "error_window_s": round(max((r.end for r in failed), default=t0) - t0, 2),
        "started_after_kill_ok": f"{sum(r.ok for r in after)}/{len(after)}",
        "slowest_after_kill_s": round(max((r.end - r.start for r in after), default=0.0), 2),
    }


async def readmitted_after(url: str, name: str, timeout: float) -> float:
    """Seconds until a request through `url` is served by deployment `name` again."""
    started = time.perf_counter()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    async with httpx.AsyncClient(timeout=60) as client:
        while time.perf_counter() - started < timeout:
            r = await client.post(f"{url}/v1/chat/completions", json=body)
            if r.headers.get("x-smolgate-deployment") == name:
                return round(time.perf_counter() - started, 2)
            await asyncio.sleep(0.1)
    return -1.0


async def scenario(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    ports = {"b1": free_port(), "b2": free_port()}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    procs = {n: backend(p, args.threads, work / f"{n}.log") for n, p in ports.items()}
    gw_ports = {"one": free_port(), "two": free_port()}
    gws = {"one": gateway(gw_ports["one"], {"b1": urls["b1"]}, work, args.cooldown_s),
           "two": gateway(gw_ports["two"], urls, work, args.cooldown_s)}  # fmt: skip
    gw_urls = {k: f"http://127.0.0.1:{p}" for k, p in gw_ports.items()}
    try:
        for name, proc in [*procs.items(), *gws.items()]:
            wait_ready(urls.get(name) or gw_urls[name], proc)
        load = Load(args.requests, args.concurrency, args.max_tokens)
        await run_load(gw_urls["two"], Load(4, 2, 4))  # warm both replicas
        rounds = []
        for r in range(args.rounds):
            row = {}
            for setup in ("one", "two"):
                cpu0 = cpu_s(list(procs.values()))
                res = await run_load(gw_urls[setup], load, tag=f"r{r}{setup}")
                row[setup] = Load.summary(res)
                # how many cores the backends got while it ran (the machine is shared), and tokens per backend CPU second
                used = cpu_s(list(procs.values())) - cpu0
                row[setup]["backend_cores"] = round(used / row[setup]["wall_s"], 2)
                row[setup]["tok_per_backend_cpu_s"] = round(row[setup]["tok_s"] * row[setup]["wall_s"] / max(used, 1e-9), 1)
                print(f"round {r} {setup}: {row[setup]}", flush=True)
            rounds.append(row)
        ratio = statistics.median(x["two"]["tok_s"] / x["one"]["tok_s"] for x in rounds)
        cores = statistics.median(x["two"]["backend_cores"] / max(x["one"]["backend_cores"], 1e-9) for x in rounds)
        overhead = {"decision_us": decision_us(), **(await hop_ms(gw_urls["one"], urls["b1"], args.hops))}
        print(f"overhead: {overhead}", flush=True)
        rec = await recovery(gw_urls["two"], procs["b2"], Load(10**6, args.concurrency, 16), args.recovery_s)
        procs["b2"] = backend(ports["b2"], args.threads, work / "b2.log")
        wait_ready(urls["b2"], procs["b2"])
        rec["readmitted_after_restart_s"] = await readmitted_after(gw_urls["two"], "b2", args.cooldown_s + 30)
        rec["cooldown_s"] = args.cooldown_s
        print(f"recovery: {rec}", flush=True)
    finally:
        for proc in [*procs.values(), *gws.values()]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*procs.values(), *gws.values()]:
            proc.wait(timeout=30)
    return {"rounds": rounds, "throughput_ratio_2_vs_1": round(ratio, 2), "backend_cores_ratio_2_vs_1": round(cores, 2),
            "overhead": overhead, "recovery": rec}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per backend replica")
    parser.add_argument("--hops", type=int, default=20, help="sequential requests for the added-latency figure")
    parser.add_argument("--recovery-s", type=float, default=15.0)
    parser.add_argument("--cooldown-s", type=float, default=5.0)
    parser.add_argument("--serve-echo", type=int, help=argparse.SUPPRESS)  # internal: a fast upstream for http_pool
    args = parser.parse_args(argv)
    if args.serve_echo:
        import uvicorn

        uvicorn.run(echo_app(), host="127.0.0.1", port=args.serve_echo, log_level="warning", access_log=False)
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = {"bench": "routing", "load": os.getloadavg()[0], "cores": os.cpu_count(),
                  **asyncio.run(scenario(args, Path(tmp)))}
        result["http_pool"] = asyncio.run(http_pool())
        print(f"http_pool: {result['http_pool']}", flush=True)
    emit(result, RESULTS)


if __name__ == "__main__":
    main()
