"""Claims: what a run is about to create on this machine, written down before it creates it.

A run that ends normally removes its daemons, namespaces, veths and processes itself (`Emulation.stop`,
`ControllerProcess.stop`). A run that is killed (SIGKILL, an OOM kill, a CI job cut off, a session
closed under it) cannot. So every run first writes a claim, `<dir>/<kind>-<pid>-<n>.json`: its own
PID and start time, the network namespaces, directories and files it will create (each switch's Open
vSwitch, the controller's socket),
and the PIDs (with their start times) of the processes it starts. A claim is *stale* when its owner
no longer runs (same PID and same start time: a reused PID is another process).

`reclaim_stale()` removes what stale claims name, and only that: processes by PID when their start
time is still the recorded one, plus every process inside the network namespace of such a process
(a host's or switch's namespace holds only what the run started there); then the named namespaces
(and with them the interfaces in them), directories and files; and, from claims of older versions, bridges
of the system's Open vSwitch and root-namespace interfaces by name.
The next run does it before it starts (`Emulation.start`), a user with `fabriclab clean`. Claims of live
runs are never touched. (Two runs on one machine no longer share names: each names its switches'
namespaces and directories after its PID, a counter and a random token.)
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from fabric.emulation import system

_counter = itertools.count()


def claim_dir() -> Path:
    """$FABRICLAB_RUN_DIR, else /run/fabriclab as root (emulations need root) or a per-user temp dir."""
    if "FABRICLAB_RUN_DIR" in os.environ:
        return Path(os.environ["FABRICLAB_RUN_DIR"])
    uid = os.geteuid()
    return Path("/run/fabriclab") if uid == 0 else Path(tempfile.gettempdir()) / f"fabriclab-{uid}"


def start_ticks(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])  # fields after the command name start at field 3


def same_process(pid: int, ticks: int | None) -> bool:
    """Whether `pid` still runs and is the process that was recorded (not a reused PID)."""
    return ticks is not None and system.alive(pid) and start_ticks(pid) == ticks


@dataclass
class Claim:
    path: Path
    owner_pid: int
    owner_ticks: int | None
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: list[tuple[int, int | None]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)  # named network namespaces (`ip netns`)
    paths: list[str] = field(default_factory=list)  # files and directories (Open vSwitch instances, sockets)

    @property
    def stale(self) -> bool:
        return not same_process(self.owner_pid, self.owner_ticks)

    def add_pids(self, pids: list[int]) -> None:
        self.pids += [(p, start_ticks(p)) for p in pids]
        self._write()

    def release(self) -> None:
        """The run removed what it created: forget the claim."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        doc = {"owner_pid": self.owner_pid, "owner_ticks": self.owner_ticks, "bridges": self.bridges,
               "interfaces": self.interfaces, "pids": [list(p) for p in self.pids],
               "namespaces": self.namespaces, "paths": self.paths}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)

    @classmethod
    def read(cls, path: Path) -> "Claim | None":
        try:
            doc = json.loads(path.read_text())
            return cls(path, int(doc["owner_pid"]), doc["owner_ticks"], list(doc["bridges"]),
                       list(doc["interfaces"]), [(int(p), t) for p, t in doc["pids"]],
                       [str(n) for n in doc.get("namespaces", [])], [str(d) for d in doc.get("paths", [])])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable (a run killed while writing it): nothing we can act on safely


def claim(kind: str, bridges: Iterable[str] = (), interfaces: Iterable[str] = (),
          pids: list[int] | None = None, namespaces: Iterable[str] = (), paths: Iterable[str] = ()) -> Claim:
    """Record what this process is about to create (write it before creating anything)."""
    d = claim_dir()
    d.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    c = Claim(d / f"{kind}-{me}-{next(_counter)}.json", me, start_ticks(me), sorted(bridges), sorted(interfaces),
              namespaces=sorted(namespaces), paths=sorted(paths))
    c.add_pids(pids or [])
    return c


def claims() -> list[Claim]:
    d = claim_dir()
    found = (Claim.read(p) for p in sorted(d.glob("*.json"))) if d.is_dir() else iter(())
    return [c for c in found if c is not None]


def _processes_by_netns() -> dict[int, list[int]]:
    """Every process, by the inode of its network namespace (one pass over /proc)."""
    by_ns: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                by_ns.setdefault(os.stat(entry / "ns" / "net").st_ino, []).append(int(entry.name))
            except OSError:
                continue
    return by_ns


def _netns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def reclaim(c: Claim) -> system.Leftovers:
    """Remove what claim `c` names and still exists; returns what was removed."""
    procs = [p for p, t in c.pids if same_process(p, t)]
    # every process inside the network namespace of such a process (unless that is our own, the root
    # one) or inside a namespace the claim names
    own = _netns_inode("/proc/self/ns/net")
    spaces = {_netns_inode(f"/proc/{p}/ns/net") for p in procs} | {_netns_inode(f"/var/run/netns/{n}")
                                                                    for n in c.namespaces}
    by_ns = _processes_by_netns()
    victims = sorted(set(procs) | {m for ino in spaces if ino is not None and ino != own for m in by_ns.get(ino, [])})
    found = system.present(set(c.bridges), set(c.interfaces), victims, set(c.namespaces), set(c.paths))
    for pid in found.pids:
        system.kill(pid)
    for pid in found.pids:
        system.wait_gone(pid, 5.0)
    if found.namespaces:  # deleting a namespace removes the interfaces in it (and their veth peers)
        subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in found.namespaces),
                       capture_output=True, text=True, check=False)
    for path in map(Path, found.paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for br in found.bridges:
        subprocess.run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br], capture_output=True, check=False)
    gone = system.present(set(), set(found.interfaces), []).interfaces  # deleting one veth end removes both
    if gone:
        subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"link del dev {i}\n" for i in gone),
                       capture_output=True, text=True, check=False)
    ovs_up = bool(c.bridges) and subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True,
                                                check=False).returncode == 0
    if ovs_up or not c.bridges:
        c.release()  # else keep it: the bridges come back when ovsdb-server starts again
    return found


def reclaim_stale() -> list[tuple[Claim, system.Leftovers]]:
    """Remove the leftovers of every run that no longer runs; claims of live runs are kept."""
    return [(c, reclaim(c)) for c in claims() if c.stale]
