"""What `fabriclab topo show` reports about a fabric: counts, bandwidths, oversubscription, paths.

- per-host bandwidth: sum of a host's NIC rates (min and max over hosts);
- bisection bandwidth: the min cut (max flow) between the first and the second half of the hosts
  ordered by the edge switch of their first NIC (then by index), which for the shipped builders
  separates whole leaves/pods, also when wired by rail (there host order alternates edge switches);
- oversubscription per tier: max over switches of (capacity towards hosts / capacity away from
  hosts); a switch-switch link within one tier (a leaf mesh) counts as away from hosts;
- hops and equal-cost paths between host pairs: min and max over all pairs (`fabric.routing`);
- servers: `gpus_per_server`, the server count, the NVLink rate, and `rails`: G when every edge switch's
  hosts are one GPU index (the fabric is wired by rail), else 0;
- `cover_switches`: the switches whose ports see every link (where the controller polls port counters).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx

from fabric.model import ROLE_TIER, Fabric
from fabric.routing import PathTable


@dataclass(frozen=True)
class TopoSummary:
    name: str
    planes: int
    hosts: int
    switches: int
    switches_by_role: dict[str, int]
    links: int
    nic_ports_per_host: int
    host_bandwidth_gbps: float
    total_host_bandwidth_gbps: float
    bisection_bandwidth_gbps: float
    bisection_ratio: float  # bisection / (half the hosts x their bandwidth); 1.0 = full bisection
    oversubscription: dict[str, float]
    hops_min: int
    hops_max: int
    ecmp_paths_min: int
    ecmp_paths_max: int
    servers: int = 0
    gpus_per_server: int = 1
    rails: int = 0  # G when wired by rail (`rails`), else 0
    nvlink_gbps: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def edge_order(fab: Fabric) -> list[str]:
    """Host names ordered by the edge switch of their first NIC (switch declaration order), then by
    index: host index order for server-wired builder fabrics, whole rails together for rail-wired ones."""
    position = {s.name: i for i, s in enumerate(fab.switches)}
    first = {h.name: position[fab.nics_of[h.name][0].switch] for h in fab.hosts}
    return sorted((h.name for h in fab.hosts), key=lambda name: (first[name], fab.host_by_name[name].index))


def bisection_gbps(fab: Fabric) -> float:
    """Min cut between the first and second half of `edge_order` (capacities in Gbit/s, links full duplex)."""
    order = edge_order(fab)
    n = len(order)
    g = nx.DiGraph()
    for link in fab.links:
        g.add_edge(link.a.node, link.b.node, capacity=link.rate_gbps)
        g.add_edge(link.b.node, link.a.node, capacity=link.rate_gbps)
    for name in order[: n // 2]:
        g.add_edge("__src__", name)  # no capacity attribute = infinite
    for name in order[n // 2 :]:
        g.add_edge(name, "__dst__")
    value, _ = nx.maximum_flow(g, "__src__", "__dst__")
    return float(value)


def oversubscription(fab: Fabric) -> dict[str, float]:
    """Tier name -> worst (max) downward/upward capacity ratio among its switches."""
    tier_of = {s.name: ROLE_TIER[s.role] for s in fab.switches}
    worst: dict[str, float] = {}
    for sw in fab.switches:
        down = up = 0.0
        for adj in fab.adjacency[sw.name]:
            if tier_of.get(adj.peer, 0) < tier_of[sw.name]:
                down += adj.rate_gbps
            else:
                up += adj.rate_gbps
        if up > 0 and down > 0:
            worst[sw.role] = max(worst.get(sw.role, 0.0), down / up)
    order = sorted(worst, key=lambda r: ROLE_TIER[r])
    return {r: round(worst[r], 4) for r in order}


def rails(fab: Fabric) -> int:
    """The rail count of a rail-wired fabric: its `gpus_per_server` G when G > 1 and the hosts on
    every switch are GPUs of one index in their servers (one rail per switch); else 0."""
    g = fab.gpus_per_server
    if g < 2:
        return 0
    rail_at: dict[str, int] = {}
    for port in fab.nic_ports:
        if rail_at.setdefault(port.switch, fab.gpu_of(port.host)) != fab.gpu_of(port.host):
            return 0
    return g


def summarize(fab: Fabric, table: PathTable | None = None) -> TopoSummary:
    table = table or PathTable(fab)
    lo, hi = table.pair_range()
    bw = [fab.host_bandwidth_gbps(name) for name in edge_order(fab)]
    bis = bisection_gbps(fab)
    half = len(fab.hosts) // 2
    # The cut also bounds by the smaller side's own NIC bandwidth.
    side = min(sum(bw[:half]), sum(bw[half:]))
    return TopoSummary(
        name=fab.name,
        planes=len(fab.planes),
        hosts=len(fab.hosts),
        switches=len(fab.switches),
        switches_by_role=dict(sorted(Counter(s.role for s in fab.switches).items(), key=lambda kv: ROLE_TIER[kv[0]])),
        links=len(fab.links),
        nic_ports_per_host=max(len(v) for v in fab.nics_of.values()),
        host_bandwidth_gbps=min(bw),
        total_host_bandwidth_gbps=sum(bw),
        bisection_bandwidth_gbps=round(bis, 6),
        bisection_ratio=round(bis / side, 4) if side else 0.0,
        oversubscription=oversubscription(fab),
        hops_min=lo.hops,
        hops_max=hi.hops,
        ecmp_paths_min=lo.paths,
        ecmp_paths_max=hi.paths,
        servers=fab.servers,
        gpus_per_server=fab.gpus_per_server,
        rails=rails(fab),
        nvlink_gbps=fab.nvlink_gbps,
    )


def cover_switches(fabric: Fabric) -> list[str]:
    """Switches whose ports see every link: every switch with hosts, then (greedily) the switch with
    the most links not yet seen, until every switch-to-switch link has an end in the set."""
    chosen = {p.switch for p in fabric.nic_ports}
    unseen = {frozenset((l.a.node, l.b.node)) for l in fabric.links
              if l.a.node in fabric.switch_by_name and l.b.node in fabric.switch_by_name}
    unseen = {e for e in unseen if not e & chosen}
    while unseen:
        count: dict[str, int] = {}
        for e in unseen:
            for n in e:
                count[n] = count.get(n, 0) + 1
        best = max(sorted(count), key=lambda n: count[n])
        chosen.add(best)
        unseen = {e for e in unseen if best not in e}
    return sorted(chosen)
