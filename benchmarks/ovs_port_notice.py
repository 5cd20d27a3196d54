"""How soon userspace OVS reports a port that went down, against how many bridges and ports it runs
(needs root and OVS; no Mininet, no controller).

    sudo .venv/bin/python benchmarks/ovs_port_notice.py [--bridges 1 8 24] [--pairs 4] [--trials 20]

The failover benchmark (`benchmarks/failover.py`) finds the fabric's outage set by when OVS notices a
port down: ~17-20 ms after it went down on the 24 switches of dual-plane-16, against 3-9 ms measured
with one bridge (`../shared/PLATFORM.md`). This isolates that: for each count N, N userspace
(`netdev`) bridges `fpn0..` are made, each with `--pairs` veth pairs whose two ends are both its
ports (the port count of a fabric's switch, no traffic), and `ovs-ofctl monitor` watches bridge 0
for port-status messages. Each trial takes one end of bridge 0's first pair down with an ioctl
(SIOCSIFFLAGS: no process start between the timestamp and the change) and times the first
port-status message that reports a port without link (the end set down, or its peer losing
carrier), then brings the end up again and waits for its port-status before the next trial.
Printed per N: min / median / max ms and the trials that saw no message within `--timeout-s`.
Everything made is removed at the end, also after an error or Ctrl-C.
"""
from __future__ import annotations

import argparse
import fcntl
import queue
import socket
import statistics
import struct
import subprocess
import threading
import time
from typing import IO

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PREFIX = "fpn"


def set_link(name: str, up: bool) -> float:
    """Set interface `name` administratively up or down; returns the monotonic time just before."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", name.encode(), 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        flags = (flags | IFF_UP) if up else (flags & ~IFF_UP)
        t = time.monotonic()
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", name.encode(), flags))
        return t


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


def build(n_bridges: int, pairs: int) -> list[str]:
    """N netdev bridges with `pairs` veth pairs each (both ends on the bridge); returns the bridges."""
    bridges = [f"{PREFIX}{b}" for b in range(n_bridges)]
    for br in bridges:
        sh("ovs-vsctl", "--may-exist", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
           "protocols=OpenFlow13", "fail_mode=secure")
        for p in range(pairs):
            a, z = f"{br}a{p}", f"{br}z{p}"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", z)
            for end in (a, z):
                sh("ip", "link", "set", end, "up")
                sh("ovs-vsctl", "add-port", br, end)
    return bridges


def remove() -> None:
    """Every bridge and veth this script makes (by its prefix), whatever a run left."""
    out = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split()
    for br in out:
        if br.startswith(PREFIX) and br[len(PREFIX):].isdigit():
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", br], capture_output=True)
    links = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX) and "a" in name[len(PREFIX):]:
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def reader(stream: IO[str], out: queue.Queue[tuple[float, str]]) -> None:
    for line in stream:
        out.put((time.monotonic(), line))


def wait_for(lines: queue.Queue[tuple[float, str]], port_down: bool, timeout_s: float) -> float | None:
    """The time of the next port-status line saying a port is without link (or with it again)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            t, line = lines.get(timeout=left)
        except queue.Empty:
            return None
        if line.strip().startswith("state:") and ("LINK_DOWN" in line) == port_down:
            return t  # a port-status message's state line (the message's lines come in one write)
    return None


def measure(n_bridges: int, pairs: int, trials: int, timeout_s: float) -> tuple[list[float], int]:
    remove()
    build(n_bridges, pairs)
    mon = subprocess.Popen(["stdbuf", "-oL", "ovs-ofctl", "-O", "OpenFlow13", "monitor", f"{PREFIX}0", "128"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    # (the miss length asks OVS for asynchronous messages: a service connection gets none without it)
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    assert mon.stdout is not None
    threading.Thread(target=reader, args=(mon.stdout, lines), daemon=True).start()
    try:
        time.sleep(1.0)  # the monitor connected; OVS has settled the new ports
        end, times, missed = f"{PREFIX}0a0", [], 0
        for _ in range(trials):
            while not lines.empty():
                lines.get()
            t0 = set_link(end, up=False)
            seen = wait_for(lines, True, timeout_s)
            if seen is None:
                missed += 1
            else:
                times.append((seen - t0) * 1000)
            time.sleep(0.05)
            set_link(end, up=True)
            wait_for(lines, False, timeout_s)
            time.sleep(0.2)
        return times, missed
    finally:
        mon.terminate()
        mon.wait(timeout=5)
        remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bridges", type=int, nargs="+", default=[1, 8, 24])
    ap.add_argument("--pairs", type=int, default=4, help="veth pairs per bridge (2 ports each)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=1.0)
    args = ap.parse_args()
    if min(args.bridges) < 1 or args.pairs < 1 or args.trials < 1:
        ap.error("--bridges, --pairs and --trials must be >= 1")
    print(f"{'bridges':>8}{'ports':>7}{'trials':>8}{'min ms':>9}{'median ms':>11}{'max ms':>9}{'missed':>8}")
    try:
        for n in args.bridges:
            times, missed = measure(n, args.pairs, args.trials, args.timeout_s)
            if times:
                print(f"{n:>8}{n * 2 * args.pairs:>7}{len(times):>8}{min(times):>9.1f}"
                      f"{statistics.median(times):>11.1f}{max(times):>9.1f}{missed:>8}", flush=True)
            else:
                print(f"{n:>8}{n * 2 * args.pairs:>7}{0:>8}{'-':>9}{'-':>11}{'-':>9}{missed:>8}", flush=True)
    finally:
        remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
