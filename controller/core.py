"""The controller's pure core: which flows each switch needs, decided from the model alone.

Proactive and deterministic: when a switch connects, it gets one flow per destination NIC address
in its plane (IPv4 by `ipv4_dst`, ARP by `arp_tpa`, so even a host that lost its static ARP entries
resolves through the fabric without flooding). No MAC learning, no flooding, no table-miss entry:
anything else is dropped. The next hop comes from `fabric.routing` under the selected mode.
"""
from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import FabriclabError
from fabric.model import Fabric
from fabric.routing import MODES, PathTable, static_port

#: Marks every flow this controller installs.
COOKIE = 0xFAB1AB
PRIORITY_HOST_ROUTE = 1000

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806


@dataclass(frozen=True)
class FlowIntent:
    """Install (or replace) one flow: match fields -> output port."""

    dpid: int
    priority: int
    match: tuple[tuple[str, object], ...]
    out_port: int
    cookie: int = COOKIE


class ControllerCore:
    """Holds the model and path tables; answers 'what does this switch need'."""

    def __init__(self, fabric: Fabric, mode: str = "static") -> None:
        if mode not in MODES:
            raise FabriclabError(f"routing mode {mode!r} is not supported (supported: {', '.join(MODES)})")
        self.fabric = fabric
        self.mode = mode
        self.table = PathTable(fabric)

    def switch_name(self, dpid: int) -> str | None:
        sw = self.fabric.switch_by_dpid.get(dpid)
        return sw.name if sw else None

    def on_switch_connect(self, dpid: int) -> list[FlowIntent]:
        """All flows for a switch that just connected (empty for a dpid not in the model)."""
        sw = self.fabric.switch_by_dpid.get(dpid)
        if sw is None:
            return []
        intents = []
        for nic in self.fabric.nic_ports:
            if nic.plane != sw.plane:
                continue
            ports = self.table.next_ports(sw.name, nic)
            if not ports:
                continue
            out = static_port(ports, self.fabric.host_by_name[nic.host].index)
            ip = str(nic.ip)
            intents.append(FlowIntent(dpid, PRIORITY_HOST_ROUTE, (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", ip)), out))
            intents.append(FlowIntent(dpid, PRIORITY_HOST_ROUTE, (("eth_type", ETH_TYPE_ARP), ("arp_tpa", ip)), out))
        return intents
