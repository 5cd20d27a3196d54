"""All-pairs reachability with fping, on any `fabric.emulation.hosts.Hosts`.

Every host pings every other host's NIC in each plane they share, hosts in parallel, paced so that
the whole fabric sends about 8k echo requests per second: the userspace datapath drops bursts far
above that (measured: 64 hosts pinging at 1 ms intervals lost ~25%).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from fabric.emulation.hosts import Hosts
from fabric.errors import EmulationError

_FPING_LINE = re.compile(r"^(\S+)\s+:\s+xmt/rcv/%loss = (\d+)/(\d+)/")


@dataclass(frozen=True)
class PingPair:
    src: str
    dst_ip: str
    sent: int
    received: int


def parse_fping(src: str, text: str) -> list[PingPair]:
    """Parse `fping -q -c N` summary lines."""
    out = []
    for line in text.splitlines():
        m = _FPING_LINE.match(line.strip())
        if m:
            out.append(PingPair(src, m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def ping_all(hosts: Hosts, count: int = 3, planes: Iterable[str] | None = None,
             only: set[tuple[str, str]] | None = None, timeout_s: float = 300.0) -> list[PingPair]:
    """Every host pings every other host's NIC in each plane they share; `only` restricts it to
    these (source host, destination address) pairs."""
    fab = hosts.fabric
    wanted = set(planes) if planes is not None else {p.name for p in fab.planes}
    gap_ms = max(1, len(fab.hosts) // 8)
    procs: list[tuple[str, subprocess.Popen[Any], Path]] = []
    out: list[PingPair] = []
    # Targets go in a file: a long command line is awkward and fping reads files.
    with tempfile.TemporaryDirectory(prefix="fabriclab-ping-") as tmp:
        try:
            for host in fab.hosts:
                mine = {p.plane for p in fab.nics_of[host.name]}
                targets = [str(o.ip) for o in fab.nic_ports if o.host != host.name and o.plane in mine & wanted
                           and (only is None or (host.name, str(o.ip)) in only)]
                if not targets:
                    continue
                path = Path(tmp) / f"{host.name}.targets"
                path.write_text("\n".join(targets) + "\n")
                result = Path(tmp) / f"{host.name}.out"
                period_ms = max(20, gap_ms * len(targets))
                with open(result, "wb") as f:
                    proc = hosts.popen(host.name, ["fping", "-q", "-c", str(count), "-p", str(period_ms), "-i",
                                                   str(gap_ms), "-t", "1000", "-f", str(path)], stdout=f, stderr=f)
                procs.append((host.name, proc, result))
            for name, proc, result in procs:
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    raise EmulationError(f"fping on {name} did not finish within {timeout_s:g} s") from None
                out.extend(parse_fping(name, result.read_text(errors="replace")))
        finally:
            for _, proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
    return out
