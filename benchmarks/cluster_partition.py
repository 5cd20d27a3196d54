"""What running a fabric across servers would cut: per fabric and server count, the links that become
tunnels and the rate they need (pure arithmetic on the model; no root; docs/cluster.md).

    .venv/bin/python benchmarks/cluster_partition.py [--topology dual-plane-1024 pyramid-1024] [--servers 2 4 8 16]

Placement ("edge blocks"): each plane's edge switches (leaves, ToRs) in contiguous blocks, one block
per server; every host on the server of its first NIC's edge switch (on the dual-plane fabrics a host's
two leaves have the same index, so both land on its server); an aggregation switch on the server holding
most of its already placed neighbours (its pod's ToRs); the top tier (spines, cores) round robin. A
link is cut (a tunnel) when its ends are on different servers. For the dual-plane fabrics and 2 servers
"plane per server" is shown too: plane A's switches and every host on server 0, plane B's switches on
server 1 (no switch-to-switch link cut; every host's plane-B link is).

Printed per placement: the most hosts and switches (each its own Open vSwitch) on one server; the cut
links, switch-to-switch and host; and for the server with the most, the emulated rate its cut links
carry each way when all run at their rate, at the replay's default link scale (a host NIC at 1 Mbit/s)
and at `fabriclab up`'s 0.1 Mbit/s per Gbit/s; beside it the rate of its hosts' NICs at the replay's
scale (what the server's userspace datapath must forward: PLATFORM.md measured ~60 Mbit/s of faithful
host traffic on 2 cores).
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from fabric import topofile
from fabric.model import Fabric
from traffic.replay.plan import default_mbps_per_gbps

EDGE, MIDDLE = ("leaf", "tor"), ("agg",)
UP_SCALE = 0.1  # `fabriclab up`'s default link scale, Mbit/s per Gbit/s


def edge_blocks(fab: Fabric, servers: int) -> dict[str, int]:
    """node -> server (module docstring)."""
    at: dict[str, int] = {}
    for plane in fab.planes:
        edges = [s.name for s in fab.switches if s.plane == plane.name and s.role in EDGE]
        for i, name in enumerate(edges):
            at[name] = i * servers // len(edges)
    for host in fab.hosts:
        at[host.name] = at[fab.nics_of[host.name][0].switch]
    load = Counter(at[s.name] for s in fab.switches if s.name in at)
    for sw in fab.switches:
        if sw.role in MIDDLE:
            votes = Counter(at[a.peer] for a in fab.adjacency[sw.name] if a.peer in at)
            best = max(votes.values(), default=0)
            at[sw.name] = min((s for s, v in votes.items() if v == best), key=lambda s: (load[s], s), default=0)
            load[at[sw.name]] += 1
    tops = [s for s in fab.switches if s.name not in at]
    for plane in fab.planes:
        for i, sw in enumerate(s for s in tops if s.plane == plane.name):
            at[sw.name] = i % servers
    return at


def plane_per_server(fab: Fabric) -> dict[str, int]:
    at = {s.name: fab.planes.index(fab.plane_by_name[s.plane]) for s in fab.switches}
    return at | {h.name: 0 for h in fab.hosts}


def row(fab: Fabric, at: dict[str, int], servers: int, name: str) -> dict[str, object]:
    replay = default_mbps_per_gbps(fab)
    cut_sw = cut_host = 0
    cut_gbps: dict[int, float] = defaultdict(float)  # server -> its cut links' rates (each way)
    for link in fab.links:
        a, b = at[link.a.node], at[link.b.node]
        if a == b:
            continue
        host = link.a.node in fab.host_by_name or link.b.node in fab.host_by_name
        cut_host += host
        cut_sw += not host
        cut_gbps[a] += link.rate_gbps
        cut_gbps[b] += link.rate_gbps
    hosts = Counter(at[h.name] for h in fab.hosts)
    switches = Counter(at[s.name] for s in fab.switches)
    worst = max(range(servers), key=lambda s: cut_gbps[s])
    host_gbps: dict[int, float] = defaultdict(float)
    for h in fab.hosts:
        host_gbps[at[h.name]] += fab.host_bandwidth_gbps(h.name)
    return {"fabric": fab.name, "servers": servers, "placement": name, "hosts": max(hosts.values()),
            "switches": max(switches.values()), "cut_switch": cut_sw, "cut_host": cut_host,
            "wire_replay_mbps": cut_gbps[worst] * replay, "wire_up_mbps": cut_gbps[worst] * UP_SCALE,
            "hosts_replay_mbps": max(host_gbps.values()) * replay}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", nargs="+", default=["dual-plane-1024", "pyramid-1024"])
    ap.add_argument("--servers", type=int, nargs="+", default=[2, 4, 8, 16])
    args = ap.parse_args()
    rows = []
    for topo in args.topology:
        fab = topofile.load(topo)
        for n in args.servers:
            rows.append(row(fab, edge_blocks(fab, n), n, "edge blocks"))
            if n == 2 and len(fab.planes) == 2:
                rows.append(row(fab, plane_per_server(fab), n, "plane per server"))
    print(f"{'fabric':<16} {'servers':>7} {'placement':<17} {'hosts/srv':>9} {'switches/srv':>12} "
          f"{'cut sw-sw':>9} {'cut host':>8} {'wire Mbit/s replay':>18} {'wire Mbit/s up':>14} "
          f"{'host NICs Mbit/s replay':>23}")
    for r in rows:
        print(f"{r['fabric']:<16} {r['servers']:>7} {r['placement']:<17} {r['hosts']:>9} {r['switches']:>12} "
              f"{r['cut_switch']:>9} {r['cut_host']:>8} {r['wire_replay_mbps']:>18.0f} {r['wire_up_mbps']:>14.0f} "
              f"{r['hosts_replay_mbps']:>23.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
