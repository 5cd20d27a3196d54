"""The fabric model: one typed, validated, immutable description of hosts, NIC ports, switches,
planes and links, read by the emulator, the controller, the simulator and the tests.

A `Fabric` is plain data and needs no root. Building one validates it; every error names the
offending item. Sizes and link rates must lie within `fabric.limits`, and each plane must be connected. Switch ports carry their OpenFlow port numbers (1, 2, ...); host ports are NIC
indexes (0 -> `<host>-eth0`). Each host has at most one NIC port per plane, and its address in a
plane is `plane.subnet + host.index + 1` (plane A 198.18.0.0/16, plane B 198.19.0.0/16).

Servers: a host of the model is one GPU and its NIC (one port per plane). A fabric with
`gpus_per_server` G > 1 groups its hosts into servers of G in host order (hosts G*s .. G*s+G-1 are
server s; a host's GPU index in its server, `gpu_of`, is its rail). The GPUs of a server are joined by
NVLink at `nvlink_gbps` per GPU each way; transfers between them never touch the fabric. G = 1 (the
default) makes every host its own server, as every fabric before servers were modelled.
"""
from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from networkx.utils import UnionFind

from fabric.errors import TopologyError
from fabric.limits import MAX_PORT, check_sizes, rate_problem

#: Switch roles, lowest tier first. Leaf/ToR carry hosts; spine/core are the top of their design.
ROLE_TIER: dict[str, int] = {"leaf": 1, "tor": 1, "agg": 2, "spine": 3, "core": 3}

#: Every emulated address must fall in the RFC 2544 benchmarking range.
BENCHMARK_NET = ipaddress.IPv4Network("198.18.0.0/15")

#: Default subnets for planes, in declaration order.
DEFAULT_SUBNETS = ("198.18.0.0/16", "198.19.0.0/16")


@dataclass(frozen=True)
class Plane:
    """An independent switching plane and the subnet its host ports are numbered from."""

    name: str
    subnet: ipaddress.IPv4Network


@dataclass(frozen=True)
class Switch:
    name: str
    role: str
    plane: str
    dpid: int


@dataclass(frozen=True)
class Host:
    name: str
    index: int


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: a node and its port (OpenFlow port on a switch, NIC index on a host)."""

    node: str
    port: int


@dataclass(frozen=True)
class Link:
    a: Endpoint
    b: Endpoint
    rate_gbps: float

    def label(self) -> str:
        return f"{self.a.node}:{self.a.port} -- {self.b.node}:{self.b.port}"


@dataclass(frozen=True)
class NicPort:
    """A host's NIC port in one plane: where it attaches and how it is addressed."""

    host: str
    nic: int
    plane: str
    switch: str
    switch_port: int
    ip: ipaddress.IPv4Address
    mac: str
    rate_gbps: float

    @property
    def intf(self) -> str:
        return intf_name(self.host, self.nic)


@dataclass(frozen=True)
class Adjacency:
    """A switch's view of one of its links."""

    port: int
    peer: str
    peer_port: int
    rate_gbps: float


@dataclass(frozen=True)
class Fabric:
    """The whole fabric. Construct with the builders in `fabric.builders` or `fabric.topofile`."""

    name: str
    planes: tuple[Plane, ...]
    switches: tuple[Switch, ...]
    hosts: tuple[Host, ...]
    links: tuple[Link, ...]
    gpus_per_server: int = 1  # G: hosts G*s .. G*s+G-1 are server s (module docstring)
    nvlink_gbps: float = 0.0  # in-server bandwidth per GPU, each way (Gbit/s); 0 with G = 1

    def __post_init__(self) -> None:
        _validate(self)

    # ---- servers -------------------------------------------------------------------------------
    @property
    def servers(self) -> int:
        return len(self.hosts) // self.gpus_per_server

    def server_of(self, host: str) -> int:
        """The server a host (GPU) is in."""
        return self.host_by_name[host].index // self.gpus_per_server

    def gpu_of(self, host: str) -> int:
        """The host's GPU index in its server: its rail (0 with one GPU per server)."""
        return self.host_by_name[host].index % self.gpus_per_server

    def server_hosts(self, server: int) -> tuple[str, ...]:
        """The hosts (GPUs) of server `server`, in GPU order."""
        g = self.gpus_per_server
        return tuple(h.name for h in self.hosts[server * g:(server + 1) * g])

    def same_server(self, a: str, b: str) -> bool:
        """Whether two hosts are GPUs of one server (their transfers go over NVLink, not the fabric)."""
        return self.server_of(a) == self.server_of(b)

    @property
    def nvlink_bps(self) -> float:
        """The in-server bandwidth per GPU each way, bits per second (0 without servers)."""
        return self.nvlink_gbps * 1e9

    # ---- lookups -------------------------------------------------------------------------------
    @cached_property
    def switch_by_name(self) -> dict[str, Switch]:
        return {s.name: s for s in self.switches}

    @cached_property
    def switch_by_dpid(self) -> dict[int, Switch]:
        return {s.dpid: s for s in self.switches}

    @cached_property
    def host_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    @cached_property
    def plane_by_name(self) -> dict[str, Plane]:
        return {p.name: p for p in self.planes}

    @cached_property
    def adjacency(self) -> dict[str, tuple[Adjacency, ...]]:
        """Switch name -> its links (to switches and hosts), sorted by port."""
        adj: dict[str, list[Adjacency]] = defaultdict(list)
        for link in self.links:
            for here, there in ((link.a, link.b), (link.b, link.a)):
                if here.node in self.switch_by_name:
                    adj[here.node].append(Adjacency(here.port, there.node, there.port, link.rate_gbps))
        return {s.name: tuple(sorted(adj[s.name], key=lambda a: a.port)) for s in self.switches}

    @cached_property
    def _peer_of(self) -> dict[tuple[str, int], Endpoint]:
        out = {}
        for link in self.links:
            out[(link.a.node, link.a.port)] = link.b
            out[(link.b.node, link.b.port)] = link.a
        return out

    @cached_property
    def _port_to(self) -> dict[tuple[str, str], int]:
        out = {}
        for link in self.links:
            out[(link.a.node, link.b.node)] = link.a.port
            out[(link.b.node, link.a.node)] = link.b.port
        return out

    def port_towards(self, node: str, neighbour: str) -> int:
        """`node`'s port on its link to `neighbour` (links are never parallel)."""
        try:
            return self._port_to[(node, neighbour)]
        except KeyError:
            raise TopologyError(f"no link between {node} and {neighbour}") from None

    def peer(self, node: str, port: int) -> Endpoint:
        """The far end of the link at `node`'s `port`."""
        try:
            return self._peer_of[(node, port)]
        except KeyError:
            raise TopologyError(f"no link at {node} port {port}") from None

    @cached_property
    def nic_ports(self) -> tuple[NicPort, ...]:
        """Every host NIC port, ordered by host index then NIC index."""
        plane_index = {p.name: i for i, p in enumerate(self.planes)}
        out = []
        for link in self.links:
            for here, there in ((link.a, link.b), (link.b, link.a)):
                host = self.host_by_name.get(here.node)
                if host is None:
                    continue
                plane = self.plane_by_name[self.switch_by_name[there.node].plane]
                out.append(
                    NicPort(
                        host=host.name,
                        nic=here.port,
                        plane=plane.name,
                        switch=there.node,
                        switch_port=there.port,
                        ip=plane.subnet.network_address + host.index + 1,
                        mac=host_mac(plane_index[plane.name], host.index),
                        rate_gbps=link.rate_gbps,
                    )
                )
        out.sort(key=lambda p: (self.host_by_name[p.host].index, p.nic))
        return tuple(out)

    @cached_property
    def nics_of(self) -> dict[str, tuple[NicPort, ...]]:
        """Host name -> its NIC ports."""
        by_host: dict[str, list[NicPort]] = defaultdict(list)
        for p in self.nic_ports:
            by_host[p.host].append(p)
        return {h.name: tuple(by_host[h.name]) for h in self.hosts}

    @cached_property
    def nic_by_ip(self) -> dict[ipaddress.IPv4Address, NicPort]:
        return {p.ip: p for p in self.nic_ports}

    def nic(self, host: str, plane: str) -> NicPort:
        for p in self.nics_of[host]:
            if p.plane == plane:
                return p
        raise TopologyError(f"host {host!r} has no port in plane {plane!r}")

    def switches_in(self, plane: str) -> tuple[Switch, ...]:
        return tuple(s for s in self.switches if s.plane == plane)

    def host_bandwidth_gbps(self, host: str) -> float:
        return sum(p.rate_gbps for p in self.nics_of[host])


def intf_name(node: str, port: int) -> str:
    """The interface of a node's port (Mininet's convention, for switches and hosts alike)."""
    return f"{node}-eth{port}"


def host_mac(plane_index: int, host_index: int) -> str:
    """Locally administered, deterministic MAC for a host's NIC in a plane."""
    n = host_index + 1
    return f"02:fb:{plane_index:02x}:{(n >> 16) & 0xFF:02x}:{(n >> 8) & 0xFF:02x}:{n & 0xFF:02x}"


def _validate(fab: Fabric) -> None:
    """Check a fabric; raise TopologyError naming the first offending item."""
    check_sizes(f"fabric {fab.name!r}", len(fab.hosts), len(fab.switches), len(fab.links), len(fab.planes))
    _check_servers(fab)
    if not fab.planes:
        raise TopologyError(f"fabric {fab.name!r} declares no planes")
    seen_planes: dict[str, Plane] = {}
    for plane in fab.planes:
        if plane.name in seen_planes:
            raise TopologyError(f"duplicate plane name {plane.name!r}")
        if not plane.subnet.subnet_of(BENCHMARK_NET):
            raise TopologyError(
                f"plane {plane.name!r}: subnet {plane.subnet} is outside {BENCHMARK_NET} "
                "(emulated hosts use the RFC 2544 benchmarking range only)"
            )
        for other in seen_planes.values():
            if plane.subnet.overlaps(other.subnet):
                raise TopologyError(
                    f"plane {plane.name!r}: subnet {plane.subnet} overlaps plane {other.name!r} ({other.subnet})"
                )
        seen_planes[plane.name] = plane

    names: dict[str, str] = {}
    dpids: dict[int, str] = {}
    for sw in fab.switches:
        if sw.name in names:
            raise TopologyError(f"duplicate node name {sw.name!r}")
        names[sw.name] = "switch"
        if sw.role not in ROLE_TIER:
            raise TopologyError(f"switch {sw.name!r}: role {sw.role!r} is not one of {sorted(ROLE_TIER)}")
        if sw.plane not in seen_planes:
            raise TopologyError(
                f"switch {sw.name!r}: plane {sw.plane!r} is not declared (planes: {', '.join(seen_planes)})"
            )
        if not 0 < sw.dpid < 2**64:
            raise TopologyError(f"switch {sw.name!r}: dpid {sw.dpid} out of range")
        if sw.dpid in dpids:
            raise TopologyError(f"switch {sw.name!r}: dpid {sw.dpid} already used by {dpids[sw.dpid]!r}")
        dpids[sw.dpid] = sw.name
    for i, host in enumerate(fab.hosts):
        if host.name in names:
            raise TopologyError(f"duplicate node name {host.name!r}")
        names[host.name] = "host"
        if host.index != i:
            raise TopologyError(f"host {host.name!r}: index {host.index} does not match its position {i}")
    planes_with_switches = {s.plane for s in fab.switches}
    for plane in fab.planes:
        if plane.name not in planes_with_switches:
            raise TopologyError(f"plane {plane.name!r} has no switch")
        if len(fab.hosts) + 2 > plane.subnet.num_addresses:
            raise TopologyError(f"plane {plane.name!r}: subnet {plane.subnet} too small for {len(fab.hosts)} hosts")

    used_ports: dict[tuple[str, int], str] = {}
    pairs: dict[frozenset[str], str] = {}
    host_planes: dict[str, dict[str, str]] = defaultdict(dict)
    for i, link in enumerate(fab.links):
        where = f"link {i} ({link.a.node} -- {link.b.node})"
        for end in (link.a, link.b):
            if end.node not in names:
                raise TopologyError(f"{where}: unknown node {end.node!r}")
        problem = rate_problem(link.rate_gbps)
        if problem:
            raise TopologyError(f"{where}: {problem}")
        if link.a.node == link.b.node:
            raise TopologyError(f"{where}: a link cannot connect a node to itself")
        kinds = (names[link.a.node], names[link.b.node])
        if kinds == ("host", "host"):
            raise TopologyError(f"{where}: hosts cannot be linked directly to each other")
        for end in (link.a, link.b):
            low = 1 if names[end.node] == "switch" else 0
            if not low <= end.port <= MAX_PORT:
                raise TopologyError(f"{where}: port {end.port} on {end.node!r} must be in {low}..{MAX_PORT}")
            if (end.node, end.port) in used_ports:
                raise TopologyError(
                    f"{where}: port {end.port} on {end.node!r} is already used by {used_ports[(end.node, end.port)]}"
                )
            used_ports[(end.node, end.port)] = where
        pair = frozenset((link.a.node, link.b.node))
        if pair in pairs:
            raise TopologyError(f"{where}: parallel links are not supported (duplicates {pairs[pair]})")
        pairs[pair] = where
        if kinds == ("switch", "switch"):
            pa = fab.switch_by_name[link.a.node].plane
            pb = fab.switch_by_name[link.b.node].plane
            if pa != pb:
                raise TopologyError(f"{where}: joins plane {pa!r} to plane {pb!r}; planes are independent")
        else:
            h_name, s_name = (link.a.node, link.b.node) if kinds[0] == "host" else (link.b.node, link.a.node)
            p_name = fab.switch_by_name[s_name].plane
            if p_name in host_planes[h_name]:
                raise TopologyError(
                    f"host {h_name!r} has two ports in plane {p_name!r} ({host_planes[h_name][p_name]} and {where}); "
                    "one NIC port per plane"
                )
            host_planes[h_name][p_name] = where
    for host in fab.hosts:
        if not host_planes[host.name]:
            raise TopologyError(f"host {host.name!r} has no link")
        for plane in fab.planes:
            if plane.name not in host_planes[host.name]:
                raise TopologyError(f"host {host.name!r} has no port in plane {plane.name!r}")
    _check_planes_connected(fab)


def _check_servers(fab: Fabric) -> None:
    g = fab.gpus_per_server
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise TopologyError(f"fabric {fab.name!r}: gpus_per_server must be an integer >= 1, got {g!r}")
    if len(fab.hosts) % g:
        raise TopologyError(f"fabric {fab.name!r}: {len(fab.hosts)} hosts are not a whole number of servers of "
                            f"{g} GPUs (gpus_per_server)")
    if not fab.nvlink_gbps >= 0 or fab.nvlink_gbps != fab.nvlink_gbps:
        raise TopologyError(f"fabric {fab.name!r}: nvlink_gbps must be >= 0, got {fab.nvlink_gbps}")
    if g > 1 and not fab.nvlink_gbps > 0:
        raise TopologyError(f"fabric {fab.name!r}: servers of {g} GPUs need their in-server bandwidth "
                            "(nvlink_gbps > 0, per GPU each way; e.g. 3600 for H100 NVLink 4's 450 GB/s)")
    if fab.nvlink_gbps > 1e6:
        raise TopologyError(f"fabric {fab.name!r}: nvlink_gbps {fab.nvlink_gbps} is beyond any in-server link "
                            "(more than 1 Pbit/s)")


def _check_planes_connected(fab: Fabric) -> None:
    """Every plane's switches form one connected graph (hosts do not forward, so only switch links count).

    Otherwise hosts on different islands of a plane cannot reach each other in it.
    """
    switches = {s.name for s in fab.switches}
    islands = UnionFind(switches)
    for link in fab.links:
        if link.a.node in switches and link.b.node in switches:
            islands.union(link.a.node, link.b.node)
    first: dict[str, Switch] = {}  # plane -> its first switch
    hosts_at: dict[str, list[str]] = defaultdict(list)
    for link in fab.links:
        for here, there in ((link.a, link.b), (link.b, link.a)):
            if here.node in switches and there.node not in switches:
                hosts_at[here.node].append(there.node)
    for sw in fab.switches:
        ref = first.setdefault(sw.plane, sw)
        if islands[sw.name] != islands[ref.name]:
            between = ""
            if hosts_at[sw.name] and hosts_at[ref.name]:
                between = f"; hosts {hosts_at[ref.name][0]!r} and {hosts_at[sw.name][0]!r} cannot reach each other in it"
            raise TopologyError(
                f"plane {sw.plane!r} is disconnected: switch {sw.name!r} has no path to switch {ref.name!r}{between}"
            )
