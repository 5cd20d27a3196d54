"""Liveness as a routing policy sees it: which directed links are down, and which ports of every
equal-cost choice (switch, destination edge switch) still lead to the destination.

The down links are kept three ways: a set; a bitmask, one bit per directed link (1 << its index:
a dict of the bits themselves would hold n integers of up to n bits); and the xor of a random 64-bit
number per down link (Zobrist hashing: a memo key that costs nothing to hash, where the mask,
thousands of bits, does). `update` recomputes the live ports of every choice whose paths may cross a
link that changed, nearest the destination first; whether a port is live is the policy's to say
(`RoutingPolicy._port_alive`, `RoutingPolicy._live_tier`, passed in).
"""
from __future__ import annotations

import functools
import operator
import random
from typing import Callable, Iterable

from fabric.errors import RoutingError
from fabric.routing.records import DecisionPoint, DirectedLink
from fabric.routing.tables import PathTable

Ends = tuple[tuple[DirectedLink, ...], int, int]  # a link's directed links, their bits, their Zobrist number
Live = tuple[int, ...]
# a choice whose paths may cross a link: (its decision point, switch, dest, port, whether that
# decision point has detours)
_Crossing = tuple[DecisionPoint, str, str, int, bool]


class Liveness:
    """The down links and the live ports of every choice of `table`'s fabric (`links`: every
    directed link there is)."""

    def __init__(self, table: PathTable, links: Iterable[DirectedLink]) -> None:
        self.table = table
        fab = table.fabric
        self.down: set[DirectedLink] = set()
        self.mask = 0  # the same set, one bit per directed link (`link_index`)
        # (switch, dest) -> equal-cost next-hop ports currently usable
        self.live: dict[DecisionPoint, Live] = {}
        for dest in table.edge_switches:
            for switch in fab.switches_in(fab.switch_by_name[dest].plane):
                ports = table.ecmp_ports(switch.name, dest)
                if ports:
                    self.live[(switch.name, dest)] = ports
        ordered = sorted(links)
        self.link_index = {link: i for i, link in enumerate(ordered)}
        rng = random.Random(0)
        self.link_hash = {link: rng.getrandbits(64) for link in ordered}
        self.hash = 0  # the down set's Zobrist hash
        # directed link -> both ends (one for a host link), their bits and the xor of their numbers;
        # and the choices whose paths may cross either, nearest the destination first (both filled
        # on first use)
        self.ends: dict[DirectedLink, Ends] = {}
        self.crossing: dict[DirectedLink, tuple[_Crossing, ...]] = {}
        self.same_key = {k: k for k in self.live}  # one key object per (switch, dest): memo entries share them
        self.same_alive: dict[Live, Live] = {}  # one object per set of live ports
        # (equal-cost ports, live ones, a port) -> the live ones with that port toggled
        self.toggled: dict[tuple[Live, Live, int], Live] = {}
        self.alive_before: tuple[Live, ...] = ()  # the last `update`'s live ports before, for the memo

    def link_ends(self, switch: str, port: int) -> Ends:
        """Both directed links of the link at `switch`'s `port` (one for a host link), their bits
        and the xor of their numbers."""
        got = self.ends.get((switch, port))
        if got is None:
            table = self.table
            if (switch, port) not in self.link_index:
                raise RoutingError(f"{switch} port {port} is not a switch port of fabric {table.fabric.name!r}")
            peer = table.peer(switch, port)
            ends = ((switch, port), peer) if peer[0] in table.fabric.switch_by_name else ((switch, port),)
            got = self.ends[(switch, port)] = (ends, sum(1 << self.link_index[e] for e in ends),
                                               functools.reduce(operator.xor, (self.link_hash[e] for e in ends)))
        return got

    def set_down(self, link: Ends, up: bool) -> None:
        """Mark both ends of a link down or up (in the set, the mask and the mask's hash)."""
        ends, mask, zobrist = link
        if up:
            self.down.difference_update(ends)
            self.mask &= ~mask
        else:
            self.down.update(ends)
            self.mask |= mask
        self.hash ^= zobrist

    def update(self, switch: str, port: int, link: Ends, port_alive: Callable[[str, str, int], bool],
               live_tier: Callable[[str, str], Live]) -> tuple[DecisionPoint, ...]:
        """Update the live ports of every choice whose paths may cross the link at `switch`'s `port`
        (its ends already marked). Returns the decision points whose set of live ports changed, in
        update order; `alive_before` holds their live ports before."""
        # Every choice whose paths may cross the link, nearest the destination first, so that a
        # switch sees its downstream neighbours' new liveness. Liveness also changes upstream of a
        # switch that lost all its ports: those choices are in `crossing` too (their `via` holds the
        # link), so one pass suffices.
        order = self.crossing.get((switch, port))
        if order is None:
            keys = {k for e in link[0] for k in self.table.crossing(*e)}
            dist = self.table.switch_hops
            same = self.same_key
            detours = self.table.detour_ports
            order = self.crossing[(switch, port)] = tuple(
                (same[(sw, dest)], sw, dest, p, bool(detours(sw, dest)))
                for sw, dest, p in sorted(keys, key=lambda k: (dist(k[0], k[1]) or 0, k)))
        live = self.live
        changed: dict[DecisionPoint, None] = {}
        before: list[Live] = []
        tiered: set[DecisionPoint] = set()
        for key, sw, dest, p, has_detours in order:
            alive = live[key]
            if has_detours:  # its live ports are a tier (`RoutingPolicy._live_tier`): recomputed whole, once
                if key in tiered:
                    continue
                tiered.add(key)
                now_alive = live_tier(sw, dest)
                if now_alive == alive:
                    continue
                live[key] = now_alive
            elif port_alive(sw, dest, p) != (p in alive):
                every = self.table.ecmp_ports(sw, dest)
                toggled = self.toggled.get((every, alive, p))
                if toggled is None:
                    ports = set(alive) ^ {p}
                    now_alive = tuple(q for q in every if q in ports)
                    toggled = self.toggled[(every, alive, p)] = self.same_alive.setdefault(now_alive, now_alive)
                live[key] = toggled
            else:
                continue
            if key not in changed:
                changed[key] = None
                before.append(alive)
        self.alive_before = tuple(before)
        return tuple(changed)
