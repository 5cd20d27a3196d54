"""Intents -> OpenFlow 1.3 messages, built without a datapath (attached only when sent)."""
from __future__ import annotations

from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller.core import FlowIntent


def flow_mod(intent: FlowIntent) -> Any:
    """An OFPFC_ADD that installs or replaces the intent's flow (same match and priority)."""
    actions = [parser.OFPActionOutput(intent.out_port, 0)]
    return parser.OFPFlowMod(
        datapath=None,
        cookie=intent.cookie,
        command=ofp.OFPFC_ADD,
        priority=intent.priority,
        match=parser.OFPMatch(**dict(intent.match)),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)],
    )


def barrier() -> Any:
    return parser.OFPBarrierRequest(datapath=None)
