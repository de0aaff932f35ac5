"""A real OTLP/HTTP trace receiver in the test process: an HTTP server on a free port that takes POST /v1/traces,
decodes each body as the protobuf ExportTraceServiceRequest (opentelemetry-proto) and keeps the spans, and the raw
bytes (a test searches them for what must never be exported)."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass(frozen=True)
class Event:
    name: str
    time_ns: int
    attrs: dict[str, Any]


@dataclass(frozen=True)
class ExportedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    events: tuple[Event, ...]
    error: bool  # status code ERROR


@dataclass
class Receiver:
    url: str = ""
    bodies: list[tuple[frozenset[str], bytes]] = field(default_factory=list)  # (the services it carries, its bytes)
    spans: list[ExportedSpan] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.absorb(raw)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None: ...

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def absorb(self, raw: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(raw)
        found = []
        services = set()
        for rs in request.resource_spans:
            service = str(_attrs(rs.resource.attributes).get("service.name", ""))
            services.add(service)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    events = tuple(Event(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events)
                    found.append(ExportedSpan(
                        service, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, KINDS.get(s.kind, "?"),
                        s.start_time_unix_nano, s.end_time_unix_nano, _attrs(s.attributes), events, s.status.code == 2,
                    ))  # fmt: skip
        with self._lock:
            self.bodies.append((frozenset(services), raw))
            self.spans.extend(found)

    def snapshot(self) -> list[ExportedSpan]:
        with self._lock:
            return list(self.spans)

    def raw(self, exclude: str = "") -> bytes:
        """Every body received (but those carrying spans of service `exclude`), as one string of bytes."""
        with self._lock:
            return b"".join(raw for services, raw in self.bodies if exclude not in services)

    def wait(
        self, done: Callable[[list[ExportedSpan]], bool], flush: Callable[[], object], timeout: float = 20.0
    ) -> list[ExportedSpan]:
        """The spans once `done` holds of them; `flush` pushes the gateways' queued spans out meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            flush()
            spans = self.snapshot()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver did not get the expected spans; it has: {[s.name for s in spans]}")
            time.sleep(0.05)
