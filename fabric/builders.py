"""Builder functions: parameters in, a validated `Fabric` out.

- `dual_plane`: two independent planes; every host has one NIC port in each. Inside a plane either a
  2-tier leaf-spine Clos (`plane_kind="clos"`, every leaf to every spine) or leaves in full mesh
  (`plane_kind="mesh"`).
- `pyramid`: the classic 3-tier tree (ToR, aggregation, core), single-homed hosts, oversubscribed.
- `leaf_spine`: one leaf-spine plane, single-homed hosts.

Uplink rates are derived from the host NIC rate and an oversubscription ratio, so fair comparisons
need only the NIC rate: `dual_plane(nic_rate_gbps=200)` and `pyramid(nic_rate_gbps=400)` give every
host the same 400 Gbit/s.

Servers: every builder takes `gpus_per_server` (G), `nvlink_gbps` and `wiring`. A host stays one GPU
with its NIC(s); hosts G*s .. G*s+G-1 are server s (`fabric.model`). `wiring="server"` hangs host k
from edge switch k // hosts_per_edge, so a server's GPUs share an edge switch. `wiring="rail"`
(rail-optimised) puts NIC g of every server on rail g: a rail group is hosts_per_edge servers, and
GPU g of server s hangs from edge switch (s // hosts_per_edge) * G + g (in both planes of
`dual_plane`); every edge switch still has hosts_per_edge hosts.

Each builder works out its host, switch and link counts from its parameters and refuses counts beyond
`fabric.limits` before it builds anything (a billion hosts fail at once, not after minutes).
"""
from __future__ import annotations

import inspect
import ipaddress
from collections import defaultdict
from typing import Any, Callable

import pydantic

from fabric.errors import TopologyError
from fabric.limits import check_sizes, rate_problem
from fabric.model import DEFAULT_SUBNETS, Endpoint, Fabric, Host, Link, Plane, Switch


class _Wiring:
    """Collects nodes and links, numbering switch ports 1, 2, ... and host NICs 0, 1, ... in order."""

    def __init__(self) -> None:
        self.switches: list[Switch] = []
        self.links: list[Link] = []
        self._next_port: dict[str, int] = defaultdict(int)
        self._is_host: set[str] = set()

    def switch(self, name: str, role: str, plane: str) -> str:
        self.switches.append(Switch(name=name, role=role, plane=plane, dpid=len(self.switches) + 1))
        self._next_port[name] = 1
        return name

    def host(self, name: str) -> str:
        self._is_host.add(name)
        self._next_port[name] = 0
        return name

    def link(self, a: str, b: str, rate_gbps: float) -> None:
        ea, eb = Endpoint(a, self._next_port[a]), Endpoint(b, self._next_port[b])
        self._next_port[a] += 1
        self._next_port[b] += 1
        self.links.append(Link(ea, eb, float(rate_gbps)))

    def fabric(self, name: str, planes: list[str], hosts: list[str], gpus_per_server: int = 1,
               nvlink_gbps: float = 0.0) -> Fabric:
        """The one way every builder assembles (and so validates) its Fabric."""
        return Fabric(
            name=name,
            planes=_planes(planes),
            switches=tuple(self.switches),
            hosts=tuple(Host(n, i) for i, n in enumerate(hosts)),
            links=tuple(self.links),
            gpus_per_server=gpus_per_server,
            nvlink_gbps=float(nvlink_gbps),
        )


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise TopologyError(f"{name} must be > 0, got {value}")


def _rate(name: str, value: float) -> None:
    _positive(name, value)
    problem = rate_problem(value, name)
    if problem:
        raise TopologyError(problem)


def _leaves_for(hosts: int, per_leaf: int, name: str = "hosts_per_leaf") -> int:
    _positive("hosts", hosts)
    _positive(name, per_leaf)
    if hosts % per_leaf:
        raise TopologyError(f"hosts ({hosts}) must be a multiple of {name} ({per_leaf})")
    return hosts // per_leaf


WIRINGS = ("server", "rail")


def _edge_of(hosts: int, per_edge: int, gpus_per_server: int, wiring: str, per_edge_name: str) -> list[int]:
    """The edge switch (leaf or ToR) index of each host, checking the server parameters.

    `hosts` is already a positive multiple of `per_edge` (`_leaves_for`)."""
    g = gpus_per_server
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise TopologyError(f"gpus_per_server must be an integer >= 1, got {g!r}")
    if hosts % g:
        raise TopologyError(f"hosts ({hosts}) must be a multiple of gpus_per_server ({g}): whole servers")
    if wiring == "server":
        if per_edge % g:
            raise TopologyError(f"wiring='server' puts a server's GPUs on one edge switch: {per_edge_name} "
                                f"({per_edge}) must be a multiple of gpus_per_server ({g})")
        return [k // per_edge for k in range(hosts)]
    if wiring != "rail":
        raise TopologyError(f"wiring must be one of {', '.join(map(repr, WIRINGS))}, got {wiring!r}")
    if g < 2:
        raise TopologyError(f"wiring='rail' needs servers of more than one GPU (gpus_per_server > 1), got {g}")
    if hosts % (per_edge * g):
        raise TopologyError(f"wiring='rail': hosts ({hosts}) must be a multiple of {per_edge_name} x gpus_per_server "
                            f"({per_edge} x {g} = {per_edge * g}): whole rail groups of {per_edge} servers")
    return [(k // g // per_edge) * g + k % g for k in range(hosts)]


def _default_name(stem: str, hosts: int, wiring: str) -> str:
    return f"{stem}-{hosts}" + ("-rail" if wiring == "rail" else "")


def _planes(names: list[str]) -> tuple[Plane, ...]:
    return tuple(Plane(n, ipaddress.IPv4Network(DEFAULT_SUBNETS[i])) for i, n in enumerate(names))


def _plane_size(leaves: int, hosts: int, spines: int, kind: str) -> tuple[int, int]:
    """(switches, links) of one leaf-spine plane of `kind`, checking its parameters; nothing built."""
    if kind == "clos":
        _positive("spines_per_plane", spines)
        return leaves + spines, leaves * spines + hosts
    if kind == "mesh":
        if leaves < 2:
            raise TopologyError(f"plane_kind='mesh' needs at least 2 leaves, got {leaves}")
        return leaves, leaves * (leaves - 1) // 2 + hosts
    raise TopologyError(f"plane_kind must be 'clos' or 'mesh', got {kind!r}")


def _leaf_spine_plane(
    w: _Wiring,
    plane: str,
    host_names: list[str],
    hosts_per_leaf: int,
    spines: int,
    nic_rate_gbps: float,
    oversubscription: float,
    kind: str,
    edge_of: list[int],
) -> None:
    """Wire one plane (parameters already checked by `_plane_size`)."""
    leaves = len(host_names) // hosts_per_leaf
    leaf_names = [w.switch(f"leaf{plane}{i}", "leaf", plane) for i in range(leaves)]
    down_gbps = hosts_per_leaf * nic_rate_gbps
    if kind == "clos":
        spine_names = [w.switch(f"spine{plane}{j}", "spine", plane) for j in range(spines)]
        up_gbps = down_gbps / oversubscription / spines
        for leaf in leaf_names:
            for spine in spine_names:
                w.link(leaf, spine, up_gbps)
    else:
        up_gbps = down_gbps / oversubscription / (leaves - 1)
        for i, a in enumerate(leaf_names):
            for b in leaf_names[i + 1 :]:
                w.link(a, b, up_gbps)
    for k, host in enumerate(host_names):
        w.link(host, leaf_names[edge_of[k]], nic_rate_gbps)


def dual_plane(
    hosts: int = 16,
    hosts_per_leaf: int = 4,
    spines_per_plane: int = 2,
    nic_rate_gbps: float = 200.0,
    oversubscription: float = 1.0,
    plane_kind: str = "clos",
    name: str | None = None,
    gpus_per_server: int = 1,
    nvlink_gbps: float = 0.0,
    wiring: str = "server",
) -> Fabric:
    """Two independent planes A and B; host i has NIC 0 in plane A and NIC 1 in plane B (servers and
    wiring: module docstring; a rail fabric's GPU g is on rail g in both planes)."""
    _rate("nic_rate_gbps", nic_rate_gbps)
    _positive("oversubscription", oversubscription)
    switches, links = _plane_size(_leaves_for(hosts, hosts_per_leaf), hosts, spines_per_plane, plane_kind)
    check_sizes("dual_plane", hosts, 2 * switches, 2 * links, planes=2)
    edge_of = _edge_of(hosts, hosts_per_leaf, gpus_per_server, wiring, "hosts_per_leaf")
    w = _Wiring()
    host_names = [w.host(f"h{i}") for i in range(hosts)]
    for plane in ("A", "B"):
        _leaf_spine_plane(
            w, plane, host_names, hosts_per_leaf, spines_per_plane, nic_rate_gbps, oversubscription, plane_kind,
            edge_of,
        )
    return w.fabric(name or _default_name("dual-plane", hosts, wiring), ["A", "B"], host_names, gpus_per_server,
                    nvlink_gbps)


def leaf_spine(
    hosts: int = 16,
    hosts_per_leaf: int = 4,
    spines: int = 4,
    nic_rate_gbps: float = 400.0,
    oversubscription: float = 1.0,
    name: str | None = None,
    gpus_per_server: int = 1,
    nvlink_gbps: float = 0.0,
    wiring: str = "server",
) -> Fabric:
    """One leaf-spine plane A, single-homed hosts (servers and wiring: module docstring)."""
    _rate("nic_rate_gbps", nic_rate_gbps)
    _positive("oversubscription", oversubscription)
    _positive("spines", spines)
    sizes = _plane_size(_leaves_for(hosts, hosts_per_leaf), hosts, spines, "clos")
    check_sizes("leaf_spine", hosts, *sizes)
    edge_of = _edge_of(hosts, hosts_per_leaf, gpus_per_server, wiring, "hosts_per_leaf")
    w = _Wiring()
    host_names = [w.host(f"h{i}") for i in range(hosts)]
    _leaf_spine_plane(w, "A", host_names, hosts_per_leaf, spines, nic_rate_gbps, oversubscription, "clos", edge_of)
    return w.fabric(name or _default_name("leaf-spine", hosts, wiring), ["A"], host_names, gpus_per_server,
                    nvlink_gbps)


def pyramid(
    hosts: int = 16,
    hosts_per_tor: int = 4,
    tors_per_pod: int = 2,
    aggs_per_pod: int = 2,
    cores: int = 2,
    nic_rate_gbps: float = 400.0,
    oversubscription: float = 2.0,
    core_oversubscription: float = 1.0,
    name: str | None = None,
    gpus_per_server: int = 1,
    nvlink_gbps: float = 0.0,
    wiring: str = "server",
) -> Fabric:
    """Three tiers: hosts -> ToR (`oversubscription`:1) -> aggregation (`core_oversubscription`:1) -> core.

    Each ToR connects to every aggregation switch of its pod; every aggregation switch connects to
    every core switch. Servers and wiring: module docstring (the edge switches are the ToRs).
    """
    _rate("nic_rate_gbps", nic_rate_gbps)
    _positive("oversubscription", oversubscription)
    _positive("core_oversubscription", core_oversubscription)
    _positive("aggs_per_pod", aggs_per_pod)
    _positive("cores", cores)
    _positive("tors_per_pod", tors_per_pod)
    tors = _leaves_for(hosts, hosts_per_tor, "hosts_per_tor")
    if tors % tors_per_pod:
        raise TopologyError(f"ToRs ({tors}) must be a multiple of tors_per_pod ({tors_per_pod})")
    pods = tors // tors_per_pod
    aggs = pods * aggs_per_pod
    check_sizes("pyramid", hosts, cores + aggs + tors, aggs * cores + tors * aggs_per_pod + hosts)
    edge_of = _edge_of(hosts, hosts_per_tor, gpus_per_server, wiring, "hosts_per_tor")
    w = _Wiring()
    host_names = [w.host(f"h{i}") for i in range(hosts)]
    tor_up_gbps = hosts_per_tor * nic_rate_gbps / oversubscription / aggs_per_pod
    agg_up_gbps = tors_per_pod * tor_up_gbps / core_oversubscription / cores
    core_names = [w.switch(f"core{c}", "core", "A") for c in range(cores)]
    tor_names: list[str] = []
    for pod in range(pods):
        agg_names = [w.switch(f"agg{pod * aggs_per_pod + a}", "agg", "A") for a in range(aggs_per_pod)]
        for agg in agg_names:
            for core in core_names:
                w.link(agg, core, agg_up_gbps)
        for t in range(tors_per_pod):
            tor = w.switch(f"tor{pod * tors_per_pod + t}", "tor", "A")
            tor_names.append(tor)
            for agg in agg_names:
                w.link(tor, agg, tor_up_gbps)
    for k, host in enumerate(host_names):
        w.link(host, tor_names[edge_of[k]], nic_rate_gbps)
    return w.fabric(name or _default_name("pyramid", hosts, wiring), ["A"], host_names, gpus_per_server, nvlink_gbps)


BUILDERS: dict[str, Callable[..., Fabric]] = {
    "dual_plane": dual_plane,
    "pyramid": pyramid,
    "leaf_spine": leaf_spine,
}


def build(builder: str, params: dict[str, Any]) -> Fabric:
    """Call a builder by name, with errors that name an unknown builder or parameter."""
    fn = BUILDERS.get(builder)
    if fn is None:
        raise TopologyError(f"unknown builder {builder!r} (known: {', '.join(sorted(BUILDERS))})")
    known = inspect.signature(fn).parameters
    for key in params:
        if key not in known:
            raise TopologyError(f"builder {builder}: unknown parameter {key!r} (known: {', '.join(known)})")
    try:
        return pydantic.validate_call(fn)(**params)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise TopologyError(f"builder {builder}: {problems}") from None
