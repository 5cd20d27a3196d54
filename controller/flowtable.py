"""The flow tables every switch should have: the controller's pipeline (`controller.core`'s docstring) compiled
from the model and the routing policy's state into intents (`controller.intents`). Pure: no datapath, no I/O.

Table 0 routes by destination address (output, or on to the ECMP table at a decision point); table 1 holds a
decision point's slots (TCP and UDP source-port bits -> a fast-failover group), and the transit flows of a
switch that is a two-hop detour for others; table 2 the nudge. Intents are immutable and cached: a slot's
flows are built once per (switch, destination, slot, port), its matches once per (destination, tier, slot).
"""
from __future__ import annotations

from controller.gray import PROBE_ETH_TYPE, GrayWatch
from controller.intents import (ETH_TYPE_ARP, ETH_TYPE_IPV4, IPPROTO_TCP, IPPROTO_UDP, PRIORITY_NUDGE, PRIORITY_PROBE,
                                PRIORITY_ROUTE, PRIORITY_SLOT, PRIORITY_SLOT_OTHER, PRIORITY_TRANSIT, TABLE_ECMP,
                                TABLE_NUDGE, TABLE_ROUTE, Action, Drop, FlowIntent, GroupIntent, Match, Output, ToEcmp,
                                ToGroup)
from fabric.model import Fabric
from fabric.routing import PathTable, RoutingPolicy


class FlowTable:
    """The desired state of every switch for `policy` as it is now (its slots are read at each call)."""

    def __init__(self, fabric: Fabric, table: PathTable, policy: RoutingPolicy, gray: GrayWatch) -> None:
        self.fabric, self.table, self.policy, self.gray = fabric, table, policy, gray
        self.dest_id = {d: i + 1 for i, d in enumerate(table.edge_switches)}
        self.dest_by_id = {i: d for d, i in self.dest_id.items()}
        # switch -> fast-failover bucket order -> group id; switch -> its decision points' dests
        self.group_ids: dict[str, dict[tuple[int, ...], int]] = {}
        self.decision_dests: dict[str, list[str]] = {}
        for sw, dest in policy.decision_points():
            self.decision_dests.setdefault(sw, []).append(dest)
            ids = self.group_ids.setdefault(sw, {})
            for order in policy.failover_orders(sw, dest):
                ids.setdefault(order, 0)
        for ids in self.group_ids.values():
            for i, key in enumerate(sorted(ids)):
                ids[key] = i + 1
        self._slot_flows: dict[tuple[str, str, int, int], tuple[FlowIntent, ...]] = {}
        self._matches: dict[tuple[str, int, int], tuple[Match, Match, Match]] = {}
        self._actions: dict[ToGroup, ToGroup] = {}  # one object per group action

    def dpid(self, switch: str) -> int:
        return self.fabric.switch_by_name[switch].dpid

    def groups(self, switch: str) -> list[GroupIntent]:
        dpid = self.dpid(switch)
        return [GroupIntent(dpid, gid, order)
                for order, gid in sorted(self.group_ids.get(switch, {}).items(), key=lambda kv: kv[1])]

    def _group(self, switch: str, dest: str, slot: int, port: int) -> ToGroup:
        return ToGroup(self.group_ids[switch][self.policy.failover_order(switch, dest, slot, port)])

    def slot_flows(self, switch: str, dest: str, slot: int, port: int) -> tuple[FlowIntent, ...]:
        """Table-1 flows for one slot at one decision point (slot 0 also carries non-TCP/UDP).
        Intents are immutable, so they are built once per (switch, dest, slot, port) and reused."""
        key = (switch, dest, slot, port)
        cached = self._slot_flows.get(key)
        if cached is None:
            cached = self._slot_flows[key] = tuple(self._build_slot_flows(switch, dest, slot, port))
        return cached

    def _build_slot_flows(self, switch: str, dest: str, slot: int, port: int) -> list[FlowIntent]:
        dpid = self.dpid(switch)
        tcp, udp, other = self._slot_matches(dest, self.policy.tier(switch), slot)
        group = self._group(switch, dest, slot, port)
        action = self._actions.setdefault(group, group)
        out = [FlowIntent(dpid, TABLE_ECMP, PRIORITY_SLOT, tcp, action),
               FlowIntent(dpid, TABLE_ECMP, PRIORITY_SLOT, udp, action)]
        if slot == 0:  # everything else for this destination (ICMP, other IP, ARP) follows slot 0
            out.append(FlowIntent(dpid, TABLE_ECMP, PRIORITY_SLOT_OTHER, other, action))
        return out

    def _slot_matches(self, dest: str, tier: int, slot: int) -> tuple[Match, Match, Match]:
        """The TCP, UDP and other matches of a slot's flows: the same at every switch of a tier, so
        built once and shared (prebuilt intents for every failure would otherwise hold ~10^5 copies)."""
        key = (dest, tier, slot)
        got = self._matches.get(key)
        if got is None:
            meta = self.dest_id[dest]
            value, mask = self.policy.entropy.match(tier, slot)
            got = self._matches[key] = (
                (("metadata", meta), ("eth_type", ETH_TYPE_IPV4), ("ip_proto", IPPROTO_TCP), ("tcp_src", (value, mask))),
                (("metadata", meta), ("eth_type", ETH_TYPE_IPV4), ("ip_proto", IPPROTO_UDP), ("udp_src", (value, mask))),
                (("metadata", meta),),
            )
        return got

    def _arp_flow(self, dpid: int, ip: str, action: Action) -> FlowIntent:
        return FlowIntent(dpid, TABLE_ROUTE, PRIORITY_ROUTE, (("eth_type", ETH_TYPE_ARP), ("arp_tpa", ip)), action)

    def flows(self, switch: str) -> list[FlowIntent]:
        """Every flow `switch` should have now."""
        sw = self.fabric.switch_by_name[switch]
        dpid = sw.dpid
        out: list[FlowIntent] = []
        for nic in self.fabric.nic_ports:
            if nic.plane != sw.plane:
                continue
            ip = str(nic.ip)
            ipv4 = (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", ip))
            dest = nic.switch
            action: Action
            if switch == dest:
                action = Output(nic.switch_port)
            elif not self.table.ecmp_ports(switch, dest):
                continue
            elif self.policy.is_decision(switch, dest):
                action = ToEcmp(self.dest_id[dest])
            else:
                action = Output(self.policy.port(switch, dest))
            out.append(FlowIntent(dpid, TABLE_ROUTE, PRIORITY_ROUTE, ipv4, action))
            out.append(self._arp_flow(dpid, ip, action))
        for dest in self.decision_dests.get(switch, ()):
            for slot, port in enumerate(self.policy.slots(switch, dest)):
                out.extend(self.slot_flows(switch, dest, slot, port))
            out.extend(self.transit_flows(switch, dest))
        if switch in self.decision_dests:
            out.append(self.nudge_flow(switch))
        for port in self.gray.counting_ports(switch) if self.gray.config.enabled else ():
            out.append(FlowIntent(dpid, TABLE_ROUTE, PRIORITY_PROBE,
                                  (("in_port", port), ("eth_type", PROBE_ETH_TYPE)), Drop()))
        return out

    def nudge_flow(self, switch: str) -> FlowIntent:
        """The decision point's flow in table 2, which no packet reaches: adding it again changes the
        flow table and so makes OVS refresh every flow's counters at once (module docstring)."""
        return FlowIntent(self.dpid(switch), TABLE_NUDGE, PRIORITY_NUDGE, (), Drop())

    def transit_flows(self, switch: str, dest: str) -> list[FlowIntent]:
        """Table-1 flows for detoured packets at a decision point that is a detour for others: from
        each of their in-ports, out by the direct link to `dest` (never detoured again; dropped
        while that link is down)."""
        ins = self.table.transit_ports(switch, dest)
        if not ins:
            return []
        dpid = self.dpid(switch)
        meta = self.dest_id[dest]
        (direct,) = self.table.ecmp_ports(switch, dest)
        return [FlowIntent(dpid, TABLE_ECMP, PRIORITY_TRANSIT, (("metadata", meta), ("in_port", p)), Output(direct))
                for p in ins]
