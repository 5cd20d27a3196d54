"""Reroute decision latency against a fair recompute, on every fabric family at 16 and 1024 hosts
(no root needed).

    .venv/bin/python benchmarks/decision_latency.py [--topology T ...] [--samples 2000] [--json FILE]

For each topology and each of `--samples` random switch-to-switch link failures (each followed by
its recovery, untimed), in two conditions:
- warm: events back to back, as when a controller is busy;
- cold: the CPU caches flushed before each sample (a 64 MB memory walk), as for an event that
  arrives after a quiet spell;
it times:
- ours, decision: `ControllerCore.on_port_status` (the routing policy's decision, then the intents
  for every affected switch);
- ours, decision + messages: the same plus building every OpenFlow message;
- networkx, affected destinations: the fair incremental baseline. It keeps its own graph of the
  plane, removes the failed edge in place (no copy, no filtered view) and recomputes, for every
  destination edge switch whose shortest paths crossed the link (known to it for free: taken from our
  path table, untimed), the shortest-path next hops of every switch (one BFS per destination);
- networkx, full: the same for every destination of the plane (a controller without any index).
Before timing, the controller prepares every single-link failure from the all-up state, as the
controller process does at start (`ControllerCore.precompute_failures`; its time and memory are
printed; the memory from a second, traced run of it); `--no-precompute` leaves the memo cold, so
each link's first failure is computed.
The baselines build no messages: compare them with "decision". Every row is printed, including those
where a baseline is faster. Percentiles are over all samples (>= 2000 by default).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import numpy as np

from controller import ofmsg
from controller.__main__ import tune_gc
from controller.core import ControllerCore
from fabric import builders, topofile
from fabric.model import Fabric

#: the three fabric families at 16 and 1024 hosts; leaf-spine-1024 is not shipped, it is built here
#: with the shape of dual-plane-1024's planes (32 hosts per leaf, 32 spines)
DEFAULT_TOPOLOGIES = ("dual-plane-16", "leaf-spine-16", "pyramid-16",
                      "dual-plane-1024", "leaf-spine-1024", "pyramid-1024")
FLUSH_BYTES = 64 << 20  # larger than any last-level cache of this machine class
ROWS = ("ours: decision", "ours: decision + messages", "networkx: affected destinations", "networkx: full")


def load(name: str) -> Fabric:
    if name == "leaf-spine-1024":
        return builders.leaf_spine(hosts=1024, hosts_per_leaf=32, spines=32)
    return topofile.load(name)


@dataclass
class Figures:
    warm_us: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROWS})
    cold_us: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROWS})
    messages: list[int] = field(default_factory=list)


class Baseline:
    """A controller that keeps a networkx graph per plane and recomputes next hops itself."""

    def __init__(self, fab: Fabric) -> None:
        self.graphs: dict[str, nx.Graph] = {p.name: nx.Graph() for p in fab.planes}
        for link in fab.links:
            a, b = link.a.node, link.b.node
            if a in fab.switch_by_name and b in fab.switch_by_name:
                self.graphs[fab.switch_by_name[a].plane].add_edge(a, b)
        self.edge_switches = {p.name: sorted({n.switch for n in fab.nic_ports if n.plane == p.name})
                              for p in fab.planes}

    @staticmethod
    def next_hops(g: nx.Graph, dest: str) -> dict[str, list[str]]:
        dist = nx.single_source_shortest_path_length(g, dest)
        return {n: [m for m in g[n] if dist.get(m, -1) == d - 1] for n, d in dist.items() if d}

    def fail(self, plane: str, a: str, b: str, dests: list[str]) -> dict[str, dict[str, list[str]]]:
        g = self.graphs[plane]
        g.remove_edge(a, b)
        try:
            return {d: self.next_hops(g, d) for d in dests}
        finally:
            g.add_edge(a, b)  # restored for the next sample: O(1), inside the timing (it favours no one)


def flush_caches(buf: np.ndarray) -> None:
    buf += 1  # touches every cache line of 64 MB


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e6, out


def precompute_mb(fab: Fabric) -> float:
    """Memory the precomputation holds, MB: the traced allocations of a second controller's (the
    timed one runs without the tracer, which slows Python down)."""
    core = ControllerCore(fab, "adaptive", rate_scale=1.0)
    tracemalloc.start()
    core.precompute_failures()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del core
    gc.collect()
    return held / 2**20


def measure(fab: Fabric, samples: int, seed: int, precompute: bool = True) -> tuple[Figures, dict[str, Any]]:
    t0 = time.perf_counter()
    core = ControllerCore(fab, "adaptive", rate_scale=1.0)
    setup_s = time.perf_counter() - t0
    uplinks = [(l.a.node, l.a.port) for l in fab.links
               if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]
    t0 = time.perf_counter()
    prepared = core.precompute_failures() if precompute else 0
    precompute_s = time.perf_counter() - t0
    memo_mb = precompute_mb(fab) if precompute else 0.0
    base = Baseline(fab)
    tune_gc()  # as the controller process does
    table = core.table
    rng = random.Random(seed)
    flush = np.zeros(FLUSH_BYTES // 8, dtype=np.int64)
    figs = Figures()
    for cond in ("warm", "cold"):
        out = figs.warm_us if cond == "warm" else figs.cold_us
        for _ in range(samples):
            sw, port = rng.choice(uplinks)
            dpid = fab.switch_by_name[sw].dpid
            peer, peer_port = table.peer(sw, port)
            plane = fab.switch_by_name[sw].plane
            dests = sorted({d for _, d, _ in table.crossing(sw, port)}
                           | {d for _, d, _ in table.crossing(peer, peer_port)})
            for row in ROWS:
                if cond == "cold":
                    flush_caches(flush)
                if row.startswith("ours"):
                    t = time.perf_counter()
                    changes = core.on_port_status(dpid, port, False, time.monotonic())
                    if row.endswith("messages"):
                        msgs = [m for ch in changes for m in ofmsg.messages(ch)]
                        figs.messages.append(len(msgs))
                    out[row].append((time.perf_counter() - t) * 1e6)
                    core.on_port_status(dpid, port, True, time.monotonic())  # recovery, untimed
                elif row.endswith("affected destinations"):
                    out[row].append(timed(lambda: base.fail(plane, sw, peer, dests))[0])
                else:
                    out[row].append(timed(lambda: base.fail(plane, sw, peer, base.edge_switches[plane]))[0])
    meta = {"hosts": len(fab.hosts), "switches": len(fab.switches), "links": len(uplinks),
            "decision_points": len(core.policy.decision_points()), "path_tables_s": round(setup_s, 3),
            "precomputed_failures": prepared, "precompute_s": round(precompute_s, 3),
            "precompute_mb": round(memo_mb, 1), "samples": samples}
    gc.collect()
    return figs, meta


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def report(name: str, figs: Figures, meta: dict[str, Any]) -> dict[str, Any]:
    print(f"\n{name}: {meta['hosts']} hosts, {meta['switches']} switches, {meta['links']} switch links, "
          f"{meta['decision_points']} decision points; path tables {meta['path_tables_s']:.2f} s; "
          f"{meta['precomputed_failures']} failures precomputed in {meta['precompute_s']:.2f} s, "
          f"holding {meta['precompute_mb']:.1f} MB; "
          f"{meta['samples']} samples per figure; {np.mean(figs.messages):.0f} OpenFlow messages per failure")
    print(f"  {'':<44}{'warm p50':>10}{'warm p99':>10}{'cold p50':>10}{'cold p99':>10}   (us)")
    rows: dict[str, Any] = {}
    for row in ROWS:
        w, c = figs.warm_us[row], figs.cold_us[row]
        rows[row] = {"warm_p50_us": pct(w, 50), "warm_p99_us": pct(w, 99),
                     "cold_p50_us": pct(c, 50), "cold_p99_us": pct(c, 99)}
        r = rows[row]
        print(f"  {row:<44}{r['warm_p50_us']:>10.1f}{r['warm_p99_us']:>10.1f}"
              f"{r['cold_p50_us']:>10.1f}{r['cold_p99_us']:>10.1f}")
    ours = rows["ours: decision"]
    ratios = {}
    for row in ROWS[2:]:
        ratios[row] = {k: rows[row][k] / ours[k] for k in ours}
        r = ratios[row]
        verdict = "ours faster" if r["warm_p50_us"] > 1 else "BASELINE FASTER"
        print(f"  {row + ' / ours':<44}{r['warm_p50_us']:>9.1f}x{r['warm_p99_us']:>9.1f}x"
              f"{r['cold_p50_us']:>9.1f}x{r['cold_p99_us']:>9.1f}x   {verdict} (p50 warm)")
    return {"meta": meta, "rows": rows, "ratios_vs_decision": ratios,
            "messages_per_failure": float(np.mean(figs.messages))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", action="append", help=f"repeatable (default: {', '.join(DEFAULT_TOPOLOGIES)})")
    ap.add_argument("--samples", type=int, default=2000, help="samples per figure (default 2000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument("--no-precompute", action="store_true", help="leave the link memo cold")
    args = ap.parse_args()
    results = {}
    for name in args.topology or DEFAULT_TOPOLOGIES:
        figs, meta = measure(load(name), args.samples, args.seed, precompute=not args.no_precompute)
        results[name] = report(name, figs, meta)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
