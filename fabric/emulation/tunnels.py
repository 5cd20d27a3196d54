"""Switch-to-switch links carried by a tunnel, as between two servers (pure: checks, names, addresses,
MTUs and the commands that build them; unit-tested without root).

Running one fabric across machines (docs/cluster.md) cuts the links between switches that run on
different servers: each becomes a tunnel over the servers' own network, the underlay. This module
plans that, on one machine, for the links a user names (`EmulationOptions.tunnel_links`):

- Two network namespaces stand for the root namespaces of two servers (`flu-<run>-0`, `flu-<run>-1`).
  A veth pair joins them: their wire. It is addressed in 198.51.100.0/24 (TEST-NET-2, RFC 5737: never
  routed, and apart from the hosts' 198.18.0.0/15), with static neighbour entries, so nothing but
  encapsulated frames crosses it (no ARP; IPv6 is off).
- The two ends of a tunnelled link are VXLAN devices (RFC 7348; or GRE, `gretap` with a key,
  RFC 2890). Each is made in the namespace of the server its switch is on, which is where it
  encapsulates to and decapsulates from, then moved into its switch's own namespace with the name, MAC
  and OpenFlow port its veth end would have had. So the switch's Open vSwitch, HTB and the controller
  see the same port as on the untunnelled fabric. Deleting a server's namespace deletes its tunnel
  devices, wherever they are.
- The switches at the tunnelled links' ends are put on the two servers by 2-colouring: the two ends
  of every tunnelled link are on different servers. A set of links that cannot be split so (an odd
  cycle, e.g. three leaves of a mesh plane) is refused, naming the link that closes it. Switches at no
  tunnelled link are on neither; their links stay veths.
- MTU: the links keep 1500 bytes, the hosts' MTU, as every veth of the fabric does. The wire's MTU is
  raised by what the encapsulation adds (1550 bytes for VXLAN) instead of lowering the inner MTU, as
  Mininet's cluster mode does (1450): so the tunnelled and the untunnelled fabric carry the same frames,
  and no frame is fragmented on the wire.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import AbstractSet

from fabric.errors import TopologyError, UnsupportedError
from fabric.model import Fabric, intf_name

TUNNEL_KINDS = ("vxlan", "gre")
#: The kernel module each kind needs (probed by `fabric.emulation.system.tunnel_kinds`).
KIND_MODULES = {"vxlan": "vxlan", "gre": "ip_gre"}
#: The wire between the two stand-in servers: TEST-NET-2 (RFC 5737), server k at host address k + 1.
UNDERLAY = ipaddress.IPv4Network("198.51.100.0/24")
#: The wire's ends' MACs, locally administered (apart from host NICs' 02:fb:... and switch ports' 06:...).
UNDERLAY_MACS = ("0a:fb:ff:00:00:01", "0a:fb:ff:00:00:02")
#: The wire's interface in each server's namespace.
UNDERLAY_DEVS = ("ul0", "ul1")
#: Every link's MTU, as Mininet makes veths and as the hosts send.
INNER_MTU_BYTES = 1500
VXLAN_UDP_PORT = 4789  # IANA
ETHERNET_HEADER_BYTES = 14
IPV4_HEADER_BYTES = 20
#: What follows the outer IPv4 header: UDP (8) and the VXLAN header (8); GRE's base header (4) and key (4).
TUNNEL_HEADER_BYTES = {"vxlan": 8 + 8, "gre": 4 + 4}


def overhead_bytes(kind: str) -> int:
    """Bytes each frame gains on the wire: an outer Ethernet and IPv4 header and the tunnel's own."""
    return ETHERNET_HEADER_BYTES + IPV4_HEADER_BYTES + TUNNEL_HEADER_BYTES[kind]


def underlay_mtu_bytes(kind: str) -> int:
    """The wire's MTU (its IP packets' size) that carries a full inner frame (MTU plus its Ethernet
    header) inside an outer IPv4 header and the tunnel's."""
    return INNER_MTU_BYTES + ETHERNET_HEADER_BYTES + IPV4_HEADER_BYTES + TUNNEL_HEADER_BYTES[kind]


@dataclass(frozen=True)
class Tunnel:
    """One tunnelled link: its key (VXLAN network identifier or GRE key) and its ends, the (switch,
    port) on server 0 and on server 1."""

    key: int
    end0: tuple[str, int]
    end1: tuple[str, int]

    def end_on(self, server: int) -> tuple[str, int]:
        return self.end0 if server == 0 else self.end1

    @property
    def label(self) -> str:
        return f"{self.end0[0]}-{self.end1[0]}"


@dataclass(frozen=True)
class TunnelPlan:
    """The tunnels of a run: their kind, the tunnels, and the two servers' namespaces."""

    kind: str
    tunnels: tuple[Tunnel, ...]
    servers: tuple[str, str]

    @property
    def overhead_bytes(self) -> int:
        return overhead_bytes(self.kind)

    @property
    def underlay_mtu_bytes(self) -> int:
        return underlay_mtu_bytes(self.kind)

    def address(self, server: int) -> ipaddress.IPv4Address:
        return UNDERLAY.network_address + server + 1

    def carries(self, a: str, b: str) -> bool:
        """Whether the link between switches a and b is tunnelled."""
        return any({a, b} == {t.end0[0], t.end1[0]} for t in self.tunnels)

    def devices(self, server: int) -> list[tuple[str, str]]:
        """(switch, device) of every tunnel end on `server`."""
        return [(t.end_on(server)[0], intf_name(*t.end_on(server))) for t in self.tunnels]


def parse_link(fabric: Fabric, text: str) -> tuple[str, str]:
    """`SW1-SW2` as the two switch names (names may contain '-': the split that names two switches
    of the fabric joined by a link); a `TopologyError` naming `text` otherwise."""
    parts = [(text[:i], text[i + 1:]) for i, ch in enumerate(text) if ch == "-"]
    switches = fabric.switch_by_name
    named = [(a, b) for a, b in parts if a in switches and b in switches]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        raise TopologyError(f"tunnel link {text!r} is ambiguous in fabric {fabric.name!r}: "
                            + " or ".join(f"{a} and {b}" for a, b in named))
    hosts = [n for a, b in parts for n in (a, b) if n in fabric.host_by_name]
    if hosts:
        raise UnsupportedError(f"tunnel link {text!r}: {hosts[0]} is a host; only switch-to-switch links can be "
                               "tunnelled")
    raise TopologyError(f"tunnel link {text!r}: name two switches of fabric {fabric.name!r} joined by a link, "
                        "as SW1-SW2 (e.g. leafA0-spineA0)")


def servers_of(fabric: Fabric, links: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Server 0 or 1 for every switch at a tunnelled link, the two ends of each on different servers
    (module docstring): a 2-colouring in the order the links are given, the first-named switch on
    server 0. Refuses links that are not switch-to-switch links of the fabric, repeated links, and a
    link whose ends the links before it already put on one server."""
    side: dict[str, int] = {}
    seen: set[frozenset[str]] = set()
    for a, b in links:
        for node in (a, b):
            if node in fabric.host_by_name:
                raise UnsupportedError(f"tunnel link {a}-{b}: {node} is a host; only switch-to-switch links can be "
                                       "tunnelled")
            if node not in fabric.switch_by_name:
                raise TopologyError(f"tunnel link {a}-{b}: no switch {node!r} in fabric {fabric.name!r}")
        try:
            fabric.port_towards(a, b)
        except TopologyError as e:
            raise TopologyError(f"tunnel link {a}-{b}: {e} in fabric {fabric.name!r}") from None
        if frozenset((a, b)) in seen:
            raise UnsupportedError(f"tunnel link {a}-{b} is named twice")
        seen.add(frozenset((a, b)))
    # 2-colour link by link: a link joining two groups of switches flips the later group if it must; a
    # link inside one group whose ends are on one server closes an odd cycle
    group: dict[str, list[str]] = {}  # switch -> the switches of its group (one list per group), first seen first
    seen_at = {node: i for i, node in reversed(list(enumerate(n for link in links for n in link)))}
    for a, b in links:
        if a not in side and b not in side:
            side[a], side[b] = 0, 1
            group[a] = group[b] = [a, b]
        elif a not in side or b not in side:
            known, new = (a, b) if a in side else (b, a)
            side[new] = 1 - side[known]
            group[known].append(new)
            group[new] = group[known]
        elif group[a] is not group[b]:
            first, later = sorted((group[a], group[b]), key=lambda g: seen_at[g[0]])
            if side[a] == side[b]:
                for node in later:
                    side[node] = 1 - side[node]
            merged = first + later
            for node in merged:
                group[node] = merged
        elif side[a] == side[b]:
            raise UnsupportedError(f"tunnel link {a}-{b}: the tunnelled links cannot be split over two servers "
                                   f"(it closes an odd cycle: the links before it put {a} and {b} on one server)")
    return side


def check_tunnels(fabric: Fabric, links: Sequence[tuple[str, str]], kind: str,
                  available: AbstractSet[str]) -> None:
    """Refuse tunnels that cannot be built: an unknown kind, one this kernel lacks (`available`), or
    links `servers_of` refuses."""
    if not links:
        return
    if kind not in TUNNEL_KINDS:
        raise UnsupportedError(f"tunnel kind must be one of {', '.join(TUNNEL_KINDS)}, got {kind!r}")
    if kind not in available:
        others = [k for k in TUNNEL_KINDS if k in available]
        raise UnsupportedError(f"this kernel has no {kind} tunnels (module {KIND_MODULES[kind]})"
                               + (f"; use the tunnel kind {others[0]}" if others else ""))
    servers_of(fabric, links)


def plan_tunnels(fabric: Fabric, links: Sequence[tuple[str, str]], kind: str, run: str) -> TunnelPlan:
    """The tunnels of run `run` (checked links, `check_tunnels`): keys 1, 2, ... in the order given."""
    side = servers_of(fabric, links)
    tunnels = []
    for key, (a, b) in enumerate(links, start=1):
        ends = {side[a]: (a, fabric.port_towards(a, b)), side[b]: (b, fabric.port_towards(b, a))}
        tunnels.append(Tunnel(key, ends[0], ends[1]))
    return TunnelPlan(kind, tuple(tunnels), (f"flu-{run}-0", f"flu-{run}-1"))


@dataclass(frozen=True)
class Command:
    """A command the adapter runs: what it does (for errors), its argv, and its standard input."""

    what: str
    argv: tuple[str, ...]
    stdin: str = ""


def build_commands(plan: TunnelPlan, switch_netns: Mapping[str, str],
                   port_macs: Mapping[tuple[str, int], str]) -> list[Command]:
    """The commands that build `plan`, in order, once the two servers' namespaces exist and before the
    switches' bridges are made: IPv6 off in the servers' namespaces; the wire (made from server 0, its
    far end put in server 1), its MTU, addresses and static neighbours; each tunnel end made on its
    server and moved into its switch's namespace (`switch_netns`) with its port's MAC (`port_macs`)
    and the inner MTU; offloads off on the wire (as on every emulated interface: no super-frames);
    each tunnel end up in its switch's namespace."""
    out = []
    for ns in plan.servers:
        out.append(Command(f"disabling IPv6 in {ns}", ("ip", "netns", "exec", ns, "sysctl", "-qw",
                                                        "net.ipv6.conf.all.disable_ipv6=1",
                                                        "net.ipv6.conf.default.disable_ipv6=1")))
    for server in (0, 1):
        ns, peer = plan.servers[server], 1 - server
        dev, mine, theirs = UNDERLAY_DEVS[server], plan.address(server), plan.address(peer)
        lines = []
        if server == 0:
            lines.append(f"link add {dev} type veth peer name {UNDERLAY_DEVS[1]} netns {plan.servers[1]}")
        lines += [f"link set {dev} address {UNDERLAY_MACS[server]} mtu {plan.underlay_mtu_bytes} up",
                  f"addr add {mine}/{UNDERLAY.prefixlen} dev {dev}",
                  f"neigh replace {theirs} lladdr {UNDERLAY_MACS[peer]} dev {dev} nud permanent"]
        for t in plan.tunnels:
            switch, port = t.end_on(server)
            name = intf_name(switch, port)
            if plan.kind == "vxlan":
                lines.append(f"link add {name} type vxlan id {t.key} local {mine} remote {theirs} "
                             f"dstport {VXLAN_UDP_PORT} nolearning")
            else:
                lines.append(f"link add {name} type gretap local {mine} remote {theirs} key {t.key}")
            lines.append(f"link set {name} address {port_macs[(switch, port)]} mtu {INNER_MTU_BYTES}")
            lines.append(f"link set {name} netns {switch_netns[switch]}")
        out.append(Command(f"making server {server}'s wire and tunnel ends in {ns}",
                           ("ip", "-netns", ns, "-batch", "-"), "\n".join(lines) + "\n"))
    for server in (0, 1):
        out.append(Command(f"offloads off on {UNDERLAY_DEVS[server]} in {plan.servers[server]}",
                           ("ip", "netns", "exec", plan.servers[server], "ethtool", "-K", UNDERLAY_DEVS[server],
                            "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off")))
    per_switch: dict[str, list[str]] = {}
    for t in plan.tunnels:
        for switch, port in (t.end0, t.end1):
            per_switch.setdefault(switch, []).append(f"link set {intf_name(switch, port)} up")
    for switch, lines in per_switch.items():
        out.append(Command(f"setting {switch}'s tunnel ports up", ("ip", "-netns", switch_netns[switch], "-batch", "-"),
                           "\n".join(lines) + "\n"))
    return out
