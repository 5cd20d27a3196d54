"""How the planned source ports spread a leaf's pipeline pairs over its uplinks (no root).

    .venv/bin/python benchmarks/planned_ports_spread.py [--topology dual-plane-1024-servers] [--shift 4]
                                                        [--channels 2]

On a server-wired fabric every GPU g of the servers under leaf 0 sends to GPU g of the server `--shift`
servers on (a pipeline's next stage on another leaf, as the GPT-3 preset's PP pairs run): the connections
`fabriclab` plans for those pairs (planned ports, `fabric.routing.entropy.pair_sport`), each walked on the
adaptive policy's data plane; printed per leaf: the uplinks used, the flows on each, and the leaf's uplinks.
With the rule's count w = channels x (src + dst) + channel, the pairs (8X + g, 8(X + shift) + g) step w by
2 x channels over g and by 16 x channels over the servers of a leaf, so on a 32-spine plane they use 16 uplinks,
4 flows each, where 32 uplinks with 2 flows each would give every pair its NIC's rate.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from fabric import topofile
    from fabric.flowsim.connections import plan_connections
    from fabric.routing import PathTable, load_policy, plan_entropy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="dual-plane-1024-servers")
    ap.add_argument("--shift", type=int, default=4, help="servers from a sender to its receiver (default 4)")
    ap.add_argument("--channels", type=int, default=2)
    args = ap.parse_args(argv)
    fab = topofile.load(args.topology)
    g = fab.gpus_per_server
    if g < 1:
        ap.error(f"{args.topology} has no servers (gpus_per_server is 0)")
    table = PathTable(fab)
    policy = load_policy("adaptive")(table)
    hosts = [h.name for h in fab.hosts]
    nics = fab.nics_of
    leaf0 = {n.switch for n in nics[hosts[0]]}
    if any({n.switch for n in nics[h]} != leaf0 for h in hosts[:g]):
        ap.error(f"{args.topology} is not server-wired (a server's GPUs hang from different leaves)")
    servers = sorted({i // g for i, h in enumerate(hosts) if {n.switch for n in nics[h]} <= leaf0})
    pairs = [(hosts[g * x + k], hosts[g * (x + args.shift) + k]) for x in servers for k in range(g)]
    conns = plan_connections(fab, plan_entropy(table), pairs, channels=args.channels, ports="planned")
    flows: collections.Counter[tuple[str, str]] = collections.Counter()
    for cs in conns.values():
        for c in cs:
            path = policy.path(c.src, c.dst, c.sport)
            if path is not None and path[2] in fab.switch_by_name:  # leaves the leaf
                flows[(path[1], path[2])] += 1
    for leaf in sorted(leaf0):
        used = {spine: n for (sw, spine), n in flows.items() if sw == leaf}
        uplinks = sum(1 for l in fab.links if leaf in (l.a.node, l.b.node)
                      and fab.switch_by_name.get(l.b.node if l.a.node == leaf else l.a.node) is not None)
        print(f"{leaf}: servers {servers[0]}-{servers[-1]} x {g} GPUs -> +{args.shift} servers, {sum(used.values())} "
              f"flows on {len(used)} of {uplinks} uplinks, flows per used uplink {sorted(set(used.values()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
