"""Gray-failure probes on a full link (needs root and OVS): lossy readings from congestion alone.

    sudo .venv/bin/python benchmarks/gray_busy.py [--seconds 60] [--busy-util 0.8 1000] [--busy-core]

Fabric: the congestion benchmark's (dual-plane, 8 hosts, 2 per leaf, 2 spines per plane, leaf
uplinks 10 Mbit/s emulated, host NICs 20 Mbit/s), under `ecmp`, which reports gray links and does
not move anything. Two TCP flows leafA0 -> leafA3 with source ports in slots 0 and 2 share uplink 1
(spineA0) and keep it full for `--seconds`: its queue overflows, by design, and the gray prober's
frames in it are lost with the traffic. Once per probing period (`GrayConfig.period_s`, 1 s; the
controller reads the switches' probe counters `settle_s` (0.95 s) into each period, on the system's
monotonic clock, which this script shares; polled half a period into the next) `/api/links` gives every link's last reading: probes
lost of sent. Printed per `--busy-util` (the controller's `--gray-busy-util`; above 1 no reading is
ever exempt, the behaviour before it existed):
- readings of the full uplink, of them lossy (>= `min_lost` and >= `loss` of the probes lost, the
  `GrayConfig` defaults) and the most probes one lost;
- the same for every other link (the idle ones: the background);
- the gray verdicts `/api/gray` logged (a link turned gray: when, and probes lost of sent) and the
  uplink's lowest utilisation seen at a reading.
`--busy-core` keeps one core busy meanwhile (`nice -n 5 python3 -c 'while True: pass'`, as the CI
campaign's busy runs; ended by its PID).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
import time
from collections.abc import Iterator

from controller.gray import GrayConfig
from fabric.builders import dual_plane
from fabric.emulation import EmulationOptions
from fabriclab.session import Lab
from traffic.iperf import start_iperf

FULL = ("leafA0", 1)  # uplink 1: the two flows' slots 0 and 2 both hash onto it (benchmarks/congestion.py)


@contextlib.contextmanager
def busy_core(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    hog = subprocess.Popen(["nice", "-n", "5", sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def trial(busy_util: float, seconds: float) -> dict[str, float]:
    cfg = GrayConfig()
    fab = dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200, oversubscription=2.0)
    args = ["--gray-busy-util", str(busy_util)]
    full = {"readings": 0, "lossy": 0, "max_lost": 0, "util_min": math.inf}
    rest = {"readings": 0, "lossy": 0, "max_lost": 0}
    with Lab(fab, routing="ecmp", opts=EmulationOptions(mbps_per_gbps=0.1), controller_args=args) as lab:
        em, ctl = lab.emulation, lab.controller
        if em is None or ctl is None:
            raise RuntimeError("the lab is not running")
        a = start_iperf(em, "h0", "h6", "A", seconds=seconds + 3, cport=49152, port=5201)
        b = start_iperf(em, "h1", "h7", "A", seconds=seconds + 3, cport=49156, port=5202)
        time.sleep(2.0)  # past TCP's slow start: the uplink full
        end = time.monotonic() + seconds
        while True:
            # half a period into the next period: the reading of the one before (at settle_s) is in
            now = time.monotonic()
            wake = math.floor(now / cfg.period_s) * cfg.period_s + 0.5 * cfg.period_s
            if wake <= now:
                wake += cfg.period_s
            if wake > end:
                break
            time.sleep(wake - now)
            for link in ctl.get("/api/links"):
                if link["probes_sent"] == 0:
                    continue
                lost, sent = link["probes_lost"], link["probes_sent"]
                row = full if (link["switch"], link["port"]) == FULL else rest
                row["readings"] += 1
                row["lossy"] += cfg.lossy(lost, sent)  # the controller's own rule
                row["max_lost"] = max(row["max_lost"], lost)
                if row is full:
                    full["util_min"] = min(full["util_min"], link["utilisation"])
        verdicts = [g for g in ctl.get("/api/gray") if g["gray"]]
        t0 = end - seconds
        a.result(), b.result()
    return {"full_readings": full["readings"], "full_lossy": full["lossy"], "full_max_lost": full["max_lost"],
            "full_util_min": full["util_min"], "other_readings": rest["readings"], "other_lossy": rest["lossy"],
            "other_max_lost": rest["max_lost"], "gray_verdicts": len(verdicts),
            "gray_links": ", ".join(f"{g['switch']}:{g['port']} at {g['time_s'] - t0:.1f} s ({g['probes_lost']} of "
                                    f"{g['probes_sent']})" for g in verdicts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the uplink is kept full per run")
    ap.add_argument("--busy-util", type=float, nargs="+", default=[0.8, 1000.0],
                    help="the controller's --gray-busy-util per run (default: 0.8, and 1000: never exempt)")
    ap.add_argument("--busy-core", action="store_true", help="keep one core busy meanwhile")
    args = ap.parse_args()
    for busy in args.busy_util:
        with busy_core(args.busy_core):
            r = trial(busy, args.seconds)
        print(f"--gray-busy-util {busy:g}, {args.seconds:g} s{', a core busy' if args.busy_core else ''}: full uplink {FULL[0]}:{FULL[1]} "
              f"(utilisation >= {r['full_util_min']:.2f} at every reading): {r['full_lossy']} lossy of "
              f"{r['full_readings']} readings, at most {r['full_max_lost']} of {GrayConfig().probes} probes lost; "
              f"other links: {r['other_lossy']} lossy of {r['other_readings']}, at most {r['other_max_lost']} lost; "
              f"gray verdicts {r['gray_verdicts']}{' (' + r['gray_links'] + ')' if r['gray_links'] else ''}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
