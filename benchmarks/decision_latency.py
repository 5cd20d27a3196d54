"""Reroute decision latency on a large model: event in -> OpenFlow messages out (no root needed).

    .venv/bin/python benchmarks/decision_latency.py [--topology dual-plane-1024] [--events 200] [--seed 1]

For random leaf-spine links of the model it times, per event:
- failure: `ControllerCore.on_port_status` (router decision from the precomputed path tables, intents
  for every affected switch) plus building the OpenFlow messages (also shown without them);
- congestion: `ControllerCore.on_loads` with one hot uplink and per-slot rates, plus messages;
- baseline: recomputing, with networkx, the shortest-path next hops towards every destination whose
  paths cross the failed link (BFS from each on a view of the plane without that link), which is the
  least a controller without path tables must redo; messages not included.
Prints p50/p99 in microseconds and the baseline/ours ratio, all measured in this run.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import networkx as nx

from controller import ofmsg
from controller.core import ControllerCore, tune_gc
from fabric import topofile


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="dual-plane-1024")
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    fab = topofile.load(args.topology)
    t0 = time.perf_counter()
    core = ControllerCore(fab, "adaptive", rate_scale=1.0)
    policy = core.policy
    setup_s = time.perf_counter() - t0
    tune_gc()  # as the controller process does
    rng = random.Random(args.seed)
    uplinks = [(l.a.node, l.a.port) for l in fab.links
               if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]
    graphs = {}
    for plane in fab.planes:
        g = nx.Graph()
        for l in fab.links:
            if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name \
                    and fab.switch_by_name[l.a.node].plane == plane.name:
                g.add_edge(l.a.node, l.b.node)
        graphs[plane.name] = g

    fail_us, recover_us, nx_us, moved, fail_decide_us = [], [], [], [], []
    for _ in range(args.events):
        sw, port = rng.choice(uplinks)
        dpid = fab.switch_by_name[sw].dpid
        peer = core.table.peer(sw, port)[0]
        t = time.perf_counter()
        changes = core.on_port_status(dpid, port, False, time.monotonic())
        fail_decide_us.append((time.perf_counter() - t) * 1e6)
        msgs = [m for ch in changes for m in ofmsg.messages(ch)]
        fail_us.append((time.perf_counter() - t) * 1e6)
        moved.append(len(msgs))
        t = time.perf_counter()
        changes = core.on_port_status(dpid, port, True, time.monotonic())
        [m for ch in changes for m in ofmsg.messages(ch)]
        recover_us.append((time.perf_counter() - t) * 1e6)
        # baseline: networkx recomputes next hops towards every affected destination
        dests = {d for _, d, _ in core.table.crossing(sw, port)} | {d for _, d, _ in core.table.crossing(peer, core.table.peer(sw, port)[1])}
        g = graphs[fab.switch_by_name[sw].plane]
        t = time.perf_counter()
        view = nx.subgraph_view(g, filter_edge=lambda a, b, x=sw, y=peer: {a, b} != {x, y})
        for d in dests:
            dist = nx.single_source_shortest_path_length(view, d)
            {n: [m for m in view[n] if dist.get(m, -1) == dist[n] - 1] for n in dist}
        nx_us.append((time.perf_counter() - t) * 1e6)

    # congestion: one hot uplink, per-slot rates on it, a decision per event
    # congestion: one hot uplink, per-slot rates on it, a decision per event; measured loads are
    # forgotten (untimed) before the next event, and events are a second apart so hold-downs expire
    cong_us = []
    decisions = list(policy.decision_points())
    for i in range(args.events):
        sw, dest = rng.choice(decisions)
        port = policy.slots(sw, dest)[0]
        cap = policy.capacity_bps((sw, port))
        core.last_slot_rates_bps.clear()
        core.last_slot_rates_bps.update({(sw, dest, s): cap * 0.1 for s, p in enumerate(policy.slots(sw, dest))
                                         if p == port})
        t = time.perf_counter()
        changes = core.on_loads({(sw, port): cap * 0.97}, 1000.0 + i)
        [m for ch in changes for m in ofmsg.messages(ch)]
        cong_us.append((time.perf_counter() - t) * 1e6)
        policy.forget_loads()

    print(f"model {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
          f"{len(policy.decision_points())} ECMP decision points; path tables built in {setup_s:.2f} s")
    print(f"{'event':<34}{'p50 us':>10}{'p99 us':>10}{'mean us':>10}")
    for name, xs in (("link failure: decision only", fail_decide_us),
                     ("link failure (ours)", fail_us), ("link recovery (ours)", recover_us),
                     ("congestion move (ours)", cong_us), ("failure: networkx recompute", nx_us)):
        print(f"{name:<34}{pct(xs, 0.5):>10.1f}{pct(xs, 0.99):>10.1f}{statistics.mean(xs):>10.1f}")
    print(f"networkx recompute / ours, failure p50: {pct(nx_us, 0.5) / pct(fail_us, 0.5):.1f}x, "
          f"p99: {pct(nx_us, 0.99) / pct(fail_us, 0.99):.1f}x "
          f"(ours includes building {statistics.mean(moved):.0f} OpenFlow messages per failure on average)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
