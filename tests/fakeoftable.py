"""A small fake OpenFlow pipeline for unit tests, after Faucet's clib/fakeoftable.py.

It applies real OFPFlowMod messages (as the controller would send them) to per-switch tables and
then forwards a packet hop by hop through the fabric's cabling, so tests can assert where packets
go instead of which bytes were sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp

from fabric.model import Fabric


@dataclass
class FlowEntry:
    priority: int
    match: dict[str, Any]
    out_ports: list[int]
    cookie: int


@dataclass
class FakeSwitch:
    flows: list[FlowEntry] = field(default_factory=list)

    def apply(self, msg: Any) -> None:
        if msg.command == ofp.OFPFC_ADD:
            match = dict(msg.match.items())
            self.flows = [f for f in self.flows if not (f.priority == msg.priority and f.match == match)]
            ports = [a.port for inst in msg.instructions for a in inst.actions]
            self.flows.append(FlowEntry(msg.priority, match, ports, msg.cookie))
        else:  # pragma: no cover - nothing else is produced yet
            raise NotImplementedError(f"flow-mod command {msg.command}")

    def lookup(self, packet: dict[str, Any]) -> FlowEntry | None:
        hits = [f for f in self.flows if all(packet.get(k) == v for k, v in f.match.items())]
        return max(hits, key=lambda f: f.priority) if hits else None


class FakeFabric:
    """Fake switches wired like the model; `trace()` follows a packet from a host NIC."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.switches = {s.dpid: FakeSwitch() for s in fabric.switches}
        self.peer: dict[tuple[str, int], tuple[str, int]] = {}
        for link in fabric.links:
            self.peer[(link.a.node, link.a.port)] = (link.b.node, link.b.port)
            self.peer[(link.b.node, link.b.port)] = (link.a.node, link.a.port)

    def apply(self, dpid: int, msgs: list[Any]) -> None:
        for m in msgs:
            if m.__class__.__name__ == "OFPFlowMod":
                self.switches[dpid].apply(m)

    def trace(self, src_host: str, src_nic: int, packet: dict[str, Any], max_hops: int = 16) -> list[str]:
        """Nodes the packet visits after leaving `src_host` by NIC `src_nic`; ends at a host or a drop."""
        node, port = self.peer[(src_host, src_nic)]
        path = []
        for _ in range(max_hops):
            path.append(node)
            if node in self.fabric.host_by_name:
                return path
            entry = self.switches[self.fabric.switch_by_name[node].dpid].lookup(packet)
            if entry is None:
                path.append("DROP")
                return path
            assert len(entry.out_ports) == 1
            node, port = self.peer[(node, entry.out_ports[0])]
        path.append("LOOP")
        return path
