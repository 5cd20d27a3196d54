"""Private Open vSwitch instances, one per switch (thin adapter: processes, files, `ip netns`).

Each switch runs in an Open vSwitch of its own: an `ovsdb-server` with its own database and an
`ovs-vswitchd` inside a network namespace that holds only that switch's ports, like a real switch
with its own control CPU. Why not one daemon for the fabric: ovs-vswitchd reconfigures every bridge
and port it runs on each rtnetlink link event of its namespace, and does so before it reads which
port changed (in its main loop `bridge_run` -> `bridge_reconfigure` on `if_notifier_changed` comes
before `netdev_run`), and the userspace datapath forwards in that same loop. With one daemon a port
going down was noticed ~0.1-0.2 ms later per port of the whole fabric, and every switch stopped
forwarding meanwhile (`benchmarks/ovs_port_notice.py`). With one per switch a link event costs only
the two switches at its ends.

Everything of an instance is in its run directory (database, sockets, pid files, logs); bridges'
OpenFlow management sockets are `<rundir>/<bridge>.mgmt` (`ovs-ofctl dump-flows unix:...`).
The switches reach the controller on a Unix socket: a TCP listener on 127.0.0.1 of the root namespace
is out of their namespaces' reach.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fabric.emulation import system
from fabric.errors import EmulationError

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
START_TIMEOUT_S = 60.0

PidSink = Callable[[list[int]], None]


@dataclass
class OvsInstance:
    """One ovsdb-server and ovs-vswitchd; `netns` is the network namespace vswitchd runs in."""

    name: str
    netns: str
    rundir: Path
    pids: list[int] = field(default_factory=list)

    @property
    def db(self) -> str:
        return f"unix:{self.rundir / 'db.sock'}"

    @property
    def mgmt(self) -> str:
        """The OpenFlow management target of the instance's bridge (named as the instance; for ovs-ofctl)."""
        return f"unix:{self.rundir / f'{self.name}.mgmt'}"

    def env(self) -> dict[str, str]:
        d = str(self.rundir)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d}

    def vsctl_cmd(self, args: list[str], timeout_s: float = START_TIMEOUT_S) -> list[str]:
        return ["ovs-vsctl", f"--db={self.db}", f"--timeout={max(1, int(timeout_s))}", *args]

    def vsctl(self, args: list[str], timeout_s: float = START_TIMEOUT_S) -> str:
        res = subprocess.run(self.vsctl_cmd(args, timeout_s), capture_output=True, text=True, check=False,
                             env=self.env())
        if res.returncode != 0:
            raise EmulationError(f"ovs-vsctl on {self.name} failed: {res.stderr.strip()[-300:]}")
        return res.stdout

    def _daemon(self, prog: str) -> list[str]:
        d = self.rundir
        return [f"--pidfile={d / f'{prog}.pid'}", f"--unixctl={d / f'{prog}.ctl'}", f"--log-file={d / f'{prog}.log'}",
                "--detach", "--no-chdir"]

    def log_tail(self, prog: str = "ovs-vswitchd", lines: int = 5) -> str:
        try:
            return "\n".join((self.rundir / f"{prog}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _wait_all(procs: list[tuple[OvsInstance, str, subprocess.Popen[str]]], timeout_s: float) -> None:
    """Wait for start-up commands (daemons that detach once ready); the first failure raises."""
    deadline = time.monotonic() + timeout_s
    failed = []
    for inst, what, proc in procs:
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed.append(f"{inst.name}: {what} did not finish within {timeout_s:g} s")
            continue
        if proc.returncode != 0:
            failed.append(f"{inst.name}: {what} failed: {(err or inst.log_tail()).strip()[-300:]}")
    if failed:
        raise EmulationError(f"starting Open vSwitch failed ({len(failed)} of {len(procs)}): {failed[0]}")


def _popen(inst: OvsInstance, cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=inst.env())


def start_all(instances: list[OvsInstance], on_pids: PidSink) -> None:
    """Create each instance's namespace and database and start its two daemons, all instances side by
    side. `on_pids(pids)` is called as soon as daemons run (for the run's claim). On an error what was
    started stays in `instances` for `kill_daemons` and `remove`."""
    if not SCHEMA.exists():
        raise EmulationError(f"Open vSwitch's schema {SCHEMA} is missing; run scripts/setup.sh")
    system.run_batch(["ip"], "".join(f"netns add {i.netns}\n" for i in instances), "creating network namespaces")
    for inst in instances:
        inst.rundir.mkdir(parents=True, exist_ok=False)
    # No IPv6 on the namespace's interfaces (set before any is made): a port going down or up would
    # also remove or add its link-local address, more link events for ovs-vswitchd to process.
    setup = "; ".join(["ip link set lo up", "sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
                       "sysctl -qw net.ipv6.conf.default.disable_ipv6=1"])
    _wait_all([(i, "namespace set-up", _popen(i, ["ip", "netns", "exec", i.netns, "sh", "-ec", setup]))
               for i in instances], START_TIMEOUT_S)
    _wait_all([(i, "ovsdb-tool create", _popen(i, ["ovsdb-tool", "create", str(i.rundir / "conf.db"), str(SCHEMA)]))
               for i in instances], START_TIMEOUT_S)
    try:
        _wait_all([(i, "ovsdb-server", _popen(i, ["ovsdb-server", str(i.rundir / "conf.db"),
                                                   f"--remote=punix:{i.rundir / 'db.sock'}", *i._daemon("ovsdb-server")]))
                   for i in instances], START_TIMEOUT_S)
    finally:
        _collect_pids(instances, "ovsdb-server", on_pids)  # those that started, also after a failure
    _wait_all([(i, "ovs-vsctl init", _popen(i, i.vsctl_cmd(["--no-wait", "init"]))) for i in instances],
              START_TIMEOUT_S)
    try:
        _wait_all([(i, "ovs-vswitchd", _popen(i, ["ip", "netns", "exec", i.netns, "ovs-vswitchd", i.db,
                                                   *i._daemon("ovs-vswitchd")]))
                   for i in instances], START_TIMEOUT_S)
    finally:
        _collect_pids(instances, "ovs-vswitchd", on_pids)


def _collect_pids(instances: list[OvsInstance], prog: str, on_pids: PidSink) -> None:
    """Record the PIDs of `prog` that are running (a detached daemon writes its pid file once ready)."""
    new = []
    for inst in instances:
        try:
            pid = int((inst.rundir / f"{prog}.pid").read_text().strip())
        except (OSError, ValueError):
            continue  # it did not start: `_wait_all` says why
        if pid not in inst.pids and system.alive(pid):
            inst.pids.append(pid)
            new.append(pid)
    on_pids(new)


def kill_daemons(instances: list[OvsInstance]) -> None:
    """Stop the instances' daemons (by PID) and wait until they are gone. Best effort."""
    for inst in instances:
        for pid in inst.pids:
            system.kill(pid)
    for inst in instances:
        for pid in inst.pids:
            system.wait_gone(pid, 5.0)


def remove(instances: list[OvsInstance]) -> None:
    """Delete the instances' namespaces (and with them every interface left in them) and their run
    directories. Best effort: runs to the end whatever is already gone."""
    present = set(namespaces())
    gone = [i.netns for i in instances if i.netns in present]
    if gone:
        subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in gone),
                       capture_output=True, text=True, check=False)
    for inst in instances:
        shutil.rmtree(inst.rundir, ignore_errors=True)
        with contextlib.suppress(OSError):
            inst.rundir.parent.rmdir()  # the run's directory, once its last instance is gone


def namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
