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

import dataclasses
import math
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
    #: tier -> the widest choice a decision point of that tier has (its equal-cost ports and detours)
    fan_outs: dict[int, int]
    #: (base, (tier, slot), ...) -> `src_port_for`'s answer: a fabric has few slot combinations, and a
    #: simulation plans a port for every connection (131,072 at 16,384 hosts)
    _ports: dict[tuple[int, ...], int] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

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
        key = (base, *(x for item in sorted(slots.items()) for x in item))
        known = self._ports.get(key)
        if known is not None:
            return known
        value = mask = 0
        for tier, slot in slots.items():
            v, m = self.match(tier, slot)
            value, mask = value | v, mask | m
        port = smallest_port_at_least(base, value, mask)
        if port is None:
            raise RoutingError(f"no source port >= {base} selects slots {slots}")
        self._ports[key] = port
        return port


def twist_blocks(entropy: EntropyPlan, channels: int) -> tuple[int, ...]:
    """The block sizes, in units of the rule's count f (`pair_sport`), at which the tiers' next hops turn
    over: the count's slots are w = channels x f + channel read as a mixed-radix number over the deciding
    tiers' fan-outs F1, F2, ..., so tier i's digit turns over every (F1 x ... x Fi) / channels of f
    (divided by their common factor where channels does not divide the product); the sizes above 1,
    ascending."""
    blocks: list[int] = []
    product = 1
    for tier in sorted(entropy.fields):
        product *= entropy.fan_outs[tier]
        block = product // math.gcd(product, channels)
        if block > 1 and (not blocks or block > blocks[-1]):
            blocks.append(block)
    return tuple(blocks)


def source_twist(src_index: int, blocks: tuple[int, ...]) -> int:
    """1 where the source's block numbers (its index // each of `blocks`) have an odd sum, else 0."""
    return sum(src_index // b for b in blocks) % 2


def pair_sport(entropy: EntropyPlan, src_index: int, dst_index: int, channel: int, channels: int) -> int:
    """The planned source port of connection `channel` (of `channels`) from host `src_index` to host
    `dst_index` (the replay's planned ports and the simulator's use this one rule). The indices are the
    hosts' places in edge-switch order (`fabric.analysis.edge_order`: the host index on server-wired
    fabrics; on rail-wired ones the hosts of a leaf are counted together, as the rule needs).

    The count is w = channels x (src_index + dst_index + t) + channel, where the twist t
    (`source_twist` over `twist_blocks`) is 1 where the source's block numbers, at the sizes where the
    tiers' next hops turn over, have an odd sum, else 0. The slot at the lowest deciding tier is
    w mod its slots, at the next tier (w // F1) mod its slots, then (w // (F1 x F2)) mod ..., where F
    is each tier's fan-out. Under default weights (slot s -> the (s mod F)-th next hop) that is a
    mixed-radix count over the next hops, so:
    - the channels of a pair take consecutive next hops at the first tier (distinct ones while
      channels <= its fan-out; their source ports differ while channels <= its slots);
    - a host sending to every other host (an all-to-all) spreads over all of its edge switch's
      uplinks (its twist is fixed, the count steps by channels as the peer's index does), and a host
      receiving from every other over all of the downlinks into its edge switch (the twist is fixed
      within a block, so there the senders' counts step by channels too);
    - pairs whose destination is the source plus a constant (a pipeline's stages, a ring across
      leaves, a pairwise all-to-all's rounds) spread over every next hop as well. Without the twist
      their count would step by 2 x channels, so a leaf's pairs would take every other next hop
      (half the uplinks, each with twice the flows); the twist puts alternate blocks on the odd
      steps. Exact where a leaf holds whole pairs of blocks (dual-plane-1024 with 2 channels:
      blocks of 16, a leaf of 32 hosts, 2 flows on each of its 32 uplinks). Where a leaf holds a
      single block (one channel and as many hosts on a leaf as uplinks) the twist is the same for
      all of its hosts and its shifted pairs stay on every other next hop, as before; a count of
      src + 2 x dst would spread them, at the cost of the point above (one host's pairs to every
      other on half its uplinks): benchmarks/planned_ports_spread.py measures both;
    - with a fan-out of 2 and 2 channels, channel c takes the c-th next hop, whatever the pair
      (no block is above 1: no twist)."""
    if not 0 <= channel < channels:
        raise RoutingError(f"channel {channel} is not one of 0..{channels - 1}")
    if src_index < 0 or dst_index < 0:
        raise RoutingError(f"host indices must be >= 0, got {src_index} and {dst_index}")
    if not entropy.fields:  # no decisions anywhere: the channels only need ports of their own
        return EPHEMERAL_BASE + 2 * channel
    if channels > (most := entropy.slots(min(entropy.fields))):
        raise RoutingError(f"{channels} channels per pair: at most {most} have source ports of their own")
    twist = source_twist(src_index, twist_blocks(entropy, channels))
    w = channels * (src_index + dst_index + twist) + channel
    slots = {}
    for tier in sorted(entropy.fields):
        slots[tier] = w % entropy.slots(tier)
        w //= entropy.fan_outs[tier]
    return entropy.src_port_for(slots)


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
    return EntropyPlan(fields, widest)
