"""Link-failure outage per routing mode, measured with a paced UDP probe (needs root and OVS).

    sudo .venv/bin/python benchmarks/failover.py [--trials 10] [--rate-pps 20000] [--routing static ecmp adaptive]

On dual-plane-16, a probe h0 -> h15 (plane A) runs at `--rate-pps` packets/s from a fixed source port;
the controller's REST API says which path it takes. Each trial takes one link of that path down for
`--down-s` and brings it back, while the probe runs:
- remote: the spine -> destination-leaf link (the sender's leaf must learn of it from the controller);
- local: the sender's leaf -> spine link (a fast-failover bucket can skip it in the data plane).
Outage = the longest lost-sequence span inside the failure's window (from one in-flight time before
the link went down to `--down-s` after), divided by the rate, so receiver scheduling gaps do not
count. Prints min/median/max per mode and failure kind, and the background loss outside the windows.

The timeline of each failure (ms after the fault's `at_s`, medians over the trials): `inject` the
two ends set down (one ioctl each, in each switch's namespace); `first lost` the first lost packet's due time (negative: it was in flight);
`port status` when the controller got the switch's port-status message (OVS noticed the port down:
the same moment its fast-failover buckets stop using it); `decided` when the controller had decided the
move of the probe's slot at the sender's leaf (the port-status handler's start plus the policy's
decision time; the messages are built and sent after it; none under `static` and `ecmp`);
`restored` the due time of the first packet delivered after the longest lost span.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fabric import topofile
from fabriclab.session import Lab
from traffic.probe_run import ProbeRun

SPORT = 49152  # slot 0 at the leaf tier


TIMELINE = ("inject", "first lost", "port status", "decided", "restored")


def trial(lab: Lab, workdir: Path, link: tuple[str, int], rate_pps: int, down_s: float,
          n: int) -> tuple[float, int, dict[str, float | None]]:
    if lab.emulation is None or lab.faults is None or lab.controller is None:
        raise RuntimeError("the lab is not running")
    run = ProbeRun(lab.emulation, "h0", "h15", plane="A", sport=SPORT, rate_pps=rate_pps, seconds=down_s + 1.5,
                   workdir=workdir, port=9000 + n % 100).start()
    t0 = run.wait_sending()
    time.sleep(max(0.0, t0 + 0.5 - time.monotonic()))
    down = lab.faults.link(*link, up=False)
    time.sleep(max(0.0, down.at_s + down_s - time.monotonic()))
    up = lab.faults.link(*link, up=True)
    report = run.result()
    window = report.window(down.at_s, down_s)
    spans = report.spans_in(*window)
    longest = max(spans, key=lambda sp: sp[1] - sp[0], default=None)
    background = report.lost_outside([window, report.window(up.at_s, 0.5)])
    peer = lab.fabric.peer(*link)
    ends = {link, (peer.node, peer.port)}
    in_fault = (down.at_s - 0.1, up.at_s)
    ports = [e["time_s"] for e in lab.controller.get("/api/ports")
             if (e["switch"], e["port"]) in ends and not e["up"] and in_fault[0] <= e["time_s"] <= in_fault[1]]
    # the sender's leaf moving the probe's destination (the decision that restores the probe's path)
    decided = [e["time_s"] + e["decision_us"] / 1e6 for e in lab.controller.get("/api/events")
               if e["cause"] == "failure" and in_fault[0] <= e["time_s"] <= in_fault[1]
               and e["switch"] == "leafA0" and e["dest"] == "leafA3"]

    def ms(t: float | None) -> float | None:
        return None if t is None else (t - down.at_s) * 1000

    timeline = {
        "inject": ms(down.done_s),
        "first lost": ms(report.due_s(spans[0][0])) if spans else None,
        "port status": ms(min(ports, default=None)),
        "decided": ms(min(decided, default=None)),
        "restored": ms(report.due_s(longest[1] + 1)) if longest else None,
    }
    outage = (longest[1] - longest[0] + 1) if longest else 0
    return outage / rate_pps * 1000, background, timeline


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--rate-pps", type=int, default=20000)
    ap.add_argument("--down-s", type=float, default=1.0)
    ap.add_argument("--routing", nargs="+", default=["static", "ecmp", "adaptive"])
    ap.add_argument("--controller-args", default="",
                    help="extra controller options, e.g. '--poll-ms 100' (to see what the polling costs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fab = topofile.load("dual-plane-16")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fabriclab-failover-") as tmp:
        for routing in args.routing:
            with Lab(fab, routing=routing, controller_args=args.controller_args.split()) as lab:
                if lab.controller is None:
                    raise RuntimeError("no controller")
                path = lab.controller.get(f"/api/paths?src=h0&dst=h15&sport={SPORT}")[0]["paths"][0]
                leaf, spine, dleaf = path[1], path[2], path[3]
                links = {
                    "remote (spine->leaf)": (spine, next(a.port for a in fab.adjacency[spine] if a.peer == dleaf)),
                    "local (leaf->spine)": (leaf, next(a.port for a in fab.adjacency[leaf] if a.peer == spine)),
                }
                for kind, link in links.items():
                    results = [trial(lab, Path(tmp), link, args.rate_pps, args.down_s, i) for i in range(args.trials)]
                    outages = [r[0] for r in results]
                    timeline = {}
                    for step in TIMELINE:
                        values = [v for r in results if (v := r[2][step]) is not None]
                        timeline[step] = statistics.median(values) if values else None
                    rows.append({"routing": routing, "failure": kind, "link": f"{link[0]}:{link[1]}",
                                 "trials": len(outages), "min_ms": min(outages),
                                 "median_ms": statistics.median(outages), "max_ms": max(outages),
                                 "background_lost": sum(r[1] for r in results), "timeline_ms": timeline,
                                 "trial_timelines_ms": [r[2] for r in results], "outages_ms": outages})
                    print(f"done {routing} {kind}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"probe {args.rate_pps} pkt/s h0 -> h15 (plane A), link down {args.down_s:g} s per trial")
    print(f"{'routing':<10}{'failure':<22}{'link':<14}{'trials':>7}{'min ms':>10}{'median ms':>11}{'max ms':>10}"
          f"{'background lost':>17}")
    for r in rows:
        print(f"{r['routing']:<10}{r['failure']:<22}{r['link']:<14}{r['trials']:>7}{r['min_ms']:>10.1f}"
              f"{r['median_ms']:>11.1f}{r['max_ms']:>10.1f}{r['background_lost']:>17}")
    print("\ntimeline, ms after the fault (median over the trials; - where it did not happen)")
    print(f"{'routing':<10}{'failure':<22}" + "".join(f"{step:>13}" for step in TIMELINE))
    for r in rows:
        cells = "".join(f"{'-' if v is None else format(v, '.1f'):>13}" for v in r["timeline_ms"].values())
        print(f"{r['routing']:<10}{r['failure']:<22}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
