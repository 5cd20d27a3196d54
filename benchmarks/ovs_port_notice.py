"""How soon userspace OVS reports a port that went down, against how many bridges and ports it runs
(needs root and OVS; no Mininet, no controller).

    sudo .venv/bin/python benchmarks/ovs_port_notice.py [--bridges 1 8 24] [--pairs 4] [--trials 20]

The failover benchmark (`benchmarks/failover.py`) finds the fabric's outage set by when OVS notices a
port down: ~17-20 ms after it went down on the 24 switches of dual-plane-16, against 3-9 ms measured
with one bridge (measured on the development machine). This isolates that: for each count N, N userspace
(`netdev`) bridges `fpn0..` are made, each with `--pairs` veth pairs whose two ends are both its
ports (the port count of a fabric's switch, no traffic), and `ovs-ofctl monitor` watches bridge 0
for port-status messages. Each trial takes one end of bridge 0's first pair down with an ioctl
(SIOCSIFFLAGS: no process start between the timestamp and the change) and times the first
port-status message that reports a port without link (the end set down, or its peer losing
carrier), then brings the end up again and waits for its port-status before the next trial.
Printed per N: min / median / max ms and the trials that saw no message within `--timeout-s`.
Then, on the same bridges, two things that say where the time goes: how many times ovs-vswitchd
reconfigured its bridges (its `bridge_reconfigure` coverage counter, read after it has settled)
for one port going down, and how long a reconfigure takes with no link event: `ovs-vsctl set
Open_vSwitch . other_config:fabriclab-probe=N` returns once ovs-vswitchd has applied it (median of
15, the ovs-vsctl process included; the key is removed after).
`--ipv6 off` turns IPv6 off on the veth ends, as the emulation does on its switch ports: a port
going down or up then adds or removes no link-local address. With `--perf-flaps K` (needs `perf`), ovs-vswitchd is also profiled (`perf record -g`) while the
end goes down and up K times on the largest N, and the symbols with the most CPU, callees included,
are printed: what it does on a link event.
Everything made is removed at the end, also after an error or Ctrl-C.
"""
from __future__ import annotations

import argparse
import queue
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from typing import IO

from fabric.emulation.plan import disable_ipv6_path
from fabric.emulation.system import set_link_up

PREFIX = "fpn"


def set_link(name: str, up: bool) -> float:
    """Set interface `name` administratively up or down; returns the monotonic time just before."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        t = time.monotonic()
        set_link_up(s, name, up)
        return t


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


def build(n_bridges: int, pairs: int, ipv6: bool = True) -> list[str]:
    """N netdev bridges with `pairs` veth pairs each (both ends on the bridge), IPv6 on the ends
    or not (the emulation turns it off on switch ports); returns the bridges."""
    bridges = [f"{PREFIX}{b}" for b in range(n_bridges)]
    for br in bridges:
        sh("ovs-vsctl", "--may-exist", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
           "protocols=OpenFlow13", "fail_mode=secure")
        for p in range(pairs):
            a, z = f"{br}a{p}", f"{br}z{p}"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", z)
            for end in (a, z):
                if not ipv6:
                    disable_ipv6_path(end).write_text("1\n")
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


def measure(n_bridges: int, pairs: int, trials: int, timeout_s: float, ipv6: bool) -> tuple[list[float], int, int, float]:
    remove()
    build(n_bridges, pairs, ipv6)
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
        return (times, missed, *reconfigure_cost())
    finally:
        mon.terminate()
        mon.wait(timeout=5)
        remove()


def reconfigures() -> int:
    """ovs-vswitchd's `bridge_reconfigure` coverage counter (its total so far)."""
    out = subprocess.run(["ovs-appctl", "coverage/show"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        words = line.split()
        if words and words[0] == "bridge_reconfigure":
            return int(words[-1])
    return 0  # not counted yet


def reconfigure_cost(trials: int = 15) -> tuple[int, float]:
    """On the bridges built: the reconfigures one port going down causes, and the median ms of a
    reconfigure with no link event (an ovs-vsctl change that waits for ovs-vswitchd to apply it)."""
    end = f"{PREFIX}0a0"
    time.sleep(COVERAGE_SETTLE_S)
    before = reconfigures()
    set_link(end, up=False)
    time.sleep(COVERAGE_SETTLE_S)
    caused = reconfigures() - before
    set_link(end, up=True)
    times = []
    try:
        for n in range(trials):
            t0 = time.monotonic()
            sh("ovs-vsctl", "set", "Open_vSwitch", ".", f"other_config:fabriclab-probe={n}")
            times.append((time.monotonic() - t0) * 1000)
            time.sleep(0.05)
    finally:
        subprocess.run(["ovs-vsctl", "remove", "Open_vSwitch", ".", "other_config", "fabriclab-probe"],
                       capture_output=True)
    return caused, statistics.median(times)


# ovs-vswitchd folds its coverage counters into the totals it shows about once a second
COVERAGE_SETTLE_S = 1.5


def profile_flaps(flaps: int, top: int = 40) -> str:
    """`perf record -g` of ovs-vswitchd while bridge 0's first end goes down and up `flaps` times;
    returns perf's report of the symbols with the most CPU (callees included)."""
    pid = subprocess.run(["pidof", "ovs-vswitchd"], capture_output=True, text=True, check=True).stdout.split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data = f"{tmp}/perf.data"
        perf = subprocess.Popen(["perf", "record", "-g", "-F", "2000", "-p", pid, "-o", data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            for _ in range(flaps):
                set_link(f"{PREFIX}0a0", up=False)
                time.sleep(0.15)
                set_link(f"{PREFIX}0a0", up=True)
                time.sleep(0.15)
        finally:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=30)
        report = subprocess.run(["perf", "report", "-i", data, "--children", "--sort", "symbol", "--stdio"],
                                capture_output=True, text=True, check=True).stdout
    rows = [line for line in report.splitlines()
            if len(line.split()) > 2 and line.split()[0].endswith("%") and line.split()[1].endswith("%")]
    return "\n".join(rows[:top])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bridges", type=int, nargs="+", default=[1, 8, 24])
    ap.add_argument("--pairs", type=int, default=4, help="veth pairs per bridge (2 ports each)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=1.0)
    ap.add_argument("--ipv6", choices=["on", "off"], default="on",
                    help="IPv6 on the veth ends (the kernel's default) or off (as the emulation sets its switch ports)")
    ap.add_argument("--perf-flaps", type=int, default=0, help="profile ovs-vswitchd over this many flaps (0: no)")
    args = ap.parse_args()
    if min(args.bridges) < 1 or args.pairs < 1 or args.trials < 1:
        ap.error("--bridges, --pairs and --trials must be >= 1")
    print(f"{'bridges':>8}{'ports':>7}{'trials':>8}{'min ms':>9}{'median ms':>11}{'max ms':>9}{'missed':>8}"
          f"{'reconfigures per port down':>28}{'reconfigure ms (no link event)':>32}")
    try:
        for n in args.bridges:
            times, missed, caused, reconf_ms = measure(n, args.pairs, args.trials, args.timeout_s, args.ipv6 == "on")
            cells = (f"{min(times):>9.1f}{statistics.median(times):>11.1f}{max(times):>9.1f}" if times
                     else f"{'-':>9}{'-':>11}{'-':>9}")
            print(f"{n:>8}{n * 2 * args.pairs:>7}{len(times):>8}{cells}{missed:>8}{caused:>28}{reconf_ms:>32.1f}",
                  flush=True)
        if args.perf_flaps > 0:
            n = max(args.bridges)
            remove()
            build(n, args.pairs, args.ipv6 == "on")
            time.sleep(1.0)
            print(f"\novs-vswitchd over {args.perf_flaps} down/up flaps on {n} bridges ({n * 2 * args.pairs} ports), "
                  f"perf: CPU share with callees, own share, symbol")
            print(profile_flaps(args.perf_flaps), flush=True)
    finally:
        remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
