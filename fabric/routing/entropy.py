"""How a flow's transport source port picks its path: the entropy plan.

At every decision point (a switch with more than one equal-cost next hop towards a destination edge
switch, or with two-hop detours: `PathTable.route_ports`) a flow falls into one of `2**bits`
*slots*, read from its TCP/UDP source port:

    slot = (src_port >> (1 + shift)) & (2**bits - 1)

Each tier that has decisions (leaf/ToR, aggregation, spine/core) reads its own bit field, so the
choices at different tiers are independent. Bit 0 is skipped because Linux hands out even ephemeral
ports to `connect()`. The fields together use at most bits 1..13, so bits 14 and 15 stay free and
every combination of slots has a source port in the ephemeral range 49152..65535 (`src_port_for`).
The controller maps every slot to one next-hop port (by default slot `s` -> the `s mod k`-th of the
`k` equal-cost ports, in port order), so under default weights a traffic generator can put a flow on
a chosen path by choosing its source port, and kernel-chosen ports spread flows like a hash would.
Moving a slot to another port is how weights shift.
"""
from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import RoutingError, TopologyError
from fabric.model import ROLE_TIER
from fabric.routing.tables import PathTable

MIN_BITS = 4
PORT_BITS = 16
#: Highest bit (exclusive) a slot field may use: bits 14 and 15 stay free for the ephemeral range.
FIELD_TOP_BIT = 14
EPHEMERAL_BASE = 49152


def smallest_port_at_least(base: int, value: int, mask: int) -> int | None:
    """The smallest 16-bit p >= base with (p & mask) == value (value within mask), or None.

    p = value | f for a subset f of the free bits; p grows with f, so look for the smallest such f
    that is >= base - value, bit by bit from the top."""
    free = ~mask & ((1 << PORT_BITS) - 1)
    target = base - value
    if target <= 0:
        return value
    best: int | None = None
    prefix = 0
    for bit in range(PORT_BITS - 1, -1, -1):
        b = 1 << bit
        if target & b:
            if not free & b:
                return None if best is None else value | best
            prefix |= b
        elif free & b:
            best = prefix | b  # exceeding the target here, all lower bits 0: smaller than any earlier one
    return value | prefix  # exactly the target


@dataclass(frozen=True)
class EntropyPlan:
    #: tier -> (shift, bits) of that tier's slot field (shift counted above bit 0)
    fields: dict[int, tuple[int, int]]

    def field(self, tier: int) -> tuple[int, int]:
        try:
            return self.fields[tier]
        except KeyError:
            raise RoutingError(f"tier {tier} has no ECMP decisions (tiers with decisions: {sorted(self.fields)})") from None

    def slots(self, tier: int) -> int:
        return 1 << self.field(tier)[1]

    def slot(self, tier: int, src_port: int) -> int:
        shift, bits = self.field(tier)
        return (src_port >> (1 + shift)) & ((1 << bits) - 1)

    def match(self, tier: int, slot: int) -> tuple[int, int]:
        """(value, mask) on the source port selecting `slot` at `tier`."""
        shift, bits = self.field(tier)
        if not 0 <= slot < (1 << bits):
            raise RoutingError(f"slot {slot} out of range 0..{(1 << bits) - 1} at tier {tier}")
        return slot << (1 + shift), ((1 << bits) - 1) << (1 + shift)

    def src_port_for(self, slots: dict[int, int], base: int = EPHEMERAL_BASE) -> int:
        """The smallest source port >= `base` that lands in `slots[tier]` at each given tier."""
        value = mask = 0
        for tier, slot in slots.items():
            v, m = self.match(tier, slot)
            value, mask = value | v, mask | m
        port = smallest_port_at_least(base, value, mask)
        if port is None:
            raise RoutingError(f"no source port >= {base} selects slots {slots}")
        return port


def channel_sport(entropy: EntropyPlan, channel: int) -> int:
    """The source port that puts channel `channel` in slot `channel` (mod the slots) at every deciding
    tier: under default weights, the channel-th equal-cost next hop at every hop. (The replay's
    planned ports and the simulator's use this one rule.)"""
    return entropy.src_port_for({tier: channel % entropy.slots(tier) for tier in entropy.fields})


def plan_entropy(table: PathTable) -> EntropyPlan:
    """Give each tier with decisions a bit field wide enough for twice its largest fan-out (its
    equal-cost ports and detours: `PathTable.route_ports`)."""
    fab = table.fabric
    widest: dict[int, int] = {}
    deciding = {switch for switch, _ in table.decisions}
    for switch, fan_out in table.widest_routes.items():
        if switch in deciding:
            tier = ROLE_TIER[fab.switch_by_name[switch].role]
            widest[tier] = max(widest.get(tier, 0), fan_out)
    fields: dict[int, tuple[int, int]] = {}
    shift = 0
    for tier in sorted(widest):
        bits = max(MIN_BITS, (widest[tier] - 1).bit_length() + 1)
        fields[tier] = (shift, bits)
        shift += bits
    if 1 + shift > FIELD_TOP_BIT:
        raise TopologyError(
            f"fabric {fab.name!r}: ECMP fan-outs {widest} need {shift} source-port bits; at most {FIELD_TOP_BIT - 1}"
        )
    return EntropyPlan(fields)
