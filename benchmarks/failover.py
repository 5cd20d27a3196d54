"""Link-failure outage per routing mode, measured with a paced UDP probe (needs root and OVS).

    sudo .venv/bin/python benchmarks/failover.py [--trials 10] [--rate 20000] [--modes static ecmp adaptive]

On dual-plane-16, a probe h0 -> h15 (plane A) runs at `--rate` packets/s from a fixed source port;
the controller's REST API says which path it takes. Each trial takes one link of that path down for
`--down-s` and brings it back, while the probe runs:
- remote: the spine -> destination-leaf link (the sender's leaf must learn of it from the controller);
- local: the sender's leaf -> spine link (a fast-failover bucket can skip it in the data plane).
Outage = longest lost-sequence span / rate, so receiver scheduling gaps do not count. Prints
min/median/max per mode and failure kind.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from fabric import topofile
from fabric.lab import Lab

SPORT = 49152  # slot 0 at the leaf tier


def trial(lab: Lab, link: tuple[str, int], rate: int, down_s: float, n: int) -> float:
    em = lab.emulation
    fab = lab.fabric
    out = lab.run_dir / f"probe-{n}.json"
    recv = em.popen("h15", [sys.executable, "-m", "traffic.probe", "recv", "--bind", str(fab.nic("h15", "A").ip),
                            "--port", "9000", "--idle-s", "2", "--out", str(out)])
    time.sleep(0.4)
    seconds = down_s + 1.5
    send = em.popen("h0", [sys.executable, "-m", "traffic.probe", "send", "--dst", str(fab.nic("h15", "A").ip),
                           "--port", "9000", "--sport", str(SPORT), "--bind", str(fab.nic("h0", "A").ip),
                           "--rate", str(rate), "--seconds", str(seconds)])
    time.sleep(0.5)
    em.set_link(*link, up=False)
    time.sleep(down_s)
    em.set_link(*link, up=True)
    send.wait(timeout=60)
    recv.wait(timeout=30)
    data = json.loads(out.read_text())
    longest = max((b - a + 1 for a, b in data["lost_spans"]), default=0)
    time.sleep(0.5)
    return longest / rate * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--down-s", type=float, default=1.0)
    ap.add_argument("--modes", nargs="+", default=["static", "ecmp", "adaptive"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fab = topofile.load("dual-plane-16")
    rows = []
    for mode in args.modes:
        with Lab(fab, mode=mode) as lab:
            path = lab.controller.get(f"/api/paths?src=h0&dst=h15&sport={SPORT}")[0]["paths"][0]
            leaf, spine, dleaf = path[1], path[2], path[3]
            links = {
                "remote (spine->leaf)": next(a.port for a in fab.adjacency[spine] if a.peer == dleaf),
                "local (leaf->spine)": next(a.port for a in fab.adjacency[leaf] if a.peer == spine),
            }
            for kind, port in links.items():
                node = spine if kind.startswith("remote") else leaf
                outages = [trial(lab, (node, port), args.rate, args.down_s, i) for i in range(args.trials)]
                rows.append({"mode": mode, "failure": kind, "link": f"{node}:{port}", "trials": len(outages),
                             "min_ms": min(outages), "median_ms": statistics.median(outages),
                             "max_ms": max(outages)})
                print(f"done {mode} {kind}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"probe {args.rate} pkt/s h0 -> h15 (plane A), link down {args.down_s:g} s per trial")
    print(f"{'mode':<10}{'failure':<22}{'link':<14}{'trials':>7}{'min ms':>10}{'median ms':>11}{'max ms':>10}")
    for r in rows:
        print(f"{r['mode']:<10}{r['failure']:<22}{r['link']:<14}{r['trials']:>7}{r['min_ms']:>10.1f}"
              f"{r['median_ms']:>11.1f}{r['max_ms']:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
