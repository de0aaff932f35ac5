"""gateway/routing/discovery.py against a real DNS server the test controls (tests/dns_fixtures.py): A records become
replicas named by their PTR records, a change of records adds and removes replicas without touching the ones that
stay, a lookup that fails keeps what is known, and the router opens and closes the replicas' connections."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog
from dns_fixtures import DnsServer

from gateway.app import build_context, create_app
from gateway.config import from_mapping
from gateway.routing.balancer import Balancer
from gateway.routing.config import DeploymentConfig, RouterConfig, RoutingConfigError, parse_deployment
from gateway.routing.discovery import Discovery, DiscoveryError, DnsResolver, Target, replica
from gateway.routing.router import Router

NAME = "engine.smolgate.svc.cluster.local"


@pytest.fixture
def dns_server() -> Iterator[DnsServer]:
    server = DnsServer().start()
    yield server
    server.stop()


def _logger() -> Any:
    return structlog.get_logger("test")


async def test_a_records_are_the_replicas_named_by_their_ptr_records(dns_server: DnsServer) -> None:
    dns_server.set(NAME, ["10.0.0.7", "10.0.0.5"])
    dns_server.ptr["10.0.0.5"] = f"smolgate-engine-0.{NAME}"
    resolver = DnsResolver(dns_server.address)
    assert await resolver.addresses(NAME) == ["10.0.0.5", "10.0.0.7"]
    assert await resolver.name_of("10.0.0.5") == "smolgate-engine-0"
    assert await resolver.name_of("10.0.0.7") == "10.0.0.7"  # no PTR record: the address names it
    assert await resolver.addresses("nothing.example") == []  # NXDOMAIN
    dns_server.set(NAME, [])
    assert await resolver.addresses(NAME) == []  # the name, no ready replica
    assert await resolver.addresses("127.0.0.9") == ["127.0.0.9"]  # an address needs no lookup


async def test_no_answering_server_is_an_error_not_an_empty_set() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))
        resolver = DnsResolver(f"127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(DiscoveryError):
            await resolver.addresses(NAME)


def test_a_replica_keeps_the_deployment_and_takes_the_address() -> None:
    dep = parse_deployment("d", {"kind": "backend", "name": "engine", "base_url": f"http://{NAME}:8000/v1",
                                 "discovery": "dns"}, {})  # fmt: skip
    one = replica(dep, "10.0.0.5", "smolgate-engine-0")
    assert (one.base_url, one.name, one.discovery, one.prefix_affinity) == (
        "http://10.0.0.5:8000/v1", "engine/smolgate-engine-0", "", True)  # fmt: skip
    with pytest.raises(RoutingConfigError):
        parse_deployment("d", {"kind": "backend", "base_url": "http://x/v1", "discovery": "srv"}, {})
    with pytest.raises(RoutingConfigError):
        parse_deployment("d", {"kind": "embedded", "discovery": "dns"}, {})


async def test_refresh_adds_and_removes_replicas_and_keeps_the_state_of_those_that_stay(dns_server: DnsServer) -> None:
    static = DeploymentConfig(kind="openai", base_url="http://api.example/v1", name="paid")
    found = DeploymentConfig(kind="backend", base_url=f"http://{NAME}:8000/v1", name="engine", discovery="dns",
                             prefix_affinity=True)  # fmt: skip
    rcfg = RouterConfig(discovery_nameservers=dns_server.address)
    balancer = Balancer([static, found], rcfg)
    assert [s.name for s in balancer.states] == ["paid"]  # the discovered deployment has no state of its own
    changes: list[tuple[list[str], list[str]]] = []
    discovery = Discovery([Target("m", 1, found, balancer)], rcfg, lambda m, a, r: changes.append(
        ([s.name for s in a], [s.name for s in r])), _logger())  # fmt: skip
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.2"])
    await discovery.refresh()
    assert sorted(s.name for s in balancer.states) == ["engine/10.0.0.1", "engine/10.0.0.2", "paid"]
    first = next(s for s in balancer.states if s.name == "engine/10.0.0.1")
    first.outstanding = 3
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3"])
    await discovery.refresh()
    assert changes[-1] == (["engine/10.0.0.3"], ["engine/10.0.0.2"])
    assert next(s for s in balancer.states if s.name == "engine/10.0.0.1") is first and first.outstanding == 3
    assert len({s.index for s in balancer.states}) == 3  # a new replica never reuses an index
    dns_server.ptr["10.0.0.9"] = dns_server.ptr["10.0.0.4"] = f"smolgate-engine-0.{NAME}"  # a pod, restarted elsewhere
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3", "10.0.0.4"])
    await discovery.refresh()
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3", "10.0.0.9"])
    await discovery.refresh()
    assert changes[-1] == (["engine/smolgate-engine-0"], ["engine/smolgate-engine-0"])  # same name, new address
    assert "http://10.0.0.9:8000/v1" in {s.cfg.base_url for s in balancer.states}
    dns_server.ptr["10.0.0.9"] = f"smolgate-engine-5.{NAME}"  # its address, listed again later, is another pod's
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3"])
    await discovery.refresh()
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3", "10.0.0.9"])
    await discovery.refresh()
    assert changes[-1] == (["engine/smolgate-engine-5"], [])
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.3"])
    await discovery.refresh()
    dns_server.stop()  # no server: the known replicas stay
    await discovery.refresh()
    assert sorted(s.name for s in balancer.states) == ["engine/10.0.0.1", "engine/10.0.0.3", "paid"]


async def test_the_router_opens_a_found_replicas_connections_and_closes_a_gone_ones_when_idle(dns_server: DnsServer) -> None:
    dns_server.set(NAME, ["10.0.0.1", "10.0.0.2"])
    cfg = from_mapping({"embeddings": False, "models": {"m": {"deployments": [
        {"kind": "backend", "name": "engine", "base_url": f"http://{NAME}:8000/v1", "discovery": "dns"}]}},
        "router": {"discovery_interval_s": 30.0, "discovery_nameservers": dns_server.address}})  # fmt: skip
    from prometheus_client import CollectorRegistry

    router = Router(cfg, {}, CollectorRegistry(), _logger(), embedder=None)
    await router.start()
    try:
        states = {s.name: s for s in router.balancers["m"].states}
        assert set(states) == {"engine/10.0.0.1", "engine/10.0.0.2"}
        assert {router.upstreams[("m", s.index)].cfg.base_url for s in states.values()} == {
            "http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"}  # fmt: skip
        gone = states["engine/10.0.0.2"]
        gone.outstanding = 1  # a stream still running on it
        dns_server.set(NAME, ["10.0.0.1"])
        await router.discovery.refresh()
        assert [s.name for s in router.balancers["m"].states] == ["engine/10.0.0.1"]
        assert ("m", gone.index) in router.upstreams  # kept until its last attempt ends
        gone.outstanding = 0
        await router.discovery.refresh()
        assert ("m", gone.index) not in router.upstreams
    finally:
        await router.close()


async def test_a_model_with_no_replica_found_answers_503_saying_so(dns_server: DnsServer) -> None:
    """A name with no address yet (no ready engine): the gateway is up and says why it cannot answer."""
    dns_server.set(NAME, [])
    cfg = from_mapping({"embeddings": False, "cache": {"backend": "off"}, "batches": {"enabled": False},
                        "models": {"m": {"deployments": [{"kind": "backend", "name": "engine", "discovery": "dns",
                                                          "base_url": f"http://{NAME}:8000/v1"}]}},
                        "router": {"discovery_nameservers": dns_server.address}})  # fmt: skip
    app = create_app(build_context(cfg, None, None))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert "no replica is up" in response.json()["error"]["message"]
