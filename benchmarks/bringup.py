"""Bring-up time of dual-plane fabrics at 16, 64 and 128 hosts (needs root and Open vSwitch).

    sudo .venv/bin/python benchmarks/bringup.py [--sizes 16 64 128] [--repeat 1] [--json]

Phases, each measured: controller listening; fabric built and started (Mininet + OVS); all switches
connected to the controller; all flows installed; all host pairs reachable on every plane
(fping, one echo per pair, until every pair answered); teardown. Ratios are against the smallest
size measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from fabric.builders import dual_plane
from fabriclab.session import Lab
from traffic.ping import ping_all

#: hosts -> (hosts per leaf, spines per plane)
SHAPES = {16: (4, 2), 32: (4, 4), 64: (8, 4), 128: (16, 4)}


def measure(hosts: int) -> dict[str, float]:
    per_leaf, spines = SHAPES[hosts]
    fab = dual_plane(hosts=hosts, hosts_per_leaf=per_leaf, spines_per_plane=spines)
    t0 = time.monotonic()
    lab = Lab(fab).start()
    try:
        if lab.emulation is None or lab.bringup is None:
            raise RuntimeError("the lab did not come up")
        t_up = time.monotonic()
        # reachable = every (host, address) pair answered at least once; later rounds ping only the
        # pairs still waiting (on 2 cores, 128 hosts pinging at once can push an RTT past fping's timeout)
        waiting = {(h.name, str(n.ip)) for h in fab.hosts for n in fab.nic_ports if n.host != h.name}
        total = len(waiting)
        rounds = 0
        while waiting:
            rounds += 1
            pings = ping_all(lab.emulation, count=1, only=waiting)
            waiting -= {(p.src, p.dst_ip) for p in pings if p.received}
            if waiting and time.monotonic() - t_up > 120:
                raise RuntimeError(f"{hosts} hosts: {total - len(waiting)}/{total} pairs reachable after 120 s")
        t_reach = time.monotonic()
    finally:
        t_stop0 = time.monotonic()
        lab.stop()
        t_stop = time.monotonic() - t_stop0
    b = lab.bringup
    if b is None:
        raise RuntimeError("no bring-up figures")
    return {
        "hosts": hosts,
        "switches": len(fab.switches),
        "controller_s": b.controller_s,
        "build_s": b.build_s,
        "connect_s": b.connect_s,
        "flows_s": b.flows_s,
        "reachable_s": t_reach - t_up,
        "ping_rounds": rounds,
        "bringup_total_s": t_reach - t0,
        "teardown_s": t_stop,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 128], choices=sorted(SHAPES))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for n in args.sizes:
        runs = [measure(n) for _ in range(args.repeat)]
        rows.append({k: statistics.median(r[k] for r in runs) for k in runs[0]})
        print(f"measured {n} hosts", file=sys.stderr)
    base = rows[0]
    for r in rows:
        r["total_vs_base"] = r["bringup_total_s"] / base["bringup_total_s"]
        r["per_host_vs_base"] = (r["bringup_total_s"] / r["hosts"]) / (base["bringup_total_s"] / base["hosts"])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ["hosts", "switches", "controller_s", "build_s", "connect_s", "flows_s", "reachable_s", "ping_rounds",
            "bringup_total_s", "teardown_s", "total_vs_base", "per_host_vs_base"]
    print("  ".join(f"{c:>15}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>15.2f}" if isinstance(r[c], float) else f"{r[c]:>15}" for c in cols))
    print(f"(median of {args.repeat} run(s); ratios against {base['hosts']} hosts measured in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
