"""bench.peer's timed completion against a real loopback HTTP server that drops connections (the fault llama-server's
keep-alive handling produced): a request the server closed before answering is sent again, one it cut off mid-answer
fails the run."""

from __future__ import annotations

import asyncio

import httpx

from bench.peer import time_completion

EVENTS = b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\ndata: [DONE]\n\n'


async def run(drop_first: bytes | None, events: bytes = EVENTS) -> tuple[object, int]:
    """One time_completion of 2 tokens; the server's first connection gets `drop_first` and is closed (None: no drop)."""
    calls = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        calls += 1
        if calls == 1 and drop_first is not None:
            writer.write(drop_first)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n"
                         b"connection: close\r\n\r\n%s" % (len(events), events))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            try:
                return await time_completion(client, f"http://127.0.0.1:{port}", "m", [1, 2], new_tokens=2), calls
            except httpx.HTTPError as exc:
                return exc, calls
    finally:
        server.close()
        await server.wait_closed()


def test_a_connection_closed_before_the_answer_is_retried() -> None:
    timing, calls = asyncio.run(run(drop_first=b""))
    assert calls == 2 and timing.new_tokens == 2  # type: ignore[union-attr]


def test_an_answer_cut_off_midway_is_not_retried() -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:"
    error, calls = asyncio.run(run(drop_first=cut))
    assert calls == 1 and isinstance(error, httpx.RemoteProtocolError)


def test_a_clean_answer_is_timed_once() -> None:
    timing, calls = asyncio.run(run(drop_first=None))
    assert calls == 1 and timing.new_tokens == 2 and timing.ttft_s > 0  # type: ignore[union-attr]


def test_an_answer_with_no_text_is_timed_by_its_last_event() -> None:
    # two tokens that decode to part of a character: no text event, only the finish and the usage
    events = (b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n\n'
              b'data: {"choices":[],"usage":{"completion_tokens":2,"prompt_tokens":2}}\n\ndata: [DONE]\n\n')
    timing, calls = asyncio.run(run(drop_first=None, events=events))
    assert calls == 1 and timing.new_tokens == 2 and timing.ttft_s > 0  # type: ignore[union-attr]


def test_resident_memory_counts_a_child_process_pages_as_they_are_touched() -> None:
    """bench.peer.resident_mb reads a live process's resident memory and its anonymous / file-backed parts: a child
    that writes 64 MiB shows them as anonymous memory it did not hold before."""
    import subprocess
    import sys

    from bench.peer import resident_mb

    code = ("import sys; print(flush=True); sys.stdin.readline(); b = bytearray(64 << 20); print(flush=True); "
            "sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdout.readline()  # the interpreter is up: its own pages are resident
        before = resident_mb(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        child.stdout.readline()  # the 64 MiB are written
        after = resident_mb(child.pid)
    finally:
        child.communicate("\n", timeout=30)
    assert set(before) == set(after) == {"rss_mb", "anon_mb", "file_mb"}
    assert 60 <= after["anon_mb"] - before["anon_mb"] <= 80 and 60 <= after["rss_mb"] - before["rss_mb"] <= 80
    assert before["file_mb"] > 0  # the interpreter's own mapped binary and libraries
