"""The Mininet adapter: a `Fabric` as a real packet network of Open vSwitch switches.

This is the only module that imports Mininet. It computes what to build from the model (names,
ports, rates, addresses, ARP entries) and then builds it:

- switches: OVS, OpenFlow 1.3 (and 1.5), fail-mode secure, the model's dpid, the model's port numbers;
  kernel datapath where the `openvswitch` module is loaded, userspace (`netdev`) otherwise (probed);
- links: HTB-shaped at `rate_gbps x mbps_per_gbps` Mbit/s (one scale factor for the whole fabric);
- hosts: one interface per NIC port (`h0-eth0` in plane A, `h0-eth1` in plane B), the model's
  address and MAC, offloads off (the userspace datapath drops TSO/GSO super-frames), IPv6 off,
  static ARP for every NIC in the same plane, no default route;
- teardown that leaves no bridge, veth or process of the run behind, checked by `leftovers()`.

Link delay or loss needs the kernel's `sch_netem`; asking for it where netem is missing raises
`UnsupportedError` rather than silently running without it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from fabric.errors import EmulationError, UnsupportedError
from fabric.model import Fabric, NicPort, intf_name

#: Mininet's HTB wrapper ignores rates above this (with only a log line); we refuse them instead.
MAX_LINK_MBPS = 1000.0
#: Below this HTB's burst dominates and rates stop meaning anything.
MIN_LINK_MBPS = 0.1


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


@dataclass(frozen=True)
class EmulationOptions:
    """How the model's real rates map onto the emulator.

    mbps_per_gbps: emulated Mbit/s per real Gbit/s (0.1: a 200G NIC runs at 20 Mbit/s).
    datapath: 'auto' (probe), 'kernel' or 'user'.
    delay_us, loss_pct: per-link delay and random loss; need sch_netem.
    """

    mbps_per_gbps: float = 0.1
    datapath: str = "auto"
    delay_us: float = 0.0
    loss_pct: float = 0.0
    protocols: str = "OpenFlow13,OpenFlow15"


def link_mbps(rate_gbps: float, opts: EmulationOptions) -> float:
    return rate_gbps * opts.mbps_per_gbps


def check_options(fabric: Fabric, opts: EmulationOptions) -> None:
    """Refuse what this machine cannot emulate faithfully, naming the problem."""
    if opts.datapath not in ("auto", "kernel", "user"):
        raise UnsupportedError(f"datapath must be auto, kernel or user, got {opts.datapath!r}")
    if not opts.mbps_per_gbps > 0:
        raise UnsupportedError(f"mbps_per_gbps must be > 0, got {opts.mbps_per_gbps}")
    for link in fabric.links:
        mbps = link_mbps(link.rate_gbps, opts)
        if not MIN_LINK_MBPS <= mbps <= MAX_LINK_MBPS:
            raise UnsupportedError(
                f"link {link.label()}: {link.rate_gbps:g} Gbit/s x {opts.mbps_per_gbps:g} = {mbps:g} Mbit/s "
                f"is outside what HTB emulates faithfully ({MIN_LINK_MBPS:g}..{MAX_LINK_MBPS:g} Mbit/s); "
                "change mbps_per_gbps"
            )
    if opts.delay_us < 0 or not 0 <= opts.loss_pct <= 100:
        raise UnsupportedError(f"delay_us must be >= 0 and loss_pct in [0, 100], got {opts.delay_us}, {opts.loss_pct}")
    if (opts.delay_us > 0 or opts.loss_pct > 0) and not kernel_module_loaded("sch_netem"):
        raise UnsupportedError(
            "link delay/loss needs the sch_netem qdisc, which this kernel does not have "
            f"(asked for delay_us={opts.delay_us:g}, loss_pct={opts.loss_pct:g})"
        )


# ---- what to build (pure) ----------------------------------------------------------------------
def arp_batch(fabric: Fabric, host: str) -> str:
    """`ip -batch` input installing permanent ARP entries for every other NIC in the host's planes."""
    lines = []
    for mine in fabric.nics_of[host]:
        for other in fabric.nic_ports:
            if other.plane == mine.plane and other.host != host:
                lines.append(f"neigh replace {other.ip} lladdr {other.mac} dev {mine.intf} nud permanent")
    return "\n".join(lines) + "\n"


def tc_batch(fabric: Fabric, opts: EmulationOptions, host: str | None) -> str:
    """`tc -batch` input shaping the egress of `host`'s interfaces, or (host None) of every switch
    port: HTB at the link's emulated rate, and netem under it when delay or loss is asked for."""
    lines = []
    for link in fabric.links:
        for end in (link.a, link.b):
            ours = end.node == host if host is not None else end.node in fabric.switch_by_name
            if not ours:
                continue
            dev = intf_name(end.node, end.port)
            mbps = link_mbps(link.rate_gbps, opts)
            lines.append(f"qdisc replace dev {dev} root handle 5: htb default 1")
            lines.append(f"class add dev {dev} parent 5: classid 5:1 htb rate {mbps:g}mbit burst 15k quantum 1514")
            if opts.delay_us > 0 or opts.loss_pct > 0:
                netem = f"delay {opts.delay_us:g}us " if opts.delay_us > 0 else ""
                netem += f"loss {opts.loss_pct:g}%" if opts.loss_pct > 0 else ""
                lines.append(f"qdisc add dev {dev} parent 5:1 handle 10: netem {netem.strip()}")
    return "\n".join(lines) + "\n"


def expected_names(fabric: Fabric) -> tuple[set[str], set[str]]:
    """(OVS bridge names, root-namespace interface names) that a run of this fabric creates."""
    bridges = {s.name for s in fabric.switches}
    intfs = set(bridges)
    for link in fabric.links:
        for end in (link.a, link.b):
            if end.node in fabric.switch_by_name:
                intfs.add(intf_name(end.node, end.port))
    return bridges, intfs


# ---- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PingPair:
    src: str
    dst_ip: str
    sent: int
    received: int


@dataclass
class Leftovers:
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.bridges or self.interfaces or self.pids)


_FPING_LINE = re.compile(r"^(\S+)\s+:\s+xmt/rcv/%loss = (\d+)/(\d+)/")


def parse_fping(src: str, text: str) -> list[PingPair]:
    """Parse `fping -q -c N` summary lines."""
    out = []
    for line in text.splitlines():
        m = _FPING_LINE.match(line.strip())
        if m:
            out.append(PingPair(src, m.group(1), int(m.group(2)), int(m.group(3))))
    return out


# ---- the adapter -------------------------------------------------------------------------------
class Emulation:
    """A running emulated fabric. Use as a context manager; `stop()` is idempotent.

    The controller must already listen on 127.0.0.1:`controller_port` (start it first: OVS backs
    off reconnecting to a controller that is not there yet).
    """

    def __init__(self, fabric: Fabric, controller_port: int, opts: EmulationOptions | None = None) -> None:
        self.fabric = fabric
        self.opts = opts or EmulationOptions()
        self.controller_port = controller_port
        self.net: Any = None
        self.datapath = ""
        self._pids: list[int] = []

    # -- lifecycle --
    def start(self) -> "Emulation":
        if os.geteuid() != 0:
            raise EmulationError("the emulation needs root (Mininet and Open vSwitch); run with sudo")
        check_options(self.fabric, self.opts)
        self.datapath = probe_datapath() if self.opts.datapath == "auto" else self.opts.datapath
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        # Mininet logs HTB quantum warnings as errors; outcomes are checked by us instead.
        setLogLevel(os.environ.get("FABRICLAB_MININET_LOG", "critical"))
        _check_ovs()
        self._check_no_clash()
        switch_cls = partial(
            OVSSwitch,
            datapath=self.datapath,
            protocols=self.opts.protocols,
            failMode="secure",
            reconnectms=1000,  # OVS's minimum max_backoff
            batch=True,
        )
        class _Controller(RemoteController):  # type: ignore[misc, valid-type]
            def checkListening(self) -> None:
                """Mininet probes with `telnet`, whose output (the controller's binary OpenFlow
                hello) it then fails to decode; the lab has already checked the controller."""

        ctrl = partial(_Controller, ip="127.0.0.1", port=self.controller_port)
        self.net = Mininet(
            topo=None,
            switch=switch_cls,
            controller=ctrl,
            link=Link,
            ipBase="198.18.0.0/15",
            autoSetMacs=False,
            autoStaticArp=False,
            build=False,
            waitConnected=False,
        )
        try:
            self._build()
            self.net.start()
            missing = sorted({s.name for s in self.fabric.switches} - set(self._present(expected_names(self.fabric)[0], set()).bridges))
            if missing:
                raise EmulationError(f"Open vSwitch did not create bridges {missing[:5]} (see ovs-vswitchd.log)")
            self._configure_switch_ports()
            self._configure_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_no_clash(self) -> None:
        bridges, intfs = expected_names(self.fabric)
        clash = self._present(bridges, intfs)
        if not clash.empty():
            raise EmulationError(
                "names this fabric needs are already in use (another run, or leftovers of one): "
                f"bridges {clash.bridges[:5]}, interfaces {clash.interfaces[:5]}"
            )

    def _build(self) -> None:
        fab, net = self.fabric, self.net
        net.addController("c0")
        for sw in fab.switches:
            net.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        for host in fab.hosts:
            net.addHost(host.name, ip=None)
        nic_at = {(p.host, p.nic): p for p in fab.nic_ports}
        for link in fab.links:
            ends: list[tuple[Any, dict[str, str], str | None]] = []
            for end in (link.a, link.b):
                if end.node in fab.host_by_name:
                    nic = nic_at[(end.node, end.port)]
                    prefix = fab.plane_by_name[nic.plane].subnet.prefixlen
                    ends.append((end, {"ip": f"{nic.ip}/{prefix}"}, nic.mac))
                else:
                    ends.append((end, {}, None))
            (ea, pa, ma), (eb, pb, mb) = ends
            # Mininet sets a veth address only when both ends get one: give the switch end a
            # derived locally administered MAC (switch ports never source IP traffic).
            ma = ma or _port_mac(fab.switch_by_name[ea.node].dpid, ea.port)
            mb = mb or _port_mac(fab.switch_by_name[eb.node].dpid, eb.port)
            net.addLink(
                ea.node,
                eb.node,
                port1=ea.port,
                port2=eb.port,
                addr1=ma,
                addr2=mb,
                params1=pa,
                params2=pb,
            )
        net.build()
        self._pids = [n.pid for n in net.hosts + net.switches if getattr(n, "pid", None)]

    def _configure_switch_ports(self) -> None:
        """Shape every switch-side interface (root namespace) with one `tc -batch`; offloads off."""
        bridges, intfs = expected_names(self.fabric)
        with tempfile.NamedTemporaryFile("w", prefix="fabriclab-tc-", suffix=".batch") as f:
            f.write(tc_batch(self.fabric, self.opts, None))
            f.flush()
            res = subprocess.run(["tc", "-batch", f.name], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"shaping switch ports failed: {res.stderr.strip()[-300:]}")
        for intf in sorted(intfs - bridges):
            subprocess.run(["ethtool", "-K", intf, "tx", "off", "rx", "off", "tso", "off", "gso", "off",
                            "gro", "off"], capture_output=True, check=False)

    def _configure_hosts(self) -> None:
        with tempfile.TemporaryDirectory(prefix="fabriclab-arp-") as tmp:
            for host in self.fabric.hosts:
                node = self.net.get(host.name)
                # IPv6 off; no ICMP rate limit (the per-namespace default of a 50-message burst
                # drops echo replies when every host pings every other one at once)
                cmds = ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
                        "sysctl -qw net.ipv4.icmp_ratelimit=0 net.ipv4.icmp_msgs_per_sec=1000000 "
                        "net.ipv4.icmp_msgs_burst=1000000 2>/dev/null; true"]
                for nic in self.fabric.nics_of[host.name]:
                    cmds.append(f"ethtool -K {nic.intf} tx off rx off tso off gso off gro off 2>/dev/null")
                path = Path(tmp) / f"{host.name}.arp"
                path.write_text(arp_batch(self.fabric, host.name))
                shaping = Path(tmp) / f"{host.name}.tc"
                shaping.write_text(tc_batch(self.fabric, self.opts, host.name))
                cmds.append(f"ip -batch {path} && tc -batch {shaping}")
                out = node.cmd("; ".join(cmds) + "; echo rc=$?")
                if "rc=0" not in out:
                    raise EmulationError(f"configuring host {host.name} failed: {out.strip()[-300:]}")

    def stop(self) -> None:
        net, self.net = self.net, None
        if net is None:
            return
        try:
            # Every link has a switch end in the root namespace: deleting those ends removes each
            # veth pair, all in one `ip -batch` (Mininet would run one shell command per interface,
            # ~14 ms each). Mininet then only stops switches and hosts.
            bridges, intfs = expected_names(self.fabric)
            present = self._present(set(), intfs - bridges).interfaces
            if present:
                with tempfile.NamedTemporaryFile("w", prefix="fabriclab-links-", suffix=".batch") as f:
                    f.write("".join(f"link del dev {i}\n" for i in present))
                    f.flush()
                    subprocess.run(["ip", "-force", "-batch", f.name], capture_output=True, check=False)
                net.links = []
            net.stop()
        finally:
            # Mininet's stop is best effort; remove whatever of ours is still there.
            bridges, intfs = expected_names(self.fabric)
            rest = self._present(bridges, intfs)
            for br in rest.bridges:
                subprocess.run(["ovs-vsctl", "--if-exists", "del-br", br], capture_output=True, check=False)
            for intf in rest.interfaces:
                subprocess.run(["ip", "link", "del", intf], capture_output=True, check=False)
            for pid in rest.pids:
                _kill(pid)

    def __enter__(self) -> "Emulation":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- checks --
    def _present(self, bridges: set[str], intfs: set[str]) -> Leftovers:
        out = Leftovers()
        res = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True, check=False)
        out.bridges = sorted(set(res.stdout.split()) & bridges)
        res = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
        present = {line.split(":")[1].strip().split("@")[0] for line in res.stdout.splitlines() if ":" in line}
        out.interfaces = sorted(present & intfs)
        out.pids = [p for p in self._pids if _alive(p)]
        return out

    def leftovers(self) -> Leftovers:
        """What of this run still exists (bridges, root-namespace interfaces, host/switch processes)."""
        bridges, intfs = expected_names(self.fabric)
        return self._present(bridges, intfs)

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def node(self, name: str) -> Any:
        if self.net is None:
            raise EmulationError("the emulation is not running")
        return self.net.get(name)

    def set_link(self, node: str, port: int, up: bool) -> float:
        """Take the link at (`node`, `port`) down or up: both of its interfaces, switch ends first.
        Returns the wall-clock time just before the first interface changed."""
        peer = self.fabric.peer(node, port)
        ends = sorted([(node, port), (peer.node, peer.port)], key=lambda e: e[0] in self.fabric.host_by_name)
        state = "up" if up else "down"
        t = time.time()
        for n, p in ends:
            if n in self.fabric.switch_by_name:
                subprocess.run(["ip", "link", "set", "dev", intf_name(n, p), state], check=True)
            else:
                self.node(n).cmd(f"ip link set dev {intf_name(n, p)} {state}")
        return t

    def popen(self, host: str, args: list[str], **kwargs: Any) -> Any:
        """Start a process inside `host`'s network namespace (end it by its PID, via the handle)."""
        return self.node(host).popen(args, **kwargs)

    def interactive(self) -> None:
        """The Mininet CLI on the running fabric (returns when the user exits it)."""
        from mininet.cli import CLI

        if self.net is None:
            raise EmulationError("the emulation is not running")
        CLI(self.net)

    def wait_until(self, what: str, ready: Callable[[], bool], timeout_s: float) -> float:
        """Poll `ready()` until true; return seconds waited; raise EmulationError at the deadline."""
        t0 = time.monotonic()
        while not ready():
            if time.monotonic() - t0 > timeout_s:
                raise EmulationError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def ping_all(self, count: int = 3, planes: Iterable[str] | None = None,
                 only: set[tuple[str, str]] | None = None) -> list[PingPair]:
        """Every host pings every other host's NIC in each plane they share (fping, hosts in parallel);
        `only` restricts it to these (source host, destination address) pairs."""
        fab = self.fabric
        wanted = set(planes) if planes is not None else {p.name for p in fab.planes}
        nodes = []
        # Targets go in a file: a command line longer than 4 kB would be cut by the host's pty.
        with tempfile.TemporaryDirectory(prefix="fabriclab-ping-") as tmp:
            for host in fab.hosts:
                mine = {p.plane for p in fab.nics_of[host.name]}
                targets = [str(o.ip) for o in fab.nic_ports if o.host != host.name and o.plane in mine & wanted
                           and (only is None or (host.name, str(o.ip)) in only)]
                if not targets:
                    continue
                path = Path(tmp) / f"{host.name}.targets"
                path.write_text("\n".join(targets) + "\n")
                node = self.node(host.name)
                # pace every host so the whole fabric sends ~8k echo requests/s: the userspace
                # datapath drops bursts far above that (measured: 64 hosts at 1 ms lost ~25%)
                gap_ms = max(1, len(fab.hosts) // 8)
                period_ms = max(20, gap_ms * len(targets))
                node.sendCmd(f"fping -q -c {count} -p {period_ms} -i {gap_ms} -t 1000 -f {path} 2>&1")
                nodes.append((host.name, node))
            out: list[PingPair] = []
            for name, node in nodes:
                out.extend(parse_fping(name, node.waitOutput()))
        return out

    def iperf(self, src: str, dst: str, plane: str, seconds: float = 5.0, omit_s: float = 1.0,
              cport: int | None = None) -> float:
        """One TCP flow src -> dst over `plane` with iperf3; returns received Mbit/s."""
        return self.start_iperf(src, dst, plane, seconds, omit_s=omit_s, cport=cport).result().mbps

    def start_iperf(self, src: str, dst: str, plane: str, seconds: float, omit_s: float = 0.0,
                    cport: int | None = None, port: int = 5201, udp_mbps: float | None = None) -> "IperfRun":
        """Start an iperf3 flow src -> dst over `plane` (TCP, or UDP at `udp_mbps`) from client port
        `cport` (which fixes its ECMP path); call `.result()` for per-second and total figures."""
        s_nic: NicPort = self.fabric.nic(src, plane)
        d_nic: NicPort = self.fabric.nic(dst, plane)
        server = self.node(dst).popen(["iperf3", "-s", "-1", "-B", str(d_nic.ip), "-p", str(port)])
        deadline = time.monotonic() + 5
        while f":{port} " not in self.node(dst).cmd(f"ss -ltnH 'sport = :{port}'"):
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise EmulationError(f"iperf3 server on {dst}:{port} did not start")
            time.sleep(0.05)
        cmd = ["iperf3", "-c", str(d_nic.ip), "-B", str(s_nic.ip), "-p", str(port), "-t", f"{seconds:g}",
               "-O", f"{omit_s:g}", "-J", "-i", "0.5"]
        if cport is not None:
            cmd += ["--cport", str(cport)]
        if udp_mbps is not None:
            cmd += ["-u", "-b", f"{udp_mbps:g}M"]
        client = self.node(src).popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return IperfRun(f"{src} -> {dst}", client, server)


@dataclass
class IperfResult:
    mbps: float  # received, over the whole run (after the omitted start)
    intervals: list[tuple[float, float]]  # (end time s, Mbit/s) per reporting interval


class IperfRun:
    def __init__(self, label: str, client: Any, server: Any) -> None:
        self.label, self.client, self.server = label, client, server

    def result(self, timeout_s: float = 120.0) -> IperfResult:
        try:
            out, _ = self.client.communicate(timeout=timeout_s)
        finally:
            if self.server.poll() is None:
                self.server.terminate()
            self.server.wait(timeout=5)
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        try:
            data = json.loads(text[text.index("{"):])
            end = data["end"]
            total = end.get("sum_received") or end["sum"]
            intervals = [(float(i["sum"]["end"]), float(i["sum"]["bits_per_second"]) / 1e6)
                         for i in data["intervals"] if not i["sum"].get("omitted")]
            return IperfResult(float(total["bits_per_second"]) / 1e6, intervals)
        except (ValueError, KeyError) as e:
            raise EmulationError(f"iperf3 {self.label} gave no result: {text.strip()[-300:]}") from e

    def stop(self) -> None:
        for p in (self.client, self.server):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)


def _port_mac(dpid: int, port: int) -> str:
    return f"06:fb:{(dpid >> 8) & 0xFF:02x}:{dpid & 0xFF:02x}:{(port >> 8) & 0xFF:02x}:{port & 0xFF:02x}"


def _check_ovs() -> None:
    res = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise EmulationError(
            "Open vSwitch is not running (ovs-vsctl show failed: "
            f"{res.stderr.strip()}); run scripts/setup.sh to start ovsdb-server and ovs-vswitchd"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
