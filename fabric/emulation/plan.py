"""What to build, computed from the model (pure; unit-tested without root).

- `EmulationOptions` and `check_options`: how real rates map onto the emulator, which links a tunnel
  carries (`fabric.emulation.tunnels`), and what this machine cannot emulate faithfully (refused with
  the reason, before anything is built);
- switches: each bridge as one `ovs-vsctl` transaction (`bridge_vsctl_args`), switch-port MACs;
- batches: `tc -batch` input shaping links with HTB, `ip -batch` input installing static ARP,
  and the per-host set-up commands (offloads off, IPv6 off, no ICMP rate limit).

The Mininet adapter (`fabric.emulation.net`) only runs what is computed here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet

from fabric.emulation import tunnels
from fabric.errors import EmulationError, UnsupportedError
from fabric.limits import HTB_BURST_BYTES
from fabric.model import Fabric, intf_name

#: Mininet's HTB wrapper ignores rates above this (with only a log line); we refuse them instead.
MAX_LINK_MBPS = 1000.0
#: Below this HTB's burst dominates and rates stop meaning anything.
MIN_LINK_MBPS = 0.1
#: Switch-port MACs carry the switch's position in 24 bits and the port in 16 bits.
MAX_SWITCHES = 1 << 24
MAX_PORT = (1 << 16) - 1

#: Offloads off: the userspace datapath drops TSO/GSO super-frames (docs/emulation.md).
OFFLOADS_OFF = ("tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off")


def disable_ipv6_path(intf: str) -> Path:
    """The root namespace's IPv6 switch for interface `intf` (write 1: no IPv6 on it)."""
    return Path("/proc/sys/net/ipv6/conf") / intf / "disable_ipv6"


@dataclass(frozen=True)
class EmulationOptions:
    """How the model's real rates map onto the emulator.

    mbps_per_gbps: emulated Mbit/s per real Gbit/s (0.1: a 200G NIC runs at 20 Mbit/s).
    datapath: 'auto' (probe), 'kernel' or 'user'.
    delay_us, loss_pct: per-link delay and random loss; need sch_netem.
    tunnel_links: switch-to-switch links (pairs of switch names) carried by a tunnel between two
    stand-in servers instead of a veth pair (`fabric.emulation.tunnels`, docs/cluster.md);
    tunnel_kind: 'vxlan' or 'gre'.
    """

    mbps_per_gbps: float = 0.1
    datapath: str = "auto"
    delay_us: float = 0.0
    loss_pct: float = 0.0
    protocols: str = "OpenFlow13,OpenFlow15"
    tunnel_links: tuple[tuple[str, str], ...] = ()
    tunnel_kind: str = "vxlan"


def link_mbps(rate_gbps: float, opts: EmulationOptions) -> float:
    return rate_gbps * opts.mbps_per_gbps


def check_options(fabric: Fabric, opts: EmulationOptions, *, has_netem: bool,
                  tunnel_kinds: AbstractSet[str] = frozenset(tunnels.TUNNEL_KINDS)) -> None:
    """Refuse what this machine cannot emulate faithfully, naming the problem. `tunnel_kinds`: the
    tunnels this kernel has (`fabric.emulation.system.tunnel_kinds`)."""
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
    if (opts.delay_us > 0 or opts.loss_pct > 0) and not has_netem:
        raise UnsupportedError(
            "link delay/loss needs the sch_netem qdisc, which this kernel does not have "
            f"(asked for delay_us={opts.delay_us:g}, loss_pct={opts.loss_pct:g})"
        )
    if len(fabric.switches) > MAX_SWITCHES:
        raise UnsupportedError(f"{len(fabric.switches)} switches exceed the {MAX_SWITCHES} the MAC plan numbers")
    for link in fabric.links:
        for end in (link.a, link.b):
            if end.port > MAX_PORT:
                raise UnsupportedError(f"{end.node} port {end.port} exceeds {MAX_PORT}")
    tunnels.check_tunnels(fabric, opts.tunnel_links, opts.tunnel_kind, tunnel_kinds)


def port_mac(switch_index: int, port: int) -> str:
    """Locally administered MAC of a switch port: 06, then the switch's position in the model
    (24 bits) and the port (16 bits); unique for every switch port of a fabric. (Host NICs use 02:fb:...,
    `fabric.model.host_mac`, so the two never meet.)"""
    if not 0 <= switch_index < MAX_SWITCHES or not 0 <= port <= MAX_PORT:
        raise UnsupportedError(f"switch index {switch_index} / port {port} out of the MAC plan's range")
    b = [(switch_index >> 16) & 0xFF, (switch_index >> 8) & 0xFF, switch_index & 0xFF, (port >> 8) & 0xFF, port & 0xFF]
    return "06:" + ":".join(f"{x:02x}" for x in b)


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
            lines.append(f"class add dev {dev} parent 5: classid 5:1 htb rate {mbps:g}mbit burst {HTB_BURST_BYTES // 1024}k quantum 1514")
            if opts.delay_us > 0 or opts.loss_pct > 0:
                netem = f"delay {opts.delay_us:g}us " if opts.delay_us > 0 else ""
                netem += f"loss {opts.loss_pct:g}%" if opts.loss_pct > 0 else ""
                lines.append(f"qdisc add dev {dev} parent 5:1 handle 10: netem {netem.strip()}")
    return "\n".join(lines) + "\n"


#: Random loss on a link (this kernel has neither netem nor gact): a classic-BPF classifier on the
#: egress clsact hook, `ld rand` (SKF_AD_OFF + SKF_AD_RANDOM, a 32-bit random number), `jge #K`,
#: matching (return -1) when rand >= K, and a `mirred` action that redirects what matches into a
#: sink, a veth pair of its own whose far end takes it nowhere. Dropping there (TC_ACT_SHOT) would fail
#: the sender's send: the userspace datapath sends a batch of frames in one `sendmmsg`, which stops at
#: the failed one, and the rest of the batch is lost with it (measured: a link set to lose 30% lost
#: 51% of a 4 kpps probe). Redirected, the send succeeds and each frame's loss is its own.
_BPF_LD_RAND = "32 0 0 4294963256"
_BPF_MATCH = 0xFFFFFFFF
_BPF_NO_MATCH = 0


def loss_bytecode(loss: float) -> str:
    """`tc ... bpf bytecode` text matching each packet with probability `loss` (0 < loss <= 1)."""
    if not 0 < loss <= 1:
        raise EmulationError(f"a link's loss must be in (0, 1], got {loss!r}")
    threshold = min(round((1 - loss) * 2**32), 2**32 - 1)
    return f"4,{_BPF_LD_RAND},53 0 1 {threshold},6 0 0 {_BPF_MATCH},6 0 0 {_BPF_NO_MATCH}"


def gray_sink_names(fabric: Fabric) -> tuple[str, str]:
    """The veth pair a lossy link's dropped packets are redirected into, made inside the namespace of
    each node (switch or host) with a lossy end."""
    base = fabric.switches[0].name[:9] if fabric.switches else "fabriclab"
    return f"{base}-gs0", f"{base}-gs1"


def sink_commands(sink: tuple[str, str]) -> list[list[str]]:
    """Command lines creating the sink (both ends up, no address: what reaches the far end is dropped)."""
    return [["ip", "link", "add", sink[0], "type", "veth", "peer", "name", sink[1]],
            ["ip", "link", "set", sink[0], "up"], ["ip", "link", "set", sink[1], "up"]]


def gray_commands(dev: str, mbps: float, loss: float, had_loss: bool, sink: str) -> list[list[str]]:
    """`tc` command lines setting the egress of `dev` (shaped by `tc_batch`) to `mbps` and a random
    `loss` redirected into `sink` (0: none; the clsact hook, if `had_loss`, is removed)."""
    if not mbps > 0:
        raise EmulationError(f"a degraded link needs a rate > 0 Mbit/s, got {mbps!r}")
    cmds = [["tc", "class", "change", "dev", dev, "parent", "5:", "classid", "5:1", "htb", "rate", f"{mbps:g}mbit",
             "burst", f"{HTB_BURST_BYTES // 1024}k", "quantum", "1514"]]
    if loss > 0:
        cmds.append(["tc", "qdisc", "replace", "dev", dev, "clsact"])
        cmds.append(["tc", "filter", "replace", "dev", dev, "egress", "pref", "1", "handle", "1", "bpf",
                     "bytecode", loss_bytecode(loss), "action", "mirred", "egress", "redirect", "dev", sink])
    elif had_loss:
        cmds.append(["tc", "qdisc", "del", "dev", dev, "clsact"])
    return cmds


#: TCP's minimum retransmission timeout on the emulated hosts' routes. Emulated links run ~10^5 times
#: slower than real ones, so queueing delays of hundreds of ms are normal there; with Linux's 200 ms
#: default, a connection that was idle (its RTT estimate from an empty network) fires spurious timeouts
#: and retransmits whole windows (measured: an all-to-all of 16 hosts, 34 timeouts per host, 2.6x
#: slower; with 1 s, 4 timeouts).
TCP_RTO_MIN_MS = 1000


def host_setup_commands(fabric: Fabric, host: str, arp_file: str, tc_file: str) -> list[str]:
    """Shell commands run inside a host's namespace: IPv6 off; no ICMP rate limit (the per-namespace
    default of a 50-message burst drops echo replies when every host pings every other one at
    once); TCP keeps its window across idle periods (a collective library's connections are
    persistent) and waits at least TCP_RTO_MIN_MS before a retransmission timeout; routes over a NIC
    that lost carrier (its switch port or whole plane down) are ignored, so a send there fails at once
    (ENETUNREACH) and a multi-homed sender can move to its other plane, instead of queueing into a
    dead link; offloads off on every NIC; static ARP; HTB on its NICs."""
    cmds = ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
            "sysctl -qw net.ipv4.conf.all.ignore_routes_with_linkdown=1 "
            "net.ipv4.conf.default.ignore_routes_with_linkdown=1",
            "sysctl -qw net.ipv4.icmp_ratelimit=0 net.ipv4.icmp_msgs_per_sec=1000000 "
            "net.ipv4.icmp_msgs_burst=1000000 2>/dev/null; true",
            "sysctl -qw net.ipv4.tcp_slow_start_after_idle=0"]
    for nic in fabric.nics_of[host]:
        cmds.append(f"ethtool -K {nic.intf} {' '.join(OFFLOADS_OFF)} 2>/dev/null")
        net = fabric.plane_by_name[nic.plane].subnet
        cmds.append(f"ip route replace {net} dev {nic.intf} proto kernel scope link src {nic.ip} "
                    f"rto_min {TCP_RTO_MIN_MS}ms")
    cmds.append(f"ip -batch {arp_file} && tc -batch {tc_file}")
    return cmds


def switch_setup_commands(fabric: Fabric, switch: str, tc_file: str) -> list[str]:
    """Shell commands run inside a switch's namespace (made with IPv6 off): offloads off on every
    port; HTB on every port."""
    cmds = [f"ethtool -K {dev} {' '.join(OFFLOADS_OFF)} 2>/dev/null" for dev in switch_interfaces(fabric, {switch})]
    cmds.append(f"tc -batch {tc_file}")
    return cmds


def bridge_vsctl_args(fabric: Fabric, switch: str, datapath: str, protocols: str, controller: str) -> list[str]:
    """`ovs-vsctl` arguments making `switch`'s bridge in one transaction: the model's dpid and port
    numbers, fail-mode secure, no in-band control, `controller` (an OVS target, e.g. unix:PATH) with
    a 1 s reconnect back-off (OVS's minimum)."""
    sw = fabric.switch_by_name[switch]
    dp_type = "netdev" if datapath == "user" else "system"
    args = ["--", "--id=@c", "create", "Controller", f'target="{controller}"', "max_backoff=1000",
            "--", "add-br", switch,
            "--", "set", "Bridge", switch, "controller=[@c]", f"datapath_type={dp_type}", f"protocols={protocols}",
            "fail_mode=secure", f"other_config:datapath-id={sw.dpid:016x}", "other_config:disable-in-band=true",
            f"other_config:dp-desc={switch}"]
    for link in fabric.links:
        for end in (link.a, link.b):
            if end.node == switch:
                dev = intf_name(end.node, end.port)
                args += ["--", "add-port", switch, dev, "--", "set", "Interface", dev, f"ofport_request={end.port}"]
    return args


def switch_interfaces(fabric: Fabric, switches: set[str]) -> list[str]:
    """Interfaces of these switches' ports (each in its switch's namespace), in link order."""
    out = []
    for link in fabric.links:
        for end in (link.a, link.b):
            if end.node in switches:
                out.append(intf_name(end.node, end.port))
    return out


def parse_dump_ports(text: str) -> dict[int, tuple[int, int]]:
    """Parse `ovs-ofctl dump-ports` output: port -> (tx bytes, rx bytes); the LOCAL port is skipped."""
    out: dict[int, tuple[int, int]] = {}
    port: int | None = None
    rx = 0
    for line in text.splitlines():
        words = line.replace(",", " ").split()
        if len(words) >= 2 and words[0] == "port":
            name = words[1].rstrip(":")
            port = int(name) if name.isdigit() else None
            fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            rx = int(fields.get("bytes", "0")) if "rx" in words else 0
        elif words and words[0] == "tx" and port is not None:
            fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            out[port] = (int(fields.get("bytes", "0")), rx)
    return out
