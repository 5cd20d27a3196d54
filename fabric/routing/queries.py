"""The read side of a routing policy, `PolicyQueries`, the base of `RoutingPolicy`: its decisions as
the data plane applies them (`port`, `egress`, the fast-failover orders, `path`, `live_paths`) and
read-only snapshots of its state (slot tables, pins, liveness, loads, the event log).

It reads the state `RoutingPolicy` keeps (declared below, held in its parts: `Liveness`, `LinkMemo`,
`LinkLoads`, `Pins`, `EventLog`) directly, without a call per query: these are the hot queries of
the controller and the simulator. A base class rather than a part, since subclasses override these
very methods (a policy's own `path` or `egress`) and call them on themselves.
"""
from __future__ import annotations

import functools
from typing import ClassVar

from fabric.errors import RoutingError
from fabric.model import NicPort
from fabric.routing.entropy import EntropyPlan
from fabric.routing.eventlog import EventLog
from fabric.routing.liveness import Liveness
from fabric.routing.loads import LinkLoads, _Load
from fabric.routing.memo import LinkMemo, LinkOutcome
from fabric.routing.pins import Pins
from fabric.routing.records import DecisionPoint, DirectedLink, LinkState, RouteEvent
from fabric.routing.tables import PathTable


class PolicyQueries:
    """Queries and snapshots over a routing policy's state (`RoutingPolicy` sets it up)."""

    name: ClassVar[str]
    multipath: ClassVar[bool]
    table: PathTable
    entropy: EntropyPlan
    _tier: dict[str, int]  # switch -> tier
    _edge_index: dict[str, int]  # destination edge switch -> its index
    _capacity_bps: dict[DirectedLink, float]
    _liveness: Liveness
    _down: set[DirectedLink]  # `_liveness.down`
    _live: dict[DecisionPoint, tuple[int, ...]]  # `_liveness.live`; read it as `_alive`
    _base: dict[DecisionPoint, tuple[int, ...]]  # decision point -> slot -> port with all links up
    _slot_maps: dict[DecisionPoint, tuple[int, ...]]  # ... and now; read it as `_slots`
    _memo: LinkMemo
    _pending: list[LinkOutcome]  # `_memo.pending`
    _pins: Pins
    _load_state: LinkLoads
    _loads: dict[DirectedLink, _Load]  # `_load_state.rates`
    _events: EventLog

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
        return self._liveness.mask

    def _flush(self) -> None:
        """Apply the memoised events not yet applied to the tables."""
        self._memo.flush()

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

    def static_port(self, switch: str, dest: str) -> int:
        """For policies with `multipath = False`: the one port towards `dest`."""
        ports = self.table.ecmp_ports(switch, dest)
        return ports[self._edge_index[dest] % len(ports)]

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
        return self._load_state.hot_links()

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
        return self._events.events(limit)

    def reroutes(self) -> dict[str, int]:
        """Slot moves by cause, over the events still in the log."""
        return self._events.reroutes()


@functools.lru_cache(maxsize=4096)
def _failover_order(routes: tuple[int, ...], n_primary: int, rotation: int, port: int) -> tuple[int, ...]:
    """`PolicyQueries.failover_order` for candidates `routes` (the first `n_primary` equal-cost)."""
    primaries, detours = routes[:n_primary], routes[n_primary:]
    if port in primaries and detours:
        detours = detours[rotation:] + detours[:rotation]
    return (port,) + tuple(q for q in primaries + detours if q != port)


@functools.lru_cache(maxsize=4096)
def _failover_orders(routes: tuple[int, ...], n_primary: int) -> tuple[tuple[int, ...], ...]:
    rotations = range(max(1, len(routes) - n_primary))
    return tuple(sorted({_failover_order(routes, n_primary, r, p) for p in routes for r in rotations}))
