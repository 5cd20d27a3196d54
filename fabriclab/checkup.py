"""`fabriclab up`'s check: bring a fabric up, ping every host pair on every plane, tear it down, and judge.

    check = check_fabric(fab, "adaptive", EmulationOptions(), count=3)
    print(format_check(check, fab)); sys.exit(0 if check.ok else 1)     # or json.dumps(check.figures)

The verdict: OK when every host pair is reachable on every plane (each pair's pings all answered), a
controller that died was restarted and resynchronised, and teardown left nothing behind (namespaces,
veths, bridges, processes). `while_up` runs with the lab up, after the pings (an interactive CLI, or a
hold until Ctrl-C).
"""
from __future__ import annotations

import ipaddress
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabric.emulation import EmulationOptions
from fabric.emulation.system import link_counters
from fabric.emulation.tunnels import UNDERLAY_DEVS
from fabric.errors import FabriclabError
from fabric.model import Fabric
from fabriclab.session import Lab
from traffic.ping import ping_all


@dataclass(frozen=True)
class UpCheck:
    """The figures and verdict (`figures`, plain data: `fabriclab up --json` prints it) and what teardown
    left behind, described (empty when clean)."""

    figures: dict[str, Any]
    left_behind: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.figures["ok"])


def check_fabric(fab: Fabric, routing: str, opts: EmulationOptions, *, count: int = 3,
                 log: Callable[[str], None] = lambda msg: None,
                 while_up: Callable[[Lab], None] | None = None) -> UpCheck:
    """Bring `fab` up under `routing`, ping all pairs `count` times, run `while_up`, tear down; the
    figures and the verdict (`ok`) as plain data (module docstring)."""
    t0 = time.monotonic()
    with Lab(fab, routing=routing, opts=opts, log=log) as lab:
        if lab.emulation is None or lab.bringup is None:
            raise FabriclabError("the lab did not come up")
        log(f"up in {lab.bringup.total_s:.1f} s (datapath {lab.emulation.datapath}); checking all-pairs reachability")
        pings = ping_all(lab.emulation, count=count)
        per_plane: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # pairs, pairs ok, lost packets
        for p in pings:
            plane = fab.nic_by_ip[ipaddress.IPv4Address(p.dst_ip)].plane
            per_plane[plane][0] += 1
            per_plane[plane][1] += p.received == p.sent
            per_plane[plane][2] += p.sent - p.received
        tunnels = tunnel_figures(lab)
        if while_up is not None:
            while_up(lab)
    left = lab.leftovers()
    expected_pairs = {p.name: len(fab.hosts) * (len(fab.hosts) - 1) for p in fab.planes}
    gaps = [{"exit_code": g.exit_code, "gap_s": None if g.gap_s is None else round(g.gap_s, 3), "error": g.error}
            for g in lab.controller_gaps]
    restored = all(g["gap_s"] is not None for g in gaps)
    ok = all(per_plane[p][1] == n for p, n in expected_pairs.items()) and left.empty() and restored
    return UpCheck({
        "topology": fab.name,
        "hosts": len(fab.hosts),
        "switches": len(fab.switches),
        "routing": routing,
        "datapath": lab.emulation.datapath if lab.emulation else None,
        "bringup_s": {k: round(v, 3) for k, v in vars(lab.bringup).items()} | {"total_s": round(lab.bringup.total_s, 3)},
        "reachability": {
            p: {"pairs": n, "pairs_ok": per_plane[p][1], "packets_lost": per_plane[p][2], "pings_per_pair": count}
            for p, n in expected_pairs.items()
        },
        "controller_gaps": gaps,
        "tunnels": tunnels,
        "teardown_clean": left.empty(),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "ok": ok,
    }, "" if left.empty() else str(left))


def tunnel_figures(lab: Lab) -> dict[str, Any] | None:
    """The tunnelled links of a running lab and what crossed the wire between its stand-in servers so
    far (both ways, as the kernel counts the wire's frames); None without tunnels."""
    em = lab.emulation
    plan = em.tunnels if em is not None else None
    if plan is None:
        return None
    frames = wire_bytes = 0
    for server, dev in enumerate(UNDERLAY_DEVS):
        tx_bytes, tx_frames, _, _ = link_counters(plan.servers[server], dev)
        frames += tx_frames
        wire_bytes += tx_bytes
    return {"kind": plan.kind, "links": [t.label for t in plan.tunnels], "servers": list(plan.servers),
            "wire_mtu_bytes": plan.underlay_mtu_bytes, "overhead_bytes_per_frame": plan.overhead_bytes,
            "wire_frames": frames, "wire_bytes": wire_bytes}


def format_check(check: UpCheck, fab: Fabric) -> str:
    """`check_fabric`'s result as `fabriclab up` prints it."""
    result = check.figures
    b = result["bringup_s"]
    lines = [f"fabric       {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
             f"{len(fab.links)} links, planes {', '.join(p.name for p in fab.planes)}",
             f"controller   os-ken, routing {result['routing']}; datapath {result['datapath']}",
             f"bring-up     {b['total_s']:.2f} s (controller {b['controller_s']:.2f}, build {b['build_s']:.2f}, "
             f"connect {b['connect_s']:.2f}, flows {b['flows_s']:.2f})"]
    for p, r in result["reachability"].items():
        lines.append(f"plane {p}      {r['pairs_ok']}/{r['pairs']} host pairs reachable, "
                     f"{r['packets_lost']} of {r['pairs'] * r['pings_per_pair']} pings lost")
    t = result["tunnels"]
    if t is not None:
        lines.append(f"tunnels      {t['kind']} {', '.join(t['links'])} between two stand-in servers (wire MTU "
                     f"{t['wire_mtu_bytes']}, {t['overhead_bytes_per_frame']} bytes per frame): {t['wire_frames']:,} "
                     f"frames, {t['wire_bytes']:,} bytes crossed the wire")
    for g in result["controller_gaps"]:
        what = f"resynchronised after {g['gap_s']:.2f} s" if g["gap_s"] is not None else f"NOT restored: {g['error']}"
        lines.append(f"controller   died (exit code {g['exit_code']}); restarted, {what}")
    lines.append(f"teardown     {'clean' if result['teardown_clean'] else 'LEFT BEHIND: ' + check.left_behind}")
    lines.append("result       " + ("OK" if result["ok"] else "FAILED"))
    return "\n".join(lines)
