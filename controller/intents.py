"""What the controller's core decides, as data: flows and fast-failover groups to install or change on a
switch (`FlowIntent`, `GroupIntent`, `Changes`), built without a datapath; `controller.ofmsg` turns them into
OpenFlow 1.3 messages. Tables, priorities and the cookie of the pipeline (`controller.core`'s docstring)."""
from __future__ import annotations

from dataclasses import dataclass

#: Marks every flow this controller installs.
COOKIE = 0xFAB1AB
PRIORITY_ROUTE = 1000
PRIORITY_SLOT = 1000
PRIORITY_SLOT_OTHER = 900
PRIORITY_TRANSIT = 1100
PRIORITY_PROBE = 2000
PRIORITY_NUDGE = 0
TABLE_ROUTE = 0
TABLE_ECMP = 1
TABLE_NUDGE = 2
#: memoised link events whose changes are kept (oldest dropped first)
CHANGES_MEMO_ENTRIES = 1 << 14

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806
IPPROTO_TCP = 6
IPPROTO_UDP = 17

Match = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Output:
    port: int


@dataclass(frozen=True)
class ToGroup:
    group_id: int


@dataclass(frozen=True)
class ToEcmp:
    """Write `metadata` and go to the ECMP table."""

    metadata: int


@dataclass(frozen=True)
class Drop:
    """No instructions: the packet is dropped (and counted by the flow)."""


Action = Output | ToGroup | ToEcmp | Drop


@dataclass(frozen=True, slots=True)
class FlowIntent:
    """Install (or replace) one flow: match fields -> action."""

    dpid: int
    table: int
    priority: int
    match: Match
    action: Action
    cookie: int = COOKIE

    @property
    def key(self) -> tuple[int, int, frozenset[tuple[str, object]]]:
        return (self.table, self.priority, frozenset(self.match))


@dataclass(frozen=True)
class GroupIntent:
    """A fast-failover group: buckets output to `ports` in order, each watching its own port."""

    dpid: int
    group_id: int
    ports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Changes:
    """What to send to one switch: groups first, then flows to add, modify and delete."""

    dpid: int
    groups_add: tuple[GroupIntent, ...] = ()
    groups_modify: tuple[GroupIntent, ...] = ()
    flows_add: tuple[FlowIntent, ...] = ()
    flows_modify: tuple[FlowIntent, ...] = ()
    flows_delete: tuple[FlowIntent, ...] = ()

    def __len__(self) -> int:
        return (len(self.groups_add) + len(self.groups_modify) + len(self.flows_add)
                + len(self.flows_modify) + len(self.flows_delete))
