"""A fabric with switch-to-switch links carried by a VXLAN tunnel between two stand-in servers, against the
same fabric untunnelled, in the same run (needs root and Open vSwitch; docs/cluster.md).

    sudo .venv/bin/python benchmarks/tunnel_link.py [--topology dual-plane-16] [--tunnel-link leafA0-spineA0]
        [--size-mb 64] [--collectives 2] [--reps 4] [--mbps-per-gbps X] [--budget-reps 3] [--out FILE]

1. Ring all-reduce busbw. Each repetition brings the fabric up twice, untunnelled and tunnelled (which
   goes first alternates, so a drift of the shared machine falls on both), and replays `--collectives`
   ring all-reduces of `--size-mb` over every host (adaptive routing, planned ports, one dilation for
   all runs, the replay's link scale unless `--mbps-per-gbps`). Printed: each lab's median busbw and the
   machine's idle CPU share during its replay, each repetition's ratio tunnelled / untunnelled, and over
   the repetitions the median and range of each.
2. The per-packet cost, from the tunnelled labs' kernel counters at the end of their replay (wire and
   tunnel devices, both directions): frames that crossed the wire, the bytes each frame gained (wire
   bytes less inner frames, per frame; the kernel's VXLAN device counts from the inner IP header, so an
   inner frame is its count + 14), and that overhead as a share of the inner bytes.
3. The userspace datapath's budget (`--budget-reps`, 0 skips it): one TCP flow through the tunnelled
   link's switches with every link at 1000 Mbit/s (HTB's ceiling here, far above what the datapath
   forwards, so the flow is CPU-bound), untunnelled and tunnelled, alternating: the iperf3 goodput's
   median half-second rate.
Partial results are written to `--out` (JSON) after every lab. Run it alone on the machine (nice is fine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.emulation import EmulationOptions
from fabric.emulation.system import link_counters
from fabric.emulation.tunnels import UNDERLAY_DEVS, parse_link
from fabric.model import Fabric
from fabriclab.backends import Emulated, run_workload
from fabriclab.calibrate import micro_workload
from fabriclab.progress import ProgressView
from fabriclab.session import Lab
from traffic.iperf import iperf
from traffic.replay import ReplayOptions, plan_replay

INNER_ETHERNET_BYTES = 14  # not in the VXLAN device's byte count (module docstring)


@dataclass
class Wire:
    """What crossed the wire from one server: outer frames and bytes; the tunnel devices' frames and
    bytes (inner, from the IP header on)."""

    frames: int = 0
    wire_bytes: int = 0
    tunnel_frames: int = 0
    tunnel_bytes: int = 0

    @property
    def overhead_per_frame(self) -> float:
        inner = self.tunnel_bytes + INNER_ETHERNET_BYTES * self.tunnel_frames
        return (self.wire_bytes - inner) / self.frames if self.frames else float("nan")

    @property
    def overhead_share(self) -> float:
        inner = self.tunnel_bytes + INNER_ETHERNET_BYTES * self.tunnel_frames
        return (self.wire_bytes - inner) / inner if inner else float("nan")


def read_wire(lab: Lab) -> list[Wire]:
    """Per server (0, 1): what it sent over the wire, and what its tunnel ends sent, since they were made."""
    em = lab.emulation
    if em is None or em.tunnels is None:
        raise RuntimeError("the lab has no tunnels")
    out = []
    for server, dev in enumerate(UNDERLAY_DEVS):
        tx_bytes, tx_frames, _, _ = link_counters(em.tunnels.servers[server], dev)
        w = Wire(tx_frames, tx_bytes)
        for switch, port_dev in em.tunnels.devices(server):
            b, f, _, _ = link_counters(em.ovs(switch).netns, port_dev)
            w.tunnel_frames += f
            w.tunnel_bytes += b
        out.append(w)
    return out


@dataclass
class LabRun:
    tunnelled: bool
    busbw_gbps: float
    busbw_all_gbps: list[float]
    cpu_idle_share: float
    wall_s: float
    duration_emu_s: float  # the all-reduces' median emulated duration
    wire: list[Wire] = field(default_factory=list)


def ring_lab(fab: Fabric, links: tuple[tuple[str, str], ...], size_bytes: int, collectives: int, dilation: float,
             mbps_per_gbps: float | None, progress: ProgressView, label: str) -> LabRun:
    wire: list[Wire] = []

    def during(lab: Lab, done: int, calls: int) -> None:
        progress.running({"lab": (done / calls, f"{label}: {done}/{calls} all-reduces")})
        if done == calls and links:
            wire.extend(read_wire(lab))

    opts = ReplayOptions(ranks=len(fab.hosts), dilation=dilation, ports="planned", algorithm="ring",
                         repeat=collectives, mbps_per_gbps=mbps_per_gbps)
    t0 = time.monotonic()
    res = run_workload(micro_workload(len(fab.hosts), [size_bytes]), "ring all-reduce", fab, "adaptive", opts,
                       Emulated(during=during, tunnel_links=links)).result
    busbw = [c.busbw_bps / 1e9 for c in res.collectives]
    return LabRun(bool(links), statistics.median(busbw), busbw, res.fidelity.cpu_idle_share, time.monotonic() - t0,
                  statistics.median(c.duration_emu_s for c in res.collectives), wire)


def budget_lab(fab: Fabric, links: tuple[tuple[str, str], ...], src: str, dst: str, plane: str,
               seconds: float) -> float:
    """One TCP flow src -> dst with every link at HTB's 1000 Mbit/s ceiling (the datapath, not HTB, is the
    limit): its median half-second goodput, Mbit/s."""
    top = max(link.rate_gbps for link in fab.links)
    opts = EmulationOptions(mbps_per_gbps=1000.0 / top, tunnel_links=links)
    with Lab(fab, opts=opts, controller_args=["--gray-period-ms", "0", "--poll-ms", "100"]) as lab:
        if lab.emulation is None:
            raise RuntimeError("the lab did not come up")
        return iperf(lab.emulation, src, dst, plane, seconds=seconds).steady_mbps


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="dual-plane-16")
    ap.add_argument("--tunnel-link", action="append", metavar="SW1-SW2",
                    help="a link to tunnel; repeatable (default leafA0-spineA0)")
    ap.add_argument("--size-mb", type=float, default=64.0, help="the all-reduce's size (default 64 MB)")
    ap.add_argument("--collectives", type=int, default=2, help="all-reduces per lab (default 2)")
    ap.add_argument("--reps", type=int, default=4, help="repetitions, each one lab of each kind (default 4)")
    ap.add_argument("--mbps-per-gbps", type=float, default=None, help="link scale (default: the replay's)")
    ap.add_argument("--budget-reps", type=int, default=3, help="repetitions of the datapath-budget flow (0: skip)")
    ap.add_argument("--budget-seconds", type=float, default=5.0)
    ap.add_argument("--out", default="results/bench/tunnel_link.json", help="partial and final results (JSON)")
    args = ap.parse_args()

    fab = topofile.load(args.topology)
    links = tuple(parse_link(fab, t) for t in (args.tunnel_link or ["leafA0-spineA0"]))
    size = int(args.size_mb * 1e6)
    probe = ReplayOptions(ranks=len(fab.hosts), ports="planned", algorithm="ring", mbps_per_gbps=args.mbps_per_gbps)
    plan = plan_replay(micro_workload(len(fab.hosts), [size]), fab, probe)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                           "topology": fab.name, "tunnel_links": [f"{a}-{b}" for a, b in links],
                           "size_bytes": size, "dilation": plan.dilation, "mbps_per_gbps": plan.mbps_per_gbps,
                           "ring": [], "budget": [], "loadavg_start": os.getloadavg()}

    def save() -> None:
        out.write_text(json.dumps(doc, indent=1, default=lambda o: o.__dict__ | {
            "overhead_per_frame": o.overhead_per_frame, "overhead_share": o.overhead_share}
            if isinstance(o, Wire) else o.__dict__))

    runs: list[tuple[LabRun, LabRun]] = []
    total = 2 * args.reps + 2 * args.budget_reps
    with ProgressView("tunnel_link") as progress:
        for rep in range(args.reps):
            pair: dict[bool, LabRun] = {}
            for tunnelled in ((False, True) if rep % 2 == 0 else (True, False)):
                label = f"rep {rep + 1}, {'tunnelled' if tunnelled else 'untunnelled'}"
                pair[tunnelled] = run = ring_lab(fab, links if tunnelled else (), size, args.collectives,
                                                 plan.dilation, args.mbps_per_gbps, progress, label)
                doc["ring"].append(run)
                save()
                progress.items(len(doc["ring"]), total)
            runs.append((pair[False], pair[True]))
        # the budget flow: from the first host of the first tunnelled link's edge switch to a host of another
        # edge switch of its plane, with every uplink of that edge switch tunnelled (whatever path the flow
        # hashes onto, it crosses a tunnel)
        budget: list[tuple[float, float]] = []
        if args.budget_reps:
            a, b = links[0]
            edge = a if fab.switch_by_name[a].role in ("leaf", "tor") else b
            uplinks = tuple((edge, adj.peer) for adj in fab.adjacency[edge] if adj.peer in fab.switch_by_name)
            plane = fab.switch_by_name[edge].plane
            src = next(n.host for n in fab.nic_ports if n.switch == edge)
            dst = next(n.host for n in fab.nic_ports if n.plane == plane and n.switch != edge)
            doc["budget_tunnel_links"] = [f"{x}-{y}" for x, y in uplinks]
            for rep in range(args.budget_reps):
                got: dict[bool, float] = {}
                for tunnelled in ((False, True) if rep % 2 == 0 else (True, False)):
                    progress.running({"lab": (0.0, f"budget rep {rep + 1}, "
                                                   f"{'tunnelled' if tunnelled else 'untunnelled'}")})
                    got[tunnelled] = budget_lab(fab, uplinks if tunnelled else (), src, dst, plane,
                                                args.budget_seconds)
                    doc["budget"].append({"tunnelled": tunnelled, "mbps": got[tunnelled], "src": src, "dst": dst})
                    save()
                    progress.items(len(doc["ring"]) + len(doc["budget"]), total)
                budget.append((got[False], got[True]))

    print(f"{fab.name}, tunnelled: {', '.join(doc['tunnel_links'])} (vxlan); ring all-reduce of {args.size_mb:g} MB "
          f"over {len(fab.hosts)} hosts, adaptive, dilation {plan.dilation:.4g}, link scale {plan.mbps_per_gbps:g} "
          f"Mbit/s per Gbit/s, {args.collectives} per lab")
    print(f"{'rep':>3} {'untunnelled Gbit/s':>19} {'tunnelled Gbit/s':>17} {'ratio':>7} {'CPU idle u/t':>13} "
          f"{'emulated s u/t':>15}")
    for i, (u, t) in enumerate(runs, start=1):
        print(f"{i:>3} {u.busbw_gbps:>19.1f} {t.busbw_gbps:>17.1f} {t.busbw_gbps / u.busbw_gbps:>7.3f} "
              f"{u.cpu_idle_share:>6.0%}/{t.cpu_idle_share:<6.0%} {u.duration_emu_s:>7.2f}/{t.duration_emu_s:<7.2f}")
    if runs:
        print(f"median (range): untunnelled {spread([u.busbw_gbps for u, _ in runs])}, tunnelled "
              f"{spread([t.busbw_gbps for _, t in runs])} Gbit/s; ratio {spread([t.busbw_gbps / u.busbw_gbps for u, t in runs])}")
        for server in (0, 1):
            w = [t.wire[server] for _, t in runs if t.wire]
            if w:
                frames = sum(x.frames for x in w)
                per_frame = statistics.median(x.overhead_per_frame for x in w)
                share = statistics.median(x.overhead_share for x in w)
                mean_inner = sum(x.tunnel_bytes + INNER_ETHERNET_BYTES * x.tunnel_frames for x in w) / max(1, frames)
                print(f"wire from server {server}: {frames:,} frames over {len(w)} labs, mean inner frame "
                      f"{mean_inner:.0f} B, {per_frame:.2f} B more per frame on the wire, {share:.2%} of the inner bytes")
    if budget:
        top = max(link.rate_gbps for link in fab.links)
        nic = fab.nic(doc["budget"][0]["src"], fab.nic_ports[0].plane).rate_gbps * 1000.0 / top
        print(f"datapath budget: one TCP flow {doc['budget'][0]['src']} -> {doc['budget'][0]['dst']} (NIC at "
              f"{nic:g} Mbit/s, the fastest links at 1000), tunnelled: {', '.join(doc['budget_tunnel_links'])}: "
              f"untunnelled {spread([u for u, _ in budget])}, tunnelled {spread([t for _, t in budget])} Mbit/s; "
              f"ratio {spread([t / u for u, t in budget])}")
    doc["loadavg_end"] = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the start {doc['loadavg_start'][0]:.1f} {doc['loadavg_start'][1]:.1f} "
          f"{doc['loadavg_start'][2]:.1f}, at the end {doc['loadavg_end'][0]:.1f} {doc['loadavg_end'][1]:.1f} "
          f"{doc['loadavg_end'][2]:.1f}")
    doc["summary"] = {"ratio": [t.busbw_gbps / u.busbw_gbps for u, t in runs],
                      "budget_ratio": [t / u for u, t in budget]}
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
