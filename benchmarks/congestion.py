"""Congestion reaction of the adaptive controller (needs root and OVS).

    sudo .venv/bin/python benchmarks/congestion.py [--trials 3]

Fabric: dual-plane, 8 hosts, 2 per leaf, 2 spines per plane, leaf uplinks 2:1 oversubscribed (100G,
10 Mbit/s emulated; host NICs 20 Mbit/s). Two TCP flows leafA0 -> leafA3 start together with source
ports in slots 0 and 2, so both take uplink 1 (spineA0) and share its 10 Mbit/s. Measured per trial:
- onset -> decision: the onset is the later of the shared uplink running overloaded (its tx counter,
  polled with ovs-ofctl every few ms, shows >= 90% of its 10 Mbit/s over >= 20 ms: what the
  controller's port rates see) and the second flow's start (leafA0 has received 4.5 kB from h1: iperf3
  starts each client once its server listens, so the first flow fills the uplink alone for a while,
  and no move helps a link that one flow fills) -> the controller's congestion move (its event log;
  both clocks are the system's monotonic one);
- start -> decision: the iperf3 clients are started -> the move (includes their start-up and TCP's
  slow start);
- the controller's steps before the move, per trial (`/api/congestion`): the uplink turning warm
  and hot, the last nudge and flow-statistics request to leafA0, and the reply decided on;
- decision -> first packet on the new path: -> leafA0's uplink 2 counter starts rising;
- throughput delivered to the two receivers (leafA3's host ports) over the last 4 s, against the
  same scenario under `ecmp`, where both flows stay on the shared uplink (the "before" state).
Every trial runs on a fresh fabric with the same ecmp (`--baseline`) or adaptive controller.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from fabric.builders import dual_plane
from fabric.emulation.plan import parse_dump_ports
from fabric.emulation import Emulation, EmulationOptions
from fabriclab.session import Lab
from traffic.iperf import start_iperf


def tx_bytes(em: Emulation, switch: str, port: int) -> int:
    return parse_dump_ports(em.ofctl(switch, "dump-ports", str(port)))[port][0]


def leaf_a0(em: Emulation) -> dict[int, tuple[int, int]]:
    """leafA0's port counters: port -> (tx bytes, rx bytes)."""
    return em.port_counters("leafA0")


# the second flow has started once leafA0 received this much from h1: three full-size packets, more
# than iperf3's control connection carries before the test starts
SECOND_FLOW_BYTES = 4500


UPLINK_BPS = 10e6  # 100G at 0.1 Mbit/s per Gbit/s
OVERLOAD_UTIL = 0.9  # the controller's default --hot-util
OVERLOAD_SPAN_S = 0.02  # the controller's default --port-window-ms


def overloaded(samples: list[tuple[float, int]]) -> bool:
    """Whether the newest samples (time, tx bytes) of the shared uplink show it >= 90% busy over
    at least 20 ms."""
    t, n = samples[-1]
    for t0, n0 in reversed(samples[:-1]):
        if t - t0 >= OVERLOAD_SPAN_S:
            return (n - n0) * 8 / (t - t0) >= OVERLOAD_UTIL * UPLINK_BPS
    return False


def delivered(em: Emulation) -> int:
    """Bytes leafA3 has handed to h6 and h7 (its ports 3 and 4)."""
    return tx_bytes(em, "leafA3", 3) + tx_bytes(em, "leafA3", 4)


def trial(routing: str, seconds: float, controller_args: list[str]) -> dict[str, float]:
    fab = dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200, oversubscription=2.0)
    with Lab(fab, routing=routing, opts=EmulationOptions(mbps_per_gbps=0.1), controller_args=controller_args) as lab:
        em, ctl = lab.emulation, lab.controller
        if em is None or ctl is None:
            raise RuntimeError("the lab is not running")
        h1_port = fab.port_towards("leafA0", "h1")
        base = leaf_a0(em)
        t_start = time.monotonic()
        a = start_iperf(em, "h0", "h6", "A", seconds=seconds, cport=49152, port=5201)
        b = start_iperf(em, "h1", "h7", "A", seconds=seconds, cport=49156, port=5202)
        shared: list[tuple[float, int]] = []
        t_first = t_overload = t_second = None
        deadline = t_start + seconds - 5.0
        while time.monotonic() < deadline and (t_first is None or t_overload is None or t_second is None):
            t0 = time.monotonic()
            ports = leaf_a0(em)
            now = (t0 + time.monotonic()) / 2
            shared.append((now, ports[1][0]))
            if t_overload is None and overloaded(shared):
                t_overload = now
            if t_second is None and ports[h1_port][1] - base[h1_port][1] >= SECOND_FLOW_BYTES:
                t_second = now
            if t_first is None and ports[2][0] - base[2][0] > 3000:  # two full-size packets: the moved flow arrived
                t_first = now
            time.sleep(0.002)
        time.sleep(max(0.0, t_start + seconds - 4.5 - time.monotonic()))
        d0, t0 = delivered(em), time.monotonic()
        time.sleep(4.0)
        d1, t1 = delivered(em), time.monotonic()
        a.result(), b.result()
        events = [e for e in ctl.get("/api/events") if e["cause"] == "congestion"]
        steps = ctl.get("/api/congestion")
    t_move = events[0]["time_s"] if events else float("nan")
    t_onset = None if t_overload is None or t_second is None else max(t_overload, t_second)
    return {
        "onset_to_decision_ms": (t_move - (t_onset or float("nan"))) * 1000,
        "start_to_decision_ms": (t_move - t_start) * 1000,
        "decision_to_new_path_ms": ((t_first or float("nan")) - t_move) * 1000,
        "decision_us": events[0]["decision_us"] if events else float("nan"),
        "delivered_last_4s_mbps": (d1 - d0) * 8 / (t1 - t0) / 1e6,
        "moves": len(events),
        **timeline(steps, t_onset, t_move),
    }


SHARED = ("leafA0", 1)  # the uplink both flows take


def timeline(steps: list[dict], t_onset: float | None, t_move: float) -> dict[str, float]:
    """The controller's steps up to the move (`/api/congestion`), ms after the onset: the shared uplink
    turning warm and hot in its smoothed port rates, the last nudge and flow-statistics request to
    leafA0 (the decision point) before the move, and the reply the move was decided on."""
    nan = float("nan")
    if t_onset is None or math.isnan(t_move):
        return dict.fromkeys(("warm_ms", "hot_ms", "nudge_ms", "request_ms", "reply_ms"), nan)

    def at(names: tuple[str, ...], first: bool, link: bool, until_s: float) -> float:
        """ms after the onset of the first (or last) step named before `until_s`."""
        times = [e["time_s"] for e in steps if e["step"] in names and e["time_s"] <= until_s
                 and (e["switch"], e["port"]) == (SHARED if link else (SHARED[0], None))]
        if not times:
            return nan
        return ((min(times) if first else max(times)) - t_onset) * 1000

    request_ms = at(("request", "urgent_request"), False, False, t_move)
    # the nudge that request followed (one sent with it is for the next)
    nudge_ms = at(("nudge",), False, False, t_onset + request_ms / 1000 - 1e-6) if not math.isnan(request_ms) else nan
    return {"warm_ms": at(("warm",), True, True, t_move), "hot_ms": at(("hot",), True, True, t_move),
            "nudge_ms": nudge_ms, "request_ms": request_ms, "reply_ms": at(("reply",), False, False, t_move)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--controller-args", default="", help="extra controller flags, e.g. '--hot-flow-poll-ms 50'")
    args = ap.parse_args()
    results = {}
    for routing in ("ecmp", "adaptive"):
        results[routing] = [trial(routing, args.seconds, args.controller_args.split()) for _ in range(args.trials)]
        print(f"done {routing}", file=sys.stderr)
    keys = list(results["adaptive"][0])
    print("adaptive per trial (the controller's steps in ms after the onset, the move at onset_to_decision_ms):")
    print("".join(f"{k.removesuffix('_ms'):>12}" for k in keys[:1] + keys[-5:]))
    for r in results["adaptive"]:
        print("".join(f"{r[k]:>12.1f}" for k in keys[:1] + keys[-5:]))
    print(f"two TCP flows on one 10 Mbit/s uplink (capacity with both uplinks: 20 Mbit/s); "
          f"median of {args.trials} trials")
    print(f"{'':<26}" + "".join(f"{m:>14}" for m in results))
    for k in keys:
        print(f"{k:<26}" + "".join(f"{statistics.median(r[k] for r in results[m]):>14.2f}" for m in results))
    ad, ec = results["adaptive"], results["ecmp"]
    key = "delivered_last_4s_mbps"
    print(f"delivered throughput, adaptive / ecmp (ecmp keeps both flows on the shared uplink, i.e. the "
          f"state before the move): {statistics.median(r[key] for r in ad) / statistics.median(r[key] for r in ec):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
