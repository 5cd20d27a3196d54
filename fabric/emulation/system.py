"""What this machine has and what a run left on it (thin I/O: /sys, ovs-vsctl, ip).

- kernel modules (`openvswitch` for the kernel datapath, `sch_netem` for delay/loss, `vxlan` and
  `ip_gre` for tunnelled links), probed;
- whether Open vSwitch is installed;
- which of a run's processes, namespaces, files (and, from older runs, bridges and interfaces)
  still exist (`present`);
- the socket buffer defaults the userspace datapath's ports are created with (`raised_socket_buffers`);
- interfaces set up or down in another network namespace with one ioctl (`netns_socket`, `set_link_up`).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Iterator

from fabric.errors import DeadlineError, EmulationError
from fabric.polling import wait_until


def kernel_module_loaded(name: str) -> bool:
    """True if kernel module `name` is (or can be) loaded; tries `modprobe -q` once as root."""
    if Path(f"/sys/module/{name}").exists():
        return True
    if os.geteuid() == 0:
        subprocess.run(["modprobe", "-q", name], capture_output=True, check=False)
    return Path(f"/sys/module/{name}").exists()


def probe_datapath() -> str:
    """'kernel' if the openvswitch kernel module is available, else 'user' (netdev)."""
    return "kernel" if kernel_module_loaded("openvswitch") else "user"


def has_netem() -> bool:
    return kernel_module_loaded("sch_netem")


def tunnel_kinds() -> frozenset[str]:
    """The kinds of tunnel (`fabric.emulation.tunnels.TUNNEL_KINDS`) this kernel can make."""
    from fabric.emulation.tunnels import KIND_MODULES

    return frozenset(kind for kind, module in KIND_MODULES.items() if kernel_module_loaded(module))


def link_counters(netns: str, dev: str) -> tuple[int, int, int, int]:
    """(tx bytes, tx packets, rx bytes, rx packets) of interface `dev` in network namespace `netns`,
    as the kernel counts them (`ip -s -j link show`)."""
    res = subprocess.run(["ip", "-netns", netns, "-s", "-j", "link", "show", "dev", dev], capture_output=True,
                         text=True, check=False)
    try:
        stats = json.loads(res.stdout)[0]["stats64"]
        return (int(stats["tx"]["bytes"]), int(stats["tx"]["packets"]), int(stats["rx"]["bytes"]),
                int(stats["rx"]["packets"]))
    except (ValueError, LookupError, TypeError):
        raise EmulationError(f"no counters for {dev} in {netns}: {res.stderr.strip()[-200:]}") from None


OVS_PROGRAMS = ("ovsdb-server", "ovsdb-tool", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")


def check_ovs() -> None:
    """Open vSwitch's programs are installed (each emulated switch runs daemons of its own)."""
    missing = [p for p in OVS_PROGRAMS if shutil.which(p) is None]
    if missing:
        raise EmulationError(f"Open vSwitch is not installed (no {', '.join(missing)}); run scripts/setup.sh")


@dataclass
class Leftovers:
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.bridges or self.interfaces or self.pids or self.namespaces or self.paths)


def present(bridges: set[str], intfs: set[str], pids: list[int], namespaces: AbstractSet[str] = frozenset(),
            paths: AbstractSet[str] = frozenset()) -> Leftovers:
    """Which of these bridges (of the system's Open vSwitch), root-namespace interfaces, processes,
    named network namespaces and files or directories exist now."""
    out = Leftovers()
    if bridges:
        res = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True, check=False)
        out.bridges = sorted(set(res.stdout.split()) & bridges)
    if intfs:
        res = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
        names = {line.split(":")[1].strip().split("@")[0] for line in res.stdout.splitlines() if ":" in line}
        out.interfaces = sorted(names & intfs)
    out.pids = [p for p in pids if alive(p)]
    if namespaces:
        out.namespaces = sorted(n for n in namespaces if Path("/var/run/netns", n).exists())
    out.paths = sorted(p for p in paths if os.path.lexists(p))
    return out


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def kill(pid: int) -> None:
    """SIGKILL one process we started, by PID."""
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until process `pid` is gone (or a zombie); False if it still runs after `timeout_s`."""
    try:
        wait_until(f"process {pid} to end", lambda: not alive(pid), timeout_s, 0.01)
    except DeadlineError:
        return False
    return True


def run_batch(tool: list[str], text: str, what: str) -> None:
    """Run `tool -batch -` style commands (`ip`, `tc`) on `text`; raise EmulationError on failure."""
    res = subprocess.run([*tool, "-batch", "-"], input=text, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise EmulationError(f"{what} failed: {res.stderr.strip()[-300:]}")


SOCKET_DEFAULTS = (Path("/proc/sys/net/core/rmem_default"), Path("/proc/sys/net/core/wmem_default"))


@contextlib.contextmanager
def raised_socket_buffers(n_bytes: int) -> Iterator[None]:
    """Raise the default socket receive and send buffers while the block runs, then restore them.
    (Written in the root namespace; net.core.rmem_default and wmem_default are not per namespace here:
    a namespace reads the root's and may not write them, so the switches' namespaces get them too.)

    Open vSwitch's userspace datapath receives and sends every port's packets on an AF_PACKET socket
    created with the default buffers (net.core.rmem_default / wmem_default, 208 KB). Receiving: when
    ovs-vswitchd is starved of CPU for longer than ~40 ms of a 4 kpps probe, packets are dropped there,
    before the datapath sees them (measured: a probe under load lost 489-2221 of 24,000 packets with the
    default, 0 with 8 MB). Sending: packets waiting in a port's HTB queue still count against the
    socket's send buffer, so with the default only ~140 full-size frames can queue at a switch port
    and OVS drops the rest ("error sending Ethernet packet: Resource temporarily unavailable"); an
    all-to-all's incast then loses packets to TCP timeouts (measured: 127 timeouts per host, a 3 s
    all-to-all taking 35 s). With larger buffers a port queues up to its qdisc's own limit (1000
    frames), like a switch buffer. Sockets keep the sizes they were created with, so raising the
    defaults only while the switches' ports are added is enough."""
    saved: list[tuple[Path, str]] = []
    try:
        for path in SOCKET_DEFAULTS:
            try:
                old = path.read_text().strip()
            except OSError:
                continue
            saved.append((path, old))
            if int(old) < n_bytes:
                path.write_text(str(n_bytes))
        yield
    finally:
        for path, old in saved:
            path.write_text(old)


def emulation_blocker() -> str | None:
    """Why the emulation cannot run on this machine now (root, Open vSwitch, Mininet), or None."""
    if os.geteuid() != 0:
        return "the emulation needs root (run with sudo)"
    try:
        check_ovs()
    except EmulationError as e:
        return str(e)
    if importlib.util.find_spec("mininet") is None:
        return "Mininet is not importable (use the .venv made by scripts/setup.sh)"
    return None


_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def netns_socket(ns_path: str) -> socket.socket:
    """A datagram socket in the network namespace at `ns_path` (`/var/run/netns/NAME` or
    `/proc/PID/ns/net`), made in a short-lived thread that enters the namespace (setns moves only the
    calling thread), so this process stays where it is. Interface ioctls on it act in that namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    failed: list[str] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(ns_path, os.O_RDONLY)
        except OSError as e:
            failed.append(f"{ns_path}: {e.strerror}")
            return
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                failed.append(f"setns {ns_path}: {os.strerror(ctypes.get_errno())}")
                return
            made.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        finally:
            os.close(fd)

    worker = threading.Thread(target=enter_and_make, name="netns-socket")
    worker.start()
    worker.join()
    if failed:
        raise EmulationError(f"cannot enter network namespace {failed[0]}")
    return made[0]


def set_link_up(sock: socket.socket, intf: str, up: bool) -> None:
    """Set interface `intf` administratively up or down in the namespace of `sock` (one ioctl)."""
    name = intf.encode()
    try:
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack("16sH", name, 0)))[1]
        flags = (flags | _IFF_UP) if up else (flags & ~_IFF_UP)
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", name, flags))
    except OSError as e:
        raise EmulationError(f"setting {intf} {'up' if up else 'down'} failed: {e.strerror}") from None
