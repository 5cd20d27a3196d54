"""A small fake OpenFlow 1.3 pipeline for unit tests, after Faucet's clib/fakeoftable.py.

It applies the real messages the controller would send (flow-mods and group-mods built by
`controller.ofmsg`) to per-switch tables, keeps port liveness, and forwards a packet hop by hop
through the fabric's cabling, so tests assert where packets go rather than which bytes were sent.

Supported: tables 0 and 1, priorities, exact and masked matches (`in_port` too: the port a packet
came in by at each switch), apply-actions output/group, write-metadata + goto-table, fast-failover
groups (first bucket whose watch port is live). `send` forwards bytes like `trace` and counts them
as a switch does (per flow entry, kept across a modify; per port), so tests can feed the controller
the statistics its polls would read. Packet-outs (the gray-failure probes) go out of their ports,
lose the share `loss` of a directed link sets (every 1/loss-th frame: deterministic), and are
counted (packets) by the flow entry they match at the far switch.
"""
from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsg
from controller.intents import Changes
from fabric.model import Fabric


@dataclass
class Entry:
    table: int
    priority: int
    match: dict[str, Any]
    instructions: list[Any]
    cookie: int
    byte_count: int = 0
    packet_count: int = 0


def _matches(match: dict[str, Any], packet: dict[str, Any]) -> bool:
    for key, want in match.items():
        if key not in packet:
            return False
        have = packet[key]
        if isinstance(want, tuple):
            value, mask = want
            if key.startswith(("ipv4", "arp_")):
                have, value, mask = (int(ipaddress.IPv4Address(x)) for x in (have, value, mask))
            if have & mask != value & mask:
                return False
        elif have != want:
            return False
    return True


@dataclass
class FakeSwitch:
    entries: list[Entry] = field(default_factory=list)
    groups: dict[int, list[int]] = field(default_factory=dict)  # FF group -> watched ports in order

    def apply(self, msg: Any) -> None:
        if isinstance(msg, parser.OFPGroupMod):
            assert msg.type == ofp.OFPGT_FF
            ports = [b.watch_port for b in msg.buckets]
            for b in msg.buckets:
                assert [a.port for a in b.actions] == [b.watch_port]
            if msg.command == ofp.OFPGC_ADD:
                assert msg.group_id not in self.groups, f"group {msg.group_id} exists"
            elif msg.command == ofp.OFPGC_MODIFY:
                assert msg.group_id in self.groups, f"group {msg.group_id} unknown"
            self.groups[msg.group_id] = ports
            return
        if not isinstance(msg, parser.OFPFlowMod):
            return
        match = dict(msg.match.items())
        same = [e for e in self.entries
                if e.table == msg.table_id and e.priority == msg.priority and e.match == match]
        if msg.command == ofp.OFPFC_ADD:
            for e in same:
                self.entries.remove(e)
            self.entries.append(Entry(msg.table_id, msg.priority, match, list(msg.instructions), msg.cookie))
        elif msg.command == ofp.OFPFC_MODIFY_STRICT:
            for e in same:
                e.instructions = list(msg.instructions)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            for e in same:
                self.entries.remove(e)
        else:  # pragma: no cover
            raise NotImplementedError(f"flow-mod command {msg.command}")

    def lookup(self, table: int, packet: dict[str, Any]) -> Entry | None:
        hits = [e for e in self.entries if e.table == table and _matches(e.match, packet)]
        return max(hits, key=lambda e: e.priority) if hits else None


class FakeFabric:
    """Fake switches wired like the model; `trace()` follows a packet from a host NIC."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.switches = {s.name: FakeSwitch() for s in fabric.switches}
        self.peer: dict[tuple[str, int], tuple[str, int]] = {}
        for link in fabric.links:
            self.peer[(link.a.node, link.a.port)] = (link.b.node, link.b.port)
            self.peer[(link.b.node, link.b.port)] = (link.a.node, link.a.port)
        self.down: set[tuple[str, int]] = set()
        self.tx_bytes: Counter[tuple[str, int]] = Counter()  # (node, port) -> bytes sent by it
        self.loss: dict[tuple[str, int], float] = {}  # directed link -> share of packet-outs it drops
        self._loss_due: Counter[tuple[str, int]] = Counter()

    def packet_out(self, switch: str, msg: Any) -> None:
        """Send a packet-out's frame out of each output action's port, to the far switch's table 0."""
        frame = bytes(msg.data)
        eth_type = int.from_bytes(frame[12:14], "big")
        for action in msg.actions:
            end = (switch, action.port)
            if end in self.down:
                continue
            self._loss_due[end] += self.loss.get(end, 0.0)
            if self._loss_due[end] >= 1 - 1e-9:
                self._loss_due[end] -= 1
                continue
            node, in_port = self.peer[end]
            if node in self.switches:
                entry = self.switches[node].lookup(0, {"eth_type": eth_type, "in_port": in_port})
                if entry is not None:
                    entry.packet_count += 1

    def apply(self, changes: Changes | list[Changes]) -> None:
        for ch in changes if isinstance(changes, list) else [changes]:
            sw = self.fabric.switch_by_dpid[ch.dpid].name
            for msg in ofmsg.messages(ch):
                self.switches[sw].apply(msg)

    def set_link(self, node: str, port: int, up: bool) -> None:
        """Both ends of the link at (node, port) go down or up."""
        for end in ((node, port), self.peer[(node, port)]):
            (self.down.discard if up else self.down.add)(end)

    def _egress(self, switch: str, packet: dict[str, Any], hits: list[Entry]) -> int | None:
        sw = self.switches[switch]
        table = 0
        meta = None
        for _ in range(4):
            pkt = dict(packet, metadata=meta) if meta is not None else packet
            entry = sw.lookup(table, pkt)
            if entry is None:
                return None
            hits.append(entry)
            goto = None
            for inst in entry.instructions:
                if isinstance(inst, parser.OFPInstructionWriteMetadata):
                    meta = inst.metadata
                elif isinstance(inst, parser.OFPInstructionGotoTable):
                    goto = inst.table_id
                elif isinstance(inst, parser.OFPInstructionActions):
                    (action,) = inst.actions
                    if isinstance(action, parser.OFPActionOutput):
                        return action.port
                    live = [p for p in sw.groups[action.group_id] if (switch, p) not in self.down]
                    return live[0] if live else None
            if goto is None:
                return None
            table = goto
        raise AssertionError("goto loop")

    def trace(self, src_host: str, src_nic: int, packet: dict[str, Any], max_hops: int = 16) -> list[str]:
        """Nodes the packet visits after leaving `src_host` by NIC `src_nic`: ends at a host, or
        'DROP' (no flow, or sent into a dead link)."""
        return self._walk(src_host, src_nic, packet, max_hops, [], [])

    def send(self, src_host: str, src_nic: int, packet: dict[str, Any], n_bytes: int) -> list[tuple[str, int]]:
        """Forward `n_bytes` of `packet`'s flow as `trace` does, counting them on every flow entry it
        matches and every port it leaves by (the host's NIC included); returns those (node, port)."""
        hits: list[Entry] = []
        out: list[tuple[str, int]] = [(src_host, src_nic)]
        path = self._walk(src_host, src_nic, packet, 16, hits, out)
        assert path[-1] in self.fabric.host_by_name, path
        for entry in hits:
            entry.byte_count += n_bytes
        for end in out:
            self.tx_bytes[end] += n_bytes
        return out

    def port_counters(self, switch: str, duration_s: float) -> dict[int, tuple[int, int, float]]:
        """A port-stats reply: port -> (tx bytes, rx bytes, duration)."""
        return {a.port: (self.tx_bytes[(switch, a.port)], self.tx_bytes[self.peer[(switch, a.port)]], duration_s)
                for a in self.fabric.adjacency[switch]}

    def _walk(self, src_host: str, src_nic: int, packet: dict[str, Any], max_hops: int, hits: list[Entry],
              egress: list[tuple[str, int]]) -> list[str]:
        if (src_host, src_nic) in self.down:
            return ["DROP"]
        node, in_port = self.peer[(src_host, src_nic)]
        path = []
        for _ in range(max_hops):
            path.append(node)
            if node in self.fabric.host_by_name:
                return path
            port = self._egress(node, dict(packet, in_port=in_port), hits)
            if port is None or (node, port) in self.down:
                path.append("DROP")
                return path
            egress.append((node, port))
            node, in_port = self.peer[(node, port)]
        path.append("LOOP")
        return path

    def links_of(self, src_host: str, src_nic: int, path: list[str]) -> set[frozenset[str]]:
        nodes = [src_host] + path
        return {frozenset(pair) for pair in zip(nodes, nodes[1:])}


def _wire_match(fields: dict[str, Any]) -> Any:
    """An OFPMatch as a switch's reply would carry it: serialised and parsed back."""
    buf = bytearray()
    parser.OFPMatch(**fields).serialize(buf, 0)
    return parser.OFPMatch.parser(bytes(buf), 0)


@dataclass
class FlowStat:
    """The fields of an OFPFlowStats entry that the controller reads."""

    table_id: int
    priority: int
    match: Any
    instructions: list[Any]
    cookie: int
    byte_count: int = 0
    packet_count: int = 0
    duration_sec: int = 0
    duration_nsec: int = 0


def apply_out(fake: FakeFabric, out: list[tuple[int, Any]]) -> list[Any]:
    """Apply (dpid, message) pairs from `controller.sync` to the fake switches; return the requests
    (stats, barriers) the controller asked for, in order."""
    requests = []
    for dpid, msg in out:
        if isinstance(msg, (parser.OFPGroupMod, parser.OFPFlowMod)):
            fake.switches[fake.fabric.switch_by_dpid[dpid].name].apply(msg)
        elif isinstance(msg, parser.OFPPacketOut):
            fake.packet_out(fake.fabric.switch_by_dpid[dpid].name, msg)
        else:
            requests.append((dpid, msg))
    return requests


def group_desc(fake: FakeFabric, switch: str) -> list[tuple[int, tuple[int, ...]]]:
    """What a group-desc reply says: group id -> watched ports in bucket order."""
    return [(gid, tuple(ports)) for gid, ports in sorted(fake.switches[switch].groups.items())]


def flow_stats(fake: FakeFabric, switch: str, cookie: int) -> list[FlowStat]:
    """A flow-stats reply for the flows with `cookie`, matches as they come off the wire."""
    return [FlowStat(e.table, e.priority, _wire_match(e.match), e.instructions, e.cookie, e.byte_count, e.packet_count)
            for e in fake.switches[switch].entries if e.cookie == cookie]
