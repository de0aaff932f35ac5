"""Finding a deployment's replicas by DNS: a Kubernetes headless Service's name resolves to one A record per ready
pod, so re-resolving it every `router.discovery_interval_s` routes to a new replica without a restart, and stops
sending new requests to one that is going away (its pod leaves the records as soon as it terminates).

Each address becomes a replica of the deployment (`discovery: dns`): its base_url with the address for the host.
It is named `<deployment>/<host>`, where <host> is the first label of the address's PTR record when there is one (a
StatefulSet pod's stable name, e.g. smolgate-engine-0) and otherwise the address: prefix affinity hashes these names,
so stable ones keep conversations in place across gateway replicas. A failed lookup keeps the replicas already known.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit, urlunsplit

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver
import dns.reversename

from gateway.ops.access_log import Logger
from gateway.routing.balancer import Balancer, DeploymentState
from gateway.routing.config import DeploymentConfig, RouterConfig

_TIMEOUT_S = 2.0


class DiscoveryError(Exception):
    """The name could not be resolved now (no server answered, a timeout): the last known replicas stay."""


class DnsResolver:
    """A and PTR lookups with dnspython, through the system's servers or `nameservers` ("host[:port],...")."""

    def __init__(self, nameservers: str = "") -> None:
        self._resolver = dns.asyncresolver.Resolver(configure=not nameservers)
        if nameservers:
            self._resolver.nameservers = [_nameserver(n) for n in nameservers.split(",") if n.strip()]
        self._resolver.lifetime = _TIMEOUT_S  # noqa: V101  # dnspython reads it
        self._names: dict[str, str] = {}  # address -> its PTR name ("" when it has none)

    async def addresses(self, host: str) -> list[str]:
        """The host's IPv4 addresses, sorted; [] when the name exists with no address (no ready replica)."""
        if _is_ip(host):
            return [host]
        try:
            answer = await self._resolver.resolve(host, "A", search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as exc:  # a timeout, no server answering, a malformed name
            raise DiscoveryError(f"{host}: {type(exc).__name__}") from exc
        return sorted({r.address for r in answer})

    async def name_of(self, address: str) -> str:
        """The first label of the address's PTR record (cached), or the address itself."""
        if address not in self._names:
            try:
                answer = await self._resolver.resolve(dns.reversename.from_address(address), "PTR")
                self._names[address] = str(answer[0].target).split(".", 1)[0]
            except (dns.exception.DNSException, IndexError):
                self._names[address] = ""
        return self._names[address] or address

    def forget_all_but(self, addresses: set[str]) -> None:
        """Drop the names of addresses no longer listed: one that comes back may belong to another pod by then."""
        self._names = {a: n for a, n in self._names.items() if a in addresses}


def _nameserver(spec: str) -> dns.nameserver.Do53Nameserver:
    """`host` or `host:port` (an IPv6 address without a port: as is)."""
    spec = spec.strip()
    if spec.count(":") == 1:
        host, port = spec.split(":")
        return dns.nameserver.Do53Nameserver(host, int(port))
    return dns.nameserver.Do53Nameserver(spec)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def replica(dep: DeploymentConfig, address: str, name: str) -> DeploymentConfig:
    """The deployment's config for one of its replicas: the address in its URL, its own name."""
    url = urlsplit(dep.base_url)
    netloc = f"{address}:{url.port}" if url.port else address
    return replace(dep, base_url=urlunsplit(url._replace(netloc=netloc)), name=f"{dep.name or 'replicas'}/{name}", discovery="")


@dataclass(frozen=True)
class Target:
    """One configured deployment with `discovery: dns`, in the balancer of its model."""

    model: str
    source: int
    cfg: DeploymentConfig
    balancer: Balancer


Changed = Callable[[str, list[DeploymentState], list[DeploymentState]], None]


class Discovery:
    """Re-resolves every target's host every interval and syncs its balancer; `changed(model, added, removed)`,
    called after each resolution, opens and retires the upstreams of the replicas that came and went."""

    def __init__(self, targets: Sequence[Target], rcfg: RouterConfig, changed: Changed, logger: Logger) -> None:
        self.targets = list(targets)
        self.interval_s = rcfg.discovery_interval_s
        self.resolver = DnsResolver(rcfg.discovery_nameservers)
        self.changed, self.logger = changed, logger
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """One resolution before the gateway is ready (so it starts with its replicas), then one every interval."""
        if self.targets:
            await self.refresh()
            self._task = asyncio.create_task(self._loop(), name="routing-discovery")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception as exc:  # never let one bad round stop discovery for the life of the process
                self.logger.error("discovery_error", error=f"{type(exc).__name__}: {exc}")

    async def refresh(self) -> None:
        listed: set[str] = set()
        for t in self.targets:
            host = urlsplit(t.cfg.base_url).hostname or ""
            try:
                addresses = await self.resolver.addresses(host)
            except DiscoveryError as exc:
                self.logger.warning("discovery_failed", model=t.model, deployment=t.cfg.label, error=str(exc))
                continue
            listed.update(addresses)
            members: dict[str, DeploymentConfig] = {}
            for address in addresses:
                member = replica(t.cfg, address, await self.resolver.name_of(address))
                members.setdefault(member.label, member)
            added, removed = t.balancer.sync(t.source, list(members.values()))
            if added or removed:
                self.logger.info("replicas_changed", model=t.model, deployment=t.cfg.label,
                                 added=[s.name for s in added], removed=[s.name for s in removed])  # fmt: skip
            self.changed(t.model, added, removed)  # also when nothing changed: replicas gone earlier may be idle now
        self.resolver.forget_all_but(listed)
