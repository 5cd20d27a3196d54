"""How a flow's transport source port picks its path: the entropy plan.

At every ECMP decision point (a switch with more than one equal-cost next hop towards a destination
edge switch) a flow falls into one of `2**bits` *slots*, read from its TCP/UDP source port:

    slot = (src_port >> (1 + shift)) & (2**bits - 1)

Each tier that has decisions (leaf/ToR, aggregation, spine/core) reads its own bit field, so the
choices at different tiers are independent. Bit 0 is skipped because Linux hands out even ephemeral
ports to `connect()`. The controller maps every slot to one next-hop port (by default slot `s` ->
the `s mod k`-th of the `k` equal-cost ports, in port order), so under default weights a traffic
generator can put a flow on a chosen path by choosing its source port (`src_port_for`), and kernel-
chosen ports spread flows like a hash would. Moving a slot to another port is how weights shift.
"""
from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import TopologyError
from fabric.model import ROLE_TIER
from fabric.routing.tables import PathTable

MIN_BITS = 4
PORT_BITS = 16


@dataclass(frozen=True)
class EntropyPlan:
    #: tier -> (shift, bits) of that tier's slot field (shift counted above bit 0)
    fields: dict[int, tuple[int, int]]

    def field(self, tier: int) -> tuple[int, int]:
        try:
            return self.fields[tier]
        except KeyError:
            raise KeyError(f"tier {tier} has no ECMP decisions") from None

    def slots(self, tier: int) -> int:
        return 1 << self.field(tier)[1]

    def slot(self, tier: int, src_port: int) -> int:
        shift, bits = self.field(tier)
        return (src_port >> (1 + shift)) & ((1 << bits) - 1)

    def match(self, tier: int, slot: int) -> tuple[int, int]:
        """(value, mask) on the source port selecting `slot` at `tier`."""
        shift, bits = self.field(tier)
        return slot << (1 + shift), ((1 << bits) - 1) << (1 + shift)

    def src_port_for(self, slots: dict[int, int], base: int = 49152) -> int:
        """A source port >= `base` (ephemeral range) that lands in `slots[tier]` at each given tier."""
        port = base
        for tier, slot in slots.items():
            value, mask = self.match(tier, slot)
            port = (port & ~mask) | value
        if port < base:
            port |= 1 << (PORT_BITS - 1)
        return port


def plan_entropy(table: PathTable) -> EntropyPlan:
    """Give each tier with ECMP decisions a bit field wide enough for twice its largest fan-out."""
    fab = table.fabric
    widest: dict[int, int] = {}
    for switch, dest in table.decisions:
        tier = ROLE_TIER[fab.switch_by_name[switch].role]
        widest[tier] = max(widest.get(tier, 0), len(table.ecmp_ports(switch, dest)))
    fields: dict[int, tuple[int, int]] = {}
    shift = 0
    for tier in sorted(widest):
        bits = max(MIN_BITS, (widest[tier] - 1).bit_length() + 1)
        fields[tier] = (shift, bits)
        shift += bits
    if shift > PORT_BITS - 2:
        raise TopologyError(
            f"fabric {fab.name!r}: ECMP fan-outs {widest} need {shift} source-port bits; at most {PORT_BITS - 2}"
        )
    return EntropyPlan(fields)
