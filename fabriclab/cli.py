"""The `fabriclab` command line. It only calls library functions and formats their results.

    fabriclab topo show FILE [FILE2] [--json]   what a fabric is (two files: side by side, differences marked)
    fabriclab topo check FILE                   validate a topology file
    fabriclab up [FILE] [--routing R] [--cli | --hold]
                                                bring up fabric + controller, check all-pairs reachability,
                                                print a summary, tear down

Any FabriclabError becomes a one-line message and exit code 2; a failed check exits 1.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import time
from collections import defaultdict
from typing import Any

from fabric import topofile
from fabric.analysis import TopoSummary, summarize
from fabric.emulation import EmulationOptions
from fabric.errors import FabriclabError
from fabric.routing import MODES

ROUTING_HELP = (f"routing policy: {', '.join(MODES)}, or a class of your own as package.module:ClassName "
                "(a fabric.routing.RoutingPolicy subclass, importable here)")


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


_LABELS = {
    "name": "name",
    "planes": "planes",
    "hosts": "hosts",
    "switches": "switches",
    "switches_by_role": "  by role",
    "links": "links",
    "nic_ports_per_host": "NIC ports per host",
    "host_bandwidth_gbps": "per-host bandwidth (Gbit/s)",
    "total_host_bandwidth_gbps": "total host bandwidth (Gbit/s)",
    "bisection_bandwidth_gbps": "bisection bandwidth (Gbit/s)",
    "bisection_ratio": "bisection / half the hosts' bandwidth",
    "oversubscription": "oversubscription (down:up, worst per tier)",
    "hops_min": "hops between hosts, min",
    "hops_max": "hops between hosts, max",
    "ecmp_paths_min": "equal-cost paths between hosts, min",
    "ecmp_paths_max": "equal-cost paths between hosts, max",
}


def _show(summaries: list[TopoSummary], as_json: bool) -> str:
    dicts = [s.to_dict() for s in summaries]
    if as_json:
        return json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2)
    width = max(len(v) for v in _LABELS.values()) + 2
    lines = []
    for key, label in _LABELS.items():
        values = [_fmt(d[key]) for d in dicts]
        mark = "  *" if len(values) > 1 and len(set(values)) > 1 and key != "name" else ""
        lines.append(f"{label:<{width}}" + "".join(f"{v:<28}" for v in values).rstrip() + mark)
    if len(dicts) > 1:
        lines.append("(* marks what differs)")
    return "\n".join(lines)


def cmd_topo_show(args: argparse.Namespace) -> int:
    summaries = [summarize(topofile.load(f)) for f in args.files]
    print(_show(summaries, args.json))
    return 0


def cmd_topo_check(args: argparse.Namespace) -> int:
    fab = topofile.load(args.file)
    print(f"ok: {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
          f"{len(fab.links)} links, planes {', '.join(p.name for p in fab.planes)}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from fabriclab.session import Lab
    from traffic.ping import ping_all

    fab = topofile.load(args.topology)
    opts = EmulationOptions(mbps_per_gbps=args.mbps_per_gbps, datapath=args.datapath,
                            delay_us=args.delay_us, loss_pct=args.loss_pct)
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    log(f"[fabriclab] bringing up {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
        f"routing {args.routing}")
    t0 = time.monotonic()
    with Lab(fab, routing=args.routing, opts=opts, log=lambda msg: log(f"[fabriclab] {msg}")) as lab:
        if lab.emulation is None or lab.bringup is None:
            raise FabriclabError("the lab did not come up")
        log(f"[fabriclab] up in {lab.bringup.total_s:.1f} s (datapath {lab.emulation.datapath}); "
            "checking all-pairs reachability")
        pings = ping_all(lab.emulation, count=args.count)
        per_plane: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # pairs, pairs ok, lost packets
        for p in pings:
            plane = fab.nic_by_ip[ipaddress.IPv4Address(p.dst_ip)].plane
            per_plane[plane][0] += 1
            per_plane[plane][1] += p.received == p.sent
            per_plane[plane][2] += p.sent - p.received
        if args.cli:
            lab.emulation.interactive()
        elif args.hold:
            log("[fabriclab] fabric is up; Ctrl-C tears it down")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    left = lab.leftovers()
    expected_pairs = {p.name: len(fab.hosts) * (len(fab.hosts) - 1) for p in fab.planes}
    gaps = [{"exit_code": g.exit_code, "gap_s": None if g.gap_s is None else round(g.gap_s, 3), "error": g.error}
            for g in lab.controller_gaps]
    restored = all(g["gap_s"] is not None for g in gaps)
    ok = all(per_plane[p][1] == n for p, n in expected_pairs.items()) and left.empty() and restored
    result = {
        "topology": fab.name,
        "hosts": len(fab.hosts),
        "switches": len(fab.switches),
        "routing": args.routing,
        "datapath": lab.emulation.datapath if lab.emulation else None,
        "bringup_s": {k: round(v, 3) for k, v in vars(lab.bringup).items()} | {"total_s": round(lab.bringup.total_s, 3)},
        "reachability": {
            p: {"pairs": n, "pairs_ok": per_plane[p][1], "packets_lost": per_plane[p][2], "pings_per_pair": args.count}
            for p, n in expected_pairs.items()
        },
        "controller_gaps": gaps,
        "teardown_clean": left.empty(),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "ok": ok,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        b = lab.bringup
        print(f"fabric       {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
              f"{len(fab.links)} links, planes {', '.join(p.name for p in fab.planes)}")
        print(f"controller   os-ken, routing {args.routing}; datapath {result['datapath']}")
        print(f"bring-up     {b.total_s:.2f} s (controller {b.controller_s:.2f}, build {b.build_s:.2f}, "
              f"connect {b.connect_s:.2f}, flows {b.flows_s:.2f})")
        for p, r in result["reachability"].items():
            print(f"plane {p}      {r['pairs_ok']}/{r['pairs']} host pairs reachable, "
                  f"{r['packets_lost']} of {r['pairs'] * args.count} pings lost")
        for g in gaps:
            what = f"resynchronised after {g['gap_s']:.2f} s" if g["gap_s"] is not None else f"NOT restored: {g['error']}"
            print(f"controller   died (exit code {g['exit_code']}); restarted, {what}")
        print(f"teardown     {'clean' if left.empty() else f'LEFT BEHIND: {left}'}")
        print("result       " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fabriclab", description="A lab for AI-training cluster networks.")
    sub = ap.add_subparsers(dest="command", required=True)

    topo = sub.add_parser("topo", help="inspect topology files").add_subparsers(dest="topo_command", required=True)
    show = topo.add_parser("show", help="counts, bandwidths, oversubscription, hops and paths")
    show.add_argument("files", nargs="+", metavar="FILE", help="topology file(s) or shipped names; two compare")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_topo_show)
    check = topo.add_parser("check", help="validate a topology file")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=cmd_topo_check)

    up = sub.add_parser("up", help="bring up fabric + controller, check reachability, print a summary, tear down")
    up.add_argument("topology", nargs="?", default=str(topofile.DEFAULT_TOPOLOGY),
                    help="topology file or shipped name (default: dual-plane-16)")
    up.add_argument("--routing", default="adaptive", help=ROUTING_HELP + " (default adaptive)")
    up.add_argument("--mbps-per-gbps", type=float, default=0.1,
                    help="emulated Mbit/s per real Gbit/s (default 0.1: 200G -> 20 Mbit/s)")
    up.add_argument("--datapath", default="auto", choices=["auto", "kernel", "user"])
    up.add_argument("--delay-us", type=float, default=0.0, help="per-link delay (needs sch_netem)")
    up.add_argument("--loss-pct", type=float, default=0.0, help="per-link random loss (needs sch_netem)")
    up.add_argument("--count", type=int, default=3, help="pings per host pair and plane (default 3)")
    hold = up.add_mutually_exclusive_group()
    hold.add_argument("--cli", action="store_true", help="open the Mininet CLI after the check")
    hold.add_argument("--hold", action="store_true", help="keep the fabric up until Ctrl-C")
    up.add_argument("--json", action="store_true", help="machine-readable summary")
    up.set_defaults(func=cmd_up)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except FabriclabError as e:
        print(f"fabriclab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fabriclab: interrupted; torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
