"""A DNS server the tests control: UDP on 127.0.0.1, answering A and PTR queries from records a test sets and
changes while the gateway runs, as a Kubernetes headless Service's records change when pods come and go.

It is a real server (dnspython parses and builds the messages), so the gateway's resolver is the one it uses in a
cluster; only the records are the test's. TTL 0: every lookup reaches it.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.reversename


@dataclass
class DnsServer:
    a: dict[str, list[str]] = field(default_factory=dict)  # name (no trailing dot) -> addresses
    ptr: dict[str, str] = field(default_factory=dict)  # address -> host name
    queries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        assert self._sock is not None
        host, port = self._sock.getsockname()
        return f"{host}:{port}"

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self.a[name.rstrip(".")] = list(addresses)

    def start(self) -> DnsServer:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                wire, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(wire)
            except dns.exception.DNSException:
                continue
            self._sock.sendto(self._answer(query).to_wire(), peer)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        with self._lock:
            self.queries += 1
            for q in query.question:
                name = q.name.to_text().rstrip(".")
                if q.rdtype == dns.rdatatype.A and name in self.a:
                    if self.a[name]:
                        rrset = response.find_rrset(response.answer, q.name, dns.rdataclass.IN, dns.rdatatype.A, create=True)
                        for address in self.a[name]:
                            rrset.add(dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.A, address), ttl=0)
                    # a name with no address: NOERROR and no answer (a headless Service with no ready pod)
                elif q.rdtype == dns.rdatatype.PTR and _address(q.name) in self.ptr:
                    rrset = response.find_rrset(response.answer, q.name, dns.rdataclass.IN, dns.rdatatype.PTR, create=True)
                    target = self.ptr[_address(q.name)].rstrip(".") + "."
                    rrset.add(dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.PTR, target), ttl=0)
                else:
                    response.set_rcode(dns.rcode.NXDOMAIN)
        return response


def _address(name: dns.name.Name) -> str:
    try:
        return dns.reversename.to_address(name)
    except Exception:
        return ""
