"""The routing policy interface: one class per routing mode, the researcher's extension point.

A policy decides, for every switch, destination edge switch and entropy slot, which port a packet
leaves by (`port`), and so the whole path of a flow (`path`: source NIC, destination NIC, source
port). The controller turns its decisions into OpenFlow; the simulator applies them directly. Inputs
are the model (through the path table), link states, measured loads and `now`; outputs are slot
moves. A policy never does I/O.

The base class keeps what every policy needs and exposes it read-only: liveness of every directed
link and of every equal-cost choice, smoothed loads with hot/cool hysteresis, the slot tables at the
decision points, the operator's pinned slots, and the log of routing events. Subclasses react by
overriding `react_to_link`, `react_to_loads` and `react_to_release`, changing slots only through
`_set_slot`. Built-in modes are in `fabric.routing.modes`;
`fabric.routing.registry.load_policy("mypkg.module:MyPolicy")` loads a researcher's own.

Link reactions are memoised (`link_memo`): the outcome of a link event is a function of the set of
down links (which decides liveness), the link, and the slot maps and pins of the decision points
whose liveness changes; so it is kept per (link, up, down links) together with the slot maps it
started from, and a repeated event whose decision points still hold those maps is a lookup. A
subclass that overrides the reaction gets the reference computation unless it declares
`link_memo = True` itself (its reaction must then read nothing but liveness, slots, pins and the
all-up mapping of the decision points it is given). `precompute_failures` warms the memo with every
single-link failure from the current state.

Two-hop detours (`PathTable.detour_ports`; a mesh plane's other leaves) are backups: a decision
point's live ports (`alive`) are its live equal-cost ports, and only where none is left its live
detours (a detour is live when both its links are up), so slots go over a detour only while the
direct link is down, spread over the live detours by slot as ECMP spreads them over ports, and come
back when it recovers. The detour switch forwards a detoured packet by its direct link, never on
(`path`; the controller matches such packets by their in-port), so no path loops. The data plane's
fast-failover order (`failover_order`) rotates the detours by slot, so even before the policy
reacts (or under `ecmp`, which never does) a failed direct link's slots spread over the detours.

An operator's move (`move`) pins the slot: whatever a policy's reaction does, the base class puts a
pinned slot back on the operator's port whenever that port is alive (a failure may move it off for
as long as the port's paths are dead; the recovery brings it back), until the operator releases it
(`release`).
"""
from __future__ import annotations

import functools
import itertools
import operator
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Iterator

from fabric.errors import RoutingError
from fabric.model import ROLE_TIER, NicPort
from fabric.routing.entropy import EntropyPlan, plan_entropy
from fabric.routing.tables import PathTable

DirectedLink = tuple[str, int]  # (switch, egress port)
_Ends = tuple[tuple[DirectedLink, ...], int, int]  # a link's directed links, their bits, their Zobrist number
DecisionPoint = tuple[str, str]  # (switch, destination edge switch)
SlotKey = tuple[str, str, int]  # (switch, destination edge switch, slot)

CAUSES = ("failure", "recovery", "congestion", "manual")
#: methods whose override makes a subclass's link reaction its own (see `RoutingPolicy.link_memo`)
_REACTION_METHODS = ("on_link_change", "react_to_link", "initial_port", "_keep_pins", "_set_slot",
                     "_port_alive", "_live_tier", "_update_liveness", "_remap")
#: memoised link events kept at most (oldest dropped first)
LINK_MEMO_ENTRIES = 1 << 14


@dataclass(frozen=True)
class RouterConfig:
    hot_util: float = 0.9  # a link becomes hot at this utilisation ...
    cool_util: float = 0.7  # ... and stops being hot below this (hysteresis)
    hold_s: float = 0.2  # after a congestion move, leave that decision point and that hot link alone this long
    ewma_alpha: float = 0.5  # weight of the newest rate sample
    min_move_share: float = 0.05  # slots below this share of a link are mice: not counted, not moved
    # a slot that just started is presumed an elephant only once it has sent this much (ten full-size
    # packets): a connection's first packets (a control connection's handshake) are not an elephant
    min_newcomer_bytes: int = 15000

    def __post_init__(self) -> None:
        if not 0 < self.cool_util < self.hot_util:
            raise RoutingError(f"need 0 < cool_util < hot_util, got {self.cool_util}, {self.hot_util}")
        if not 0 < self.ewma_alpha <= 1:
            raise RoutingError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if self.hold_s < 0:
            raise RoutingError(f"hold_s must be >= 0, got {self.hold_s}")
        if not 0 <= self.min_move_share < 1:
            raise RoutingError(f"min_move_share must be in [0, 1), got {self.min_move_share}")
        if self.min_newcomer_bytes < 0:
            raise RoutingError(f"min_newcomer_bytes must be >= 0, got {self.min_newcomer_bytes}")


@dataclass(frozen=True, slots=True)
class SlotMove:
    switch: str
    dest: str  # destination edge switch
    slot: int
    old_port: int
    new_port: int
    cause: str  # one of CAUSES


@dataclass(frozen=True)
class RouteEvent:
    """One decision: what triggered it, when (`now` as given, seconds), and every slot it moved."""

    time_s: float
    cause: str
    trigger: str  # e.g. "spineA0:4 down", "leafA0:1 hot", "operator"
    moves: tuple[SlotMove, ...]
    decision_us: float  # the policy's own decision time


@dataclass(frozen=True)
class LinkState:
    """A directed link (a switch's egress port) as the policy sees it."""

    switch: str
    port: int
    peer: str
    peer_port: int
    up: bool
    capacity_bps: float
    rate_bps: float  # smoothed egress rate, bits per second
    utilisation: float
    hot: bool


def _slots_getter(keys: tuple[DecisionPoint, ...]) -> Callable[[dict[DecisionPoint, tuple[int, ...]]], Any]:
    """A function of the slot tables giving the slot maps at `keys` (fast: `operator.itemgetter`)."""
    if not keys:
        return lambda slots: ()
    return operator.itemgetter(*keys)


@dataclass(frozen=True, slots=True)
class _LinkOutcome:
    """A memoised link event (see `RoutingPolicy._link_transition`)."""

    node_before: int  # the identity of the whole state it was computed from ...
    node_after: int  # ... and of the state it led to
    down_mask: int  # the down links before (the key holds only their hash)
    mask_after: int  # and after
    changed: tuple[DecisionPoint, ...]  # (switch, dest) pairs whose live ports changed, in update order
    alive_before: tuple[tuple[int, ...], ...]  # their live ports before
    alive: tuple[tuple[int, ...], ...]  # and after
    decided: tuple[DecisionPoint, ...]  # those of them with a slot table
    slots_of: Callable[[dict[DecisionPoint, tuple[int, ...]]], Any]  # the slot maps of those with a table
    before: Any  # what `slots_of` gave before: the event's outcome holds for these slot maps only
    moved: tuple[DecisionPoint, ...]  # decision points whose slots moved
    after: tuple[tuple[int, ...], ...]  # their slot maps after
    moves: tuple[SlotMove, ...]


@dataclass
class _Load:
    rate_bps: float = 0.0
    hot: bool = False


class RoutingPolicy:
    """Base of every routing mode. `capacity_scale` maps model rates onto the measured ones (the
    emulator's emulated/real ratio; 1.0 in the simulator). Rates are bits per second."""

    #: the name `--routing` knows it by (built-ins: static, ecmp, adaptive)
    name: ClassVar[str] = "policy"
    #: True: a flow's slot (source port) may choose among equal-cost ports at decision points, and
    #: the data plane keeps a slot table there; False: one port per (switch, destination).
    multipath: ClassVar[bool] = True
    #: True: link reactions are memoised (module docstring); False: always the reference computation
    link_memo: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "link_memo" not in cls.__dict__ and any(m in cls.__dict__ for m in _REACTION_METHODS):
            cls.link_memo = False  # its own reaction may read state the memo's key does not hold

    def __init__(self, table: PathTable, config: RouterConfig | None = None, *, capacity_scale: float = 1.0,
                 event_log_size: int = 10000) -> None:
        if not capacity_scale > 0:
            raise RoutingError(f"capacity_scale must be > 0, got {capacity_scale}")
        self.table = table
        self.config = config or RouterConfig()
        #: the slots of the last `on_loads` that just started sending (its `newcomers_bytes`, at least
        #: `min_newcomer_bytes` each): their measured rates are diluted by the idle time before them
        self.newcomers: frozenset[SlotKey] = frozenset()
        self.capacity_scale = capacity_scale
        self.entropy: EntropyPlan = plan_entropy(table)
        fab = table.fabric
        self._tier = {s.name: ROLE_TIER[s.role] for s in fab.switches}
        self._edge_index = {d: i for i, d in enumerate(table.edge_switches)}
        self._down: set[DirectedLink] = set()
        self._mask = 0  # the same set, one bit per directed link (`_link_index`); read it as `_down_mask`
        # (switch, dest) -> equal-cost next-hop ports currently usable; read it as `_alive`
        self._live: dict[DecisionPoint, tuple[int, ...]] = {}
        for dest in table.edge_switches:
            for switch in fab.switches_in(fab.switch_by_name[dest].plane):
                ports = table.ecmp_ports(switch.name, dest)
                if ports:
                    self._live[(switch.name, dest)] = ports
        # decision point -> slot -> port; `_base` is the all-links-up mapping
        # (slot maps are tuples, replaced on change, and equal maps are one object: memo keys and
        # memoised results share them)
        self._base: dict[DecisionPoint, tuple[int, ...]] = {}
        if self.multipath:
            same: dict[tuple[int, ...], tuple[int, ...]] = {}
            # the default placement depends on the ports and the slot count only: one map per pair
            by_ports: dict[tuple[tuple[int, ...], int], tuple[int, ...]] | None = \
                {} if type(self).initial_port is RoutingPolicy.initial_port else None
            for sw, dest in table.decisions:
                ports = table.ecmp_ports(sw, dest)
                n = self.entropy.slots(self._tier[sw])
                found = by_ports.get((ports, n)) if by_ports is not None else None
                if found is None:
                    base = tuple(self.initial_port(sw, dest, s, ports) for s in range(n))
                    found = same.setdefault(base, base)
                    if by_ports is not None:
                        by_ports[(ports, n)] = found
                self._base[(sw, dest)] = found
        self._slot_maps: dict[DecisionPoint, tuple[int, ...]] = dict(self._base)  # read it as `_slots`
        # decision point -> slot -> the port an operator put it on (kept until released)
        self._pins: dict[DecisionPoint, dict[int, int]] = {}
        self._loads: dict[DirectedLink, _Load] = {}
        self._capacity_bps: dict[DirectedLink, float] = {}
        for link in fab.links:
            for end in (link.a, link.b):
                if end.node in fab.switch_by_name:
                    self._capacity_bps[(end.node, end.port)] = link.rate_gbps * 1e9 * capacity_scale
        # the event log, one plain record per event (`RouteEvent`s are made when asked for, so the
        # decision itself makes no object but this tuple): (time, cause, trigger, moves, decision
        # time); a link event's trigger is kept as (switch, port, up) and worded when asked for
        self._events: deque[tuple[float, str, str | tuple[str, int, bool], tuple[SlotMove, ...], float]] = \
            deque(maxlen=event_log_size)
        # the bit of a directed link in the mask: 1 << its index (made when needed: a dict of the bits
        # themselves would hold n integers of up to n bits)
        self._link_index = {link: i for i, link in enumerate(sorted(self._capacity_bps))}
        # the down set is also kept as the xor of a random 64-bit number per down link (Zobrist
        # hashing): a memo key that costs nothing to hash, where the mask (thousands of bits) does
        rng = random.Random(0)
        self._link_hash = {link: rng.getrandbits(64) for link in sorted(self._capacity_bps)}
        self._down_hash = 0
        # directed link -> both ends (one for a host link), their bits and the xor of their numbers;
        # and the choices whose paths may cross either, nearest the destination first (both filled
        # on first use)
        self._ends: dict[DirectedLink, _Ends] = {}
        # (a choice's decision point, switch, dest, port, whether that decision point has detours)
        self._crossing_order: dict[DirectedLink, tuple[tuple[DecisionPoint, str, str, int, bool], ...]] = {}
        self._same_key = {k: k for k in self._live}  # one key object per (switch, dest): memo entries share them
        # (link, up, down mask before) -> (decision points whose liveness changed, their slot maps
        # before, their live ports after, the decision points moved, their slot maps after, moves)
        self._memo: dict[tuple[str, int, bool, int], _LinkOutcome] = {}
        self._same_alive: dict[tuple[int, ...], tuple[int, ...]] = {}  # one object per set of live ports
        # (equal-cost ports, live ones, a port) -> the live ones with that port toggled
        self._toggled: dict[tuple[tuple[int, ...], tuple[int, ...], int], tuple[int, ...]] = {}
        # Identities of whole states (down links, live ports, slot maps, pins): a memoised event met
        # again in the very state it was computed from needs no check, and its result is applied
        # lazily (`_pending`, applied by `_flush` before anything reads the state; dropped when the
        # events lead back to the state the tables hold, as a failure and its recovery do).
        self._node_ids = itertools.count(1)
        self._node = 0  # the state now
        self._materialized = 0  # the state the tables hold
        self._pending: list[_LinkOutcome] = []
        self._last: _LinkOutcome | None = None  # the memoised event that led to the state now
        self._alive_before: tuple[tuple[int, ...], ...] = ()  # `_update_liveness`'s, for the memo

    # ---- the state, as every method but the memo's fast path reads it -------------------------
    @property
    def _slots(self) -> dict[DecisionPoint, tuple[int, ...]]:
        if self._pending:
            self._flush()
        return self._slot_maps

    @property
    def _alive(self) -> dict[DecisionPoint, tuple[int, ...]]:
        if self._pending:
            self._flush()
        return self._live

    @property
    def _down_mask(self) -> int:
        if self._pending:
            self._flush()
        return self._mask

    def _flush(self) -> None:
        """Apply the memoised events not yet applied to the tables."""
        for e in self._pending:
            self._live.update(zip(e.changed, e.alive))
            self._slot_maps.update(zip(e.moved, e.after))
        if self._pending:
            self._mask = self._pending[-1].mask_after
            self._pending.clear()
        self._materialized = self._node

    def _new_state(self) -> None:
        """The state changed other than by a memoised link event: a new identity."""
        self._flush()
        self._node = self._materialized = next(self._node_ids)
        self._last = None

    # ---- hooks for subclasses ------------------------------------------------------------------
    def initial_port(self, switch: str, dest: str, slot: int, ports: tuple[int, ...]) -> int:
        """The port of `slot` at a decision point with all links up (default: the slot mod k-th)."""
        return ports[slot % len(ports)]

    def react_to_link(self, link: DirectedLink, up: bool, changed: tuple[DecisionPoint, ...],
                      now: float) -> list[SlotMove]:
        """Called after a link changed state and liveness was updated (`changed`: the decision
        points whose set of live ports changed). Default: no reaction."""
        return []

    @property
    def reacts_to_links(self) -> bool:
        """Whether this policy moves slots when links go down or up (it overrides `react_to_link`)."""
        return type(self).react_to_link is not RoutingPolicy.react_to_link

    def react_to_loads(self, slot_rates_bps: dict[SlotKey, float], now: float) -> list[SlotMove]:
        """Called after new loads were folded in (`hot_links()` says which are hot). Default: none."""
        return []

    def react_to_release(self, key: DecisionPoint, slots: tuple[int, ...], now: float) -> list[SlotMove]:
        """Called after the operator released pinned `slots` at decision point `key`: place them as
        the policy would. Default: back on their all-links-up port where it is alive."""
        alive = self._alive.get(key, ())
        return [self._set_slot(key, s, self._base[key][s], "manual") for s in slots
                if self._slots[key][s] != self._base[key][s] and self._base[key][s] in alive]

    def static_port(self, switch: str, dest: str) -> int:
        """For policies with `multipath = False`: the one port towards `dest`."""
        ports = self.table.ecmp_ports(switch, dest)
        return ports[self._edge_index[dest] % len(ports)]

    # ---- the one interface ---------------------------------------------------------------------
    def tier(self, switch: str) -> int:
        return self._tier[switch]

    def is_decision(self, switch: str, dest: str) -> bool:
        """Whether the data plane keeps a slot table at `switch` for `dest`."""
        return (switch, dest) in self._base

    def candidates(self, switch: str, dest: str) -> tuple[int, ...]:
        """Every next-hop port a slot may take: the equal-cost ones, then the two-hop detours (the
        data plane's fail-over order, `failover_order`, starts from the slot's)."""
        return self.table.route_ports(switch, dest)

    def failover_order(self, switch: str, dest: str, slot: int, port: int) -> tuple[int, ...]:
        """The ports the data plane tries, in order, for `slot` on `port` at a decision point (its
        fast-failover group): `port`, then the other candidates in order; for a slot on an
        equal-cost port of a switch with k detours, the detours rotated by the slot (slot s tries
        the (s mod k)-th first), so that a failed direct link spreads its slots over the detours
        in the data plane already."""
        routes = self.table.route_ports(switch, dest)
        n = len(self.table.ecmp_ports(switch, dest))
        k = len(routes) - n
        return _failover_order(routes, n, slot % k if k else 0, port)

    def failover_orders(self, switch: str, dest: str) -> tuple[tuple[int, ...], ...]:
        """Every distinct `failover_order` at a decision point (one group each in the data plane)."""
        routes = self.table.route_ports(switch, dest)
        n = len(self.table.ecmp_ports(switch, dest))
        return _failover_orders(routes, n)

    def port(self, switch: str, dest: str, slot: int = 0) -> int:
        """The port a packet of `slot` leaves `switch` by, towards destination edge switch `dest`."""
        slots = self._slots.get((switch, dest))
        if slots is not None:
            return slots[slot]
        ports = self.table.ecmp_ports(switch, dest)
        if not ports:
            raise RoutingError(f"{switch} has no path towards {dest}")
        if not self.multipath:
            return self.static_port(switch, dest)
        alive = self._alive.get((switch, dest))
        return alive[0] if alive else ports[0]

    def port_for(self, switch: str, dest: str, src_port: int) -> int:
        """`port` for a flow with this transport source port."""
        if (switch, dest) not in self._slots:
            return self.port(switch, dest)
        return self.port(switch, dest, self.entropy.slot(self._tier[switch], src_port))

    def egress(self, switch: str, dest: str, slot: int = 0) -> int | None:
        """The port the data plane sends a packet of `slot` out by now, towards `dest`: at a decision
        point the slot's port or, if that port is down, the first live one of its fast-failover
        order (`failover_order`); elsewhere `port`. None if that port is down (the packet is
        dropped)."""
        slots = self._slots.get((switch, dest))
        if slots is None:
            first = self.port(switch, dest)
            return None if (switch, first) in self._down else first
        first = slots[slot]
        if (switch, first) not in self._down:
            return first
        for port in self.failover_order(switch, dest, slot, first):
            if (switch, port) not in self._down:
                return port
        return None

    def slot_links(self, switch: str, dest: str, slot: int) -> tuple[DirectedLink, ...]:
        """Directed links the packets of `slot` at `switch` cross now towards `dest` before the next
        decision point (whose own slot then decides): empty if they are dropped at `switch`."""
        port = self.egress(switch, dest, slot)
        return () if port is None else self.table.segment(switch, dest, port)

    def _loop_limit(self) -> int:
        return len(self.table.fabric.switches) + 2

    def path(self, src: NicPort, dst: NicPort, src_port: int) -> tuple[str, ...] | None:
        """Nodes a flow from NIC `src` to NIC `dst` with this source port crosses now, hosts
        included, as the data plane forwards it (`egress` at every switch; after a two-hop detour,
        the detour switch's direct link to the destination); None if it is dropped (a dead link on
        its way)."""
        if src.plane != dst.plane:
            raise RoutingError(f"{src.host} ({src.plane}) and {dst.host} ({dst.plane}) are in different planes")
        if not self._edges_up(src, dst):
            return None
        nodes = [src.host, src.switch]
        node = src.switch
        transit: DirectedLink | None = None  # after a detour: the detour switch's direct link
        while node != dst.switch:
            if transit is not None:
                port = transit[1]
                if transit in self._down:
                    return None
                transit = None
            else:
                slot = self.entropy.slot(self._tier[node], src_port) if (node, dst.switch) in self._slots else 0
                egress = self.egress(node, dst.switch, slot)
                if egress is None:
                    return None
                port = egress
                transit = self.table.detour_hop(node, dst.switch, port)
            node = self.table.peer(node, port)[0]
            nodes.append(node)
            if len(nodes) > self._loop_limit():
                raise RoutingError(f"path {src.host} -> {dst.host} (source port {src_port}) loops: {nodes[:8]}...")
        nodes.append(dst.host)
        return tuple(nodes)

    def live_paths(self, src: NicPort, dst: NicPort) -> tuple[tuple[tuple[str, ...], int], ...]:
        """Every distinct path flows from NIC `src` to NIC `dst` take now (as `path` would give for
        some source port), each with the smallest source port >= 49152 that takes it, sorted by
        path. Paths through a dead link are not among them."""
        if src.plane != dst.plane:
            raise RoutingError(f"{src.host} ({src.plane}) and {dst.host} ({dst.plane}) are in different planes")
        if not self._edges_up(src, dst):
            return ()
        plan = self.entropy
        found: dict[tuple[str, ...], int] = {}
        dest = dst.switch

        def walk(node: str, nodes: tuple[str, ...], allowed: dict[int, tuple[int, ...]],
                 transit: DirectedLink | None = None) -> None:
            if node == dest:
                found[nodes + (dst.host,)] = plan.src_port_for({t: s[0] for t, s in allowed.items()})
                return
            if len(nodes) > self._loop_limit():
                raise RoutingError(f"paths {src.host} -> {dst.host} loop: {nodes[:8]}...")
            if transit is not None:  # a detoured packet: the detour switch's direct link, or nothing
                if transit not in self._down:
                    nxt = self.table.peer(*transit)[0]
                    walk(nxt, nodes + (nxt,), allowed)
                return
            by_port: dict[int, list[int]] = {}
            if (node, dest) in self._slots:
                # a flow keeps its slot at every switch of one tier: a tier met twice is already decided
                tier = self._tier[node]
                for slot in allowed.get(tier, range(plan.slots(tier))):
                    port = self.egress(node, dest, slot)
                    if port is not None:
                        by_port.setdefault(port, []).append(slot)
            else:
                tier = 0
                port = self.egress(node, dest)
                if port is not None:
                    by_port[port] = []
            for port, slots in by_port.items():
                nxt = self.table.peer(node, port)[0]
                walk(nxt, nodes + (nxt,), {**allowed, tier: tuple(slots)} if slots else allowed,
                     self.table.detour_hop(node, dest, port))

        walk(src.switch, (src.host, src.switch), {})
        return tuple(sorted(found.items()))

    def _edges_up(self, src: NicPort, dst: NicPort) -> bool:
        """Whether both hosts' links to their edge switches are up."""
        return (src.switch, src.switch_port) not in self._down and (dst.switch, dst.switch_port) not in self._down

    # ---- inputs --------------------------------------------------------------------------------
    def on_link_change(self, switch: str, port: int, up: bool, now: float,
                       trigger: str | None = None) -> tuple[SlotMove, ...]:
        """A port went down or came up (both directions of its link change). Returns slot moves.
        `trigger` words the event in the log (default "switch:port down|up"; the controller's gray
        failure detection takes a link that loses packets out of service through here too)."""
        started = time.perf_counter()
        link = self._ends.get((switch, port)) or self._link_ends(switch, port)
        ends, down = link[0], self._down
        if (ends[0] in down) != up and (len(ends) == 1 or (ends[1] in down) != up):
            return ()  # already so at both ends
        moves = self._link_transition(switch, port, link, up, now)[1]
        if moves:
            self._events.append((now, "recovery" if up else "failure", trigger or (switch, port, up), moves,
                                 (time.perf_counter() - started) * 1e6))
        return moves

    def _link_ends(self, switch: str, port: int) -> _Ends:
        """Both directed links of the link at `switch`'s `port` (one for a host link), their bits
        and the xor of their numbers."""
        got = self._ends.get((switch, port))
        if got is None:
            if (switch, port) not in self._capacity_bps:
                raise RoutingError(f"{switch} port {port} is not a switch port of fabric {self.table.fabric.name!r}")
            peer = self.table.peer(switch, port)
            ends = ((switch, port), peer) if peer[0] in self.table.fabric.switch_by_name else ((switch, port),)
            got = self._ends[(switch, port)] = (ends, sum(1 << self._link_index[e] for e in ends),
                                                functools.reduce(operator.xor, (self._link_hash[e] for e in ends)))
        return got

    def _link_transition(self, switch: str, port: int, link: _Ends, up: bool,
                         now: float) -> tuple[tuple[DecisionPoint, ...], tuple[SlotMove, ...]]:
        """Liveness and the reaction to a link event: the decision points whose liveness changed and
        the moves. From the memo where the event was seen before with the same slot maps there."""
        memo_key = (switch, port, up, self._down_hash)
        if self.link_memo:
            hit = self._memo.get(memo_key)
            if hit is not None and hit.node_before == self._node:
                # the very state it was computed from: no check, and applied when someone looks
                # (the mask with the rest; the down set and its hash now, as `_set_down` would)
                (self._down.difference_update if up else self._down.update)(link[0])
                self._down_hash ^= link[2]
                self._node = hit.node_after
                self._last = hit
                if self._node == self._materialized:
                    self._pending.clear()  # back where the tables are
                else:
                    self._pending.append(hit)
                return hit.changed, hit.moves
            slots = self._slots  # (applies what is pending)
            if hit is not None and hit.down_mask == self._mask and hit.slots_of(slots) == hit.before and \
                    (not self._pins or self._pins.keys().isdisjoint(hit.changed)):
                self._set_down(link, up)
                self._live.update(zip(hit.changed, hit.alive))
                slots.update(zip(hit.moved, hit.after))
                self._new_state()
                return hit.changed, hit.moves
        slots = self._slots
        node_before, down_mask = self._node, self._mask
        changed = self._update_liveness(switch, port, link, up)
        decided = tuple(k for k in changed if k in slots)
        slots_of = _slots_getter(decided)
        before = slots_of(slots)
        cause = "recovery" if up else "failure"
        moves = tuple(self._keep_pins(self.react_to_link((switch, port), up, tuple(sorted(changed)), now),
                                      changed, cause))
        last = self._last
        self._new_state()
        if self.link_memo and (not self._pins or self._pins.keys().isdisjoint(changed)):
            moved_set = {(m.switch, m.dest) for m in moves}
            moved = tuple(k for k in decided if k in moved_set)
            if len(moved) == len(moved_set):  # else the outcome read slots the key does not hold
                if last is not None and last.node_after == node_before and self._undoes(last, changed, moved):
                    self._node = self._materialized = last.node_before
                if len(self._memo) >= LINK_MEMO_ENTRIES:
                    del self._memo[next(iter(self._memo))]
                entry = self._memo[memo_key] = _LinkOutcome(
                    node_before, self._node, down_mask, self._mask, changed, self._alive_before,
                    tuple(self._live[k] for k in changed), decided, slots_of, before, moved,
                    tuple(slots[k] for k in moved), moves)
                self._last = entry
        return changed, moves

    def _undoes(self, last: _LinkOutcome, changed: tuple[DecisionPoint, ...], moved: tuple[DecisionPoint, ...]) -> bool:
        """Whether the event just computed (changing live ports at `changed` and slots at `moved`)
        took the state back to where the memoised event `last`, which led to the state before it,
        started: then that state's identity is the one to keep (a failure, then its recovery)."""
        return (self._mask == last.down_mask and set(changed) <= set(last.changed)
                and set(moved) <= set(last.decided)
                and tuple(self._live[k] for k in last.changed) == last.alive_before
                and last.slots_of(self._slot_maps) == last.before)

    def _set_down(self, link: _Ends, up: bool) -> None:
        """Mark both ends of a link down or up (in the set, the mask and the mask's hash)."""
        ends, mask, zobrist = link
        if up:
            self._down.difference_update(ends)
            self._mask &= ~mask
        else:
            self._down.update(ends)
            self._mask |= mask
        self._down_hash ^= zobrist

    def _update_liveness(self, switch: str, port: int, link: _Ends, up: bool) -> tuple[DecisionPoint, ...]:
        """Mark the link's ends down or up and update the live ports of every choice whose paths
        may cross it. Returns the decision points whose set of live ports changed."""
        self._set_down(link, up)
        # Every choice whose paths may cross the link, nearest the destination first, so that a
        # switch sees its downstream neighbours' new liveness. Liveness also changes upstream of a
        # switch that lost all its ports: those choices are in `crossing` too (their `via` holds the
        # link), so one pass suffices.
        order = self._crossing_order.get((switch, port))
        if order is None:
            keys = {k for e in link[0] for k in self.table.crossing(*e)}
            dist = self.table.switch_hops
            same = self._same_key
            detours = self.table.detour_ports
            order = self._crossing_order[(switch, port)] = tuple(
                (same[(sw, dest)], sw, dest, p, bool(detours(sw, dest)))
                for sw, dest, p in sorted(keys, key=lambda k: (dist(k[0], k[1]) or 0, k)))
        changed: dict[DecisionPoint, None] = {}
        before: list[tuple[int, ...]] = []
        tiered: set[DecisionPoint] = set()
        for key, sw, dest, p, has_detours in order:
            alive = self._alive[key]
            if has_detours:  # its live ports are a tier (module docstring): recomputed whole, once
                if key in tiered:
                    continue
                tiered.add(key)
                now_alive = self._live_tier(sw, dest)
                if now_alive == alive:
                    continue
                self._alive[key] = now_alive
            elif self._port_alive(sw, dest, p) != (p in alive):
                every = self.table.ecmp_ports(sw, dest)
                toggled = self._toggled.get((every, alive, p))
                if toggled is None:
                    ports = set(alive) ^ {p}
                    now_alive = tuple(q for q in every if q in ports)
                    toggled = self._toggled[(every, alive, p)] = self._same_alive.setdefault(now_alive, now_alive)
                self._alive[key] = toggled
            else:
                continue
            if key not in changed:
                changed[key] = None
                before.append(alive)
        self._alive_before = tuple(before)
        return tuple(changed)

    def precompute_failures(self, links: Iterable[DirectedLink] | None = None,
                            budget_s: float | None = None) -> Iterator[tuple[SlotMove, ...]]:
        """Warm the link memo: the failure of every switch-to-switch link (or of `links`), each from
        the current state, which is put back after each; no event is recorded. Yields each
        failure's moves (the controller prepares its messages for them). Stops after `budget_s`
        seconds if given; does nothing unless `link_memo`."""
        if not self.link_memo:
            return
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        fab = self.table.fabric
        todo = links if links is not None else [
            (l.a.node, l.a.port) for l in fab.links if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]
        alive = dict(self._alive)
        slots = dict(self._slots)
        node = self._node
        for switch, port in todo:
            if deadline is not None and time.perf_counter() > deadline:
                return
            link = self._link_ends(switch, port)
            if self._down_mask & link[1]:
                continue
            changed, moves = self._link_transition(switch, port, link, False, 0.0)
            self._flush()
            self._set_down(link, True)
            for k in changed:
                self._live[k] = alive[k]
            for k in {*changed, *((m.switch, m.dest) for m in moves)} & slots.keys():
                self._slot_maps[k] = slots[k]
            self._node = self._materialized = node  # exactly the state it was
            self._last = None
            yield moves

    def on_loads(self, port_rates_bps: dict[DirectedLink, float], slot_rates_bps: dict[SlotKey, float],
                 now: float, newcomers_bytes: dict[SlotKey, int] | None = None,
                 newcomers_span_s: dict[SlotKey, float] | None = None) -> list[SlotMove]:
        """Fold in measured egress rates per directed link (bits/s) and per slot; return moves.
        Slots that just started (`newcomers_bytes`, sent over `newcomers_span_s`) get presumed rates
        on the links hot after this sample (`presume_newcomers`)."""
        started = time.perf_counter()
        cfg = self.config
        for link, rate in port_rates_bps.items():
            cap = self._capacity_bps.get(link)
            if cap is None:
                continue
            load = self._loads.setdefault(link, _Load(rate))
            load.rate_bps += cfg.ewma_alpha * (rate - load.rate_bps)
            util = load.rate_bps / cap
            if load.hot and util < cfg.cool_util:
                load.hot = False
            elif not load.hot and util >= cfg.hot_util:
                load.hot = True
        floor = max(1, cfg.min_newcomer_bytes)
        # slots whose windowed rate does not cover their activity yet: never read as idle
        self.newcomers = frozenset(k for k, n in (newcomers_bytes or {}).items() if n >= floor)
        if newcomers_bytes:
            slot_rates_bps = self.presume_newcomers(slot_rates_bps, newcomers_bytes, newcomers_span_s)
        moves = self._keep_pins(self.react_to_loads(slot_rates_bps, now), (), "congestion")
        if moves:
            self._new_state()
            hot = ", ".join(f"{s}:{p}" for s, p in self.hot_links())
            home = sum(1 for m in moves if self._base.get((m.switch, m.dest), ())[m.slot:m.slot + 1] == (m.new_port,))
            detail = "; ".join(([f"hot {hot}"] if hot else [])
                               + ([f"{home} idle slot(s) back on their all-links-up port"] if home else []))
            self._record(now, "congestion", detail, moves, started)
        return moves

    def presume_newcomers(self, slot_rates_bps: dict[SlotKey, float], newcomers_bytes: dict[SlotKey, int],
                          newcomers_span_s: dict[SlotKey, float] | None = None) -> dict[SlotKey, float]:
        """`slot_rates_bps` with a presumed rate for each slot that has just started sending
        (`newcomers_bytes`: slot -> bytes counted since it started, at least `min_newcomer_bytes`),
        whose rate over a full flow-counter window is not known yet, on the hot links it crosses.

        On a hot link the newcomers are presumed to take their fair share of the link's rate next to
        the elephants already known there, as TCP flows would (n_new / (n_known + n_new) of it), split
        between them in proportion to their rates so far: bytes over `newcomers_span_s` (the time from
        the last reading before it was first seen sending to the latest, so a flow that started
        hundreds of ms after another, bytes behind it, still counts at its own pace), or in proportion
        to their bytes where no span is given; a newcomer gets the least of its hot links'
        estimates, and never less than its own measured rate. An estimate only: the windowed rates
        replace it as soon as they cover the slot's activity, and the hold-down (`hold_s`) gives the
        port samples after a move time to confirm it before that link is relieved again."""
        hot = set(self.hot_links())
        if not newcomers_bytes or not hot:
            return slot_rates_bps
        share = self.config.min_move_share
        slots = self._slots
        n_known: dict[DirectedLink, int] = {}
        for (sw, dest, s), rate in slot_rates_bps.items():
            if (sw, dest, s) in newcomers_bytes or (sw, dest) not in slots or s >= len(slots[(sw, dest)]):
                continue
            for link in self.slot_links(sw, dest, s):
                if link in hot and rate >= share * self._capacity_bps[link]:
                    n_known[link] = n_known.get(link, 0) + 1
        on_link: dict[DirectedLink, list[SlotKey]] = {}
        crossing: dict[SlotKey, list[DirectedLink]] = {}
        for key, n_bytes in newcomers_bytes.items():
            sw, dest, s = key
            if n_bytes < max(1, self.config.min_newcomer_bytes) or (sw, dest) not in slots or s >= len(slots[(sw, dest)]):
                continue
            links = [l for l in self.slot_links(sw, dest, s) if l in hot]
            if links:
                crossing[key] = links
                for link in links:
                    on_link.setdefault(link, []).append(key)
        if not crossing:
            return slot_rates_bps
        out = dict(slot_rates_bps)
        spans = newcomers_span_s or {}
        weight = {k: newcomers_bytes[k] / spans[k] if spans.get(k, 0.0) > 0 else float(newcomers_bytes[k])
                  for k in crossing}
        for key, links in crossing.items():
            estimates = []
            for link in links:
                new = on_link[link]
                pool = self.rate_bps(link) * len(new) / (n_known.get(link, 0) + len(new))
                estimates.append(pool * weight[key] / sum(weight[k] for k in new))
            out[key] = max(out.get(key, 0.0), min(estimates))
        return out

    def forget_loads(self) -> None:
        """Drop the smoothed loads and hot flags (as a freshly started controller has none)."""
        self._loads.clear()

    def move(self, switch: str, dest: str, slot: int, port: int, now: float) -> SlotMove | None:
        """An operator puts one slot on a chosen live next hop (e.g. to drain a link) and pins it
        there: it stays, through other failures, recoveries and congestion, until `release`d; if
        the port's paths die, the policy moves it off, and back when they come back."""
        started = time.perf_counter()
        key = self._slot_key(switch, dest, slot)
        if port not in self._alive.get(key, ()):
            raise RoutingError(f"port {port} of {switch} is not a live next hop towards {dest} "
                               f"(live: {list(self._alive.get(key, ()))})")
        self._pins.setdefault(key, {})[slot] = port
        self._new_state()
        if self._slots[key][slot] == port:
            return None
        move = self._set_slot(key, slot, port, "manual")
        self._record(now, "manual", "operator", [move], started)
        return move

    def release(self, switch: str, dest: str, slot: int | None, now: float) -> list[SlotMove]:
        """The operator gives pinned `slot` (None: every pinned slot) at `switch` towards `dest` back
        to the policy, which places it again (`react_to_release`). Returns the moves."""
        started = time.perf_counter()
        key = self._slot_key(switch, dest, 0 if slot is None else slot)
        pins = self._pins.get(key, {})
        if slot is not None and slot not in pins:
            raise RoutingError(f"slot {slot} at {switch} towards {dest} is not pinned (pinned: {sorted(pins)})")
        released = tuple(sorted(pins)) if slot is None else (slot,)
        for s in released:
            del pins[s]
        if not pins:
            self._pins.pop(key, None)
        moves = self._keep_pins(self.react_to_release(key, released, now), (key,), "manual")
        self._new_state()
        self._record(now, "manual", "operator release", moves, started)
        return moves

    def _slot_key(self, switch: str, dest: str, slot: int) -> DecisionPoint:
        key = (switch, dest)
        if key not in self._slots:
            raise RoutingError(f"{switch} has no ECMP choice towards {dest} under routing {self.name!r}")
        n = len(self._slots[key])
        if not 0 <= slot < n:
            raise RoutingError(f"slot {slot} out of range 0..{n - 1} at {switch}")
        return key

    # ---- for subclasses ------------------------------------------------------------------------
    def _set_slot(self, key: DecisionPoint, slot: int, port: int, cause: str) -> SlotMove:
        if cause not in CAUSES:
            raise RoutingError(f"cause {cause!r} is not one of {CAUSES}")
        if port not in self.table.route_ports(*key):
            raise RoutingError(f"port {port} of {key[0]} is not a next hop (equal-cost or detour) towards {key[1]}")
        slots = self._slots[key]
        move = SlotMove(key[0], key[1], slot, slots[slot], port, cause)
        self._slots[key] = slots[:slot] + (port,) + slots[slot + 1:]
        return move

    def _keep_pins(self, moves: list[SlotMove], keys: Iterable[DecisionPoint], cause: str) -> list[SlotMove]:
        """Put every pinned slot at `keys` and at the moves' decision points back on its operator's
        port where that port is alive; then one move per slot, none for a slot that ended where it
        began."""
        if not self._pins:
            return moves
        for key in sorted(k for k in set(keys) | {(m.switch, m.dest) for m in moves} if k in self._pins):
            alive = self._alive.get(key, ())
            for slot, port in self._pins.get(key, {}).items():
                if self._slots[key][slot] != port and port in alive:
                    moves.append(self._set_slot(key, slot, port, cause))
        first: dict[SlotKey, SlotMove] = {}
        last: dict[SlotKey, SlotMove] = {}
        for m in moves:
            first.setdefault((m.switch, m.dest, m.slot), m)
            last[(m.switch, m.dest, m.slot)] = m
        return [SlotMove(m.switch, m.dest, m.slot, first[k].old_port, m.new_port, m.cause)
                for k, m in last.items() if first[k].old_port != m.new_port]

    def _port_alive(self, sw: str, dest: str, port: int) -> bool:
        """Whether equal-cost port `port` of `sw` still leads to `dest`."""
        if (sw, port) in self._down:
            return False
        nxt = self.table.peer(sw, port)[0]
        return nxt == dest or bool(self._alive.get((nxt, dest)))

    def _live_tier(self, sw: str, dest: str) -> tuple[int, ...]:
        """The live ports of a decision point with detours: its live equal-cost ports, or where none
        is left, its detours whose both links are up."""
        table = self.table
        live = tuple(p for p in table.ecmp_ports(sw, dest) if self._port_alive(sw, dest, p))
        if not live:
            down = self._down
            live = tuple(p for p in table.detour_ports(sw, dest)
                         if (sw, p) not in down and table.detour_hop(sw, dest, p) not in down)
        return self._same_alive.setdefault(live, live)

    def _record(self, now: float, cause: str, trigger: str, moves: Iterable[SlotMove], started: float) -> None:
        if moves:
            self._events.append((now, cause, trigger, tuple(moves), (time.perf_counter() - started) * 1e6))

    # ---- read-only snapshots -------------------------------------------------------------------
    def decision_points(self) -> tuple[DecisionPoint, ...]:
        return tuple(sorted(self._base))

    def base_slots(self, switch: str, dest: str) -> tuple[int, ...]:
        return self._base[(switch, dest)]

    def slots(self, switch: str, dest: str) -> tuple[int, ...]:
        """Slot -> port at one decision point."""
        return self._slots[(switch, dest)]

    def pinned(self, switch: str, dest: str) -> dict[int, int]:
        """Slot -> port for the slots an operator pinned at one decision point."""
        return dict(self._pins.get((switch, dest), {}))

    def slot_table(self, switch: str) -> dict[str, tuple[int, ...]]:
        """Destination edge switch -> slot -> port, for every decision point of `switch`."""
        return {d: p for (s, d), p in sorted(self._slots.items()) if s == switch}

    def alive(self, switch: str, dest: str) -> tuple[int, ...]:
        """The ports slots may take now: the live equal-cost ones; where none is live, the live detours."""
        return self._alive.get((switch, dest), ())

    def has_link(self, link: DirectedLink) -> bool:
        """Whether `link` is a switch port of the fabric (a directed link this policy knows)."""
        return link in self._capacity_bps

    def is_up(self, link: DirectedLink) -> bool:
        return link not in self._down

    def capacity_bps(self, link: DirectedLink) -> float:
        return self._capacity_bps[link]

    def directed_links(self) -> tuple[DirectedLink, ...]:
        return tuple(sorted(self._capacity_bps))

    def rate_bps(self, link: DirectedLink) -> float:
        load = self._loads.get(link)
        return load.rate_bps if load else 0.0

    def utilisation(self, link: DirectedLink) -> float:
        return self.rate_bps(link) / self._capacity_bps[link]

    def hot_links(self) -> tuple[DirectedLink, ...]:
        return tuple(sorted(l for l, ld in self._loads.items() if ld.hot))

    def links(self) -> tuple[LinkState, ...]:
        out = []
        for sw, port in self.directed_links():
            peer, peer_port = self.table.peer(sw, port)
            load = self._loads.get((sw, port))
            out.append(LinkState(sw, port, peer, peer_port, (sw, port) not in self._down,
                                 self._capacity_bps[(sw, port)], load.rate_bps if load else 0.0,
                                 self.utilisation((sw, port)), bool(load and load.hot)))
        return tuple(out)

    def events(self, limit: int | None = None) -> tuple[RouteEvent, ...]:
        evs = tuple(self._events)
        if limit is not None:
            evs = evs[-limit:] if limit > 0 else ()
        return tuple(RouteEvent(now, cause, trigger if isinstance(trigger, str) else
                                f"{trigger[0]}:{trigger[1]} {'up' if trigger[2] else 'down'}", moves, took_us)
                     for now, cause, trigger, moves, took_us in evs)

    def reroutes(self) -> dict[str, int]:
        """Slot moves by cause, over the events still in the log."""
        out = {c: 0 for c in CAUSES}
        for e in self._events:
            for m in e[3]:
                out[m.cause] += 1
        return out


@functools.lru_cache(maxsize=4096)
def _failover_order(routes: tuple[int, ...], n_primary: int, rotation: int, port: int) -> tuple[int, ...]:
    """`RoutingPolicy.failover_order` for candidates `routes` (the first `n_primary` equal-cost)."""
    primaries, detours = routes[:n_primary], routes[n_primary:]
    if port in primaries and detours:
        detours = detours[rotation:] + detours[:rotation]
    return (port,) + tuple(q for q in primaries + detours if q != port)


@functools.lru_cache(maxsize=4096)
def _failover_orders(routes: tuple[int, ...], n_primary: int) -> tuple[tuple[int, ...], ...]:
    rotations = range(max(1, len(routes) - n_primary))
    return tuple(sorted({_failover_order(routes, n_primary, r, p) for p in routes for r in rotations}))
