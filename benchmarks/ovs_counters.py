"""What OVS's OpenFlow counters show on this machine's userspace datapath (needs root and OVS).

    sudo .venv/bin/python benchmarks/ovs_counters.py [--seconds 2] [--degrade 0.3]

Fabric: dual-plane, 8 hosts, 2 per leaf, 2 spines per plane, leaf uplinks 2:1 oversubscribed (10 Mbit/s
emulated; host NICs 20 Mbit/s), `ecmp`. One TCP flow h0 -> h6 takes leafA0's uplink 1. Measured:
- flow-counter refresh: while the flow runs, leafA0's table-1 (ECMP) flow counters are read with
  `ovs-ofctl dump-flows` in a tight loop for `--seconds`; printed: when their byte total changed and
  the gaps between changes (what bounds how soon a controller can see a new flow's bytes);
- the same with a nudge (what the controller does before its fast flow requests,
  `controller.core.ControllerCore.nudge_flow`): every `--nudge-every-ms` the nudge flow is added
  again (`ovs-ofctl add-flow`, a flow-table change), and the counters are read `--nudge-ms` after it;
  printed: how many of those reads showed new bytes, and how old the counters were at each read
  (the bytes the uplink's port counter, which is fresh, sent beyond them, at the flow's rate);
- drop counters: the uplink's tx packets, rate and tx drop (`ovs-ofctl dump-ports`) and its HTB
  qdisc's drops (`tc -s qdisc`) over a 4 s flow, at the full rate and with the link degraded to
  `--degrade` of it (`Faults.degrade`): whether a rate-degraded link shows in drop counters.
Run again with `--max-revalidator-ms 20` (leafA0's Open vSwitch gets `other_config:max-revalidator=20`)
to see the revalidator's effect on the refresh.
"""
from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import time

from controller.intents import COOKIE, PRIORITY_NUDGE, TABLE_NUDGE
from fabric.builders import dual_plane
from fabric.emulation import Emulation, EmulationOptions
from fabric.emulation.plan import parse_dump_ports
from fabric.model import intf_name
from fabriclab.session import Lab
from traffic.iperf import start_iperf


def table1_bytes(em: Emulation, switch: str) -> int:
    out = em.ofctl(switch, "dump-flows", "table=1")
    return sum(int(m) for m in re.findall(r"n_bytes=(\d+)", out))


def add_nudge(em: Emulation, switch: str) -> None:
    """Add the controller's nudge flow again (`ControllerCore.nudge_flow`: table 2, which no packet
    reaches): a flow-table change, after which OVS's revalidators refresh every flow's counters."""
    em.ofctl(switch, "add-flow", f"table={TABLE_NUDGE},priority={PRIORITY_NUDGE},cookie={COOKIE:#x},actions=drop")


def port_tx(em: Emulation, switch: str, port: int) -> tuple[int, int, int]:
    """(tx packets, tx bytes, tx dropped) of one port."""
    out = em.ofctl(switch, "dump-ports", str(port))
    tx_bytes = parse_dump_ports(out)[port][0]
    m = re.search(r"tx pkts=(\d+), bytes=\d+, drop=(\d+)", out)
    if m is None:
        raise RuntimeError(f"no tx line in dump-ports of {switch} port {port}: {out!r}")
    return int(m.group(1)), tx_bytes, int(m.group(2))


def qdisc_dropped(em: Emulation, switch: str, dev: str) -> int:
    out = subprocess.run(["tc", "-n", em.ovs(switch).netns, "-s", "qdisc", "show", "dev", dev], capture_output=True,
                         text=True, check=True).stdout
    return sum(int(m) for m in re.findall(r"dropped (\d+)", out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long to watch the flow counters")
    ap.add_argument("--nudge-ms", type=float, default=20.0, help="read the counters this long after each nudge")
    ap.add_argument("--nudge-every-ms", type=float, default=100.0, help="nudge this often")
    ap.add_argument("--degrade", type=float, default=0.3, help="fraction of its rate the degraded uplink keeps")
    ap.add_argument("--max-revalidator-ms", type=int, default=0,
                    help="set leafA0's Open vSwitch other_config:max-revalidator to this (0: OVS's default, 500)")
    args = ap.parse_args()
    fab = dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200, oversubscription=2.0)
    with Lab(fab, routing="ecmp", opts=EmulationOptions(mbps_per_gbps=0.1)) as lab:
        em, faults = lab.emulation, lab.faults
        if em is None or faults is None:
            raise RuntimeError("the lab is not running")
        if args.max_revalidator_ms:
            em.ovs("leafA0").vsctl(["set", "Open_vSwitch", ".", f"other_config:max-revalidator={args.max_revalidator_ms}"])
        dev = intf_name("leafA0", 1)
        flow = start_iperf(em, "h0", "h6", "A", seconds=2 * args.seconds + 2.0, cport=49152, port=5201)
        time.sleep(1.0)
        t0, last, changes = time.monotonic(), None, []
        while time.monotonic() < t0 + args.seconds:
            n = table1_bytes(em, "leafA0")
            if n != last:
                changes.append((time.monotonic() - t0) * 1000)
                last = n
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        print(f"table-1 flow counters of leafA0 changed at (ms): {', '.join(f'{c:.0f}' for c in changes)}")
        print(f"gaps between changes (ms): {', '.join(f'{g:.0f}' for g in gaps)}")
        # with nudges: how old are the counters read `--nudge-ms` after one? The uplink's port counter
        # is fresh at every read; the flow's bytes it sent beyond the flow counters, at its rate, are
        # the counters' age (the flow is the only traffic on the uplink, apart from the few probes;
        # the age includes the few ms between the two `ovs-ofctl` reads)
        fresh, ages_ms = 0, []
        add_nudge(em, "leafA0")  # a fresh baseline: its age would be subtracted from every later one
        time.sleep(0.1)
        last = table1_bytes(em, "leafA0")
        port0, flow0, t_start = port_tx(em, "leafA0", 1)[1], last, time.monotonic()
        t_next = t_start
        while time.monotonic() < t_start + args.seconds:
            time.sleep(max(0.0, t_next - time.monotonic()))
            t_next += args.nudge_every_ms / 1000
            add_nudge(em, "leafA0")
            time.sleep(args.nudge_ms / 1000)
            n, port_bytes, t = table1_bytes(em, "leafA0"), port_tx(em, "leafA0", 1)[1], time.monotonic()
            fresh += n != last
            last = n
            rate = (port_bytes - port0) / max(t - t_start, 1e-3)
            if rate > 0:
                ages_ms.append(max(0.0, ((port_bytes - port0) - (n - flow0)) / rate * 1000))
        flow.result()
        reads = len(ages_ms)
        ages_ms.sort()
        if ages_ms:
            print(f"with a nudge every {args.nudge_every_ms:g} ms, read {args.nudge_ms:g} ms after it: "
                  f"{fresh} of {reads} reads showed new bytes; counters' age (ms) median "
                  f"{ages_ms[reads // 2]:.0f}, max {ages_ms[-1]:.0f}")
        for label, fraction in (("full rate", None), (f"degraded to {args.degrade:g}", args.degrade)):
            if fraction is not None:
                faults.degrade("leafA0", 1, fraction)
            p0, q0, t0 = port_tx(em, "leafA0", 1), qdisc_dropped(em, "leafA0", dev), time.monotonic()
            start_iperf(em, "h0", "h6", "A", seconds=4, cport=49152, port=5201).result()
            p1, q1, t1 = port_tx(em, "leafA0", 1), qdisc_dropped(em, "leafA0", dev), time.monotonic()
            print(f"uplink leafA0:1 {label}: {p1[0] - p0[0]} packets, {(p1[1] - p0[1]) * 8 / (t1 - t0) / 1e6:.2f} Mbit/s, "
                  f"tx drop {p1[2] - p0[2]}, qdisc dropped {q1 - q0}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
