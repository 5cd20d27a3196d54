"""Intents <-> OpenFlow 1.3 messages. Messages are built without a datapath (attached when sent);
stats replies are read back into intents so a switch's tables can be compared with the core's."""
from __future__ import annotations

import functools
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller.intents import (
    COOKIE,
    TABLE_ECMP,
    Action,
    Changes,
    Drop,
    FlowIntent,
    GroupIntent,
    Output,
    ToEcmp,
    ToGroup,
)
from controller.gray import PROBE_ETH_TYPE, PROBE_MAC

ALL_BITS = 0xFFFFFFFFFFFFFFFF


@functools.lru_cache(maxsize=65536)
def _instructions(action: Action) -> list[Any]:
    """Instructions for an action; shared between messages (never mutated)."""
    if isinstance(action, Output):
        return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(action.port, 0)])]
    if isinstance(action, ToGroup):
        return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(action.group_id)])]
    if isinstance(action, Drop):
        return []
    return [parser.OFPInstructionWriteMetadata(action.metadata, ALL_BITS), parser.OFPInstructionGotoTable(TABLE_ECMP)]


@functools.lru_cache(maxsize=65536)
def _match(fields: tuple[tuple[str, object], ...]) -> Any:
    """OFPMatch objects are costly to build (field normalisation) and never mutated once built:
    share one per distinct match."""
    return parser.OFPMatch(**dict(fields))


def flow_mod(intent: FlowIntent, command: int = ofp.OFPFC_ADD) -> Any:
    """ADD installs or replaces; MODIFY_STRICT changes the action and keeps the counters;
    DELETE_STRICT removes exactly this flow."""
    return parser.OFPFlowMod(
        datapath=None,
        cookie=intent.cookie,
        cookie_mask=ALL_BITS if command == ofp.OFPFC_DELETE_STRICT else 0,
        table_id=intent.table,
        command=command,
        priority=intent.priority,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=_match(intent.match),
        instructions=[] if command == ofp.OFPFC_DELETE_STRICT else _instructions(intent.action),
    )


def group_mod(group: GroupIntent, command: int = ofp.OFPGC_ADD) -> Any:
    buckets = [parser.OFPBucket(weight=0, watch_port=p, watch_group=ofp.OFPG_ANY,
                                actions=[parser.OFPActionOutput(p, 0)]) for p in group.ports]
    return parser.OFPGroupMod(None, command, ofp.OFPGT_FF, group.group_id, buckets)


def barrier() -> Any:
    return parser.OFPBarrierRequest(datapath=None)


def messages(changes: Changes) -> list[Any]:
    """Groups before the flows that use them; deletes last."""
    return (
        [group_mod(g, ofp.OFPGC_ADD) for g in changes.groups_add]
        + [group_mod(g, ofp.OFPGC_MODIFY) for g in changes.groups_modify]
        + [flow_mod(f, ofp.OFPFC_ADD) for f in changes.flows_add]
        + [flow_mod(f, ofp.OFPFC_MODIFY_STRICT) for f in changes.flows_modify]
        + [flow_mod(f, ofp.OFPFC_DELETE_STRICT) for f in changes.flows_delete]
    )


# ---- requests ------------------------------------------------------------------------------------
def our_flows_request() -> Any:
    return parser.OFPFlowStatsRequest(None, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE, ALL_BITS,
                                      parser.OFPMatch())


def ecmp_flows_request() -> Any:
    return parser.OFPFlowStatsRequest(None, 0, TABLE_ECMP, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE, ALL_BITS,
                                      parser.OFPMatch())


def probe_counts_request() -> Any:
    """Our gray-failure probe counting flows (table 0, matching the probe EtherType)."""
    return parser.OFPFlowStatsRequest(None, 0, 0, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE, ALL_BITS,
                                      parser.OFPMatch(eth_type=PROBE_ETH_TYPE))


def probe_counts_from_stats(body: list[Any]) -> dict[int, int]:
    """in-port -> probes counted, from a reply to `probe_counts_request`."""
    out: dict[int, int] = {}
    for stat in body:
        match = dict(stat.match.items())
        if match.get("eth_type") == PROBE_ETH_TYPE and "in_port" in match:
            out[int(match["in_port"])] = int(stat.packet_count)
    return out


@functools.lru_cache(maxsize=1)
def probe_frame() -> bytes:
    """A minimum-size Ethernet frame carrying the probe EtherType (60 bytes before the FCS)."""
    mac = bytes(int(b, 16) for b in PROBE_MAC.split(":"))
    return (mac + mac + PROBE_ETH_TYPE.to_bytes(2, "big") + b"fabriclab gray-failure probe").ljust(60, b"\0")


def probe_burst(ports: tuple[int, ...], copies: int) -> Any:
    """One packet-out that sends `copies` probe frames out of each of `ports`."""
    actions = [parser.OFPActionOutput(p, 0) for _ in range(copies) for p in ports]
    return parser.OFPPacketOut(datapath=None, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                               actions=actions, data=probe_frame())


def groups_request() -> Any:
    return parser.OFPGroupDescStatsRequest(None, 0)


def port_stats_request() -> Any:
    return parser.OFPPortStatsRequest(None, 0, ofp.OFPP_ANY)


# ---- replies -> intents --------------------------------------------------------------------------
def flow_from_stats(dpid: int, stat: Any) -> FlowIntent | None:
    """A flow-stats entry as an intent (None if its instructions are not ones we install)."""
    action: Action | None = None if stat.instructions else Drop()
    for inst in stat.instructions:
        if isinstance(inst, parser.OFPInstructionActions) and len(inst.actions) == 1:
            a = inst.actions[0]
            if isinstance(a, parser.OFPActionOutput):
                action = Output(a.port)
            elif isinstance(a, parser.OFPActionGroup):
                action = ToGroup(a.group_id)
        elif isinstance(inst, parser.OFPInstructionWriteMetadata):
            action = ToEcmp(inst.metadata)
    if action is None:
        return None
    return FlowIntent(dpid, stat.table_id, stat.priority, tuple(stat.match.items()), action, stat.cookie)


def group_from_stats(stat: Any) -> tuple[int, tuple[int, ...]]:
    """(group id, watched ports in bucket order) from a group-desc entry (non-FF groups: no ports)."""
    if stat.type != ofp.OFPGT_FF:
        return stat.group_id, ()
    return stat.group_id, tuple(b.watch_port for b in stat.buckets)


def port_is_up(port: Any) -> bool:
    """Up only if neither administratively down (config) nor without link (state)."""
    return not (port.config & ofp.OFPPC_PORT_DOWN) and not (port.state & ofp.OFPPS_LINK_DOWN)


def port_desc_request() -> Any:
    return parser.OFPPortDescStatsRequest(None, 0)
